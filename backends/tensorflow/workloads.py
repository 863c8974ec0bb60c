"""The ``unimem compare`` workloads in TensorFlow (the math is ``unimem.workload_specs.forward``).

``TensorFlowWorkloads`` is the TensorFlow adapter's ``workloads`` topic; it imports tensorflow inside each
method, so importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unimem.backends.base import Workloads

from unimem.workload_specs import (
    LEARNING_RATE,
    Shapes,
    input_shape,
    loss_function,
    parameter_count,
    parameter_shapes,
)

__all__ = ["TensorFlowWorkloads"]


def _ops(s: Shapes) -> Any:
    """The op table ``forward`` computes with, in TensorFlow (head reshapes use static shapes)."""
    import tensorflow as tf

    class Ops:
        matmul = staticmethod(tf.matmul)
        relu = staticmethod(tf.nn.relu)
        gelu = staticmethod(tf.nn.gelu)
        mean = staticmethod(tf.reduce_mean)

        @staticmethod
        def softmax(t: Any) -> Any:
            return tf.nn.softmax(t, axis=-1)

        @staticmethod
        def layer_norm(t: Any) -> Any:
            mu, var = tf.nn.moments(t, axes=[-1], keepdims=True)
            return (t - mu) / tf.sqrt(var + 1e-5)

        @staticmethod
        def split_heads(t: Any, heads: int, head: int) -> Any:
            return tf.transpose(tf.reshape(t, (s.batch, s.seq, heads, head)), (0, 2, 1, 3))

        @staticmethod
        def merge_heads(t: Any) -> Any:
            return tf.reshape(tf.transpose(t, (0, 2, 1, 3)), (s.batch, s.seq, s.width))

        @staticmethod
        def transpose_last(t: Any) -> Any:
            return tf.linalg.matrix_transpose(t)

    return Ops


class TensorFlowWorkloads(Workloads):
    """The reference workloads in TensorFlow (``WorkloadsTopic``): a ``tf.function`` step on its default device."""

    def start_device(self) -> str:
        """Start TensorFlow's runtime with a tiny op; the first logical GPU's name, or ``"cpu"``."""
        import tensorflow as tf

        tf.zeros(1).numpy()
        gpus = tf.config.list_logical_devices("GPU")
        return str(gpus[0].name) if gpus else "cpu"

    def workload_step(self, workload: str, shapes: Shapes, dtype: str) -> tuple[Callable[[], None], int]:
        """``(step, parameter_count)``: ``step()`` runs one ``tf.function`` training step and waits for it."""
        import tensorflow as tf

        sizes = parameter_shapes(workload, shapes)
        dt = tf.bfloat16 if dtype == "bfloat16" else tf.float32
        tf.random.set_seed(0)
        params = {n: tf.Variable(tf.cast(tf.random.normal(shape) * 0.02, dt), name=n) for n, shape in sizes.items()}
        x = tf.cast(tf.random.normal(input_shape(workload, shapes)), dt)
        loss_of = loss_function(_ops(shapes), workload, shapes)
        names = list(params)

        @tf.function(jit_compile=False)
        def update() -> Any:
            with tf.GradientTape() as tape:
                loss = loss_of(params, x)
            grads = tape.gradient(loss, [params[n] for n in names])
            for n, g in zip(names, grads, strict=True):
                params[n].assign_sub(LEARNING_RATE * g)
            return loss

        def step() -> None:
            update().numpy()  # .numpy() waits for the device

        return step, parameter_count(workload, shapes)
