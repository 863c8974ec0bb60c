"""The reference workloads of ``unimem compare``, as every framework shares them: the same math,
shapes and parameter count, written with plain matmuls so no framework layer adds its own tricks.

- ``mlp``: ``depth`` × (Linear + ReLU) and a Linear back to the input width; MSE loss.
- ``transformer``: one pre-norm block, multi-head self-attention and a 4× GELU MLP, with
  residuals; loss = mean of the output squared.
Each step is forward, backward and a plain SGD update, in float32 or bfloat16.

This module holds the shapes, the parameter shapes and the loss written against an op table;
each framework's step is built by its adapter's ``workloads`` topic
(``unimem.backends.<framework>.workloads``), which ``unimem.compare.workloads`` hands the shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LEARNING_RATE",
    "Shapes",
    "forward",
    "forward_in_blocks",
    "input_shape",
    "loss_function",
    "parameter_count",
    "parameter_shapes",
]


@dataclass(frozen=True)
class Shapes:
    batch: int
    width: int  # MLP input/output width; transformer model width
    hidden: int  # MLP hidden width
    depth: int  # MLP hidden layers
    seq: int  # transformer sequence length
    heads: int  # transformer attention heads
    saver: str | None = None  # every block under unimem.remat(block, saver); None: no saver
    # What each block is called through for ``saver`` (``unimem.remat(block, saver)``), handed in
    # by ``unimem.compare.workloads.build_step``: the adapters build the step, the front owns the savers.
    wrap: Callable[[Callable[..., Any]], Any] | None = field(default=None, compare=False, repr=False)


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


def parameter_count(workload: str, s: Shapes) -> int:
    """How many numbers the parameters hold; identical for every framework."""
    return sum(math.prod(shape) for shape in parameter_shapes(workload, s).values())


def input_shape(workload: str, s: Shapes) -> tuple[int, ...]:
    return (s.batch, s.width) if workload == "mlp" else (s.batch, s.seq, s.width)


def loss_function(ops: Any, workload: str, s: Shapes) -> Callable[[dict[str, Any], Any], Any]:
    """``(params, x) -> loss``: ``forward``, or, when ``s.saver`` names a policy (the ``remat`` and
    ``offload`` configurations of ``unimem compare``), ``forward_in_blocks`` with every block
    called through ``s.wrap``.

    Raises:
        ValueError: ``s.saver`` names a policy but ``s.wrap`` is None.
    """
    if s.saver is None:
        return lambda params, x: forward(ops, workload, s, params, x)
    wrap = s.wrap
    if wrap is None:
        raise ValueError(f"shapes with saver={s.saver!r} need wrap=, the saver each block runs under")
    return lambda params, x: forward_in_blocks(ops, workload, s, params, x, wrap)


def forward_in_blocks(
    ops: Any, workload: str, s: Shapes, params: dict[str, Any], x: Any, wrap: Callable[[Callable[..., Any]], Any]
) -> Any:
    """``forward``'s loss, each block computed through ``wrap(block)``.

    The blocks: each MLP layer (matmul, bias, ReLU); the transformer's attention half and MLP
    half, each with its residual. A block takes its input and its weights positionally, so
    gradients flow to both through any saver (TensorFlow's ``recompute_grad`` differentiates
    positional arguments only).

    Args:
        ops: The op table ``forward`` computes with.
        workload: ``"mlp"`` or ``"transformer"``.
        s: The workload's shapes.
        params: The parameters, by the names of ``parameter_shapes``.
        x: The input.
        wrap: Takes a block and returns what to call in its place (``unimem.remat(block, policy)``;
            the identity gives ``forward``'s loss exactly).

    Returns:
        The loss, as ``forward`` computes it.
    """
    if workload == "mlp":
        h = x
        layers = s.depth + 1
        for i in range(layers):

            def layer(h: Any, w: Any, b: Any, hidden: bool = i < layers - 1) -> Any:
                out = ops.matmul(h, w) + b
                return ops.relu(out) if hidden else out

            h = wrap(layer)(h, params[f"w{i}"], params[f"b{i}"])
        return ops.mean((h - x) ** 2)
    heads = s.heads
    head = s.width // heads

    def attention(x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> Any:
        h = ops.layer_norm(x)
        q, k, v = (ops.split_heads(ops.matmul(h, w), heads, head) for w in (wq, wk, wv))
        scores = ops.matmul(q, ops.transpose_last(k)) * (1.0 / math.sqrt(head))
        return x + ops.matmul(ops.merge_heads(ops.matmul(ops.softmax(scores), v)), wo)

    def mlp(x: Any, w1: Any, w2: Any) -> Any:
        return x + ops.matmul(ops.gelu(ops.matmul(ops.layer_norm(x), w1)), w2)

    x = wrap(attention)(x, params["wq"], params["wk"], params["wv"], params["wo"])
    x = wrap(mlp)(x, params["w1"], params["w2"])
    return ops.mean(x**2)


def forward(ops: Any, workload: str, s: Shapes, params: dict[str, Any], x: Any) -> Any:
    """The loss, written once against a small op table (matmul, relu, gelu, softmax, ...).

    ``ops`` has ``matmul``, ``relu``, ``gelu``, ``mean``, ``softmax`` (last axis),
    ``layer_norm`` (last axis, no weights), ``split_heads``, ``merge_heads`` and
    ``transpose_last``, each in the framework's own arrays.
    """
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
