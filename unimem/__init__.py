"""unimem: one GPU-memory API for PyTorch, TensorFlow, JAX and CuPy, with NVML as ground truth.

``import unimem`` imports no framework and no NVML. The public names are in ``__all__``:
``configure`` and ``stats`` to start with. ``docs/guides/`` shows each task, ``docs/explanation/``
says why, and ``docs/api/`` documents every name.
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
    "ClusterError": "errors",
    "ConfigError": "errors",
    "OutOfMemory": "errors",
    "TooLateError": "errors",
    "UnimemError": "errors",
    "UnimemWarning": "errors",
    "UnsupportedFeature": "errors",
    "available_backends": "registry",
    "AccumulationPlan": "training.accumulation",
    "MicroBatch": "training.accumulation",
    "accumulate": "training.accumulation",
    "accumulate_grads": "training.accumulation",
    "plan_accumulation": "training.accumulation",
    "ClusterStats": "observe.cluster",
    "cluster_stats": "observe.cluster",
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
    "BatchSizeSearch": "search.batch_size",
    "Trial": "search.batch_size",
    "find_batch_size": "search.batch_size",
    "MemoryHook": "observe.hook",
    "LossScaler": "loss_scaling",
    "Monitor": "observe.monitor",
    "monitor": "observe.monitor",
    "is_oom": "diagnose.guard",
    "oom_guard": "diagnose.guard",
    "OOMReport": "diagnose.report",
    "Suggestion": "diagnose.report",
    "Fragmentation": "pool_fragmentation",
    "fragmentation": "pool_fragmentation",
    "Policy": "training.precision",
    "mixed_precision": "training.precision",
    "offload": "training.savers",
    "remat": "training.savers",
    "remat_model": "training.savers",
    "Profile": "observe.profile",
    "profile": "observe.profile",
    "RankLine": "observe.plotting",
    "RanksPlot": "observe.plotting",
    "plot_recordings": "observe.recording",
    "Mark": "observe.samples",
    "Recording": "observe.recording",
    "Sample": "observe.samples",
    "load_recording": "observe.recording",
    "Tracked": "observe.track",
    "track": "observe.track",
}

if TYPE_CHECKING:
    from typing import Any

    from unimem.api import capabilities, clear_cache, configure, configure_from_env, reset_peak, stats, summary
    from unimem.applied import Action, Applied
    from unimem.diagnose.guard import is_oom, oom_guard
    from unimem.diagnose.report import OOMReport, Suggestion
    from unimem.errors import (
        BackendUnavailable,
        ClusterError,
        ConfigError,
        OutOfMemory,
        TooLateError,
        UnimemError,
        UnimemWarning,
        UnsupportedFeature,
    )
    from unimem.in_force import BackendConfiguration, Configuration, configuration
    from unimem.loss_scaling import LossScaler
    from unimem.memory_stats import MemoryStats
    from unimem.observe.cluster import ClusterStats, cluster_stats
    from unimem.observe.hook import MemoryHook
    from unimem.observe.monitor import Monitor, monitor
    from unimem.observe.plotting import RankLine, RanksPlot
    from unimem.observe.profile import Profile, profile
    from unimem.observe.recording import Recording, load_recording, plot_recordings
    from unimem.observe.samples import Mark, Sample
    from unimem.observe.track import Tracked, track
    from unimem.pool_fragmentation import Fragmentation, fragmentation
    from unimem.ranks import RankInfo, StrayMemory, local_device, rank_info, rank_path, stray_memory
    from unimem.registry import available_backends
    from unimem.search.batch_size import BatchSizeSearch, Trial, find_batch_size
    from unimem.sizes import format_bytes, parse_size
    from unimem.support import Level, Phase, Support, When
    from unimem.training.accumulation import (
        AccumulationPlan,
        MicroBatch,
        accumulate,
        accumulate_grads,
        plan_accumulation,
    )
    from unimem.training.precision import Policy, mixed_precision
    from unimem.training.savers import offload, remat, remat_model


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
    "remat_model",
    "reset_peak",
    "stats",
    "stray_memory",
    "summary",
    "track",
]
