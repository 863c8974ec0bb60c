"""Gradient accumulation in PyTorch: skip the data-parallel synchronisation until the last micro-batch.

``TorchAccumulation`` is the torch adapter's ``accumulation`` topic; torch is imported only
inside its methods.

torch adds every backward pass into ``.grad``, so the accumulation itself needs nothing: weight
each micro-batch's loss (``mb.weight``). What needs the framework is the synchronisation: a
``DistributedDataParallel`` (or FSDP) module all-reduces in every backward pass unless it runs
inside ``model.no_sync()``.
"""

from __future__ import annotations

import contextlib
from typing import Any

from unimem.backends.base import Accumulation

from unimem.errors import ConfigError

__all__ = ["TorchAccumulation"]


def _part(total: Any, key: Any, count: int) -> Any:
    """``total[key]`` where ``total`` has ``grads``' structure; None while there is no sum yet."""
    if total is None:
        return None
    if isinstance(total, (dict, list, tuple)) and len(total) == count:
        try:
            return total[key]
        except (KeyError, IndexError, TypeError):
            pass
    raise ConfigError("grads", "expected the structure of the running sum (total); pass the same one each time")


class TorchAccumulation(Accumulation):
    """Gradient accumulation in torch (``AccumulationTopic``): DDP's ``no_sync``, gradients added out of place."""

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager[None]:
        """``model.no_sync()`` for a module wrapped for data parallelism; nothing for a plain module.

        A plain ``torch.nn.Module`` synchronises nothing, so there is nothing to skip; anything else
        is refused, so that a wrong object cannot silently all-reduce every micro-batch.
        """
        import torch

        skip = getattr(model, "no_sync", None)
        if callable(skip):
            context: contextlib.AbstractContextManager[None] = skip()
            return context
        if isinstance(model, torch.nn.Module):
            return contextlib.nullcontext()
        raise ConfigError(
            "model",
            "expected the torch.nn.Module the loop trains (DistributedDataParallel or FSDP-wrapped), "
            f"got {type(model)!r}",
        )

    def add_gradients(self, total: Any, grads: Any, weight: float) -> Any:
        """``total + weight * grads`` over dicts, lists and tuples of tensors (out of place); a None
        gradient adds nothing."""
        if grads is None:
            return total
        if isinstance(grads, dict):
            return type(grads)(
                (k, self.add_gradients(_part(total, k, len(grads)), g, weight)) for k, g in grads.items()
            )
        if isinstance(grads, (list, tuple)):
            items = [self.add_gradients(_part(total, i, len(grads)), g, weight) for i, g in enumerate(grads)]
            return type(grads)(*items) if hasattr(grads, "_fields") else type(grads)(items)
        if isinstance(total, (dict, list, tuple)):
            raise ConfigError("grads", "expected the structure of the running sum (total); pass the same one each time")
        return grads * weight if total is None else total + grads * weight
