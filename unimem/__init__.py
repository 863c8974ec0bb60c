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
    "ConfigError",
    "Level",
    "LossScaler",
    "Mark",
    "MemoryHook",
    "MemoryStats",
    "Monitor",
    "OutOfMemory",
    "Phase",
    "Policy",
    "Profile",
    "Recording",
    "Sample",
    "Support",
    "TooLateError",
    "Tracked",
    "UnimemError",
    "UnimemWarning",
    "UnsupportedFeature",
    "When",
    "available_backends",
    "capabilities",
    "clear_cache",
    "configure",
    "configure_from_env",
    "format_bytes",
    "load_recording",
    "mixed_precision",
    "monitor",
    "parse_size",
    "profile",
    "reset_peak",
    "stats",
    "summary",
    "track",
]
