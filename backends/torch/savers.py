"""Memory savers for PyTorch: activation checkpointing and saved tensors kept on the host.

``TorchSavers`` is the torch adapter's ``savers`` topic; torch is imported only inside its methods.

- ``full``: ``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)``.
- ``matmuls``: the same, with a selective-checkpoint policy that saves the outputs of the
  matrix products and the attention kernels (``create_selective_checkpoint_contexts``).
- ``offload``: ``torch.autograd.graph.save_on_cpu`` around ``fn``; nothing is recomputed.

Both checkpoint forms restore the RNG state before recomputing, so dropout draws the same
mask twice and the gradients equal those without checkpointing.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

from unimem.backends.base import Savers

__all__ = ["MATMUL_OPS", "TorchSavers"]

# aten ops whose outputs the "matmuls" policy keeps: the matrix products and the fused attention
# kernels (each exists in some torch builds only, so absent ones are skipped).
MATMUL_OPS = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_mm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)


def _matmul_context() -> Callable[[], Any]:
    """The ``context_fn`` of a selective checkpoint that saves the outputs of ``MATMUL_OPS``."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    kept = {getattr(torch.ops.aten, name) for name in MATMUL_OPS if hasattr(torch.ops.aten, name)}

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        # MUST_SAVE: torch.compile may not override it; the rest may be recomputed.
        return CheckpointPolicy.MUST_SAVE if op.overloadpacket in kept else CheckpointPolicy.PREFER_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy)


class TorchSavers(Savers):
    """torch's memory savers (``SaversTopic``): checkpointing, selective or full, and saved tensors on the host."""

    def offload(self) -> contextlib.AbstractContextManager[None]:
        """``save_on_cpu``, pinned where CUDA is available (pinned host memory copies asynchronously)."""
        import torch

        context: contextlib.AbstractContextManager[None] = torch.autograd.graph.save_on_cpu(
            pin_memory=torch.cuda.is_available()
        )
        return context

    def remat(self, fn: Callable[..., Any], policy: str) -> Callable[..., Any]:
        """``fn`` wrapped for ``policy`` (``"full"``, ``"matmuls"`` or ``"offload"``)."""
        from torch.utils.checkpoint import checkpoint, noop_context_fn

        if policy == "offload":

            @functools.wraps(fn)
            def offloaded(*args: Any, **kwargs: Any) -> Any:
                with self.offload():
                    return fn(*args, **kwargs)

            return offloaded

        context_fn = _matmul_context() if policy == "matmuls" else noop_context_fn

        @functools.wraps(fn)
        def recomputed(*args: Any, **kwargs: Any) -> Any:
            return checkpoint(fn, *args, use_reentrant=False, context_fn=context_fn, **kwargs)

        return recomputed
