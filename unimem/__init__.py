"""unimem: one GPU-memory API for PyTorch, TensorFlow, JAX and CuPy, with NVML as ground truth.

``import unimem`` imports no framework and no NVML. The public names are in ``__all__``:
``configure`` and ``stats`` to start with. ``docs/guides/`` shows each task, ``docs/explanation/``
says why, and ``docs/api/`` documents every name.
"""

from __future__ import annotations

# Not `from typing import TYPE_CHECKING`: importing typing alone costs more than the rest of
# `import unimem` (docs/measurements.md, "Import cost").
TYPE_CHECKING = False

# Every public name loads on first use (PEP 562): `import unimem` reads this file and
# nothing else, so a training script pays for what it calls, when it calls it. The one list of
# public names: `__all__` is made from it, and so is `__init__.pyi`, which type checkers read.
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
    "SearchError": "errors",
    "TooLateError": "errors",
    "UnimemError": "errors",
    "UnimemWarning": "errors",
    "UnsupportedFeature": "errors",
    "available_backends": "registry",
    "MemoryEstimate": "estimate.result",
    "SizeEstimate": "estimate.result",
    "estimate_memory": "estimate.api",
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

__all__ = sorted(_LAZY)
