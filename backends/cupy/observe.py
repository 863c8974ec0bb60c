"""CuPy under observation: the pool's figures per device, its peaks, emptying it, the monitor's reader.

Every read takes the per-device pool itself (``_pools.device_pools``) or the async pool's
handle, so asking about device 1 never switches to it (a switch makes a CUDA context).
cupy is never imported here: callers pass the module from ``sys.modules`` once it has started.
"""

from __future__ import annotations

import gc
import types
from collections.abc import Callable
from typing import Any, NamedTuple

from unimem.backends.base import Observe, no_such_device
from unimem.backends.topics import Counters

from ._pools import ASYNC, POOL, PeakTracker, allocator_in_use, device_pools

__all__ = ["CupyObserve", "Figures", "Peaks", "clear", "device_count", "read", "reset_peak", "uuid_text"]


class Figures(NamedTuple):
    allocated: int | None = None
    reserved: int | None = None
    limit: int | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    free_blocks: int | None = None


class Peaks:
    """The adapter's peak trackers, one per MemoryPool that ``reset_peak`` was asked about."""

    def __init__(self) -> None:
        self.trackers: dict[int, PeakTracker] = {}

    def of(self, pool: Any, create: bool = False) -> PeakTracker | None:
        tracker = self.trackers.get(id(pool))  # the tracker holds its pool: the id stays that pool's
        if tracker is None and create:
            tracker = self.trackers[id(pool)] = PeakTracker(pool)
        return tracker


_counts: dict[int, int] = {}


def device_count(cupy: types.ModuleType) -> int:
    """Devices CUDA shows this process (asked once; CUDA has started when this is called)."""
    count = _counts.get(id(cupy))
    if count is None:
        count = _counts[id(cupy)] = int(cupy.cuda.runtime.getDeviceCount())
    return count


def _device_pool(cupy: types.ModuleType, pool: Any, device: int) -> Any | None:
    pools = device_pools(pool)
    if pools and device in pools:
        return pools[device]
    if device >= device_count(cupy):
        raise no_such_device("cupy", device, device_count(cupy))
    return None  # this pool has not started on that device


def _async_attribute(cupy: types.ModuleType, owner: Any, device: int, name: str) -> int:
    runtime = cupy.cuda.runtime
    return int(runtime.memPoolGetAttribute(owner._pools[device], getattr(runtime, name)))


def read(cupy: types.ModuleType, device: int, peaks: Peaks) -> Figures:
    """The figures of the allocator in use on ``device``; Nones where it keeps none."""
    kind, owner = allocator_in_use(cupy)
    if kind == POOL:
        pool = _device_pool(cupy, owner, device)
        if pool is None:
            return Figures()
        limit = int(pool.get_limit())
        tracker = peaks.of(owner)
        peak, peak_reserved = tracker.read(device) if tracker is not None else (None, None)
        return Figures(
            int(pool.used_bytes()), int(pool.total_bytes()), limit or None, peak, peak_reserved, pool.n_free_blocks()
        )
    if kind == ASYNC:
        if device >= device_count(cupy):
            raise no_such_device("cupy", device, device_count(cupy))
        figures = [
            _async_attribute(cupy, owner, device, name)
            for name in (
                "cudaMemPoolAttrUsedMemCurrent",
                "cudaMemPoolAttrReservedMemCurrent",
                "cudaMemPoolAttrUsedMemHigh",
                "cudaMemPoolAttrReservedMemHigh",
            )
        ]
        return Figures(figures[0], figures[1], None, figures[2], figures[3])
    if device >= device_count(cupy):
        raise no_such_device("cupy", device, device_count(cupy))
    return Figures()  # plain cudaMalloc, or an allocator of the user's own: nothing to read


def reset_peak(cupy: types.ModuleType, device: int, peaks: Peaks) -> None:
    kind, owner = allocator_in_use(cupy)
    if kind == POOL:
        pool = _device_pool(cupy, owner, device)
        used, total = (int(pool.used_bytes()), int(pool.total_bytes())) if pool is not None else (0, 0)
        tracker = peaks.of(owner, create=True)
        assert tracker is not None
        tracker.reset(cupy, device, used, total)
    elif kind == ASYNC:
        runtime = cupy.cuda.runtime
        for name in ("cudaMemPoolAttrUsedMemHigh", "cudaMemPoolAttrReservedMemHigh"):
            runtime.memPoolSetAttribute(owner._pools[device], getattr(runtime, name), 0)  # the driver resets to 0


def clear(cupy: types.ModuleType, device: int) -> int:
    """Free the pool's unused blocks on ``device``; the bytes its total dropped by."""
    kind, owner = allocator_in_use(cupy)
    gc.collect()  # arrays kept alive only by reference cycles go back to the pool first
    if kind == POOL:
        pool = _device_pool(cupy, owner, device)
        if pool is None:
            return 0
        before = int(pool.total_bytes())
        pool.free_all_blocks()  # this device's pool: no switch
        return max(0, before - int(pool.total_bytes()))
    if kind == ASYNC:
        before = _async_attribute(cupy, owner, device, "cudaMemPoolAttrReservedMemCurrent")
        with cupy.cuda.Device(device):
            owner.free_all_blocks()  # synchronizes the stream, then trims the driver's pool
        return max(0, before - _async_attribute(cupy, owner, device, "cudaMemPoolAttrReservedMemCurrent"))
    return 0


def uuid_text(raw: Any) -> str | None:
    """CUDA's 16-byte device UUID as NVML spells it (``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``)."""
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != 16:
        return None
    text = bytes(raw).hex()
    return f"GPU-{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


class CupyObserve(Observe):
    """CuPy under observation (``ObserveTopic``): the pool's counters; no profiler."""

    peak_reset_exact = True  # the hook counts every malloc and free from the reset on

    def counter_reader(self, device: int) -> tuple[Callable[[], Counters] | None, str]:
        """``(allocated, reserved)`` through ``stats(nvml=False)``: Nones until CuPy's pool has started."""

        def reader() -> Counters:
            snapshot = self.backend.stats(device, nvml=False)
            return snapshot.allocated, snapshot.reserved

        return reader, ""
