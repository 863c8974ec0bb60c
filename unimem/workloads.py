"""Reference workloads for ``unimem compare``: the same math, shapes and parameter count
in each framework, written with plain matmuls so no framework layer adds its own tricks.

- ``mlp``: ``depth`` × (Linear + ReLU) and a Linear back to the input width; MSE loss.
- ``transformer``: one pre-norm block, multi-head self-attention and a 4× GELU MLP, with
  residuals; loss = mean of the output squared.
Each step is forward, backward and a plain SGD update, in float32 or bfloat16.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["SIZES", "Shapes", "build_step", "parameter_shapes"]


@dataclass(frozen=True)
class Shapes:
    batch: int
    width: int  # MLP input/output width; transformer model width
    hidden: int  # MLP hidden width
    depth: int  # MLP hidden layers
    seq: int  # transformer sequence length
    heads: int  # transformer attention heads


SIZES: dict[str, Shapes] = {
    # small: seconds per run on a laptop CPU; large: enough to matter on a datacenter GPU
    "small": Shapes(batch=32, width=128, hidden=512, depth=3, seq=32, heads=4),
    "large": Shapes(batch=256, width=2048, hidden=8192, depth=4, seq=512, heads=16),
}
LEARNING_RATE = 1e-3


def parameter_shapes(workload: str, s: Shapes) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter; identical for every framework."""
    if workload == "mlp":
        shapes: dict[str, tuple[int, ...]] = {}
        widths = [s.width] + [s.hidden] * s.depth + [s.width]
        for i in range(len(widths) - 1):
            shapes[f"w{i}"] = (widths[i], widths[i + 1])
            shapes[f"b{i}"] = (widths[i + 1],)
        return shapes
    if workload == "transformer":
        d = s.width
        return {"wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "w1": (d, 4 * d), "w2": (4 * d, d)}
    raise ValueError(f"unknown workload {workload!r}")


def input_shape(workload: str, s: Shapes) -> tuple[int, ...]:
    return (s.batch, s.width) if workload == "mlp" else (s.batch, s.seq, s.width)


def _forward(ops: Any, workload: str, s: Shapes, params: dict[str, Any], x: Any) -> Any:
    """The loss, written once against a small op table (matmul, relu, gelu, softmax, ...)."""
    if workload == "mlp":
        h = x
        layers = s.depth + 1
        for i in range(layers):
            h = ops.matmul(h, params[f"w{i}"]) + params[f"b{i}"]
            if i < layers - 1:
                h = ops.relu(h)
        return ops.mean((h - x) ** 2)
    d, heads = s.width, s.heads
    head = d // heads
    h = ops.layer_norm(x)
    q, k, v = (ops.split_heads(ops.matmul(h, params[n]), heads, head) for n in ("wq", "wk", "wv"))
    scores = ops.matmul(q, ops.transpose_last(k)) * (1.0 / math.sqrt(head))
    attn = ops.merge_heads(ops.matmul(ops.softmax(scores), v))
    x = x + ops.matmul(attn, params["wo"])
    x = x + ops.matmul(ops.gelu(ops.matmul(ops.layer_norm(x), params["w1"])), params["w2"])
    return ops.mean(x**2)


def build_step(framework: str, workload: str, s: Shapes, dtype: str) -> tuple[Callable[[], None], int]:
    """``(step, parameter_count)``: ``step()`` runs one training step and waits for it."""
    builder = {"torch": _torch_step, "tensorflow": _tf_step, "jax": _jax_step}[framework]
    shapes = parameter_shapes(workload, s)
    count = sum(math.prod(shape) for shape in shapes.values())
    return builder(workload, s, dtype, shapes), count


def _torch_step(workload: str, s: Shapes, dtype: str, shapes: dict[str, tuple[int, ...]]) -> Callable[[], None]:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    gen = torch.Generator(device="cpu").manual_seed(0)
    params = {
        n: (torch.randn(shape, generator=gen) * 0.02).to(device=device, dtype=dt).requires_grad_()
        for n, shape in shapes.items()
    }
    x = torch.randn(input_shape(workload, s), generator=gen).to(device=device, dtype=dt)

    class Ops:
        matmul = staticmethod(torch.matmul)
        relu = staticmethod(torch.relu)
        gelu = staticmethod(torch.nn.functional.gelu)
        mean = staticmethod(torch.mean)

        @staticmethod
        def softmax(t: Any) -> Any:
            return torch.softmax(t, dim=-1)

        @staticmethod
        def layer_norm(t: Any) -> Any:
            return torch.nn.functional.layer_norm(t, t.shape[-1:])

        @staticmethod
        def split_heads(t: Any, heads: int, head: int) -> Any:
            return t.reshape(t.shape[0], t.shape[1], heads, head).transpose(1, 2)

        @staticmethod
        def merge_heads(t: Any) -> Any:
            b, h, q, d = t.shape
            return t.transpose(1, 2).reshape(b, q, h * d)

        @staticmethod
        def transpose_last(t: Any) -> Any:
            return t.transpose(-1, -2)

    def step() -> None:
        loss = _forward(Ops, workload, s, params, x)
        loss.backward()
        with torch.no_grad():
            for p in params.values():
                p -= LEARNING_RATE * p.grad  # type: ignore[operator]  # set by backward()
                p.grad = None
        if device == "cuda":
            torch.cuda.synchronize()

    return step


def _jax_step(workload: str, s: Shapes, dtype: str, shapes: dict[str, tuple[int, ...]]) -> Callable[[], None]:
    import jax
    import jax.numpy as jnp

    dt = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    keys = jax.random.split(jax.random.PRNGKey(0), len(shapes) + 1)
    params = {
        n: (jax.random.normal(k, shape) * 0.02).astype(dt)
        for (n, shape), k in zip(shapes.items(), keys[:-1], strict=True)
    }
    x = jax.random.normal(keys[-1], input_shape(workload, s)).astype(dt)

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

    @jax.jit
    def update(p: dict[str, Any]) -> dict[str, Any]:
        grads = jax.grad(lambda q: _forward(Ops, workload, s, q, x))(p)
        return {n: p[n] - LEARNING_RATE * grads[n] for n in p}

    state = {"params": params}

    def step() -> None:
        state["params"] = update(state["params"])
        jax.block_until_ready(state["params"])

    return step


def _tf_step(workload: str, s: Shapes, dtype: str, shapes: dict[str, tuple[int, ...]]) -> Callable[[], None]:
    import tensorflow as tf

    dt = tf.bfloat16 if dtype == "bfloat16" else tf.float32
    tf.random.set_seed(0)
    params = {n: tf.Variable(tf.cast(tf.random.normal(shape) * 0.02, dt), name=n) for n, shape in shapes.items()}
    x = tf.cast(tf.random.normal(input_shape(workload, s)), dt)

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

    names = list(params)

    @tf.function(jit_compile=False)
    def update() -> Any:
        with tf.GradientTape() as tape:
            loss = _forward(Ops, workload, s, params, x)
        grads = tape.gradient(loss, [params[n] for n in names])
        for n, g in zip(names, grads, strict=True):
            params[n].assign_sub(LEARNING_RATE * g)
        return loss

    def step() -> None:
        update().numpy()  # .numpy() waits for the device

    return step
