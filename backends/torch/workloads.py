"""The ``unimem compare`` workloads in PyTorch (the math is ``unimem.workloads.forward``).

Reached through ``TorchBackend.workload_step`` and ``start_device``; imports torch inside
each function, so importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unimem.compare import forward_in_blocks
from unimem.savers import remat
from unimem.workloads import LEARNING_RATE, Shapes, forward, input_shape, parameter_count, parameter_shapes

__all__ = ["build", "loss_function", "start_device"]


def loss_function(ops: Any, workload: str, s: Shapes) -> Callable[[dict[str, Any], Any], Any]:
    """``(params, x) -> loss``: ``forward``, or, when ``s`` names a saver (``s.saver``, set by the
    ``remat`` and ``offload`` configurations), ``forward_in_blocks`` with every block under
    ``unimem.remat(block, s.saver)``. A policy torch cannot do raises ``UnsupportedFeature`` here,
    before anything runs."""
    policy = getattr(s, "saver", None)
    if policy is None:
        return lambda params, x: forward(ops, workload, s, params, x)
    remat(lambda: None, policy, backend="torch")  # refuses a policy torch cannot do, now

    def wrap(block: Callable[..., Any]) -> Any:
        return remat(block, policy, backend="torch")

    return lambda params, x: forward_in_blocks(ops, workload, s, params, x, wrap)


def start_device() -> str:
    """Start CUDA with a tiny op when there is a GPU; the device's name, or ``"cpu"``."""
    import torch

    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        return str(torch.cuda.get_device_name(0))
    return "cpu"


def _ops() -> Any:
    """The op table ``forward`` computes with, in torch."""
    import torch

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

    return Ops


def build(workload: str, s: Shapes, dtype: str) -> tuple[Callable[[], None], int]:
    """``(step, parameter_count)``: ``step()`` runs one training step on CUDA (else the CPU) and waits."""
    import torch

    shapes = parameter_shapes(workload, s)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    gen = torch.Generator(device="cpu").manual_seed(0)
    params = {
        n: (torch.randn(shape, generator=gen) * 0.02).to(device=device, dtype=dt).requires_grad_()
        for n, shape in shapes.items()
    }
    x = torch.randn(input_shape(workload, s), generator=gen).to(device=device, dtype=dt)
    loss_of = loss_function(_ops(), workload, s)

    def step() -> None:
        loss = loss_of(params, x)
        loss.backward()
        with torch.no_grad():
            for p in params.values():
                p -= LEARNING_RATE * p.grad  # type: ignore[operator]  # set by backward()
                p.grad = None
        if device == "cuda":
            torch.cuda.synchronize()

    return step, parameter_count(workload, s)
