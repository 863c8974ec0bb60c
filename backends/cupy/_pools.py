"""CuPy's allocators as unimem reads them, without starting CUDA.

CuPy allocates through ``cupy.cuda.get_allocator()``: by default the ``malloc`` of the
default ``MemoryPool``; after ``set_allocator(MemoryAsyncPool().malloc)`` through
cudaMallocAsync; after ``set_allocator(None)`` through plain cudaMalloc, with no pool.

A ``MemoryPool`` makes its per-device pools (``SingleDeviceMemoryPool``) at its first
allocation or query, and keeps them in a C field Python cannot read. The garbage
collector's view of the pool (``gc.get_referents``) is the one way to see whether they
exist without calling into CUDA: a tuple indexed by device in CuPy 14 (``None`` before
the first use), a dict keyed by device in CuPy 13 and older. Once they exist, their
counters (``used_bytes``, ``total_bytes``, ``get_limit``) are plain reads, no CUDA call.

cupy is never imported here: callers pass the module they took from ``sys.modules``.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import types
from typing import Any

__all__ = [
    "ASYNC",
    "OTHER",
    "POOL",
    "RAW",
    "PeakTracker",
    "allocator_in_use",
    "context_active",
    "device_pools",
    "driver_initialised",
    "runtime_started",
]

POOL = "pool"  # a cupy.cuda.MemoryPool (the default one, or the user's own)
ASYNC = "async"  # a cupy.cuda.MemoryAsyncPool: the driver's stream-ordered pool
RAW = "raw"  # set_allocator(None): every allocation a cudaMalloc, every free a cudaFree
OTHER = "other"  # a function the user installed: unimem cannot read it


def device_pools(pool: Any) -> dict[int, Any] | None:
    """The per-device pools ``pool`` has made so far, by device (empty before its first use);
    None when the pool's layout is not one unimem knows."""
    refs = gc.get_referents(pool)
    for ref in refs:
        if isinstance(ref, tuple) and all(hasattr(p, "used_bytes") for p in ref):
            return dict(enumerate(ref))
        if isinstance(ref, dict) and all(hasattr(p, "used_bytes") for p in ref.values()):
            return dict(ref)
    return {} if None in refs else None


def allocator_in_use(cupy: types.ModuleType) -> tuple[str, Any]:
    """``(kind, owner)`` of CuPy's allocator in this thread: the pool object for POOL and ASYNC.

    unimem's own first-allocation allocator (``configure.FirstAllocation``) names the
    kind and pool it will install, so it reads as that one.
    """
    allocator = cupy.cuda.get_allocator()
    pending = getattr(allocator, "unimem_pending", None)
    if pending is not None:
        return pending
    owner = getattr(allocator, "__self__", None)
    if isinstance(owner, cupy.cuda.MemoryPool):
        return POOL, owner
    if isinstance(owner, cupy.cuda.MemoryAsyncPool):
        return ASYNC, owner
    if isinstance(owner, types.ModuleType) and getattr(allocator, "__name__", "") == "_malloc":
        return RAW, None
    return OTHER, None


def runtime_started(cupy: types.ModuleType) -> bool:
    """Whether CuPy has started on a device: its MemoryPool has made its per-device pools.

    With another allocator in use (async, uncached, the user's own) there is no pool to
    ask, and a CUDA context in the process is taken as the start: one that another
    framework made counts too. So does a pool layout unimem does not know.
    """
    kind, owner = allocator_in_use(cupy)
    candidates = [cupy.get_default_memory_pool()]
    if kind == POOL and owner is not candidates[0]:
        candidates.append(owner)
    for pool in candidates:
        pools = device_pools(pool)
        if pools:
            return True
        if pools is None:
            return context_active()
    if getattr(cupy.cuda.get_allocator(), "unimem_pending", None) is not None:
        return False  # unimem's first-allocation allocator stands in: nothing has been allocated
    return kind != POOL and context_active()


# --- the driver, through the library already loaded (never loads or initialises it) ------

_cuda: list[Any] = []


def _libcuda() -> Any | None:
    """libcuda if this process has loaded it already (RTLD_NOLOAD); None otherwise."""
    if _cuda:
        return _cuda[0]
    noload = getattr(os, "RTLD_NOLOAD", None)
    if noload is None:  # not a Linux-like loader: the driver's state cannot be asked safely
        return None
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=noload)
    except OSError:
        return None  # not loaded: nothing in this process has used CUDA
    _cuda.append(lib)
    return lib


def _device_count(lib: Any) -> int | None:
    count = ctypes.c_int()
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:  # CUDA_ERROR_NOT_INITIALIZED before cuInit
        return None
    return count.value


def driver_initialised() -> bool:
    """Whether CUDA's driver was initialised in this process, by any library: from then on
    CUDA_VISIBLE_DEVICES is fixed. Asks with cuDeviceGetCount, which fails before cuInit."""
    lib = _libcuda()
    return lib is not None and _device_count(lib) is not None


def context_active() -> bool:
    """Whether a primary CUDA context is active on any device in this process, made by any
    library (cuDevicePrimaryCtxGetState creates nothing)."""
    lib = _libcuda()
    count = None if lib is None else _device_count(lib)
    if lib is None or count is None:
        return False
    for ordinal in range(count):
        device, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
            continue
        if lib.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(active)) == 0 and active.value:
            return True
    return False


# --- peaks: CuPy keeps none -----------------------------------------------------------


class PeakTracker:
    """Peak used and total bytes of one ``MemoryPool`` per device since ``reset``.

    A ``cupy.cuda.MemoryHook`` runs after every allocation from the pool and reads the
    pool's ``used_bytes()`` and ``total_bytes()`` there: both grow only at an allocation,
    so sampling after each one misses no peak. CuPy registers hooks per thread: the hook
    is registered in each thread that calls ``reset``, and an allocation made in another
    thread is seen only at the next allocation in a registered one.
    """

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._peaks: dict[int, list[int]] = {}
        self._threads: set[int] = set()
        self._lock = threading.Lock()

    def reset(self, cupy: types.ModuleType, device: int, used: int, total: int) -> None:
        with self._lock:
            self._peaks[device] = [used, total]
            thread = threading.get_ident()
            if thread not in self._threads:
                self._threads.add(thread)
                _hook(cupy, self).__enter__()  # registered for this thread, for the rest of its life

    def read(self, device: int) -> tuple[int | None, int | None]:
        peaks = self._peaks.get(device)
        return (None, None) if peaks is None else (peaks[0], peaks[1])

    def saw_allocation(self, device: int) -> None:
        peaks = self._peaks.get(device)
        if peaks is None:
            return
        used, total = int(self.pool.used_bytes()), int(self.pool.total_bytes())  # on ``device``: it is current
        if used > peaks[0]:
            peaks[0] = used
        if total > peaks[1]:
            peaks[1] = total


def _hook(cupy: types.ModuleType, tracker: PeakTracker) -> Any:
    class UnimemPeakHook(cupy.cuda.MemoryHook):  # type: ignore[name-defined]
        name = "unimem_peak"

        def malloc_postprocess(self, **kwargs: Any) -> None:
            if kwargs.get("mem_ptr"):  # 0: the allocation failed
                tracker.saw_allocation(int(kwargs["device_id"]))

    return UnimemPeakHook()
