"""torch under a launcher: the rank's device pin, and the c10d store a cluster view gathers through.

The pin is ``torch.cuda.set_device(d)`` made inside CUDA's lazy init, before the first
tensor: a tensor made on ``"cuda"`` before ``set_device`` starts a context on GPU 0 that
stays there for the life of the rank.

The gather uses the default group's c10d store, one key per rank read with a bounded wait,
not a collective: a new process group (gloo included) is itself created by a collective, so
one rank asking alone would hang in it; and an NCCL collective stages through the current
GPU, starting the very context on GPU 0 that the pin avoids. ``find_batch_size`` agrees on
its trials through the same store, for the same reasons.

Its trials run a DDP model under ``no_sync()`` with buffer broadcasting off, so a trial's
forward and backward make no collective; a model whose forward itself communicates (FSDP,
tensor-parallel ``DTensor`` parameters) is refused: no context keeps its trials to one rank.
"""

from __future__ import annotations

import contextlib
import datetime
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from unimem.backends.steps import STATUS_PENDING, STATUS_SKIPPED, STATUS_UNCHANGED, Step
from unimem.backends.topics import KeyValueStore

from unimem.errors import ConfigError
from unimem.support import Phase

if TYPE_CHECKING:
    from .adapter import TorchBackend

__all__ = ["C10dStore", "plan_pin", "store", "trial_context"]


def plan_pin(adapter: TorchBackend, device: int, note: str) -> list[Step]:
    """``torch.cuda.set_device(device)``: at CUDA init when it has not started, now when it has."""
    target = f"torch.cuda.set_device({device})"
    if adapter.phase() is Phase.INITIALIZED:
        torch = sys.modules["torch"]
        current = int(torch.cuda.current_device())
        if current == device:
            return [Step("torch", "pin", device, "api", target, status=STATUS_UNCHANGED, note=note)]

        def run_now() -> None:
            adapter.at_init.pinned = device
            torch.cuda.set_device(device)

        late = (
            f"; CUDA had already started on device {current}: what was made there stays there "
            "(call unimem.configure before the first CUDA operation)"
        )
        return [Step("torch", "pin", device, "api", target, run=run_now, note=note + late)]
    loaded = sys.modules.get("torch")
    if loaded is not None and getattr(loaded, "cuda", None) is not None and not loaded.cuda.is_available():
        skipped = f"{note}; torch sees no CUDA device here: nothing to pin"
        return [Step("torch", "pin", device, "api", target, status=STATUS_SKIPPED, note=skipped)]

    def run_later() -> None:
        adapter.pin_at_init(device)

    return [
        Step("torch", "pin", device, "hook", target + " at CUDA init", run=run_later, status=STATUS_PENDING, note=note)
    ]


class C10dStore:
    """The default process group's store: ``set``, and ``get`` with a bounded wait."""

    def __init__(self, backing: Any, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.backing = backing

    def set(self, key: str, value: str) -> None:
        self.backing.set(key, value)

    def get(self, key: str, timeout: float) -> str | None:
        try:
            if timeout > 0:
                # A zero timedelta means "no timeout" to c10d: only a positive wait is bounded.
                self.backing.wait([key], datetime.timedelta(seconds=max(timeout, 0.001)))
            elif not self.backing.check([key]):
                return None
            raw = self.backing.get(key)
        except RuntimeError:  # c10d's DistStoreError on a timeout, or the store's host has gone
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)


def store() -> KeyValueStore | None:
    """The store of the default process group, if the script has initialised one."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    # torch has no public handle on the default group's store.
    return C10dStore(dist.distributed_c10d._get_default_store(), int(dist.get_rank()), int(dist.get_world_size()))


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


def trial_context(model: Any) -> Callable[[], contextlib.AbstractContextManager[None]] | None:
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
