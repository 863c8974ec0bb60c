"""unimem: one GPU-memory API for PyTorch, TensorFlow, JAX and CuPy, with NVML as ground truth.

``import unimem`` imports no framework and no NVML. The public names are in ``__all__``:
``configure`` and ``stats`` to start with; ``docs/api/`` documents every one.
"""

from __future__ import annotations

# Not `from typing import TYPE_CHECKING`: importing typing alone costs more than the rest of
# `import unimem` (docs/measurements.md, "Import cost"); type checkers read this name too.
TYPE_CHECKING = False

# Every public name loads on first use (PEP 562): `import unimem` reads this file and
# nothing else, so a training script pays for what it calls, when it calls it.
_LAZY: dict[str, str] = {
    "capabilities": "api",
    "clear_cache": "api",
    "configure": "api",
    "configure_from_env": "api",
    "reset_peak": "api",
    "stats": "api",
    "summary": "api",
    "Action": "applied",
    "Applied": "applied",
    "BackendConfiguration": "in_force",
    "Configuration": "in_force",
    "configuration": "in_force",
    "BackendUnavailable": "errors",
    "ConfigError": "errors",
    "OutOfMemory": "errors",
    "TooLateError": "errors",
    "UnimemError": "errors",
    "UnimemWarning": "errors",
    "UnsupportedFeature": "errors",
    "available_backends": "registry",
    "AccumulationPlan": "accumulation",
    "MicroBatch": "accumulation",
    "accumulate": "accumulation",
    "accumulate_grads": "accumulation",
    "plan_accumulation": "accumulation",
    "ClusterError": "cluster",
    "ClusterStats": "cluster",
    "cluster_stats": "cluster",
    "RankInfo": "ranks",
    "StrayMemory": "ranks",
    "local_device": "ranks",
    "rank_info": "ranks",
    "rank_path": "ranks",
    "stray_memory": "ranks",
    "format_bytes": "sizes",
    "parse_size": "sizes",
    "MemoryStats": "memory_stats",
    "Level": "support",
    "Phase": "support",
    "Support": "support",
    "When": "support",
    "BatchSizeSearch": "batch_size",
    "Trial": "batch_size",
    "find_batch_size": "batch_size",
    "MemoryHook": "hook",
    "LossScaler": "loss_scaling",
    "Monitor": "monitoring",
    "monitor": "monitoring",
    "is_oom": "oom",
    "oom_guard": "oom",
    "OOMReport": "oom_report",
    "Suggestion": "oom_report",
    "Fragmentation": "pool_fragmentation",
    "fragmentation": "pool_fragmentation",
    "Policy": "precision",
    "mixed_precision": "precision",
    "offload": "savers",
    "remat": "savers",
    "Profile": "profiling",
    "profile": "profiling",
    "RankLine": "plotting",
    "RanksPlot": "plotting",
    "plot_recordings": "plotting",
    "Mark": "recording",
    "Recording": "recording",
    "Sample": "recording",
    "load_recording": "recording",
    "Tracked": "tracking",
    "track": "tracking",
}

if TYPE_CHECKING:
    from typing import Any

    from .accumulation import AccumulationPlan, MicroBatch, accumulate, accumulate_grads, plan_accumulation
    from .api import capabilities, clear_cache, configure, configure_from_env, reset_peak, stats, summary
    from .applied import Action, Applied
    from .batch_size import BatchSizeSearch, Trial, find_batch_size
    from .cluster import ClusterError, ClusterStats, cluster_stats
    from .errors import (
        BackendUnavailable,
        ConfigError,
        OutOfMemory,
        TooLateError,
        UnimemError,
        UnimemWarning,
        UnsupportedFeature,
    )
    from .hook import MemoryHook
    from .in_force import BackendConfiguration, Configuration, configuration
    from .loss_scaling import LossScaler
    from .memory_stats import MemoryStats
    from .monitoring import Monitor, monitor
    from .oom import is_oom, oom_guard
    from .oom_report import OOMReport, Suggestion
    from .plotting import RankLine, RanksPlot, plot_recordings
    from .pool_fragmentation import Fragmentation, fragmentation
    from .precision import Policy, mixed_precision
    from .profiling import Profile, profile
    from .ranks import RankInfo, StrayMemory, local_device, rank_info, rank_path, stray_memory
    from .recording import Mark, Recording, Sample, load_recording
    from .registry import available_backends
    from .savers import offload, remat
    from .sizes import format_bytes, parse_size
    from .support import Level, Phase, Support, When
    from .tracking import Tracked, track


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'unimem' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module_name}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "AccumulationPlan",
    "Action",
    "Applied",
    "BackendConfiguration",
    "BackendUnavailable",
    "BatchSizeSearch",
    "ClusterError",
    "ClusterStats",
    "ConfigError",
    "Configuration",
    "Fragmentation",
    "Level",
    "LossScaler",
    "Mark",
    "MemoryHook",
    "MemoryStats",
    "MicroBatch",
    "Monitor",
    "OOMReport",
    "OutOfMemory",
    "Phase",
    "Policy",
    "Profile",
    "RankInfo",
    "RankLine",
    "RanksPlot",
    "Recording",
    "Sample",
    "StrayMemory",
    "Suggestion",
    "Support",
    "TooLateError",
    "Tracked",
    "Trial",
    "UnimemError",
    "UnimemWarning",
    "UnsupportedFeature",
    "When",
    "accumulate",
    "accumulate_grads",
    "available_backends",
    "capabilities",
    "clear_cache",
    "cluster_stats",
    "configuration",
    "configure",
    "configure_from_env",
    "find_batch_size",
    "format_bytes",
    "fragmentation",
    "is_oom",
    "load_recording",
    "local_device",
    "mixed_precision",
    "monitor",
    "offload",
    "oom_guard",
    "parse_size",
    "plan_accumulation",
    "plot_recordings",
    "profile",
    "rank_info",
    "rank_path",
    "remat",
    "reset_peak",
    "stats",
    "stray_memory",
    "summary",
    "track",
]
