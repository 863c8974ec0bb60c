"""TensorFlow adapter: ``tf.config`` before the runtime starts, env vars before import.

TF has no public "is initialised" query; the eager context's handle is what TF
itself checks before raising "Physical devices cannot be modified after being
initialized", so unimem reads the same handle.
"""

from __future__ import annotations

import sys
import warnings
from functools import cached_property
from typing import ClassVar

from unimem.backends import nvml_gate
from unimem.backends.base import Backend, no_such_device
from unimem.backends.steps import Step
from unimem.backends.tensorflow import configure
from unimem.backends.tensorflow.configure import ALLOCATOR_VAR, GROWTH_VAR
from unimem.backends.topics import (
    AccumulationTopic,
    DiagnoseTopic,
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

__all__ = ["TensorFlowBackend"]


class TensorFlowBackend(Backend):
    name = "tensorflow"
    module = "tensorflow"
    preallocation_var = "TF_FORCE_GPU_ALLOW_GROWTH"
    distributions = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly")
    error_modules = ("tensorflow",)
    runs_workloads = True
    # Start-up chatter off in compare's workers: C++ info logs, and the oneDNN notice on the CPU.
    workload_env: ClassVar[dict[str, str]] = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}
    CAPABILITIES: ClassVar[dict[str, Support]] = {
        "fraction": Support(
            Level.NATIVE,
            "tf.config.set_logical_device_configuration(gpu, [LogicalDeviceConfiguration(memory_limit=MiB)])",
            When.BEFORE_INIT,
            "memory_limit = fraction × NVML's device total; excludes growth=True",
        ),
        "limit": Support(
            Level.NATIVE,
            "tf.config.set_logical_device_configuration(gpu, [LogicalDeviceConfiguration(memory_limit=MiB)])",
            When.BEFORE_INIT,
            "excludes growth=True",
        ),
        "growth": Support(
            Level.NATIVE,
            f"tf.config.experimental.set_memory_growth ({GROWTH_VAR}=true before import)",
            When.BEFORE_INIT,
        ),
        "preallocate": Support(
            Level.NATIVE,
            "tf.config.experimental.set_memory_growth(gpu, False)",
            When.BEFORE_INIT,
            "TF's default",
        ),
        "allocator.default": Support(Level.ENV, f"{ALLOCATOR_VAR} unset (BFC)", When.BEFORE_INIT),
        "allocator.async": Support(Level.ENV, f"{ALLOCATOR_VAR}=cuda_malloc_async", When.BEFORE_INIT),
        "allocator.expandable": Support(Level.UNSUPPORTED, note="TF has no expandable-segments allocator"),
        "allocator.uncached": Support(Level.UNSUPPORTED, note="TF has no allocator that returns memory on free"),
        "devices": Support(
            Level.NATIVE,
            "tf.config.set_visible_devices (CUDA_VISIBLE_DEVICES before import)",
            When.BEFORE_INIT,
        ),
        "stats.allocated": Support(Level.NATIVE, "tf.config.experimental.get_memory_info: current"),
        "stats.reserved": Support(Level.UNSUPPORTED, note="get_memory_info has no pool size"),
        "stats.peak": Support(
            Level.NATIVE, "tf.config.experimental.get_memory_info: peak", note="peak_reserved is None"
        ),
        "stats.limit": Support(Level.EMULATED, "(the memory_limit unimem set)", note="None when unimem set no cap"),
        "stats.largest_free_block": Support(Level.UNSUPPORTED, note="TF does not expose its BFC bins"),
        "stats.num_allocs": Support(Level.UNSUPPORTED, note="TF does not expose allocation counts"),
        "stats.device": Support(Level.NATIVE, "NVML"),
        "stats.process_used": Support(Level.NATIVE, "NVML (nvmlDeviceGetComputeRunningProcesses)"),
        "reset_peak": Support(Level.NATIVE, "tf.config.experimental.reset_memory_stats"),
        "clear_cache": Support(
            Level.UNSUPPORTED, note="nothing frees TF's pool short of process exit; clear_cache() returns 0"
        ),
        "precision.bf16": Support(
            Level.NATIVE,
            "keras.mixed_precision.set_global_policy('mixed_bfloat16')",
            note="layers built after enable() take it; a GPU needs compute capability 8.0",
        ),
        "precision.fp16": Support(
            Level.NATIVE,
            "keras.mixed_precision.set_global_policy('mixed_float16')",
            note="layers built after enable() take it",
        ),
        "precision.loss_scaling": Support(
            Level.NATIVE,
            "keras.optimizers.LossScaleOptimizer (scaler.wrap(optimizer), policy.wrap_optimizer)",
            note="policy.loss_scaler() for a tf.GradientTape loop (tf.Variable state, works in tf.function)",
        ),
        "oom": Support(Level.NATIVE, "tf.errors.ResourceExhaustedError (memory messages only)"),
        "fragmentation": Support(Level.UNSUPPORTED, note="TF does not expose its BFC allocator's free bins"),
        "batch_size": Support(
            Level.EMULATED,
            "unimem.find_batch_size: get_memory_info peak per trial, fitted against the memory_limit unimem set",
            note="without a cap (or on the CPU) it doubles then bisects, or fits what measure= reports. No "
            "prediction before running (lower= takes a peak in bytes only): each placement is a real trial",
        ),
        "accumulate": Support(
            Level.EMULATED,
            "unimem.accumulate_grads: tf.nest over the tape's gradients, applied once per optimizer step",
            note="no no_sync: a tf.distribute strategy reduces where the script applies the gradients; "
            "works inside tf.function",
        ),
        "ranks.pin": Support(
            Level.UNSUPPORTED,
            note="no call unimem makes pins TensorFlow: use devices='per-rank' (CUDA_VISIBLE_DEVICES)",
        ),
        "ranks.cluster": Support(
            Level.UNSUPPORTED, note="unimem reads no tf.distribute key-value store: initialise torch or jax.distributed"
        ),
        "ranks.batch_size": Support(
            Level.UNSUPPORTED, note="no key-value store to agree through: each rank searches alone (collective=False)"
        ),
        "remat.full": Support(
            Level.EMULATED,
            "tf.recompute_grad(fn) with Keras seed generators replayed",
            note="tf.recompute_grad and keras.RematScope draw new dropout masks when recomputing; unimem "
            "restores the seed generators of the Keras layers fn reaches (fn, its bound layer, layers in its "
            "closure or globals) before the recomputation, and compares the recomputed output with the "
            "forward's: a mismatch (tf.random.uniform, tf.nn.dropout without a seed) is an error in the "
            "backward pass, never silently wrong gradients. Keeps each call's output until the backward pass",
        ),
        "remat.matmuls": Support(
            Level.UNSUPPORTED,
            note="TensorFlow has no per-op save policy (keras.RematScope chooses whole layers); "
            "use remat(fn, 'full') on the block instead",
        ),
        "remat.offload": Support(
            Level.UNSUPPORTED,
            note="TensorFlow has no hook that moves saved activations to the host; use remat(fn, 'full') "
            "to recompute them instead",
        ),
    }

    def __init__(self) -> None:
        self._limits: dict[int, int] = {}  # memory_limit unimem set, per GPU, in bytes

    def phase(self) -> Phase:
        if "tensorflow" not in sys.modules:
            return Phase.NOT_IMPORTED
        context = sys.modules.get("tensorflow.python.eager.context")
        ctx = None if context is None else context.context_safe()
        if ctx is not None and getattr(ctx, "_context_handle", None) is not None:
            return Phase.INITIALIZED
        return Phase.IMPORTED

    def takes_safe_growth(self, settings: Settings) -> bool:
        # Capped, it takes only its share; growth would conflict with the memory_limit device.
        capped = settings.fraction is not None or settings.limit is not None
        return not capped and super().takes_safe_growth(settings)

    # --- configuration -----------------------------------------------------
    def check(self, settings: Settings) -> None:
        configure.check(settings, self.phase())

    def plan(self, settings: Settings) -> list[Step]:
        return configure.plan(settings, self.phase(), self._limits)

    # --- queries ------------------------------------------------------------------
    def _gpu_name(self, device: int) -> str | None:
        if self.phase() is not Phase.INITIALIZED:
            return None  # listing logical devices would start the runtime
        gpus = sys.modules["tensorflow"].config.list_logical_devices("GPU")
        if not gpus:
            return None  # no GPU here: nothing to read, and on the CPU TF's zeros mean "not tracked"
        if device >= len(gpus):
            raise no_such_device("tensorflow", device, len(gpus))
        return f"GPU:{device}"

    def stats(self, device: int = 0, *, nvml: bool = True) -> MemoryStats:
        total, free, used = nvml_gate.device_figures(device) if nvml else (None, None, None)
        name = self._gpu_name(device)
        if name is None:
            # On the CPU, get_memory_info('CPU:0') answers zeros meaning "not tracked".
            return MemoryStats("tensorflow", device, device_total=total, device_free=free, process_used=used)
        info = sys.modules["tensorflow"].config.experimental.get_memory_info(name)
        return MemoryStats(
            "tensorflow",
            device,
            allocated=int(info["current"]),
            peak_allocated=int(info["peak"]),
            limit=self._limits.get(device),
            device_total=total,
            device_free=free,
            process_used=used,
        )

    def fragmentation(self, device: int = 0) -> dict[str, int | None] | None:
        """Unknown: TF does not expose its BFC allocator's free bins."""
        return None

    def reset_peak(self, device: int = 0) -> None:
        name = self._gpu_name(device)
        if name is not None:
            sys.modules["tensorflow"].config.experimental.reset_memory_stats(name)

    def clear_cache(self, device: int = 0) -> int:
        if self._gpu_name(device) is not None:
            warnings.warn(
                "tensorflow: nothing frees TensorFlow's GPU pool short of process exit; "
                "cap it with configure(limit=...) or growth=True before the first op",
                UnimemWarning,
                stacklevel=3,
            )
        return 0

    # --- topics (backends/tensorflow/<topic>.py, imported on first use) -----------------------
    @cached_property
    def diagnose(self) -> DiagnoseTopic:
        from .diagnose import TensorFlowDiagnose

        return TensorFlowDiagnose(self)

    @cached_property
    def observe(self) -> ObserveTopic:
        from .observe import TensorFlowObserve

        return TensorFlowObserve(self)

    @cached_property
    def precision(self) -> PrecisionTopic:
        from . import precision

        return precision

    @cached_property
    def savers(self) -> SaversTopic:
        from .savers import TensorFlowSavers

        return TensorFlowSavers(self)

    @cached_property
    def accumulation(self) -> AccumulationTopic:
        from .accumulation import TensorFlowAccumulation

        return TensorFlowAccumulation(self)

    @cached_property
    def search(self) -> SearchTopic:
        from .search import TensorFlowSearch

        return TensorFlowSearch(self)

    @cached_property
    def workloads(self) -> WorkloadsTopic:
        from .workloads import TensorFlowWorkloads

        return TensorFlowWorkloads(self)

    @cached_property
    def estimate(self) -> EstimateTopic:
        from .estimate import TensorFlowEstimate

        return TensorFlowEstimate(self)
