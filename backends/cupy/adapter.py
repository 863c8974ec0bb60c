"""CuPy adapter: its MemoryPool (or the allocator that replaces it), never starting CUDA itself.

CuPy makes its CUDA context and its per-device pools lazily, at the first allocation.
The phase reads whether those pools exist (``_pools.runtime_started``); settings made
before then go through CuPy's own variable and an allocator installed at import
(``configure``); figures are read from each device's pool directly (``observe``).
cupy is imported only inside methods, from ``sys.modules`` except where the user asked for it.
"""

from __future__ import annotations

import sys
from functools import cached_property
from typing import ClassVar

from unimem.backends import nvml_gate
from unimem.backends.base import Backend
from unimem.backends.steps import Step
from unimem.backends.topics import DiagnoseTopic, ObserveTopic, SearchTopic

from unimem.config import Settings
from unimem.memory_stats import MemoryStats
from unimem.support import Level, Phase, Support, When

from . import configure, observe
from ._pools import allocator_in_use, device_pools, runtime_started

__all__ = ["CupyBackend"]

_MEMORY_POOL = "cupy.get_default_memory_pool()"
_CAP_NOTE = (
    "caps CuPy's MemoryPool only (the CUDA context and cuBLAS/cuFFT/cuSOLVER workspaces are outside it); "
    f"before the pool starts it is CuPy's {configure.CAP_VAR}, read by each device's pool when CuPy makes it "
    "at the first allocation; after, set_limit(size=...) on every device's pool. Not with allocator "
    "'async' or 'uncached', which have no MemoryPool"
)
_NO_PRECISION = (
    "CuPy has no autocast or dtype policy: cast arrays with astype() (x.astype(cupy.float16)), "
    "or run the model in torch or JAX for mixed precision"
)


class CupyBackend(Backend):
    name = "cupy"
    module = "cupy"
    distributions = ("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy")
    error_modules = ("cupy", "cupy_backends")
    CAPABILITIES: ClassVar[dict[str, Support]] = {
        "fraction": Support(
            Level.NATIVE,
            f"{_MEMORY_POOL}.set_limit(fraction=...); {configure.CAP_VAR}='N%' before the pool starts",
            When.ANYTIME,
            _CAP_NOTE,
        ),
        "limit": Support(
            Level.NATIVE,
            f"{_MEMORY_POOL}.set_limit(size=...); {configure.CAP_VAR}=<bytes> before the pool starts",
            When.ANYTIME,
            _CAP_NOTE,
        ),
        "growth": Support(Level.NATIVE, "(default behaviour)", note="CuPy's MemoryPool allocates on demand"),
        "preallocate": Support(
            Level.EMULATED,
            f"{_MEMORY_POOL}.malloc(allowance), freed into the pool",
            When.ANYTIME,
            "at once on every device when the pool has started, else at CuPy's first allocation (on its "
            "device); the allowance is the cap less what the pool holds, or the device's free memory, less "
            "1 GiB for workspaces; the block stays in the pool (clear_cache() gives it back); default allocator only",
        ),
        "allocator.default": Support(
            Level.NATIVE,
            f"cupy.cuda.set_allocator({_MEMORY_POOL}.malloc)",
            When.ANYTIME,
            "for allocations from then on; configured before CuPy's first allocation, made at it",
        ),
        "allocator.async": Support(
            Level.NATIVE,
            "cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)",
            When.ANYTIME,
            "MemoryAsyncPool() starts CUDA on every device, so configured before CuPy's first allocation it "
            "is made at that allocation; it takes no cap (a limit is its release threshold) and no memory hook",
        ),
        "allocator.expandable": Support(
            Level.UNSUPPORTED, note="CuPy has no expandable-segments allocator; use 'async' (cudaMallocAsync)"
        ),
        "allocator.uncached": Support(
            Level.NATIVE,
            "cupy.cuda.set_allocator(None)",
            When.ANYTIME,
            "every allocation a cudaMalloc, every free a cudaFree: slow, for debugging; stats() then has no "
            "pool figures (None)",
        ),
        "devices": Support(
            Level.ENV,
            "CUDA_VISIBLE_DEVICES",
            When.BEFORE_INIT,
            "read when CUDA's driver initialises, by CuPy's first device call (cupy.cuda.is_available() is "
            "one) or another library's",
        ),
        "stats.allocated": Support(
            Level.NATIVE,
            "MemoryPool.used_bytes()",
            note="of the pool behind cupy.cuda.get_allocator(), read per device without switching to it; "
            "allocator 'async': cudaMemPoolAttrUsedMemCurrent; None with 'uncached' or a user's own allocator",
        ),
        "stats.reserved": Support(
            Level.NATIVE, "MemoryPool.total_bytes()", note="allocator 'async': cudaMemPoolAttrReservedMemCurrent"
        ),
        "stats.peak": Support(
            Level.EMULATED,
            "a cupy.cuda.MemoryHook reading used_bytes() / total_bytes() after each allocation",
            note="CuPy keeps no peak: reset_peak() installs the hook in the calling thread, "
            "and the peaks read None until then; an allocation in another thread is seen at the next one in "
            "a hooked thread. Allocator 'async': the driver's cudaMemPoolAttrUsedMemHigh / ReservedMemHigh",
        ),
        "stats.limit": Support(
            Level.NATIVE, "MemoryPool.get_limit()", note="0 (no limit) reads None; None with 'async' or 'uncached'"
        ),
        "stats.largest_free_block": Support(
            Level.UNSUPPORTED,
            note="CuPy's pool does not tell its free blocks' sizes; fragmentation() gives the free bytes and "
            "the number of free blocks",
        ),
        "stats.num_allocs": Support(Level.UNSUPPORTED, note="CuPy counts neither allocations nor OOMs"),
        "stats.device": Support(Level.NATIVE, "NVML; cupy.cuda.runtime.memGetInfo without NVML (current device)"),
        "stats.process_used": Support(Level.NATIVE, "NVML (nvmlDeviceGetComputeRunningProcesses)"),
        "reset_peak": Support(
            Level.EMULATED,
            "(unimem's MemoryHook restarts the peaks from the pool's current figures)",
            note="exact for allocations in the thread that called it; allocator 'async': "
            "cudaMemPoolSetAttribute(UsedMemHigh / ReservedMemHigh, 0)",
        ),
        "clear_cache": Support(
            Level.NATIVE,
            "MemoryPool.free_all_blocks()",
            note="returns the drop in total_bytes(); a block split by a live array stays (CuPy frees whole "
            "blocks only); allocator 'async': MemoryAsyncPool.free_all_blocks() (cudaMemPoolTrimTo)",
        ),
        "precision.bf16": Support(Level.UNSUPPORTED, note=_NO_PRECISION),
        "precision.fp16": Support(Level.UNSUPPORTED, note=_NO_PRECISION),
        "precision.loss_scaling": Support(Level.UNSUPPORTED, note=_NO_PRECISION),
        "oom": Support(
            Level.NATIVE,
            "cupy.cuda.memory.OutOfMemoryError; cudaErrorMemoryAllocation and *_ALLOC_FAILED of CUDA's libraries",
            note="the pool's error names the request's size exactly",
        ),
        "fragmentation": Support(
            Level.NATIVE,
            "MemoryPool.total_bytes() - used_bytes(), n_free_blocks()",
            note="the largest free block is unknown (None)",
        ),
        "batch_size": Support(
            Level.EMULATED,
            "unimem.find_batch_size: the hook's peak per trial, fitted against MemoryPool.get_limit()",
            note="free_all_blocks() between trials (cheap), so each peak starts from an empty pool; the cap "
            "bounds the pool's total bytes, so the pool's overhead at the peak (total - used) counts against it",
        ),
        **{
            feature: Support(
                Level.UNSUPPORTED, note="CuPy has no automatic differentiation, so no activations to recompute"
            )
            for feature in ("remat.full", "remat.matmuls", "remat.offload")
        },
        "accumulate": Support(
            Level.UNSUPPORTED, note="CuPy has no automatic differentiation, so no gradients to accumulate"
        ),
        "ranks.pin": Support(Level.UNSUPPORTED, note="no call unimem makes pins CuPy: use devices='per-rank'"),
        "ranks.cluster": Support(
            Level.UNSUPPORTED, note="CuPy has no distributed runtime: initialise torch or jax.distributed"
        ),
        "ranks.batch_size": Support(Level.UNSUPPORTED, note="CuPy has no distributed runtime to agree through"),
    }

    def __init__(self) -> None:
        self._pending = configure.Pending()
        self._peaks = observe.Peaks()
        self._uuids: dict[int, str | None] = {}

    # --- phase ----------------------------------------------------------------
    def phase(self) -> Phase:
        cupy = sys.modules.get("cupy")
        if cupy is None:
            return Phase.NOT_IMPORTED
        if getattr(cupy, "get_default_memory_pool", None) is None:  # still being imported
            return Phase.IMPORTED
        return Phase.INITIALIZED if runtime_started(cupy) else Phase.IMPORTED

    # --- configuration ------------------------------------------------------------
    def check(self, settings: Settings) -> None:
        configure.check(settings)

    def plan(self, settings: Settings) -> list[Step]:
        return configure.plan(settings, self._state(), self._pending)

    def _state(self) -> configure.State:
        phase = self.phase()
        cupy = sys.modules.get("cupy") if phase is not Phase.NOT_IMPORTED else None
        if cupy is None or getattr(cupy, "get_default_memory_pool", None) is None:
            return configure.State(None, phase)
        kind, owner = allocator_in_use(cupy)
        pools = device_pools(owner) if owner is not None else None
        return configure.State(cupy, phase, kind, owner, pools or {})

    # --- queries ------------------------------------------------------------------
    def stats(self, device: int = 0, *, nvml: bool = True) -> MemoryStats:
        cupy = sys.modules.get("cupy")
        started = cupy is not None and self.phase() is Phase.INITIALIZED
        figures = observe.read(cupy, device, self._peaks) if started and cupy is not None else None
        total = free = used = None
        if nvml:
            total, free, used = nvml_gate.device_figures(device, self.device_uuid(device) if started else None)
            if total is None and cupy is not None and started and cupy.cuda.runtime.getDevice() == device:
                free, total = (int(x) for x in cupy.cuda.runtime.memGetInfo())  # no NVML here: the driver's
        if figures is None:
            return MemoryStats("cupy", device, device_total=total, device_free=free, process_used=used)
        return MemoryStats(
            "cupy",
            device,
            allocated=figures.allocated,
            reserved=figures.reserved,
            peak_allocated=figures.peak_allocated,
            peak_reserved=figures.peak_reserved,
            limit=figures.limit,
            device_total=total,
            device_free=free,
            process_used=used,
        )

    def reset_peak(self, device: int = 0) -> None:
        cupy = sys.modules.get("cupy")
        if cupy is not None and self.phase() is Phase.INITIALIZED:
            observe.reset_peak(cupy, device, self._peaks)

    def clear_cache(self, device: int = 0) -> int:
        cupy = sys.modules.get("cupy")
        if cupy is None or self.phase() is not Phase.INITIALIZED:
            return 0
        return observe.clear(cupy, device)

    def fragmentation(self, device: int = 0) -> dict[str, int | None] | None:
        """The pool's unused bytes and its count of free blocks; their sizes are CuPy's own."""
        cupy = sys.modules.get("cupy")
        if cupy is None or self.phase() is not Phase.INITIALIZED:
            return None
        figures = observe.read(cupy, device, self._peaks)
        if figures.allocated is None or figures.reserved is None:
            return None
        return {
            "free_in_pool": max(0, figures.reserved - figures.allocated),
            "largest_free_block": None,
            "free_blocks": figures.free_blocks,
        }

    def device_uuid(self, device: int) -> str | None:
        if device in self._uuids:  # stats() asks on every call: format it once
            return self._uuids[device]
        cupy = sys.modules.get("cupy")
        if cupy is None or self.phase() is not Phase.INITIALIZED or device >= observe.device_count(cupy):
            return None
        uuid = observe.uuid_text(cupy.cuda.runtime.getDeviceProperties(device).get("uuid"))  # starts no context
        self._uuids[device] = uuid
        return uuid

    # --- topics (backends/cupy/<topic>.py, imported on first use) -----------------------------
    @cached_property
    def diagnose(self) -> DiagnoseTopic:
        from .diagnose import CupyDiagnose

        return CupyDiagnose(self)

    @cached_property
    def observe(self) -> ObserveTopic:
        from .observe import CupyObserve

        return CupyObserve(self)

    @cached_property
    def search(self) -> SearchTopic:
        from .search import CupySearch

        return CupySearch(self)
