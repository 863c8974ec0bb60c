"""PyTorch adapter: the CUDA caching allocator.

torch is imported only inside methods; ``configure`` plans the settings (deferred to CUDA's
lazy init where making them now would start CUDA).
"""

from __future__ import annotations

import gc
import sys
from functools import cached_property
from typing import Any, ClassVar

from unimem.backends import nvml_gate
from unimem.backends.base import Backend, no_such_device
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
from unimem.backends.torch import configure

from unimem.config import Settings
from unimem.memory_stats import MemoryStats
from unimem.support import Level, Phase, Support, When

__all__ = ["TorchBackend"]


class TorchBackend(Backend):
    name = "torch"
    module = "torch"
    distributions = ("torch",)
    error_modules = ("torch",)
    runs_workloads = True
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
            Level.ENV, f"{configure.UNCACHED_VAR}=1", When.BEFORE_INIT, "every free is a cudaFree: slow, for debugging"
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
            note="keeps fn's inputs only; the RNG state is restored for the recomputation, so dropout replays; "
            "a draw from a torch.Generator of fn's own is refused (recomputed, it would differ)",
        ),
        "remat.matmuls": Support(
            Level.NATIVE,
            "checkpoint(..., context_fn=create_selective_checkpoint_contexts(policy))",
            note="saves the outputs of aten.mm, addmm, bmm, baddbmm, the convolutions and the "
            "scaled-dot-product attention kernels, except a kernel that draws dropout numbers: every draw from "
            "the default generators is recomputed in order, so dropout replays",
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
        self.at_init = configure.AtCudaInit()  # settings made before CUDA starts, and the rank's pin
        self._properties: dict[int, Any] = {}
        self._uuids: dict[int, str | None] = {}

    # --- phase ----------------------------------------------------------------
    def phase(self) -> Phase:
        torch = sys.modules.get("torch")
        if torch is None:
            return Phase.NOT_IMPORTED
        cuda = getattr(torch, "cuda", None)  # absent while torch is half-imported
        if cuda is not None and cuda.is_initialized():
            return Phase.INITIALIZED
        return Phase.IMPORTED

    # --- configuration ------------------------------------------------------------
    def plan(self, settings: Settings) -> list[Step]:
        return configure.plan(settings, self.phase(), self.version(), self.at_init)

    def _props(self, device: int) -> Any:
        props = self._properties.get(device)
        if props is None:
            props = sys.modules["torch"].cuda.get_device_properties(device)
            self._properties[device] = props
        return props

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

    # --- topics (backends/torch/<topic>.py, imported on first use) --------------------
    @cached_property
    def diagnose(self) -> DiagnoseTopic:
        from .diagnose import TorchDiagnose

        return TorchDiagnose(self)

    @cached_property
    def observe(self) -> ObserveTopic:
        from .observe import TorchObserve

        return TorchObserve(self)

    @cached_property
    def precision(self) -> PrecisionTopic:
        from . import precision

        return precision

    @cached_property
    def savers(self) -> SaversTopic:
        from .savers import TorchSavers

        return TorchSavers(self)

    @cached_property
    def accumulation(self) -> AccumulationTopic:
        from .accumulation import TorchAccumulation

        return TorchAccumulation(self)

    @cached_property
    def search(self) -> SearchTopic:
        from .search import TorchSearch

        return TorchSearch(self)

    @cached_property
    def distributed(self) -> DistributedTopic:
        from .distributed import TorchDistributed

        return TorchDistributed(self, self.at_init)

    @cached_property
    def workloads(self) -> WorkloadsTopic:
        from .workloads import TorchWorkloads

        return TorchWorkloads(self)

    @cached_property
    def estimate(self) -> EstimateTopic:
        from .estimate import TorchEstimate

        return TorchEstimate(self)
