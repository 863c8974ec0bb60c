"""The NVML gate: the one way into nvidia-ml-py for adapters, the CLI, the monitor and compare.

NVML is initialised lazily under a lock and never shut down (other code in the
process may use it too). Failures are remembered so a machine without a driver
costs one failed ``nvmlInit`` per process, not one per query.

A failure is kept as its reason; the error raised names the backend once (``nvml: <reason>``),
and ``nvml_status()`` answers the bare reason, which its callers show under their own label.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any

from unimem.errors import BackendUnavailable

__all__ = [
    "device_count",
    "device_figures",
    "device_usage",
    "devices_info",
    "handle",
    "initialized",
    "load",
    "nvml_status",
    "probe",
    "process_used",
    "processes",
]

_lock = threading.Lock()
_pynvml: Any = None
_init_error: str | None = None
_handles: dict[tuple[int, str | None], Any] = {}
_use_v2 = True


def load() -> Any:
    """pynvml, initialised; raises ``BackendUnavailable`` saying why not."""
    global _pynvml, _init_error
    if _pynvml is not None:
        return _pynvml
    with _lock:
        if _pynvml is not None:
            return _pynvml
        if _init_error is not None:
            raise _unavailable(_init_error)
        try:
            import pynvml
        except ImportError:
            _init_error = "nvidia-ml-py is not installed; pip install nvidia-ml-py (unimem depends on it)"
            raise _unavailable(_init_error) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            _init_error = (
                f"nvmlInit failed ({exc}); the NVIDIA driver is probably not installed "
                "or this machine has no NVIDIA GPU"
            )
            raise _unavailable(_init_error) from exc
        _pynvml = pynvml
        return pynvml


def _unavailable(reason: str) -> BackendUnavailable:
    return BackendUnavailable(f"nvml: {reason}")


def nvml_status() -> str:
    """``"ok"`` or the reason NVML cannot be used here, without a prefix (callers label it)."""
    try:
        load()
    except BackendUnavailable:
        return _init_error or "nvml could not be loaded"
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


def handle(ordinal: int, uuid: str | None = None) -> Any:
    """NVML handle of CUDA device ``ordinal``.

    NVML numbers devices by PCI bus order over the whole machine; CUDA numbers the
    visible ones. Map through the UUID when the framework knows it, else through
    CUDA_VISIBLE_DEVICES (an index or a UUID prefix).
    """
    pynvml = load()
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
        pynvml = load()
        device = handle(ordinal, uuid)
    except (BackendUnavailable, IndexError):
        return None, None, None
    except Exception:  # an NVMLError for a device that vanished: no figures, no crash
        return None, None, None
    total = free = used = None
    try:
        if _use_v2:
            try:
                memory = pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2)
            except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported, AttributeError):
                _use_v2 = False  # old driver: v1 "used" also counts reserved memory
                memory = pynvml.nvmlDeviceGetMemoryInfo(device)
        else:
            memory = pynvml.nvmlDeviceGetMemoryInfo(device)
        total, free = int(memory.total), int(memory.free)
    except pynvml.NVMLError:
        pass
    try:
        used = process_used(device)
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
    array) and builds an object per process: most of what stats() spends in NVML
    (docs/measurements.md, "stats() latency"). Same function and struct as pynvml uses.
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
        return int(load().nvmlDeviceGetCount())
    except Exception:
        return None


def devices_info() -> list[dict[str, Any]]:
    """Name, UUID, driver and memory of every NVML device (for ``unimem info``)."""
    pynvml = load()
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


def device_usage(index: int) -> tuple[dict[str, Any], list[tuple[int, int | None]]]:
    """Name and memory of NVML device ``index``, and ``(pid, bytes)`` of its compute processes.

    An NVML error on this device becomes the row's ``error`` (processes listed so far are
    kept): one failing device must not blank the others in ``unimem watch``.
    """
    pynvml = load()
    row: dict[str, Any] = {"index": index, "name": "?", "total": None, "used": None, "free": None, "error": None}
    listed: list[tuple[int, int | None]] = []
    try:
        device = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(device)
        row["name"] = name.decode() if isinstance(name, bytes) else name
        memory = pynvml.nvmlDeviceGetMemoryInfo(device)
        row.update(total=int(memory.total), free=int(memory.free), used=int(memory.total) - int(memory.free))
        listed = processes(index)
    except pynvml.NVMLError as exc:
        row["error"] = str(exc)
    return row, listed


def initialized() -> bool:
    """Whether NVML has been initialised in this process (no call is made)."""
    return _pynvml is not None


def processes(index: int) -> list[tuple[int, int | None]]:
    """``(pid, bytes)`` of every compute process NVML lists on NVML device ``index``.

    A process of another PID namespace (a container) is not listed: absence is not proof.
    """
    pynvml = load()
    device = pynvml.nvmlDeviceGetHandleByIndex(index)
    listed = _processes_in_one_call(device)
    if listed is None:
        listed = [(int(p.pid), p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(device)]
    return [(pid, None if used is None else int(used)) for pid, used in listed]


Reading = tuple[int | None, int | None, int | None]


def probe(ordinal: int, pid: int, uuid: str | None = None) -> Callable[[], Reading]:
    """A reader of ``(device_total, device_used, process_used)`` for CUDA device ``ordinal``
    and process ``pid``, for a sampler polling at up to 1 kHz: the handle is found once.

    Raises ``BackendUnavailable`` when NVML cannot be used here; a failed reading raises
    NVML's error (the caller records a gap).
    """
    pynvml = load()
    device = handle(ordinal, uuid)
    use_v2 = True

    def read() -> Reading:
        nonlocal use_v2
        if use_v2:
            try:
                memory = pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2)
            except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported, AttributeError):
                use_v2 = False  # an old driver: v1's "used" also counts reserved memory
                memory = pynvml.nvmlDeviceGetMemoryInfo(device)
        else:
            memory = pynvml.nvmlDeviceGetMemoryInfo(device)
        used = None
        listed = _processes_in_one_call(device)
        if listed is None:
            listed = [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(device)]
        for proc_pid, proc_used in listed:
            if proc_pid == pid and proc_used is not None:
                used = (used or 0) + int(proc_used)
        total = int(memory.total)
        return total, total - int(memory.free), used

    return read
