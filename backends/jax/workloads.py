"""The ``unimem compare`` workloads in JAX (the math is ``unimem.workload_specs.forward``).

``JaxWorkloads`` is the JAX adapter's ``workloads`` topic; it imports jax inside each
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

__all__ = ["JaxWorkloads"]


def _ops() -> Any:
    """The op table ``forward`` computes with, in jax.numpy."""
    import jax
    import jax.numpy as jnp

    class Ops:
        matmul = staticmethod(jnp.matmul)
        relu = staticmethod(jax.nn.relu)
        gelu = staticmethod(jax.nn.gelu)
        mean = staticmethod(jnp.mean)

        @staticmethod
        def softmax(t: Any) -> Any:
            return jax.nn.softmax(t, axis=-1)

        @staticmethod
        def layer_norm(t: Any) -> Any:
            mu = t.mean(-1, keepdims=True)
            return (t - mu) / jnp.sqrt(((t - mu) ** 2).mean(-1, keepdims=True) + 1e-5)

        @staticmethod
        def split_heads(t: Any, heads: int, head: int) -> Any:
            return t.reshape(t.shape[0], t.shape[1], heads, head).transpose(0, 2, 1, 3)

        @staticmethod
        def merge_heads(t: Any) -> Any:
            b, h, q, d = t.shape
            return t.transpose(0, 2, 1, 3).reshape(b, q, h * d)

        @staticmethod
        def transpose_last(t: Any) -> Any:
            return jnp.swapaxes(t, -1, -2)

    return Ops


class JaxWorkloads(Workloads):
    """The reference workloads in JAX (``WorkloadsTopic``): a jitted step on JAX's default device."""

    def start_device(self) -> str:
        """Start JAX's backend with a tiny op; the first device's kind (``"cpu"`` without a GPU)."""
        import jax
        import jax.numpy as jnp

        jnp.zeros(1).block_until_ready()
        return str(jax.devices()[0].device_kind)

    def workload_step(self, workload: str, shapes: Shapes, dtype: str) -> tuple[Callable[[], None], int]:
        """``(step, parameter_count)``: ``step()`` runs one jitted training step and waits for it."""
        import jax
        import jax.numpy as jnp

        sizes = parameter_shapes(workload, shapes)
        dt = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
        keys = jax.random.split(jax.random.PRNGKey(0), len(sizes) + 1)
        params = {
            n: (jax.random.normal(k, shape) * 0.02).astype(dt)
            for (n, shape), k in zip(sizes.items(), keys[:-1], strict=True)
        }
        x = jax.random.normal(keys[-1], input_shape(workload, shapes)).astype(dt)
        loss = loss_function(_ops(), workload, shapes)

        @jax.jit
        def update(p: dict[str, Any]) -> dict[str, Any]:
            grads = jax.grad(lambda q: loss(q, x))(p)
            return {n: p[n] - LEARNING_RATE * grads[n] for n in p}

        state = {"params": params}

        def step() -> None:
            state["params"] = update(state["params"])
            jax.block_until_ready(state["params"])

        return step, parameter_count(workload, shapes)
