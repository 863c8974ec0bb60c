"""What ``find_batch_size`` asks of torch: the bytes a trial may reach, the pool's overhead, the
moment to empty the cache in the settle call, and a trial's context under DDP.

torch is read from ``sys.modules`` only: a search that runs these has already run a step.

Under ``torch.distributed`` a trial runs a DDP model under ``no_sync()`` with buffer
broadcasting off, so its forward and backward make no collective one rank's out-of-memory
error could leave the others waiting in; a model whose forward itself communicates (FSDP,
tensor-parallel ``DTensor`` parameters) is refused: no context keeps its trials to one rank.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from unimem.backends.base import Search

from unimem.errors import ConfigError
from unimem.memory_stats import MemoryStats

__all__ = ["TorchSearch", "at_first_forward"]


# Wrappers whose forward gathers or shards parameters across ranks: (class name, module prefix).
_SHARDED = (
    ("FullyShardedDataParallel", "torch.distributed.fsdp"),
    ("FSDPModule", "torch.distributed.fsdp"),
    ("DTensor", "torch.distributed"),
)


def _sharded(obj: object) -> str | None:
    """The sharding class ``obj`` is an instance of, if any; read from its MRO, importing nothing."""
    for cls in type(obj).__mro__:
        for name, module in _SHARDED:
            if cls.__name__ == name and cls.__module__.startswith(module):
                return name
    return None


def _communicating(model: Any) -> str | None:
    """What in ``model`` communicates during a forward pass: an FSDP module, or a parameter that is a ``DTensor``."""
    for module in model.modules():
        found = _sharded(module)
        if found is not None:
            return f"{found} ({type(module).__name__})"
    for name, param in model.named_parameters():
        found = _sharded(param)
        if found is not None:
            return f"the {found} parameter {name!r}"
    return None


@contextlib.contextmanager
def _quiet(replicas: list[Any]) -> Iterator[None]:
    """Each DDP replica under ``no_sync()`` with buffer broadcasting off, restored afterwards:
    the first forward under ``no_sync`` still broadcasts buffers, a collective one rank's
    failure before it would leave the others waiting in."""
    with contextlib.ExitStack() as stack:
        for ddp in replicas:
            stack.enter_context(ddp.no_sync())
            before = ddp.broadcast_buffers
            stack.callback(setattr, ddp, "broadcast_buffers", before)
            ddp.broadcast_buffers = False
        yield


@contextlib.contextmanager
def at_first_forward(action: Callable[[], object]) -> Iterator[None]:
    """Within: ``action()`` runs once, when the first ``nn.Module`` forward starts (a global
    forward pre-hook, removed on exit). Nothing runs if torch is not imported or no module runs."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    fired = False

    def hook(module: Any, args: Any) -> None:
        nonlocal fired
        if not fired:
            fired = True
            action()

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


class TorchSearch(Search):
    """torch in the batch search (``SearchTopic``): the caching allocator's cap and segments, measured per trial."""

    release_every_trial = True  # empty the cache every trial: each peak starts from a clean pool
    settle_call = True  # the gradients leave the answer's large segments (settle)

    def search_capacity(self, snapshot: MemoryStats) -> int | None:
        """The cap, and no more than the pool plus the device's free bytes: the caching allocator
        can grow only into what the device still has, whatever the cap says."""
        bounds = [snapshot.limit]
        if snapshot.reserved is not None and snapshot.device_free is not None:
            bounds.append(snapshot.reserved + snapshot.device_free)
        known = [b for b in bounds if b is not None]
        return min(known) if known else None

    def pool_overhead(self, peak: int | None, peak_reserved: int | None) -> int:
        """The pool's bytes beyond those in use at a trial's peak: the cap bounds what the caching
        allocator reserves, which moves in whole segments, not the bytes in use."""
        if peak is None or peak_reserved is None:
            return 0
        return max(0, peak_reserved - peak)

    def settle(self, release: Callable[[], None]) -> contextlib.AbstractContextManager[None]:
        """``release`` as the settle call's first forward starts: the step's state leaves the answer's segments."""
        return at_first_forward(release)

    def trial_context(self, model: Any) -> Callable[[], contextlib.AbstractContextManager[None]] | None:
        """For a torch module: a context per trial in which its DDP replicas make no collective.

        Raises ``ConfigError("model")`` for a module whose forward communicates (FSDP, ``DTensor``
        parameters); None for anything that is not a torch module.
        """
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(model, torch.nn.Module):
            return None
        found = _communicating(model)
        if found is not None:
            raise ConfigError(
                "model",
                f"the model holds {found}, which gathers or reduces across ranks inside its forward and backward "
                "passes: one rank's out-of-memory error there leaves the others blocked in those collectives, so "
                "find_batch_size cannot try sizes on it. Search on a DDP-wrapped (or unwrapped) copy of the model "
                "with the same per-rank batch, or run the search in a single process (world size 1), then set the "
                "batch size on every rank",
            )
        replicas = [m for m in model.modules() if isinstance(m, torch.nn.parallel.DistributedDataParallel)]
        if not replicas:
            return contextlib.nullcontext
        return lambda: _quiet(replicas)
