"""The ``unimem compare`` workloads in PyTorch (the math is ``unimem.workload_specs.forward``).

``TorchWorkloads`` is the PyTorch adapter's ``workloads`` topic; it imports torch inside each
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

__all__ = ["TorchWorkloads"]


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


class TorchWorkloads(Workloads):
    """The reference workloads in torch (``WorkloadsTopic``), on CUDA when there is a GPU, else the CPU."""

    def start_device(self) -> str:
        """Start CUDA with a tiny op when there is a GPU; the device's name, or ``"cpu"``."""
        import torch

        if torch.cuda.is_available():
            torch.zeros(1, device="cuda")
            torch.cuda.synchronize()
            return str(torch.cuda.get_device_name(0))
        return "cpu"

    def workload_step(self, workload: str, shapes: Shapes, dtype: str) -> tuple[Callable[[], None], int]:
        """``(step, parameter_count)``: ``step()`` runs one training step on CUDA (else the CPU) and waits."""
        import torch

        sizes = parameter_shapes(workload, shapes)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        dt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        gen = torch.Generator(device="cpu").manual_seed(0)
        params = {
            n: (torch.randn(shape, generator=gen) * 0.02).to(device=device, dtype=dt).requires_grad_()
            for n, shape in sizes.items()
        }
        x = torch.randn(input_shape(workload, shapes), generator=gen).to(device=device, dtype=dt)
        loss_of = loss_function(_ops(), workload, shapes)

        def step() -> None:
            loss = loss_of(params, x)
            loss.backward()
            with torch.no_grad():
                for p in params.values():
                    p -= LEARNING_RATE * p.grad  # type: ignore[operator]  # set by backward()
                    p.grad = None
            if device == "cuda":
                torch.cuda.synchronize()

        return step, parameter_count(workload, shapes)
