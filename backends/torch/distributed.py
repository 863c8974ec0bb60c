"""torch under a launcher: the rank's device pin, and the c10d store a cluster view gathers through.

The pin is ``torch.cuda.set_device(d)`` made inside CUDA's lazy init, before the first
tensor: a tensor made on ``"cuda"`` before ``set_device`` starts a context on GPU 0 that
stays there for the life of the rank.

The gather uses the default group's c10d store, one key per rank read with a bounded wait,
not a collective: a new process group (gloo included) is itself created by a collective, so
one rank asking alone would hang in it; and an NCCL collective stages through the current
GPU, starting the very context on GPU 0 that the pin avoids.
"""

from __future__ import annotations

import datetime
import sys
from typing import TYPE_CHECKING, Any

from unimem.backends.base import STATUS_PENDING, STATUS_SKIPPED, STATUS_UNCHANGED, KeyValueStore, Step

from unimem.support import Phase

if TYPE_CHECKING:
    from .adapter import TorchBackend

__all__ = ["C10dStore", "plan_pin", "store"]


def plan_pin(adapter: TorchBackend, device: int, note: str) -> list[Step]:
    """``torch.cuda.set_device(device)``: at CUDA init when it has not started, now when it has."""
    target = f"torch.cuda.set_device({device})"
    if adapter.phase() is Phase.INITIALIZED:
        torch = sys.modules["torch"]
        current = int(torch.cuda.current_device())
        if current == device:
            return [Step("torch", "pin", device, "api", target, status=STATUS_UNCHANGED, note=note)]

        def run_now() -> None:
            adapter.pinned = device
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
