"""NVML (nvidia-ml-py) as a backend: the framework-free view of device and process memory.

It observes and never configures; every NVML call goes through the gate (``unimem.backends.nvml_gate``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import cached_property
from typing import Any, ClassVar

from unimem.backends import nvml_gate as gate
from unimem.backends.base import Backend, no_such_device
from unimem.backends.nvml_gate import Reading
from unimem.backends.steps import Step
from unimem.backends.topics import ObserveTopic

from unimem.config import Settings
from unimem.errors import UnsupportedFeature
from unimem.memory_stats import MemoryStats
from unimem.support import Level, Phase, Support

__all__ = ["NvmlBackend"]


_NO_CONFIG = "NVML observes; it cannot change what a framework allocates"
# Present wherever the NVIDIA driver is loaded (the kernel module; WSL's GPU device instead).
_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")


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
        "ranks.pin": Support(Level.UNSUPPORTED, note="NVML observes every GPU and pins nothing"),
        "ranks.cluster": Support(
            Level.UNSUPPORTED, note="NVML has no distributed runtime: initialise torch or jax.distributed"
        ),
        **{
            feature: Support(Level.UNSUPPORTED, note="NVML observes memory and runs no computation")
            for feature in ("remat.full", "remat.matmuls", "remat.offload", "accumulate", "ranks.batch_size")
        },
    }

    def phase(self) -> Phase:
        return (
            Phase.INITIALIZED
            if gate.initialized()
            else (Phase.IMPORTED if "pynvml" in sys.modules else Phase.NOT_IMPORTED)
        )

    def plan(self, settings: Settings) -> list[Step]:
        for setting in settings.given():
            raise UnsupportedFeature("nvml", setting, f"{_NO_CONFIG}; configure a framework backend")
        return []

    def stats(self, device: int = 0, *, nvml: bool = True) -> MemoryStats:
        pynvml = gate.load()  # an explicit NVML query on a machine without NVML is an error, not Nones
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None and device >= pynvml.nvmlDeviceGetCount():
            raise no_such_device("nvml", device, pynvml.nvmlDeviceGetCount())
        total, free, used = gate.device_figures(device)
        return MemoryStats("nvml", device, device_total=total, device_free=free, process_used=used)

    def reset_peak(self, device: int = 0) -> None:
        raise UnsupportedFeature("nvml", "reset_peak", "NVML keeps no peak; use a framework backend")

    def clear_cache(self, device: int = 0) -> int:
        raise UnsupportedFeature("nvml", "clear_cache", f"{_NO_CONFIG}; use a framework backend")

    @cached_property
    def observe(self) -> ObserveTopic:
        from .observe import NvmlObserve

        return NvmlObserve(self)

    # --- the device view the CLI, the monitor's sampler and compare read (all through the gate) ---
    def status(self) -> str:
        """``"ok"`` or the reason NVML cannot be used here (no driver, no GPU)."""
        return gate.nvml_status()

    def device_count(self) -> int | None:
        """NVML devices on the machine; None when NVML cannot be used."""
        return gate.device_count()

    def gpu_count(self) -> tuple[int | None, str]:
        """GPUs NVML counts on this host, and how that was found; None when NVML cannot tell.

        On Linux with no NVIDIA driver loaded NVML cannot answer, so it is not imported to find
        that out: ``configure`` asks this, and must not import NVML for nothing.
        """
        if sys.platform.startswith("linux") and not any(os.path.exists(path) for path in _DRIVER_PATHS):
            return None, "NVML cannot count GPUs here: no NVIDIA driver is loaded (no /proc/driver/nvidia)"
        count = gate.device_count()
        if count is None:
            return None, f"NVML cannot count GPUs here ({gate.nvml_status()})"
        return count, f"NVML counts {count} GPU(s) on this host"

    def devices(self) -> list[dict[str, Any]]:
        """Index, name, UUID, driver, total and free bytes of every NVML device."""
        return gate.devices_info()

    def device_usage(self, index: int) -> tuple[dict[str, Any], list[tuple[int, int | None]]]:
        """Memory of NVML device ``index`` and its compute processes; a failure is the row's ``error``."""
        return gate.device_usage(index)

    def processes(self, index: int) -> list[tuple[int, int | None]]:
        """``(pid, bytes)`` of every compute process NVML lists on NVML device ``index``."""
        return gate.processes(index)

    def device_figures(self, device: int, uuid: str | None = None) -> tuple[int | None, int | None, int | None]:
        """``(device_total, device_free, process_used)`` of CUDA device ``device``; None for each unknown."""
        return gate.device_figures(device, uuid)

    def probe(self, device: int, pid: int, uuid: str | None = None) -> Callable[[], Reading]:
        """A fast reader of ``(device_total, device_used, process_used)`` of process ``pid`` on CUDA
        device ``device``; ``BackendUnavailable`` when NVML cannot be used here."""
        return gate.probe(device, pid, uuid)
