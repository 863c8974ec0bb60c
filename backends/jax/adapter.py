"""JAX adapter: XLA's GPU client, configured only through its environment.

JAX reads ``XLA_*`` variables once, when its backend starts (the first op or
``jax.devices()``), and silently ignores them afterwards. unimem detects that
phase and raises ``TooLateError`` instead of setting a variable nobody reads.
"""

from __future__ import annotations

import gc
import sys
import warnings
from functools import cached_property
from typing import Any, ClassVar

from unimem.backends import nvml_gate
from unimem.backends.base import Backend, no_such_device
from unimem.backends.jax import _runtime as runtime
from unimem.backends.jax import configure
from unimem.backends.jax.configure import ALLOCATOR, PREALLOCATE
from unimem.backends.steps import Step
from unimem.backends.topics import (
    AccumulationTopic,
    DiagnoseTopic,
    DistributedTopic,
    EstimateTopic,
    ObserveTopic,
    PrecisionTopic,
    SaversTopic,
    SearchTopic,
    WorkloadsTopic,
)

from unimem.config import Settings
from unimem.errors import UnimemWarning
from unimem.memory_stats import MemoryStats
from unimem.support import Level, Phase, Support, When

__all__ = ["JaxBackend"]


class JaxBackend(Backend):
    name = "jax"
    module = "jax"
    preallocation_var = "XLA_PYTHON_CLIENT_PREALLOCATE"
    distributions = ("jax",)
    error_modules = ("jax", "jaxlib")
    failed_step_keeps_outputs = True  # XLA never frees a failed execution's outputs
    runs_workloads = True
    CAPABILITIES: ClassVar[dict[str, Support]] = {
        "fraction": Support(
            Level.ENV,
            "XLA_CLIENT_MEM_FRACTION (XLA_PYTHON_CLIENT_MEM_FRACTION before the rename)",
            When.BEFORE_INIT,
            "the name is picked from the installed jaxlib; it is the pool's limit and, with preallocation, its size",
        ),
        "limit": Support(
            Level.ENV,
            "XLA_CLIENT_MEM_FRACTION = limit / device total",
            When.BEFORE_INIT,
            "converted with NVML's device total: needs nvidia-ml-py",
        ),
        "growth": Support(Level.ENV, f"{PREALLOCATE}=false", When.BEFORE_INIT),
        "preallocate": Support(
            Level.ENV,
            f"{PREALLOCATE}=true",
            When.BEFORE_INIT,
            "JAX's default: 75% of the device at the first op",
        ),
        "allocator.default": Support(Level.ENV, f"{ALLOCATOR} unset (BFC)", When.BEFORE_INIT),
        "allocator.async": Support(Level.ENV, f"{ALLOCATOR}=cuda_async", When.BEFORE_INIT),
        "allocator.expandable": Support(Level.UNSUPPORTED, note="XLA has no expandable-segments allocator"),
        "allocator.uncached": Support(
            Level.ENV, f"{ALLOCATOR}=platform", When.BEFORE_INIT, "slow; memory_stats() then answers None"
        ),
        "devices": Support(Level.ENV, "CUDA_VISIBLE_DEVICES", When.BEFORE_INIT),
        "stats.allocated": Support(
            Level.NATIVE,
            "Device.memory_stats()['bytes_in_use']",
            note="None with the platform allocator and on the CPU",
        ),
        "stats.reserved": Support(Level.NATIVE, "Device.memory_stats()['pool_bytes']"),
        "stats.peak": Support(Level.NATIVE, "Device.memory_stats()['peak_bytes_in_use'] / ['peak_pool_bytes']"),
        "stats.limit": Support(Level.NATIVE, "Device.memory_stats()['bytes_limit']"),
        "stats.largest_free_block": Support(Level.NATIVE, "Device.memory_stats()['largest_free_block_bytes']"),
        "stats.num_allocs": Support(
            Level.NATIVE, "Device.memory_stats()['num_allocs']", note="no OOM counter: num_ooms is None"
        ),
        "stats.device": Support(Level.NATIVE, "NVML"),
        "stats.process_used": Support(Level.NATIVE, "NVML (nvmlDeviceGetComputeRunningProcesses)"),
        "reset_peak": Support(
            Level.EMULATED,
            "(baseline of peak_bytes_in_use)",
            note="XLA cannot reset its peak: after reset_peak() the peak is known only once it "
            "passes the old one, and reads None until then",
        ),
        "clear_cache": Support(
            Level.EMULATED,
            "gc.collect() + jax.clear_caches()",
            note="the BFC pool never shrinks, so this returns 0 unless allocator='uncached'",
        ),
        "precision.bf16": Support(
            Level.EMULATED,
            "policy.cast_to_compute / cast_to_param / cast_to_output (jax.tree_util)",
            note="JAX has no autocast or global dtype policy: the step casts its pytrees",
        ),
        "precision.fp16": Support(
            Level.EMULATED,
            "policy.cast_to_compute / cast_to_param / cast_to_output (jax.tree_util)",
            note="JAX has no autocast or global dtype policy: the step casts its pytrees",
        ),
        "precision.loss_scaling": Support(
            Level.EMULATED,
            "policy.loss_scaler() (a pytree: grads, finite, scaler = scaler.step(grads) inside jax.jit)",
            note="implemented in unimem with jax.numpy; no jmp/optax needed",
        ),
        "oom": Support(Level.NATIVE, "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED (memory messages only)"),
        "fragmentation": Support(Level.NATIVE, "Device.memory_stats()['largest_free_block_bytes'], pool_bytes"),
        "batch_size": Support(
            Level.EMULATED,
            "unimem.find_batch_size: peak_bytes_in_use per trial, fitted against bytes_limit; with lower=, "
            "each size's peak predicted from the compiled step (memory_analysis()) before it runs",
            note="with lower=(n -> jax.jit(step).lower(...)) only sizes predicted under the capacity run; "
            "the CPU figure is arguments + outputs + temporaries - aliased (XLA's own CPU peak leaves the "
            "temporaries out). With growth on, the capacity is the cap less the pool's free bytes outside "
            "its largest block. XLA cannot reset its peak: a trial smaller than an earlier one adds no "
            "point to the fit; jax.clear_caches() once at the end drops the trials' compiled steps. Each "
            "failed trial costs about 10 s (XLA's allocator waits for memory before it fails) and keeps "
            "the step's outputs in use for good (XLA does not free a failed execution's output buffers; "
            "with donated inputs it keeps none, but deletes those inputs): the search measures what stays, "
            "holds it against the cap, reports it, and says to start a fresh process when the answer no "
            "longer fits beside it. Under jax.distributed (several processes) every trial is agreed through "
            "the coordinator's key-value store, so every process returns the same answer; the step must be "
            "process-local (a computation spanning processes cannot fail on one of them alone)",
        ),
        "accumulate": Support(
            Level.EMULATED,
            "unimem.accumulate_grads: jax.tree_util over the gradient pytrees",
            note="no no_sync: a pmean or sharded update reduces where the script places it; works inside jax.jit",
        ),
        "ranks.pin": Support(
            Level.NATIVE,
            "jax_cuda_visible_devices at import; JAX_LOCAL_DEVICE_IDS for jax.distributed.initialize",
            When.BEFORE_INIT,
        ),
        "ranks.cluster": Support(Level.EMULATED, "jax.distributed's coordinator key-value store"),
        "ranks.batch_size": Support(
            Level.EMULATED,
            "each trial's outcome agreed through the coordinator's key-value store",
            note="the step must be process-local: a computation over several processes cannot be detected",
        ),
        "remat.full": Support(
            Level.NATIVE,
            "jax.checkpoint(fn, policy=jax.checkpoint_policies.nothing_saveable)",
            note="randomness replays by construction: jax.random takes explicit keys",
        ),
        "remat.matmuls": Support(
            Level.NATIVE,
            "jax.checkpoint(fn, policy=jax.checkpoint_policies.dots_saveable)",
            note="saves every dot's output, batched ones included; recomputes the rest",
        ),
        "remat.offload": Support(
            Level.NATIVE,
            "jax.checkpoint(fn, policy=offload_dot_with_no_batch_dims('device', 'pinned_host'))",
            note="dots without batch dimensions go to pinned host memory, the rest is recomputed; a policy "
            "only: unimem.offload() refuses (named activations: jax.checkpoint with "
            "save_and_offload_only_these_names). The copies can raise the device peak or the step time "
            "instead of saving: measure",
        ),
    }

    def __init__(self) -> None:
        self._devices: list[Any] | None = None
        self._peak_baseline: dict[int, int] = {}

    def phase(self) -> Phase:
        if "jax" not in sys.modules:
            return Phase.NOT_IMPORTED
        return Phase.INITIALIZED if runtime.started() else Phase.IMPORTED

    # --- configuration --------------------------------------------------------
    def plan(self, settings: Settings) -> list[Step]:
        return configure.plan(settings, self.phase())

    # --- queries ----------------------------------------------------------------
    def _device(self, device: int) -> Any | None:
        if self._devices is None:
            self._devices = list(sys.modules["jax"].local_devices())
        if device >= len(self._devices):
            return None
        return self._devices[device]

    def _raw_stats(self, device: int) -> dict[str, int] | None:
        devices = self._devices
        if devices is not None and device < len(devices):
            # Hot path: the device list exists only once the backend started, so the
            # phase check (a lock in jax) is skipped; stats() is polled in loops.
            return devices[device].memory_stats()
        if self.phase() is not Phase.INITIALIZED:
            return None  # asking would start the backend (and preallocate 75% of the GPU)
        dev = self._device(device)
        if dev is None:
            raise no_such_device("jax", device, len(self._devices or ()))
        return dev.memory_stats()

    def stats(self, device: int = 0, *, nvml: bool = True) -> MemoryStats:
        total, free, used = nvml_gate.device_figures(device) if nvml else (None, None, None)
        raw = self._raw_stats(device)
        if not raw:
            return MemoryStats("jax", device, device_total=total, device_free=free, process_used=used)
        peak = raw.get("peak_bytes_in_use")
        baseline = self._peak_baseline.get(device)
        if baseline is not None and peak is not None and peak <= baseline:
            peak = None  # the peak since reset_peak() is unknown until it passes the old one
        # pool_bytes is the pool XLA holds from the device; bytes_reserved is not (it reads 0
        # beside a full BFC pool on a GPU: the GPU suite). The cuda_async allocator has no
        # pool and answers 0 for bytes_limit and largest_free_block_bytes: untracked, so None.
        reserved = raw.get("pool_bytes")
        return MemoryStats(
            "jax",
            device,
            allocated=raw.get("bytes_in_use"),
            reserved=reserved,
            peak_allocated=peak,
            peak_reserved=raw.get("peak_pool_bytes"),
            limit=raw.get("bytes_limit") or None,
            largest_free_block=None if reserved is None else raw.get("largest_free_block_bytes"),
            num_allocs=raw.get("num_allocs"),
            device_total=total,
            device_free=free,
            process_used=used,
        )

    def fragmentation(self, device: int = 0) -> dict[str, int | None] | None:
        """XLA's own figures: the pool's unused bytes and its largest free block."""
        snapshot = self.stats(device, nvml=False)  # one key mapping, stats()'s
        if snapshot.allocated is None:
            return None
        pool, in_use = snapshot.reserved, snapshot.allocated
        return {
            "free_in_pool": None if pool is None else max(0, pool - in_use),
            "largest_free_block": snapshot.largest_free_block,
            "free_blocks": None,
        }

    def reset_peak(self, device: int = 0) -> None:
        raw = self._raw_stats(device)
        if raw and "peak_bytes_in_use" in raw:
            self._peak_baseline[device] = int(raw["peak_bytes_in_use"])

    def clear_cache(self, device: int = 0) -> int:
        if self.phase() is not Phase.INITIALIZED:
            return 0
        before_stats = self._raw_stats(device)
        before_process = nvml_gate.device_figures(device)[2]
        gc.collect()  # arrays kept alive only by reference cycles
        sys.modules["jax"].clear_caches()  # compiled executables and their constants
        gc.collect()  # executables the caches let go of may sit in cycles: their modules unload now
        after_stats = self._raw_stats(device)
        if before_stats and after_stats and "pool_bytes" in before_stats:
            given = before_stats["pool_bytes"] - after_stats.get("pool_bytes", before_stats["pool_bytes"])
        else:
            after_process = nvml_gate.device_figures(device)[2]
            given = 0 if before_process is None or after_process is None else before_process - after_process
        if given <= 0 and before_stats is not None:
            warnings.warn(
                "jax: XLA's BFC allocator keeps its pool until the process exits; "
                "configure allocator='uncached' for memory that returns on free",
                UnimemWarning,
                stacklevel=3,
            )
        return max(0, given)

    # --- topics (backends/jax/<topic>.py, imported on first use) ------------------------------
    @cached_property
    def diagnose(self) -> DiagnoseTopic:
        from .diagnose import JaxDiagnose

        return JaxDiagnose(self)

    @cached_property
    def observe(self) -> ObserveTopic:
        from .observe import JaxObserve

        return JaxObserve(self)

    @cached_property
    def precision(self) -> PrecisionTopic:
        from . import precision

        return precision

    @cached_property
    def savers(self) -> SaversTopic:
        from .savers import JaxSavers

        return JaxSavers(self)

    @cached_property
    def accumulation(self) -> AccumulationTopic:
        from .accumulation import JaxAccumulation

        return JaxAccumulation(self)

    @cached_property
    def search(self) -> SearchTopic:
        from .search import JaxSearch

        return JaxSearch(self)

    @cached_property
    def distributed(self) -> DistributedTopic:
        from .distributed import JaxDistributed

        return JaxDistributed(self)

    @cached_property
    def workloads(self) -> WorkloadsTopic:
        from .workloads import JaxWorkloads

        return JaxWorkloads(self)

    @cached_property
    def estimate(self) -> EstimateTopic:
        from .estimate import JaxEstimate

        return JaxEstimate(self)
