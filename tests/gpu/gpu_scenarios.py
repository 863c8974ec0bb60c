"""GPU scenarios, each run in a fresh interpreter by the tests in this folder.

Caps, growth and allocators are process-global and fixed once a framework's device
runtime starts, so every scenario gets a process of its own:

    python gpu_scenarios.py NAME '{"kwarg": value}'

A scenario measures and reports; the test that started it asserts. It fills the
dict ``R`` as it goes, and whatever it holds is printed as one JSON line after
``MARK``, also when the scenario raises (then with ``error``), so a failed test
still carries its figures into the evidence file.

Only the standard library is imported at the top: each scenario decides when the
framework is imported, because that moment is what is under test. NVML figures
marked ``raw_`` come from pynvml directly, not through unimem.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

MARK = "UNIMEM_SCENARIO_RESULT "
MiB = 1 << 20
GiB = 1 << 30

R: dict[str, Any] = {}

# --- raw NVML (ground truth, independent of unimem's own NVML code) ---------------


def _pynvml() -> Any:
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def raw_handle(uuid: str | None = None) -> Any:
    """NVML handle by UUID, else NVML index 0 (the machine has one GPU)."""
    nvml = _pynvml()
    if uuid is not None:
        return nvml.nvmlDeviceGetHandleByUUID(uuid)
    return nvml.nvmlDeviceGetHandleByIndex(0)


def raw_memory(handle: Any) -> tuple[int, int, int]:
    """``(total, free, used)`` from nvmlDeviceGetMemoryInfo v2."""
    nvml = _pynvml()
    info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
    return int(info.total), int(info.free), int(info.used)


def raw_process_used(handle: Any) -> int | None:
    """NVML's bytes for this PID, or None when NVML does not list it."""
    nvml = _pynvml()
    found = None
    for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
            found = (found or 0) + int(proc.usedGpuMemory)
    return found


def applied_text(applied: Any) -> str:
    return "; ".join(f"{a.backend}.{a.setting}={a.status} ({a.method}: {a.target})" for a in applied)


def env_snapshot(*names: str) -> None:
    for name in names:
        R[f"env.{name}"] = os.environ.get(name, "<unset>")


def stats_into(prefix: str, snapshot: Any) -> None:
    for key, value in snapshot.as_dict().items():
        if key in ("backend", "device", "timestamp"):
            continue
        R[f"{prefix}.{key}"] = value


# --- baselines: what a process holds on the device with nothing allocated -----------


def baseline_driver() -> None:
    """A bare CUDA context through the driver API (ctypes), no framework at all."""
    cuda = ctypes.CDLL("libcuda.so.1")

    def check(code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what} returned CUDA error {code}")

    check(cuda.cuInit(0), "cuInit")
    version = ctypes.c_int()
    check(cuda.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
    R["cuda_driver_version"] = f"{version.value // 1000}.{version.value % 1000 // 10}"
    device = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    context = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    pointer = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(2 * MiB)), "cuMemAlloc")
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    R["cuda_total"], R["cuda_free"] = int(total.value), int(free.value)
    handle = raw_handle()
    R["nvml_total"], R["nvml_free"], R["nvml_used"] = raw_memory(handle)
    R["process_used"] = raw_process_used(handle)
    R["allocated_by_test"] = 2 * MiB


def baseline_torch() -> None:
    """torch with one tiny tensor: its context plus the smallest pool segment."""
    import torch

    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    handle = raw_handle()
    R["process_used"] = raw_process_used(handle)
    R["reserved"] = torch.cuda.memory_reserved()
    free, total = torch.cuda.mem_get_info()
    R["cuda_total"], R["cuda_free"] = int(total), int(free)
    R["torch_cuda"] = str(torch.version.cuda)
    R["device_name"] = torch.cuda.get_device_name(0)


def baseline_jax() -> None:
    """JAX with growth (no preallocation) after one tiny op, without unimem."""
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    import jax
    import jax.numpy as jnp

    jnp.zeros(1).block_until_ready()
    handle = raw_handle()
    R["process_used"] = raw_process_used(handle)
    stats = jax.devices()[0].memory_stats() or {}
    R["pool_bytes"] = stats.get("pool_bytes", stats.get("bytes_reserved"))
    R["jax_devices"] = str(jax.devices())


# --- caps ---------------------------------------------------------------------------


def _parse_limit(limit: str | int) -> int:
    from unimem import parse_size

    return parse_size(limit)


def torch_cap(
    fraction: float | None = None,
    limit: str | None = None,
    chunk: int = GiB,
    after_import: bool = False,
    allocator: str | None = None,
) -> None:
    """Configure a cap (before ``import torch``, or after it but before the first
    CUDA call), then allocate ``chunk``-sized tensors until torch raises OOM."""
    import unimem

    kwargs: dict[str, Any] = {"fraction": fraction} if fraction is not None else {"limit": limit}
    if allocator is not None:
        kwargs["allocator"] = allocator
    if after_import:
        import torch

        R["torch_initialized_at_configure"] = torch.cuda.is_initialized()
    R["torch_imported_at_configure"] = "torch" in sys.modules
    R["applied"] = applied_text(unimem.configure("torch", **kwargs))
    env_snapshot("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
    import torch

    torch.empty(1, device="cuda")  # the first CUDA call: the cap is made here
    handle = raw_handle()
    total = int(torch.cuda.get_device_properties(0).total_memory)
    cap = int(total * fraction) if fraction is not None else _parse_limit(limit)  # type: ignore[arg-type]
    R.update(total_memory=total, cap=cap, fraction_in_torch=torch.cuda.get_per_process_memory_fraction(0))
    R["allocator_backend"] = torch.cuda.get_allocator_backend()
    blocks = []
    max_used = max_raw = max_reserved = 0
    R["oom"] = False
    for _ in range(cap // chunk + 8):
        try:
            blocks.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError as exc:
            R["oom"] = True
            R["oom_type"] = f"{type(exc).__module__}.{type(exc).__qualname__}"
            R["oom_message"] = str(exc).splitlines()[0][:400]
            break
        snapshot = unimem.stats("torch")
        max_used = max(max_used, snapshot.process_used or 0)
        max_raw = max(max_raw, raw_process_used(handle) or 0)
        max_reserved = max(max_reserved, torch.cuda.memory_reserved())
    max_raw = max(max_raw, raw_process_used(handle) or 0)
    R["blocks_allocated"] = len(blocks)
    R["allocated_at_oom"] = int(torch.cuda.memory_allocated())
    R["max_reserved"] = max_reserved
    R["max_process_used"] = max_used
    R["max_process_used_raw"] = max_raw
    final = unimem.stats("torch")
    R["stats_limit"] = final.limit
    R["stats_num_ooms"] = final.num_ooms
    if allocator == "expandable":
        _segments_into_r(torch)


def jax_cap(fraction: float | None = None, limit: str | None = None, chunk: int = GiB) -> None:
    """Configure a cap before ``import jax``; allocate until XLA says RESOURCE_EXHAUSTED."""
    import unimem

    kwargs: dict[str, Any] = {"fraction": fraction} if fraction is not None else {"limit": limit}
    R["applied"] = applied_text(unimem.configure("jax", **kwargs))
    env_snapshot("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE")
    import jax
    import jax.numpy as jnp

    handle = raw_handle()
    nvml_total = raw_memory(handle)[0]
    cap = int(nvml_total * fraction) if fraction is not None else _parse_limit(limit)  # type: ignore[arg-type]
    R.update(nvml_total=nvml_total, cap=cap)
    device = jax.devices()[0]
    jnp.zeros(1).block_until_ready()
    raw = device.memory_stats() or {}
    R["bytes_limit"] = raw.get("bytes_limit")
    R["process_used_after_first_op"] = raw_process_used(handle)
    blocks = []
    max_used = max_raw = 0
    R["oom"] = False
    for _ in range(cap // chunk + 8):
        try:
            array = jnp.zeros((chunk,), dtype=jnp.uint8)
            array.block_until_ready()
            blocks.append(array)
        except Exception as exc:  # JaxRuntimeError, or XlaRuntimeError on older jaxlib
            if "RESOURCE_EXHAUSTED" not in str(exc):
                raise
            R["oom"] = True
            R["oom_type"] = f"{type(exc).__module__}.{type(exc).__qualname__}"
            R["oom_message"] = str(exc).splitlines()[0][:400]
            break
        snapshot = unimem.stats("jax")
        max_used = max(max_used, snapshot.process_used or 0)
        max_raw = max(max_raw, raw_process_used(handle) or 0)
    max_raw = max(max_raw, raw_process_used(handle) or 0)
    R["blocks_allocated"] = len(blocks)
    raw = device.memory_stats() or {}
    R["bytes_in_use_at_oom"] = raw.get("bytes_in_use")
    R["allocated_at_oom"] = len(blocks) * chunk
    R["max_process_used"] = max_used
    R["max_process_used_raw"] = max_raw
    R["stats_limit"] = unimem.stats("jax").limit


# --- JAX growth / preallocation / late configure -------------------------------------------


def jax_growth(growth: bool, fraction: float | None = None, grow_by: int = 2 * GiB) -> None:
    import unimem

    R["applied"] = applied_text(unimem.configure("jax", growth=growth, fraction=fraction))
    env_snapshot("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_CLIENT_MEM_FRACTION")
    import jax
    import jax.numpy as jnp

    handle = raw_handle()
    R["nvml_total"] = raw_memory(handle)[0]
    R["process_used_before_first_op"] = raw_process_used(handle)
    jnp.zeros(1).block_until_ready()
    R["process_used_after_first_op"] = raw_process_used(handle)
    R["stats_process_used_after_first_op"] = unimem.stats("jax").process_used
    raw = jax.devices()[0].memory_stats() or {}
    for key in ("bytes_limit", "pool_bytes", "bytes_reserved", "bytes_in_use"):
        R[f"memory_stats.{key}"] = raw.get(key)
    array = jnp.zeros((grow_by,), dtype=jnp.uint8)
    array.block_until_ready()
    R["process_used_after_grow"] = raw_process_used(handle)
    R["grow_by"] = grow_by


def jax_late() -> None:
    """configure after JAX's first op: a changed setting raises, the same one is a no-op."""
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # as a user's shell would set it
    import jax
    import jax.numpy as jnp

    import unimem

    jnp.zeros(1).block_until_ready()
    from unimem import registry

    R["phase"] = registry.get_backend("jax").phase().name
    limit_before = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
    R["bytes_limit_before"] = limit_before
    R["late_error"] = "<none>"
    try:
        unimem.configure("jax", fraction=0.5)
    except unimem.TooLateError as exc:
        R["late_error"] = type(exc).__name__
        R["late_message"] = str(exc)[:400]
        R["late_is_runtime_error"] = isinstance(exc, RuntimeError)
    env_snapshot("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
    same = unimem.configure("jax", growth=True)  # PREALLOCATE is already false: nothing to do
    R["same_setting_status"] = ",".join(a.status for a in same)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lenient = unimem.configure("jax", fraction=0.5, strict=False)
    R["lenient_status"] = ",".join(a.status for a in lenient)
    R["lenient_warnings"] = "; ".join(f"{w.category.__name__}: {w.message}" for w in caught)[:400]
    env_snapshot("XLA_CLIENT_MEM_FRACTION")
    R["bytes_limit_after"] = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")


# --- torch preallocation and allocators ---------------------------------------------------------------


def torch_prealloc(fraction: float | None = None, use: int = 10 * GiB) -> None:
    import unimem

    R["applied"] = applied_text(unimem.configure("torch", growth=False, fraction=fraction))
    import torch

    handle = raw_handle()
    R["initialized_after_import"] = torch.cuda.is_initialized()
    R["process_used_before_init"] = raw_process_used(handle)
    R["nvml_total"], R["nvml_free_before_init"], _ = raw_memory(handle)
    torch.zeros(1, device="cuda")  # the first CUDA call
    R["total_memory"] = int(torch.cuda.get_device_properties(0).total_memory)
    R["fraction_in_torch"] = torch.cuda.get_per_process_memory_fraction(0)
    R["reserved_after_init"] = int(torch.cuda.memory_reserved())
    R["allocated_after_init"] = int(torch.cuda.memory_allocated())
    R["process_used_after_init"] = raw_process_used(handle)
    size = min(use, R["reserved_after_init"] // 2)
    tensor = torch.empty(size, dtype=torch.uint8, device="cuda")
    R["used_block"] = size
    R["reserved_after_use"] = int(torch.cuda.memory_reserved())
    R["process_used_after_use"] = raw_process_used(handle)
    del tensor


def _segments_into_r(torch: Any) -> None:
    try:
        snapshot = torch.cuda.memory._snapshot()
    except Exception as exc:  # the cudaMallocAsync backend keeps no segments
        R["snapshot_error"] = f"{type(exc).__name__}: {exc}"[:300]
        return
    large = [s for s in snapshot["segments"] if s.get("segment_type") == "large"]
    R["large_segments"] = len(large)
    R["large_segment_sizes"] = ",".join(str(s["total_size"]) for s in large)
    flags = {str(s.get("is_expandable", "<no key>")) for s in large}
    R["segments_is_expandable"] = ",".join(sorted(flags))


def torch_allocator(allocator: str | None, after_import: bool = False, blocks: int = 3) -> None:
    """Configure an allocator, then allocate ``blocks`` tensors of 1 GiB and look at
    which backend and what segments torch made."""
    import unimem

    if after_import:
        import torch

        R["torch_initialized_at_configure"] = torch.cuda.is_initialized()
    if allocator is not None:
        try:
            R["applied"] = applied_text(unimem.configure("torch", allocator=allocator))
        except unimem.TooLateError as exc:
            R["configure_error"] = type(exc).__name__
            R["configure_message"] = str(exc)[:400]
    env_snapshot("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING")
    import torch

    R["initialized_after_configure"] = torch.cuda.is_initialized()

    tensors = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(blocks)]
    R["allocator_backend"] = torch.cuda.get_allocator_backend()
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if getter is not None:
        try:
            R["allocator_settings"] = str(getter())[:300]
        except Exception as exc:
            R["allocator_settings"] = f"<{type(exc).__name__}: {exc}>"[:300]
    _segments_into_r(torch)
    try:
        snapshot = unimem.stats("torch")
        R["stats_allocated"], R["stats_reserved"] = snapshot.allocated, snapshot.reserved
        R["memory_allocated"] = int(torch.cuda.memory_allocated())
    except Exception as exc:
        R["stats_error"] = f"{type(exc).__name__}: {exc}"[:300]
    handle = raw_handle()
    R["process_used_with_blocks"] = raw_process_used(handle)
    del tensors
    gc.collect()
    R["process_used_after_free"] = raw_process_used(handle)


def torch_after_init() -> None:
    """configure after CUDA started: the allocator backend is too late, a cap and
    expandable segments still apply (the latter to new segments)."""
    import torch

    import unimem

    torch.zeros(1, device="cuda")
    R["async_error"] = "<none>"
    try:
        unimem.configure("torch", allocator="async")
    except unimem.TooLateError as exc:
        R["async_error"] = type(exc).__name__
        R["async_message"] = str(exc)[:400]
    R["fraction_applied"] = applied_text(unimem.configure("torch", fraction=0.3))
    R["fraction_in_torch"] = torch.cuda.get_per_process_memory_fraction(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        R["expandable_applied"] = applied_text(unimem.configure("torch", allocator="expandable"))
    R["expandable_warnings"] = "; ".join(f"{w.category.__name__}: {w.message}" for w in caught)[:400]
    tensors = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(3)]
    _segments_into_r(torch)
    del tensors


# --- clear_cache -------------------------------------------------------------------------------------


def torch_clear_cache(size: int = 8 * GiB) -> None:
    import unimem

    unimem.configure("torch", allocator="default")
    import torch

    handle = raw_handle()
    tensors = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(size // GiB)]
    del tensors
    R["allocated_before"] = int(torch.cuda.memory_allocated())
    R["reserved_before"] = int(torch.cuda.memory_reserved())
    R["process_used_before"] = raw_process_used(handle)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        R["returned"] = unimem.clear_cache("torch")
    R["warnings"] = "; ".join(str(w.message) for w in caught)[:300]
    R["reserved_after"] = int(torch.cuda.memory_reserved())
    R["process_used_after"] = raw_process_used(handle)
    R["reserved_delta"] = R["reserved_before"] - R["reserved_after"]
    R["nvml_delta"] = (R["process_used_before"] or 0) - (R["process_used_after"] or 0)
    R["returned_second_call"] = unimem.clear_cache("torch")


def torch_uncached(size: int = 4 * GiB) -> None:
    import unimem

    R["applied"] = applied_text(unimem.configure("torch", allocator="uncached"))
    env_snapshot("PYTORCH_NO_CUDA_MEMORY_CACHING")
    import torch

    handle = raw_handle()
    torch.zeros(1, device="cuda")
    R["process_used_start"] = raw_process_used(handle)
    tensor = torch.empty(size, dtype=torch.uint8, device="cuda")
    R["process_used_with_tensor"] = raw_process_used(handle)
    del tensor
    R["process_used_after_del"] = raw_process_used(handle)
    R["reserved_after_del"] = int(torch.cuda.memory_reserved())
    R["returned"] = unimem.clear_cache("torch")
    R["size"] = size


def jax_clear_cache(allocator: str | None, size: int = 4 * GiB, settle: float = 1.0) -> None:
    """uncached: an array kept alive by a reference cycle goes back on clear_cache.
    default (BFC, with growth): the pool keeps it; clear_cache returns 0 and warns."""
    import unimem

    if allocator == "uncached":
        R["applied"] = applied_text(unimem.configure("jax", allocator="uncached"))
    else:
        R["applied"] = applied_text(unimem.configure("jax", growth=True, allocator="default"))
    env_snapshot("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_PREALLOCATE")
    import jax
    import jax.numpy as jnp

    handle = raw_handle()
    jnp.zeros(1).block_until_ready()
    R["process_used_start"] = raw_process_used(handle)
    array = jnp.zeros((size,), dtype=jnp.uint8)
    array.block_until_ready()
    R["process_used_with_array"] = raw_process_used(handle)
    R["memory_stats_is_none"] = jax.devices()[0].memory_stats() is None
    gc.disable()  # the cycle must survive until clear_cache's own gc.collect()
    holder: list[Any] = [array]
    holder.append(holder)
    del array, holder
    R["process_used_before"] = raw_process_used(handle)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        R["returned"] = unimem.clear_cache("jax")
    R["process_used_after"] = raw_process_used(handle)
    R["warning_categories"] = ",".join(sorted({w.category.__name__ for w in caught})) or "<none>"
    R["warnings"] = "; ".join(str(w.message) for w in caught)[:300]
    time.sleep(settle)
    R["process_used_after_settle"] = raw_process_used(handle)
    R["nvml_delta"] = (R["process_used_before"] or 0) - (R["process_used_after"] or 0)
    R["nvml_delta_settled"] = (R["process_used_before"] or 0) - (R["process_used_after_settle"] or 0)
    R["size"] = size
    gc.enable()


# --- stats --------------------------------------------------------------------------------------------


def torch_stats() -> None:
    import unimem

    R["applied"] = applied_text(unimem.configure("torch", fraction=0.5, allocator="default"))
    import torch

    handle = raw_handle()
    tensors = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (MiB // 2, 3 * MiB, 100 * MiB, GiB)]
    del tensors[1]
    peak_tensor = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    del peak_tensor
    R["allocator_backend"] = torch.cuda.get_allocator_backend()
    snapshot = unimem.stats("torch")
    native = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    nvml_total, nvml_free, _ = raw_memory(handle)
    raw_used = raw_process_used(handle)
    stats_into("stats", snapshot)
    for key in (
        "allocated_bytes.all.current",
        "reserved_bytes.all.current",
        "allocated_bytes.all.peak",
        "reserved_bytes.all.peak",
        "allocation.all.allocated",
        "num_ooms",
    ):
        R[f"native.{key}"] = native.get(key)
    R.update(cuda_total=int(total), cuda_free=int(free), nvml_total=nvml_total, nvml_free=nvml_free)
    R["raw_process_used"] = raw_used
    R["total_memory"] = int(torch.cuda.get_device_properties(0).total_memory)
    R["expected_limit"] = int(R["total_memory"] * torch.cuda.get_per_process_memory_fraction(0))

    # reset_peak: the peak restarts at the current figure
    unimem.reset_peak("torch")
    after_reset = unimem.stats("torch")
    R["after_reset.peak_allocated"] = after_reset.peak_allocated
    R["after_reset.allocated"] = after_reset.allocated
    R["after_reset.native_peak"] = torch.cuda.memory_stats()["allocated_bytes.all.peak"]

    # num_ooms counts an OOM past the cap
    try:
        torch.empty(int(0.6 * R["total_memory"]), dtype=torch.uint8, device="cuda")
        R["oom_raised"] = False
    except torch.OutOfMemoryError:
        R["oom_raised"] = True
    R["after_oom.num_ooms"] = unimem.stats("torch").num_ooms
    R["after_oom.native_num_ooms"] = torch.cuda.memory_stats()["num_ooms"]
    del tensors


def jax_stats() -> None:
    import unimem

    R["applied"] = applied_text(unimem.configure("jax", growth=True, allocator="default"))
    import jax
    import jax.numpy as jnp

    handle = raw_handle()
    device = jax.devices()[0]
    arrays = [jnp.zeros((n,), dtype=jnp.uint8) for n in (MiB, 256 * MiB, GiB)]
    for array in arrays:
        array.block_until_ready()
    del arrays[1]
    snapshot = unimem.stats("jax")
    native = device.memory_stats() or {}
    nvml_total, nvml_free, _ = raw_memory(handle)
    raw_used = raw_process_used(handle)
    stats_into("stats", snapshot)
    R["memory_stats_keys"] = ",".join(sorted(native))
    for key, value in sorted(native.items()):
        R[f"memory_stats.{key}"] = value
    R.update(nvml_total=nvml_total, nvml_free=nvml_free, raw_process_used=raw_used)

    # reset_peak is emulated: the peak reads None until it passes the old one
    old_peak = native.get("peak_bytes_in_use")
    unimem.reset_peak("jax")
    R["after_reset.peak_allocated"] = unimem.stats("jax").peak_allocated
    bigger = jnp.zeros(((old_peak or 0) + 64 * MiB,), dtype=jnp.uint8)
    bigger.block_until_ready()
    R["after_bigger.peak_allocated"] = unimem.stats("jax").peak_allocated
    R["after_bigger.native_peak"] = (device.memory_stats() or {}).get("peak_bytes_in_use")
    del bigger


def nvml_stats() -> None:
    """unimem.stats('nvml') against raw pynvml, before and after this process has a context."""
    import unimem

    handle = raw_handle()
    before = unimem.stats("nvml")
    raw_total, raw_free, _ = raw_memory(handle)
    stats_into("before", before)
    R.update(before_raw_total=raw_total, before_raw_free=raw_free, before_raw_process=raw_process_used(handle))
    import torch

    tensor = torch.empty(GiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    after = unimem.stats("nvml")
    raw_total, raw_free, _ = raw_memory(handle)
    stats_into("after", after)
    R.update(after_raw_total=raw_total, after_raw_free=raw_free, after_raw_process=raw_process_used(handle))
    del tensor


# --- devices ------------------------------------------------------------------------------------------


def devices(framework: str, uuid: str, configure_devices: bool) -> None:
    """CUDA_VISIBLE_DEVICES holds the GPU's UUID (set by the parent); optionally
    ``configure(devices=[0])`` on top; stats() must find the NVML device of that UUID."""
    import unimem

    R["visible_at_start"] = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    if configure_devices:
        R["applied"] = applied_text(unimem.configure(framework, devices=[0]))
    R["visible_after_configure"] = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    if framework == "torch":
        import torch

        tensor = torch.empty(GiB, dtype=torch.uint8, device="cuda")
        R["framework_device_count"] = torch.cuda.device_count()
        R["framework_uuid"] = str(torch.cuda.get_device_properties(0).uuid)
    else:
        import jax
        import jax.numpy as jnp

        tensor = jnp.zeros((GiB,), dtype=jnp.uint8)
        tensor.block_until_ready()
        R["framework_device_count"] = len(jax.devices())
    snapshot = unimem.stats(framework)
    stats_into("stats", snapshot)
    handle = raw_handle(uuid)
    R["raw_total"], R["raw_free"], _ = raw_memory(handle)
    R["raw_process_used"] = raw_process_used(handle)
    del tensor


# --- torch and JAX in one process ----------------------------------------------------------------------


def mixed(torch_share: float = 0.5, jax_share: float = 0.3, chunk: int = GiB) -> None:
    import unimem

    applied = unimem.configure(backend=["torch", "jax"], fraction={"torch": torch_share, "jax": jax_share})
    R["applied"] = applied_text(applied)
    env_snapshot("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
    import jax
    import jax.numpy as jnp
    import torch

    handle = raw_handle()
    nvml_total = raw_memory(handle)[0]
    jnp.zeros(1).block_until_ready()  # JAX takes its share now
    torch.empty(1, device="cuda")
    total = int(torch.cuda.get_device_properties(0).total_memory)
    R.update(nvml_total=nvml_total, total_memory=total)
    R["torch_cap"] = int(total * torch_share)
    R["jax_cap"] = int(nvml_total * jax_share)
    R["torch_fraction_in_torch"] = torch.cuda.get_per_process_memory_fraction(0)
    R["jax_bytes_limit"] = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
    max_used = 0

    torch_blocks = []
    R["torch_oom"] = False
    for _ in range(R["torch_cap"] // chunk + 8):
        try:
            torch_blocks.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError as exc:
            R["torch_oom"] = True
            R["torch_oom_message"] = str(exc).splitlines()[0][:300]
            break
        max_used = max(max_used, raw_process_used(handle) or 0)
    R["torch_allocated_max"] = int(torch.cuda.memory_allocated())
    R["torch_reserved_max"] = int(torch.cuda.memory_reserved())

    jax_blocks = []
    R["jax_oom"] = False
    for _ in range(R["jax_cap"] // chunk + 8):
        try:
            array = jnp.zeros((chunk,), dtype=jnp.uint8)
            array.block_until_ready()
            jax_blocks.append(array)
        except Exception as exc:
            if "RESOURCE_EXHAUSTED" not in str(exc):
                raise
            R["jax_oom"] = True
            R["jax_oom_message"] = str(exc).splitlines()[0][:300]
            break
        max_used = max(max_used, raw_process_used(handle) or 0)
    R["jax_allocated_max"] = len(jax_blocks) * chunk
    R["jax_bytes_in_use"] = (jax.devices()[0].memory_stats() or {}).get("bytes_in_use")
    R["max_process_used"] = max(max_used, raw_process_used(handle) or 0)
    torch_view, jax_view = unimem.stats("torch"), unimem.stats("jax")
    R["stats_torch.limit"], R["stats_jax.limit"] = torch_view.limit, jax_view.limit
    R["stats_torch.reserved"], R["stats_jax.reserved"] = torch_view.reserved, jax_view.reserved


# --- JAX allocators ------------------------------------------------------------------------------------


def jax_allocator(allocator: str | None, via_unimem: bool = True, size: int = GiB) -> None:
    """``async`` through unimem; ``vmm`` as a probe of XLA's own variable (not a unimem setting)."""
    if via_unimem:
        import unimem

        R["applied"] = applied_text(unimem.configure("jax", allocator=allocator, growth=True))
    elif allocator is not None:
        os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] = allocator
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env_snapshot("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_PREALLOCATE")
    import jax
    import jax.numpy as jnp

    handle = raw_handle()
    jnp.zeros(1).block_until_ready()
    R["process_used_after_first_op"] = raw_process_used(handle)
    array = jnp.zeros((size,), dtype=jnp.uint8)
    array.block_until_ready()
    R["process_used_with_array"] = raw_process_used(handle)
    native = jax.devices()[0].memory_stats()
    if via_unimem:
        import unimem

        stats_into("stats_live", unimem.stats("jax"))
    R["memory_stats_keys"] = "<None>" if native is None else ",".join(sorted(native))
    for key, value in sorted((native or {}).items()):
        R[f"memory_stats.{key}"] = value
    del array
    gc.collect()
    R["process_used_after_del"] = raw_process_used(handle)
    if via_unimem:
        import unimem

        stats_into("stats", unimem.stats("jax"))


# --- memory savers on real models: gradients against the plain model, device peaks ------------

SAVERS_CAP = "4GiB"  # each model's plain step fits well inside it


def _grad_equal(plain: list[Any], other: list[Any]) -> float:
    """max over parameters of |g_other - g_plain|, over the plain gradients' global norm (float64 arrays)."""
    import numpy as np

    norm = float(np.sqrt(sum(float(np.sum(g**2)) for g in plain)))
    return max(float(np.max(np.abs(a - b))) for a, b in zip(plain, other, strict=True)) / norm


def _torch_saver_run(build: Callable[[], Any], loss_of: Callable[[Any], Any], match: str, policy: str) -> None:
    """``build()``'s model plain (twice: the floor of run-to-run differences) and with ``policy`` on every
    submodule named ``match``: gradients, and the device peak of one step above what was allocated before."""
    import copy

    import torch

    import unimem

    unimem.configure(backend="torch", limit=SAVERS_CAP)
    plain = build().cuda().train()
    saved = copy.deepcopy(plain)
    R["wrapped"] = unimem.remat_model(saved, policy, match=match)

    def step(model: Any) -> tuple[list[Any], int]:
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        torch.manual_seed(1234)  # the same dropout masks in every run
        loss_of(model).backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        return [p.grad.detach().double().cpu().numpy() for p in model.parameters() if p.grad is not None], peak

    first, R["plain_peak"] = step(plain)
    again, _ = step(plain)
    grads, R["saver_peak"] = step(saved)
    R["grad_count"] = [len(first), len(grads)]
    R["floor"] = _grad_equal(first, again)
    R["grad_equal"] = _grad_equal(first, grads)
    R["grad_norm"] = float(sum((g**2).sum() for g in first) ** 0.5)


def savers_gpt2(policy: str, batch: int = 16, seq: int = 512) -> None:
    """transformers' GPT-2 (a small config: 4 layers, width 256) in train mode, fp32, SDPA, dropout 0.1."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=seq, vocab_size=1000, attn_implementation="sdpa")

    def build() -> Any:
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config)
        R["attention"] = str(model.config._attn_implementation)
        R["dropout"] = [config.resid_pdrop, config.attn_pdrop, config.embd_pdrop]
        return model

    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1)).cuda()
    # use_cache=False, as transformers' own gradient checkpointing sets it: a cache filled inside a
    # recomputed block would be filled twice.
    _torch_saver_run(build, lambda model: model(ids, labels=ids, use_cache=False).loss, "GPT2Block", policy)


def savers_resnet(policy: str, batch: int = 32, size: int = 224) -> None:
    """timm's resnet18 (no weights downloaded) in train mode, fp32, each BasicBlock saved."""
    import timm
    import torch

    def build() -> Any:
        torch.manual_seed(0)
        return timm.create_model("resnet18", pretrained=False, num_classes=10, drop_rate=0.1)

    images = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1)).cuda()
    labels = torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(2)).cuda()
    _torch_saver_run(
        build, lambda model: torch.nn.functional.cross_entropy(model(images), labels), "BasicBlock", policy
    )


def savers_flax(policy: str, batch: int = 256, width: int = 1024, depth: int = 6) -> None:
    """A Flax linen model as Flax's docs write one (a Block class, nn.compact, nn.Dropout with its flag
    an attribute), its Block class saved with unimem.remat; XLA's compiled peak of the plain and saved
    training steps, and their gradients."""
    import unimem

    unimem.configure(backend="jax", limit=SAVERS_CAP)
    import flax
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np

    R["flax"] = flax.__version__

    class Block(nn.Module):
        width: int
        deterministic: bool = False

        @nn.compact
        def __call__(self, x: Any) -> Any:
            h = nn.Dense(4 * self.width)(nn.LayerNorm()(x))
            h = nn.Dropout(rate=0.1, deterministic=self.deterministic)(nn.gelu(h))
            return x + nn.Dense(self.width)(h)

    def model_of(block: Any) -> Any:
        class Model(nn.Module):
            @nn.compact
            def __call__(self, x: Any, train: bool) -> Any:
                for _ in range(depth):
                    x = block(width, deterministic=not train)(x)
                return nn.Dense(10)(x)

        return Model()

    x = jax.random.normal(jax.random.PRNGKey(0), (batch, width))
    labels = jax.random.randint(jax.random.PRNGKey(1), (batch,), 0, 10)
    plain, saved = model_of(Block), model_of(unimem.remat(Block, policy))
    params = plain.init(jax.random.PRNGKey(2), x, train=False)
    R["same_parameter_paths"] = jax.tree.structure(params) == jax.tree.structure(
        saved.init(jax.random.PRNGKey(2), x, train=False)
    )

    def grad_step(model: Any) -> Any:
        def loss(p: Any) -> Any:
            logits = model.apply(p, x, train=True, rngs={"dropout": jax.random.PRNGKey(3)})
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))

        return jax.jit(jax.grad(loss))

    def float64(tree: Any) -> list[Any]:
        return [np.asarray(leaf, dtype=np.float64) for leaf in jax.tree.leaves(jax.block_until_ready(tree))]

    peaks, grads = {}, {}
    for name, model in (("plain", plain), ("saver", saved)):
        step = grad_step(model)
        peaks[name] = int(step.lower(params).compile().memory_analysis().peak_memory_in_bytes)
        grads[name] = float64(step(params))
    R["plain_peak"], R["saver_peak"] = peaks["plain"], peaks["saver"]
    R["grad_norm"] = float(np.sqrt(sum(float(np.sum(g**2)) for g in grads["plain"])))
    R["grad_equal"] = _grad_equal(grads["plain"], grads["saver"])
    R["floor"] = _grad_equal(grads["plain"], float64(grad_step(plain)(params)))


SCENARIOS: dict[str, Callable[..., None]] = {
    f.__name__: f
    for f in (
        baseline_driver,
        baseline_torch,
        baseline_jax,
        torch_cap,
        jax_cap,
        jax_growth,
        jax_late,
        torch_prealloc,
        torch_allocator,
        torch_after_init,
        torch_clear_cache,
        torch_uncached,
        jax_clear_cache,
        torch_stats,
        jax_stats,
        nvml_stats,
        devices,
        mixed,
        jax_allocator,
        savers_gpt2,
        savers_resnet,
        savers_flax,
    )
}


def main() -> int:
    name = sys.argv[1]
    kwargs = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    started = time.perf_counter()
    code = 0
    try:
        SCENARIOS[name](**kwargs)
    except BaseException as exc:  # report, with the figures gathered so far
        R["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        traceback.print_exc()
        code = 1
    R["seconds"] = round(time.perf_counter() - started, 3)
    try:
        import unimem

        R["unimem_file"] = unimem.__file__
    except Exception:
        pass
    sys.stdout.write(MARK + json.dumps(R, default=str) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
