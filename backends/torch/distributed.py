"""torch under a launcher: the rank's device pin, and the c10d store a cluster view gathers through.

The pin is ``torch.cuda.set_device(d)`` made inside CUDA's lazy init, before the first
tensor: a tensor made on ``"cuda"`` before ``set_device`` starts a context on GPU 0 that
stays there for the life of the rank.

The gather uses the default group's c10d store, one key per rank read with a bounded wait,
not a collective: a new process group (gloo included) is itself created by a collective, so
one rank asking alone would hang in it; and an NCCL collective stages through the current
GPU, starting the very context on GPU 0 that the pin avoids. ``find_batch_size`` agrees on
its trials through the same store, for the same reasons.
"""

from __future__ import annotations

import datetime
import sys
from typing import Any

from unimem.backends.base import Backend, Distributed
from unimem.backends.steps import STATUS_PENDING, STATUS_SKIPPED, STATUS_UNCHANGED, Step
from unimem.backends.topics import KeyValueStore
from unimem.backends.torch.configure import AtCudaInit

from unimem.support import Phase

__all__ = ["C10dStore", "TorchDistributed"]


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


class TorchDistributed(Distributed):
    """torch under a launcher (``DistributedTopic``): ``torch.cuda.set_device`` at CUDA init, the c10d store."""

    def __init__(self, backend: Backend, at_init: AtCudaInit) -> None:
        super().__init__(backend)
        self.at_init = at_init  # the adapter's CUDA-init work, where a pin made before CUDA starts waits

    def plan_pin(self, device: int | None, *, per_rank: bool, note: str) -> list[Step]:
        """``torch.cuda.set_device(device)``: at CUDA init when it has not started, now when it has;
        ``per_rank`` (or nothing to pin): the base's ``CUDA_VISIBLE_DEVICES`` step."""
        if device is None or per_rank:
            return super().plan_pin(device, per_rank=per_rank, note=note)
        target = f"torch.cuda.set_device({device})"
        if self.backend.phase() is Phase.INITIALIZED:
            torch = sys.modules["torch"]
            current = int(torch.cuda.current_device())
            if current == device:
                return [Step("torch", "pin", device, "api", target, status=STATUS_UNCHANGED, note=note)]

            def run_now() -> None:
                self.at_init.pinned = device
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
            self.at_init.pin(device)

        return [
            Step(
                "torch",
                "pin",
                device,
                "hook",
                target + " at CUDA init",
                run=run_later,
                status=STATUS_PENDING,
                note=note,
            )
        ]

    def distributed_store(self) -> KeyValueStore | None:
        """The store of the default process group, if the script has initialised one."""
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        # torch has no public handle on the default group's store.
        return C10dStore(dist.distributed_c10d._get_default_store(), int(dist.get_rank()), int(dist.get_world_size()))
