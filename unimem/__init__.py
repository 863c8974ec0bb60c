"""unimem: one GPU-memory API for PyTorch, TensorFlow and JAX, with NVML as ground truth.

``import unimem`` imports no framework and no NVML.
"""

from __future__ import annotations

from .api import (
    capabilities,
    clear_cache,
    configure,
    configure_from_env,
    reset_peak,
    stats,
    summary,
)
from .applied import Action, Applied
from .batch_size import BatchSizeSearch, Trial, find_batch_size
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
from .loss_scaling import LossScaler
from .monitor import Monitor, monitor
from .oom import is_oom, oom_guard
from .oom_report import OOMReport, Suggestion
from .pool_fragmentation import Fragmentation, fragmentation
from .precision import Policy, mixed_precision
from .profile import Profile, profile
from .recording import Mark, Recording, Sample, load_recording
from .registry import available_backends
from .sizes import format_bytes, parse_size
from .stats import MemoryStats
from .support import Level, Phase, Support, When
from .track import Tracked, track

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Applied",
    "BackendUnavailable",
    "BatchSizeSearch",
    "ConfigError",
    "Fragmentation",
    "Level",
    "LossScaler",
    "Mark",
    "MemoryHook",
    "MemoryStats",
    "Monitor",
    "OOMReport",
    "OutOfMemory",
    "Phase",
    "Policy",
    "Profile",
    "Recording",
    "Sample",
    "Suggestion",
    "Support",
    "TooLateError",
    "Tracked",
    "Trial",
    "UnimemError",
    "UnimemWarning",
    "UnsupportedFeature",
    "When",
    "available_backends",
    "capabilities",
    "clear_cache",
    "configure",
    "configure_from_env",
    "find_batch_size",
    "format_bytes",
    "fragmentation",
    "is_oom",
    "load_recording",
    "mixed_precision",
    "monitor",
    "oom_guard",
    "parse_size",
    "profile",
    "reset_peak",
    "stats",
    "summary",
    "track",
]
