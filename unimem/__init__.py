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
from .loss_scaling import LossScaler
from .precision import Policy, mixed_precision
from .registry import available_backends
from .sizes import format_bytes, parse_size
from .stats import MemoryStats
from .support import Level, Phase, Support, When

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Applied",
    "BackendUnavailable",
    "ConfigError",
    "Level",
    "LossScaler",
    "MemoryStats",
    "OutOfMemory",
    "Phase",
    "Policy",
    "Support",
    "TooLateError",
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
    "mixed_precision",
    "parse_size",
    "reset_peak",
    "stats",
    "summary",
]
