"""NVML (nvidia-ml-py): the framework-free ground truth for device and process memory.

NVML is initialised lazily under a lock and never shut down (other code in the
process may use it too). Failures are remembered so a machine without a driver
costs one failed ``nvmlInit`` per process, not one per query.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Any, ClassVar

from unimem.config import Settings
from unimem.errors import BackendUnavailable, UnsupportedFeature
from unimem.stats import MemoryStats
from unimem.support import Level, Phase, Support

from .base import Backend, Step, no_such_device

__all__ = ["NvmlBackend", "device_figures", "nvml_status"]

_lock = threading.Lock()
_pynvml: Any = None
_init_error: str | None = None
_handles: dict[tuple[int, str | None], Any] = {}
_use_v2 = True


def _load() -> Any:
    """pynvml, initialised; raises ``BackendUnavailable`` saying why not."""
    global _pynvml, _init_error
    if _pynvml is not None:
        return _pynvml
    with _lock:
        if _pynvml is not None:
            return _pynvml
        if _init_error is not None:
            raise BackendUnavailable(_init_error)
        try:
            import pynvml
        except ImportError:
            _init_error = "nvml: nvidia-ml-py is not installed; pip install 'unimem[nvml]'"
            raise BackendUnavailable(_init_error) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            _init_error = (
                f"nvml: nvmlInit failed ({exc}); the NVIDIA driver is probably not installed "
                "or this machine has no NVIDIA GPU"
            )
            raise BackendUnavailable(_init_error) from exc
        _pynvml = pynvml
        return pynvml


def nvml_status() -> str:
    """``"ok"`` or the reason NVML cannot be used here."""
    try:
        _load()
    except BackendUnavailable as exc:
        return str(exc)
    return "ok"


def _visible_entry(ordinal: int) -> str | None:
    """The CUDA_VISIBLE_DEVICES entry CUDA ordinal ``ordinal`` refers to, or None if unset.

    CUDA stops reading the list at the first invalid entry, so the list is cut there.
    """
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    entries: list[str] = []
    for part in raw.split(","):
        part = part.strip()
        if part.isdigit() or part.startswith(("GPU-", "MIG-")):
            entries.append(part)
        else:
            break
    if ordinal >= len(entries):
        raise IndexError(f"CUDA device {ordinal} is not visible (CUDA_VISIBLE_DEVICES={raw!r})")
    return entries[ordinal]


def _handle(ordinal: int, uuid: str | None = None) -> Any:
    """NVML handle of CUDA device ``ordinal``.

    NVML numbers devices by PCI bus order over the whole machine; CUDA numbers the
    visible ones. Map through the UUID when the framework knows it, else through
    CUDA_VISIBLE_DEVICES (an index or a UUID prefix).
    """
    pynvml = _load()
    entry = uuid if uuid is not None else _visible_entry(ordinal)
    key = (ordinal, entry)
    handle = _handles.get(key)
    if handle is not None:
        return handle
    if entry is None:
        handle = pynvml.nvmlDeviceGetHandleByIndex(ordinal)
    elif entry.isdigit():
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(entry))
    else:
        wanted = entry if entry.startswith(("GPU-", "MIG-")) else f"GPU-{entry}"
        for index in range(pynvml.nvmlDeviceGetCount()):
            candidate = pynvml.nvmlDeviceGetHandleByIndex(index)
            found = pynvml.nvmlDeviceGetUUID(candidate)
            found = found.decode() if isinstance(found, bytes) else found
            if found.startswith(wanted):
                handle = candidate
                break
        else:
            raise IndexError(f"no NVML device has UUID {entry}")
    _handles[key] = handle
    return handle


def device_figures(ordinal: int, uuid: str | None = None) -> tuple[int | None, int | None, int | None]:
    """``(device_total, device_free, process_used)`` from NVML; ``None`` for each unknown."""
    global _use_v2
    try:
        pynvml = _load()
        handle = _handle(ordinal, uuid)
    except (BackendUnavailable, IndexError):
        return None, None, None
    except Exception:  # an NVMLError for a device that vanished: no figures, no crash
        return None, None, None
    total = free = used = None
    try:
        if _use_v2:
            try:
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported, AttributeError):
                _use_v2 = False  # old driver: v1 "used" also counts reserved memory
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        else:
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        total, free = int(memory.total), int(memory.free)
    except pynvml.NVMLError:
        pass
    try:
        used = process_used(handle)
    except pynvml.NVMLError:
        used = None
    return total, free, used


def process_used(handle: Any) -> int | None:
    """Bytes NVML counts for this process on ``handle``; None if it does not list us.

    A process missing from the list may have no context there, or live in a PID
    namespace NVML does not see into: the two cannot be told apart, so None.
    """
    pid = os.getpid()
    listed = _processes_in_one_call(handle)
    if listed is None:
        listed = [(p.pid, p.usedGpuMemory) for p in _pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    total = None
    for proc_pid, used in listed:
        if proc_pid == pid and used is not None:
            total = (total or 0) + int(used)
    return total


_PROCESS_SLOTS = 64
_process_query: Any = None  # (function, array type) once looked up; False if this pynvml lacks them


def _processes_in_one_call(handle: Any) -> list[tuple[int, int | None]] | None:
    """``(pid, bytes)`` of every compute process on ``handle``, in one NVML call.

    pynvml's nvmlDeviceGetComputeRunningProcesses makes two (the first only sizes the
    array) and builds an object per process: 26.5 of the 32 µs stats() spent in NVML on
    an H200 (benchmarks/results/gpu-h200.json). Same function and struct as pynvml uses.
    None when more processes than slots run there or this pynvml lacks the pieces: the
    caller then asks pynvml's public call.
    """
    global _process_query
    pynvml = _pynvml
    if _process_query is None:
        try:
            function = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
            _process_query = (function, pynvml.c_nvmlProcessInfo_v3_t * _PROCESS_SLOTS)
        except Exception:  # an old driver or pynvml: the public call still works
            _process_query = False
    if _process_query is False:
        return None
    function, array_type = _process_query
    slots = array_type()
    count = ctypes.c_uint(_PROCESS_SLOTS)
    code = function(handle, ctypes.byref(count), slots)
    if code == pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
        return None
    if code != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(code)
    unavailable = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
    return [
        (int(slot.pid), None if slot.usedGpuMemory == unavailable else int(slot.usedGpuMemory))
        for slot in slots[: count.value]
    ]


def device_count() -> int | None:
    try:
        return int(_load().nvmlDeviceGetCount())
    except Exception:
        return None


def devices_info() -> list[dict[str, Any]]:
    """Name, UUID, driver and memory of every NVML device (for ``unimem info``)."""
    pynvml = _load()
    driver = pynvml.nvmlSystemGetDriverVersion()
    driver = driver.decode() if isinstance(driver, bytes) else driver
    out = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        out.append(
            {
                "index": index,
                "name": name.decode() if isinstance(name, bytes) else name,
                "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                "driver": driver,
                "total": int(memory.total),
                "free": int(memory.free),
            }
        )
    return out


_NO_CONFIG = "NVML observes; it cannot change what a framework allocates"


class NvmlBackend(Backend):
    name = "nvml"
    module = "pynvml"
    distributions = ("nvidia-ml-py", "pynvml")
    CAPABILITIES: ClassVar[dict[str, Support]] = {
        **{
            feature: Support(Level.UNSUPPORTED, note=_NO_CONFIG)
            for feature in (
                "fraction",
                "limit",
                "growth",
                "preallocate",
                "allocator.default",
                "allocator.async",
                "allocator.expandable",
                "allocator.uncached",
                "devices",
            )
        },
        **{
            feature: Support(Level.UNSUPPORTED, note="NVML sees the device, not a framework's pool")
            for feature in (
                "stats.allocated",
                "stats.reserved",
                "stats.peak",
                "stats.limit",
                "stats.largest_free_block",
                "stats.num_allocs",
            )
        },
        "stats.device": Support(Level.NATIVE, "nvmlDeviceGetMemoryInfo (v2, v1 on old drivers)"),
        "stats.process_used": Support(
            Level.NATIVE,
            "nvmlDeviceGetComputeRunningProcesses",
            note="None where NVML does not list this PID (another PID namespace)",
        ),
        "reset_peak": Support(Level.UNSUPPORTED, note="NVML keeps no peak"),
        "clear_cache": Support(Level.UNSUPPORTED, note=_NO_CONFIG),
        **{
            feature: Support(Level.UNSUPPORTED, note="NVML observes memory and runs no computation")
            for feature in ("precision.bf16", "precision.fp16", "precision.loss_scaling")
        },
        "oom": Support(Level.UNSUPPORTED, note="NVML runs no computation and raises no out-of-memory error"),
        "fragmentation": Support(Level.UNSUPPORTED, note="NVML sees device memory, not a framework's pool"),
        "batch_size": Support(Level.UNSUPPORTED, note="NVML runs no step"),
    }

    def phase(self) -> Phase:
        return (
            Phase.INITIALIZED
            if _pynvml is not None
            else (Phase.IMPORTED if "pynvml" in sys.modules else Phase.NOT_IMPORTED)
        )

    def plan(self, settings: Settings) -> list[Step]:
        for setting in settings.given():
            raise UnsupportedFeature("nvml", setting, f"{_NO_CONFIG}; configure a framework backend")
        return []

    def stats(self, device: int = 0, *, nvml: bool = True) -> MemoryStats:
        pynvml = _load()  # an explicit NVML query on a machine without NVML is an error, not Nones
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None and device >= pynvml.nvmlDeviceGetCount():
            raise no_such_device("nvml", device, pynvml.nvmlDeviceGetCount())
        total, free, used = device_figures(device)
        return MemoryStats("nvml", device, device_total=total, device_free=free, process_used=used)

    def reset_peak(self, device: int = 0) -> None:
        raise UnsupportedFeature("nvml", "reset_peak", "NVML keeps no peak; use a framework backend")

    def clear_cache(self, device: int = 0) -> int:
        raise UnsupportedFeature("nvml", "clear_cache", f"{_NO_CONFIG}; use a framework backend")
