"""PyTorch adapter: the CUDA caching allocator.

torch is imported only inside methods. Caps are deferred to CUDA's lazy init with
``torch.cuda._lazy_call`` because ``set_per_process_memory_fraction`` would
otherwise start CUDA itself (and fix the allocator settings) at configure time.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from unimem.backends.base import Backend, no_such_device
from unimem.backends.nvml import _gate as nvml_gate
from unimem.backends.steps import (
    STATUS_APPLIED,
    STATUS_NO_DEVICE,
    STATUS_PENDING,
    STATUS_UNCHANGED,
    Step,
    devices_step,
    env_step,
    merge_conf,
)
from unimem.backends.topics import Counters, KeyValueStore, PrecisionHelpers, Profiler
from unimem.backends.torch import diagnose

from unimem.config import Settings
from unimem.errors import ConfigError
from unimem.import_hooks import when_imported
from unimem.memory_stats import MemoryStats
from unimem.support import Level, Phase, Support, When

if TYPE_CHECKING:
    from unimem.diagnose.live_objects import LiveMemory

__all__ = ["TorchBackend"]

# Left free when preallocating without a cap: cuBLAS/cuDNN handles and kernels
# loaded later take device memory outside the caching allocator.
_UNCAPPED_HEADROOM = 1 << 30
# Kept out of a capped preallocation: requests under 1 MiB come from a separate
# small pool of 2 MiB segments; with the cap full of one large block their first
# cudaMalloc would fail and torch would free the whole preallocation to retry.
_SMALL_POOL_HEADROOM = 64 << 20

_CONF_ALLOCATOR: dict[str, dict[str, str | None]] = {
    "default": {"backend": None, "expandable_segments": None},
    "async": {"backend": "cudaMallocAsync", "expandable_segments": None},
    "expandable": {"backend": None, "expandable_segments": "True"},
    "uncached": {"backend": None, "expandable_segments": None},
}
_UNCACHED_VAR = "PYTORCH_NO_CUDA_MEMORY_CACHING"


def _conf_var(version: str | None) -> str:
    """torch 2.9 renamed PYTORCH_CUDA_ALLOC_CONF to PYTORCH_ALLOC_CONF (the old name
    still works, with a deprecation warning)."""
    if version is None:
        return "PYTORCH_CUDA_ALLOC_CONF"
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return "PYTORCH_CUDA_ALLOC_CONF"
    return "PYTORCH_ALLOC_CONF" if (major, minor) >= (2, 9) else "PYTORCH_CUDA_ALLOC_CONF"


class TorchBackend(Backend):
    name = "torch"
    module = "torch"
    distributions = ("torch",)
    CAPABILITIES: ClassVar[dict[str, Support]] = {
        "fraction": Support(
            Level.NATIVE,
            "torch.cuda.set_per_process_memory_fraction",
            When.ANYTIME,
            "made at CUDA init when configured earlier; caps the caching allocator only "
            "(the CUDA context and library workspaces are outside it)",
        ),
        "limit": Support(
            Level.NATIVE,
            "torch.cuda.set_per_process_memory_fraction(limit / total_memory)",
            When.ANYTIME,
            "converted to a fraction of the device's total memory",
        ),
        "growth": Support(
            Level.NATIVE, "(default behaviour)", When.ANYTIME, "the caching allocator allocates on demand"
        ),
        "preallocate": Support(
            Level.EMULATED,
            "torch.empty(allowance, device='cuda') freed into the cache",
            When.ANYTIME,
            "the block stays in the cache; clear_cache() gives it back",
        ),
        "allocator.default": Support(
            Level.ENV, "PYTORCH_ALLOC_CONF (backend, expandable_segments unset)", When.BEFORE_INIT
        ),
        "allocator.async": Support(
            Level.ENV,
            "PYTORCH_ALLOC_CONF=backend:cudaMallocAsync",
            When.BEFORE_IMPORT,
            "torch reads the allocator backend when it is imported, unlike the other allocator keys",
        ),
        "allocator.expandable": Support(
            Level.ENV,
            "PYTORCH_ALLOC_CONF=expandable_segments:True",
            When.ANYTIME,
            "after CUDA init through torch.cuda.memory._set_allocator_settings (new segments only)",
        ),
        "allocator.uncached": Support(
            Level.ENV, f"{_UNCACHED_VAR}=1", When.BEFORE_INIT, "every free is a cudaFree: slow, for debugging"
        ),
        "devices": Support(Level.ENV, "CUDA_VISIBLE_DEVICES", When.BEFORE_INIT),
        "stats.allocated": Support(Level.NATIVE, "torch.cuda.memory_stats: allocated_bytes.all.current"),
        "stats.reserved": Support(Level.NATIVE, "torch.cuda.memory_stats: reserved_bytes.all.current"),
        "stats.peak": Support(Level.NATIVE, "torch.cuda.memory_stats: *_bytes.all.peak"),
        "stats.limit": Support(Level.NATIVE, "torch.cuda.get_per_process_memory_fraction × total_memory"),
        "stats.largest_free_block": Support(
            Level.UNSUPPORTED, note="only torch.cuda.memory_snapshot() knows it, too slow for stats()"
        ),
        "stats.num_allocs": Support(Level.NATIVE, "torch.cuda.memory_stats: allocation.all.allocated, num_ooms"),
        "stats.device": Support(Level.NATIVE, "NVML; torch.cuda.mem_get_info without NVML"),
        "stats.process_used": Support(Level.NATIVE, "NVML (nvmlDeviceGetComputeRunningProcesses)"),
        "reset_peak": Support(Level.NATIVE, "torch.cuda.reset_peak_memory_stats"),
        "clear_cache": Support(Level.NATIVE, "torch.cuda.empty_cache", note="returns the drop in reserved bytes"),
        "precision.bf16": Support(
            Level.NATIVE,
            "torch.autocast(device, dtype=torch.bfloat16)",
            note="on CUDA if available, else the CPU; a GPU needs torch.cuda.is_bf16_supported(); "
            "autocast state is per thread",
        ),
        "precision.fp16": Support(
            Level.NATIVE,
            "torch.autocast(device, dtype=torch.float16)",
            note="CPU autocast takes fp16 only in recent torch: mixed_precision() refuses it where torch would not",
        ),
        "precision.loss_scaling": Support(
            Level.NATIVE,
            "torch.amp.GradScaler (scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update())",
            note="ShardedGradScaler when torch.distributed is initialised (the inf flag agreed across ranks); "
            "scale/unscale(grads)/update(finite) also work, on the same GradScaler state",
        ),
        "oom": Support(
            Level.NATIVE,
            "torch.OutOfMemoryError; allocator messages (CUDA, CPU, MPS)",
            note="the CPU allocator's OOM is a plain RuntimeError: recognised by its message",
        ),
        "fragmentation": Support(
            Level.NATIVE,
            "torch.cuda.memory_snapshot(): inactive blocks",
            note="read on request (fragmentation(), summary(), OOM reports), never in stats(): it walks every block",
        ),
        "batch_size": Support(
            Level.EMULATED,
            "unimem.find_batch_size: peak_allocated per trial, fitted against the cap",
            note="the cap less the pool's overhead (peak_reserved - peak_allocated) at the largest trial "
            "that fit; empty_cache() between trials so each peak starts from a clean pool. Near the cap a "
            "size that ran can fail after a later OOM (split segments): the answer is re-run, one size lower "
            "if needed, then one call at start with the cache emptied as its forward starts (the gradients "
            "leave the large segments). No prediction before running (lower= takes a peak in bytes "
            "only): each placement is a real trial, from a small one at start. Under torch.distributed "
            "(world size > 1) every trial is agreed through the default group's c10d store: a size fits only if "
            "it fit on every rank, so every rank returns the same answer; model=ddp runs each trial under "
            "no_sync() with buffer broadcasting off; FSDP and DTensor models are refused (their forward "
            "communicates)",
        ),
        "accumulate": Support(
            Level.NATIVE,
            "loss.backward() adds into .grad; DistributedDataParallel.no_sync() on all but the last micro-batch",
            note="unimem.accumulate weighs each micro-batch's loss by its share of the global batch; "
            "accumulate_grads adds gradient lists or dicts for loops that take them from torch.autograd.grad",
        ),
        "ranks.pin": Support(
            Level.NATIVE,
            "torch.cuda.set_device(local rank) inside CUDA's lazy init",
            When.BEFORE_INIT,
            "a tensor made on 'cuda' before it starts a context on GPU 0 for the life of the rank",
        ),
        "ranks.cluster": Support(
            Level.EMULATED,
            "the initialised process group's c10d store (no NCCL, no new group)",
            note="every rank must call it; one that asks alone returns after timeout= with the others missing",
        ),
        "ranks.batch_size": Support(
            Level.EMULATED,
            "each trial's outcome agreed through the c10d store; model= runs trials under DDP's no_sync()",
            note="a model whose forward communicates (FSDP, DTensor parameters) is refused",
        ),
        "remat.full": Support(
            Level.NATIVE,
            "torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)",
            note="keeps fn's inputs only; the RNG state is restored for the recomputation, so dropout replays",
        ),
        "remat.matmuls": Support(
            Level.NATIVE,
            "checkpoint(..., context_fn=create_selective_checkpoint_contexts(policy))",
            note="saves the outputs of aten.mm, addmm, bmm, baddbmm and the scaled-dot-product attention "
            "kernels; recomputes the rest (dropout replays)",
        ),
        "remat.offload": Support(
            Level.NATIVE,
            "torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available())",
            note="every tensor autograd saves in fn is copied to host memory and back for the backward "
            "pass; nothing is recomputed; also as a context: unimem.offload(). A saved tensor still "
            "referenced elsewhere stays on the device too, and one saved twice comes back twice: the device "
            "peak can rise instead of fall; measure",
        ),
    }

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # What to do at CUDA init, for settings made before it: read when the hook fires.
        self._at_init: dict[str, Any] = {}
        self._properties: dict[int, Any] = {}
        self._uuids: dict[int, str | None] = {}
        # The rank's own device once pinned: caps and preallocation touch it alone, since a
        # call on another device starts a CUDA context there.
        self.pinned: int | None = None

    # --- phase ----------------------------------------------------------------
    def phase(self) -> Phase:
        torch = sys.modules.get("torch")
        if torch is None:
            return Phase.NOT_IMPORTED
        cuda = getattr(torch, "cuda", None)  # absent while torch is half-imported
        if cuda is not None and cuda.is_initialized():
            return Phase.INITIALIZED
        return Phase.IMPORTED

    def _cuda_available(self) -> bool | None:
        """None while torch is not imported: unknown without importing it."""
        torch = sys.modules.get("torch")
        if torch is None or getattr(torch, "cuda", None) is None:
            return None
        return bool(torch.cuda.is_available())

    # --- configuration ------------------------------------------------------------
    def plan(self, settings: Settings) -> list[Step]:
        phase = self.phase()
        steps: list[Step] = []
        if settings.devices is not None:
            steps.append(
                devices_step(
                    "torch",
                    settings.devices,
                    phase=phase,
                    when=When.BEFORE_INIT,
                    fix="set devices before the first CUDA call, or restart the process",
                )
            )
        if settings.allocator is not None:
            steps.extend(self._plan_allocator(settings.allocator, phase))
        if settings.fraction is not None or settings.limit is not None:
            steps.append(self._plan_cap(settings, phase))
        if settings.growth is not None:
            steps.append(self._plan_growth(settings.growth, phase))
        return steps

    def _plan_allocator(self, allocator: str, phase: Phase) -> list[Step]:
        var = _conf_var(self.version())
        if phase is Phase.INITIALIZED:
            return [self._allocator_after_init(allocator, var)]
        if phase is Phase.IMPORTED:
            fixed = self._backend_fixed_at_import(allocator, var)
            if fixed is not None:
                return [fixed]
        # A user's own variable wins where torch reads both names (the legacy one does in
        # torch 2.13: tests/test_backend_torch.py), so unimem writes into whichever is set.
        present = [name for name in (var, "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF") if name in os.environ]
        targets = list(dict.fromkeys(present)) or [var]
        fix = "configure the allocator before the first CUDA call"
        steps = [
            env_step(
                "torch",
                "allocator",
                allocator,
                name,
                merge_conf(os.environ.get(name), _CONF_ALLOCATOR[allocator]) or None,
                phase=phase,
                when=When.BEFORE_INIT,
                fix=fix,
            )
            for name in targets
        ]
        uncached_value = "1" if allocator == "uncached" else None
        if os.environ.get(_UNCACHED_VAR) != uncached_value:
            steps.append(
                env_step(
                    "torch",
                    "allocator",
                    allocator,
                    _UNCACHED_VAR,
                    uncached_value,
                    phase=phase,
                    when=When.BEFORE_INIT,
                    fix=fix,
                )
            )
        return steps

    def _allocator_after_init(self, allocator: str, var: str) -> Step:
        """The allocator once CUDA runs: unchanged, expandable segments switched for new
        segments, or too late (the backend and the uncached switch are read at init)."""
        torch = sys.modules["torch"]
        backend = torch.cuda.get_allocator_backend()
        uncached = os.environ.get(_UNCACHED_VAR) == "1"
        if allocator == "async" and backend == "cudaMallocAsync":
            target = f"{var}=backend:cudaMallocAsync"
            return Step("torch", "allocator", allocator, "env", target, status=STATUS_UNCHANGED)
        if allocator == "uncached" and uncached:
            return Step("torch", "allocator", allocator, "env", f"{_UNCACHED_VAR}=1", status=STATUS_UNCHANGED)
        if allocator not in ("async", "uncached") and backend == "native" and not uncached:
            # expandable_segments can be switched for segments made from now on.
            value = "True" if allocator == "expandable" else "False"
            # torch 2.11 deprecates torch.cuda.memory._set_allocator_settings with a
            # FutureWarning that names this call as its replacement.
            setter = getattr(getattr(torch, "_C", None), "_accelerator_setAllocatorSettings", None)
            name = "torch._C._accelerator_setAllocatorSettings"
            if setter is None:
                setter = torch.cuda.memory._set_allocator_settings
                name = "torch.cuda.memory._set_allocator_settings"

            def run() -> None:
                setter(f"expandable_segments:{value}")

            call = f"{name}('expandable_segments:{value}')"
            note = "applies to segments allocated from now on"
            return Step("torch", "allocator", allocator, "api", call, run=run, note=note)
        too_late = (
            f"CUDA is already initialised with the {'uncached' if uncached else backend} allocator, "
            "which cannot change in a running process; configure the allocator before the first "
            "CUDA call, or start the script with `unimem run --allocator ...`"
        )
        return Step("torch", "allocator", allocator, "env", var, too_late=too_late)

    def _backend_fixed_at_import(self, allocator: str, var: str) -> Step | None:
        """torch picks its allocator backend (native or cudaMallocAsync) when it is imported;
        the other allocator keys are read at CUDA init. A backend set after the import makes
        the first CUDA call fail ("Allocator backend parsed at runtime != allocator backend
        parsed at load time"; the GPU suite's allocator test shows it)."""
        torch = sys.modules["torch"]
        try:
            loaded = torch.cuda.get_allocator_backend()  # names the import-time choice; starts no CUDA
        except (AttributeError, RuntimeError):  # a CPU-only build has no CUDA allocator
            return None
        wanted = "cudaMallocAsync" if allocator == "async" else "native"
        if loaded == wanted:
            return None
        return Step(
            "torch",
            "allocator",
            allocator,
            "env",
            var,
            too_late=(
                f"torch chose its {loaded} allocator backend when it was imported and does not read it again; "
                f"configure allocator={allocator!r} before `import torch`, or start the script with "
                "`unimem run --allocator ...`"
            ),
            when=When.BEFORE_IMPORT,
        )

    def _allowance_fraction(self, settings: Settings, total: int) -> float:
        if settings.fraction is not None:
            return settings.fraction
        assert settings.limit is not None
        if settings.limit > total:
            raise ConfigError(
                "limit",
                f"{settings.limit} bytes is more than the device's {total} bytes; pass a smaller limit",
            )
        return settings.limit / total

    def _plan_cap(self, settings: Settings, phase: Phase) -> Step:
        setting = "fraction" if settings.fraction is not None else "limit"
        value = settings.fraction if settings.fraction is not None else settings.limit
        if phase is Phase.INITIALIZED:
            torch = sys.modules["torch"]
            count = torch.cuda.device_count()
            fractions = {}
            for device in range(count):
                total = self._props(device).total_memory
                fractions[device] = self._allowance_fraction(settings, total)
            current = {d: torch.cuda.get_per_process_memory_fraction(d) for d in range(count)}
            call = ", ".join(
                f"torch.cuda.set_per_process_memory_fraction({f:.6g}, device={d})" for d, f in fractions.items()
            )
            if all(abs(current[d] - f) < 1e-9 for d, f in fractions.items()):
                return Step("torch", setting, value, "api", call, status=STATUS_UNCHANGED)

            def run_now() -> None:
                for device, fraction in fractions.items():
                    torch.cuda.set_per_process_memory_fraction(fraction, device)

            return Step("torch", setting, value, "api", call, run=run_now)

        if self._cuda_available() is False:
            return Step(
                "torch",
                setting,
                value,
                "api",
                "torch.cuda.set_per_process_memory_fraction",
                status=STATUS_NO_DEVICE,
                note="torch sees no CUDA device here: there is no GPU memory to cap",
            )
        if settings.limit is not None:
            # Check against the device now when NVML can tell, so a bad limit fails
            # at configure time rather than at the first CUDA call.
            total = nvml_gate.device_figures(0)[0]
            if total is not None:
                self._allowance_fraction(settings, total)

        def run_later() -> None:
            with self._lock:
                self._at_init["cap"] = settings
            self._register_init_hook()

        target = (
            f"torch.cuda.set_per_process_memory_fraction({settings.fraction})"
            if settings.fraction is not None
            else f"torch.cuda.set_per_process_memory_fraction({settings.limit} / total_memory)"
        )
        return Step("torch", setting, value, "hook", target + " at CUDA init", run=run_later, status=STATUS_PENDING)

    def _plan_growth(self, growth: bool, phase: Phase) -> Step:
        if growth:

            def cancel() -> None:
                with self._lock:
                    self._at_init.pop("preallocate", None)

            return Step(
                "torch",
                "growth",
                True,
                "none",
                "(torch default)",
                run=cancel,
                status=STATUS_APPLIED,
                note="torch's caching allocator allocates on demand; nothing to change",
            )
        if phase is Phase.INITIALIZED:
            torch = sys.modules["torch"]

            def run_now() -> None:
                for device in range(torch.cuda.device_count()):
                    self._preallocate(torch, device)

            return Step("torch", "growth", False, "api", "torch.empty(allowance) freed into the cache", run=run_now)
        if self._cuda_available() is False:
            return Step(
                "torch",
                "growth",
                False,
                "api",
                "torch.empty(allowance)",
                status=STATUS_NO_DEVICE,
                note="torch sees no CUDA device here: nothing to preallocate",
            )

        def run_later() -> None:
            with self._lock:
                self._at_init["preallocate"] = True
            self._register_init_hook()

        return Step(
            "torch",
            "growth",
            False,
            "hook",
            "torch.empty(allowance) freed into the cache at CUDA init",
            run=run_later,
            status=STATUS_PENDING,
        )

    def _register_init_hook(self) -> None:
        def on_import(torch: types.ModuleType) -> None:
            torch.cuda._lazy_call(self._on_cuda_init)

        when_imported("torch", on_import, key="unimem.torch.at_init")

    def _on_cuda_init(self) -> None:
        """Runs inside torch's lazy CUDA init: the pin first, then on every visible device (the pinned one alone)."""
        torch = sys.modules["torch"]
        with self._lock:
            pending = dict(self._at_init)
            self._at_init.clear()
        if pending.get("pin") is not None:
            torch.cuda.set_device(pending["pin"])
        cap: Settings | None = pending.get("cap")
        for device in range(torch.cuda.device_count()) if self.pinned is None else [self.pinned]:
            if cap is not None:
                total = torch.cuda.get_device_properties(device).total_memory
                fraction = self._allowance_fraction(cap, total)
                torch.cuda.set_per_process_memory_fraction(fraction, device)
            if pending.get("preallocate"):
                self._preallocate(torch, device)

    def _preallocate(self, torch: Any, device: int) -> None:
        free, total = torch.cuda.mem_get_info(device)
        fraction = torch.cuda.get_per_process_memory_fraction(device)
        reserved = torch.cuda.memory_reserved(device)
        size = int(total * fraction) - reserved - _SMALL_POOL_HEADROOM if fraction < 1.0 else free - _UNCAPPED_HEADROOM
        size = min(size, free - _SMALL_POOL_HEADROOM)
        if size <= 0:
            return
        block = torch.empty(size, dtype=torch.uint8, device=f"cuda:{device}")
        del block  # back to the cache, not to the device: that is the preallocation

    def _props(self, device: int) -> Any:
        props = self._properties.get(device)
        if props is None:
            props = sys.modules["torch"].cuda.get_device_properties(device)
            self._properties[device] = props
        return props

    # --- many processes (distributed.py) ---------------------------------------------
    def plan_pin(self, device: int | None, *, per_rank: bool, note: str) -> list[Step]:
        if device is None or per_rank:
            return super().plan_pin(device, per_rank=per_rank, note=note)
        from .distributed import plan_pin

        return plan_pin(self, device, note)

    def pin_at_init(self, device: int) -> None:
        """Make ``device`` this process's own at CUDA init (before any tensor)."""
        with self._lock:
            self.pinned = device
            self._at_init["pin"] = device
        self._register_init_hook()

    def distributed_store(self) -> KeyValueStore | None:
        from .distributed import store

        return store()

    def trial_context(self, model: Any) -> Callable[[], contextlib.AbstractContextManager[None]] | None:
        from .distributed import trial_context

        return trial_context(model)

    # --- queries ------------------------------------------------------------------
    def stats(self, device: int = 0, *, nvml: bool = True) -> MemoryStats:
        torch = sys.modules.get("torch")
        initialized = torch is not None and torch.cuda.is_initialized()
        if initialized:
            count = sys.modules["torch"].cuda.device_count()  # cached by torch: free in the hot path
            if device >= count:
                raise no_such_device("torch", device, count)
        total = free = used = None
        if nvml:
            total, free, used = nvml_gate.device_figures(device, self._uuid(device) if initialized else None)
        if not initialized:
            return MemoryStats("torch", device, device_total=total, device_free=free, process_used=used)
        assert torch is not None
        if nvml and total is None:  # no NVML here: the driver's figures through CUDA
            free, total = torch.cuda.mem_get_info(device)
        # The nested dict straight from C++: torch.cuda.memory_stats() flattens it
        # into 120 keys in Python, which is most of its cost.
        raw = torch._C._cuda_memoryStats(device)
        allocated = raw["allocated_bytes"]["all"]
        reserved = raw["reserved_bytes"]["all"]
        fraction = torch._C._cuda_getMemoryFraction(device) if hasattr(torch._C, "_cuda_getMemoryFraction") else None
        device_total = self._props(device).total_memory
        return MemoryStats(
            "torch",
            device,
            allocated=int(allocated["current"]),
            reserved=int(reserved["current"]),
            peak_allocated=int(allocated["peak"]),
            peak_reserved=int(reserved["peak"]),
            limit=None if fraction is None else int(device_total * fraction),
            num_allocs=int(raw["allocation"]["all"]["allocated"]),
            num_ooms=int(raw["num_ooms"]),
            device_total=total,
            device_free=free,
            process_used=used,
        )

    def fragmentation(self, device: int = 0) -> dict[str, int | None] | None:
        """Free blocks inside the caching allocator's segments on ``device``.

        Walks ``torch.cuda.memory_snapshot()``, every block of every segment: too slow
        for ``stats()`` (which must stay ~µs), fine on request or at an OOM.
        """
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return None
        free_blocks = [
            int(block["size"])
            for segment in torch.cuda.memory_snapshot()
            if segment.get("device") == device
            for block in segment.get("blocks", ())
            if block.get("state") == "inactive"  # "active_pending_free" is not free yet
        ]
        return {
            "free_in_pool": sum(free_blocks),
            "largest_free_block": max(free_blocks, default=0),
            "free_blocks": len(free_blocks),
        }

    def _uuid(self, device: int) -> str | None:
        if device in self._uuids:  # stats() asks on every call: format it once
            return self._uuids[device]
        uuid = getattr(self._props(device), "uuid", None)
        text = None if uuid is None else str(uuid)
        if text is not None and not text.startswith(("GPU-", "MIG-")):
            text = f"GPU-{text}"
        self._uuids[device] = text
        return text

    def device_uuid(self, device: int) -> str | None:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return None  # reading device properties would start CUDA
        return self._uuid(device)

    # --- observation ----------------------------------------------------------------
    def counter_reader(self, device: int) -> tuple[Callable[[], Counters] | None, str]:
        from .observe import counter_reader

        return counter_reader(self, device)

    def profiler(self) -> Profiler:
        from .observe import profiler

        return profiler()

    def reset_peak(self, device: int = 0) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats(device)

    def clear_cache(self, device: int = 0) -> int:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return 0
        before = torch.cuda.memory_reserved(device)
        gc.collect()  # tensors kept alive only by reference cycles go back to the cache first
        with torch.cuda.device(device):
            torch.cuda.empty_cache()
        return max(0, before - torch.cuda.memory_reserved(device))

    # --- out-of-memory diagnosis (diagnose.py) -------------------------------------------
    error_modules = diagnose.ERROR_MODULES
    accumulation_code = diagnose.ACCUMULATION_CODE
    checkpoint_code = diagnose.CHECKPOINT_CODE
    scan_needs_gc = True

    @classmethod
    def recognises_oom(cls, exc: BaseException, message: str) -> bool:
        return diagnose.recognises_oom(exc, message)

    @classmethod
    def requested_bytes(cls, message: str) -> tuple[int, str] | None:
        return diagnose.requested_bytes(message)

    def oom_place(self, exc: BaseException, device: int, message: str) -> str | None:
        return diagnose.oom_place(device, message)

    def place_spelling(self, place: str) -> str | None:
        return diagnose.place_spelling(place)

    def precision_in_force(self) -> tuple[bool, str] | None:
        return diagnose.precision_in_force()

    def live_memory(self, objects: list[object], place: str | None, top: int) -> LiveMemory | None:
        return diagnose.live_memory(objects, place, top)

    # --- batch-size search (search.py) -------------------------------------------------
    release_every_trial: ClassVar[bool] = True  # empty the cache every trial: each peak starts from a clean pool
    settle_call: ClassVar[bool] = True  # the gradients leave the answer's large segments (settle)

    def search_capacity(self, snapshot: MemoryStats) -> int | None:
        from .search import capacity

        return capacity(snapshot)

    def pool_overhead(self, peak: int | None, peak_reserved: int | None) -> int:
        from .search import pool_overhead

        return pool_overhead(peak, peak_reserved)

    def settle(self, release: Callable[[], None]) -> contextlib.AbstractContextManager[None]:
        from .search import at_first_forward

        return at_first_forward(release)

    # --- mixed precision and compare workloads (precision.py, workloads.py) ------------
    runs_workloads: ClassVar[bool] = True
    precision_state_per_thread: ClassVar[bool] = True  # autocast state belongs to the thread that entered it

    def precision(self) -> PrecisionHelpers:
        from . import precision

        return precision

    # --- memory savers (savers.py) ------------------------------------------------------
    def remat(self, fn: Callable[..., Any], policy: str) -> Callable[..., Any]:
        from . import savers

        return savers.remat(fn, policy)

    # --- gradient accumulation (accumulation.py) --------------------------------------
    def no_sync(self, model: Any) -> contextlib.AbstractContextManager[None]:
        from . import accumulation

        return accumulation.no_sync(model)

    def add_gradients(self, total: Any, grads: Any, weight: float) -> Any:
        from . import accumulation

        return accumulation.add_gradients(total, grads, weight)

    def offload(self) -> contextlib.AbstractContextManager[None]:
        from . import savers

        return savers.offload()

    def start_device(self) -> str:
        from . import workloads

        return workloads.start_device()

    def workload_step(self, workload: str, shapes: Any, dtype: str) -> tuple[Callable[[], None], int]:
        from . import workloads

        return workloads.build(workload, shapes, dtype)
