"""Backend names to lazily imported adapters.

Nothing here imports a framework or NVML: installed frameworks are found with
``importlib.util.find_spec`` and imported ones through ``sys.modules``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import BackendUnavailable, ConfigError
from .support import Support

if TYPE_CHECKING:
    from unimem.backends.base import Backend

__all__ = [
    "BACKENDS",
    "FRAMEWORKS",
    "available_backends",
    "canonical_name",
    "get_backend",
    "imported_frameworks",
]


@dataclass(frozen=True)
class Entry:
    module: str  # the top-level module the framework is imported as
    adapter: str  # "package.module:Class", imported on first use
    install: str  # what to run when it is missing


BACKENDS: dict[str, Entry] = {
    "torch": Entry("torch", "unimem.backends.torch_backend:TorchBackend", "pip install 'unimem[torch]'"),
    "tensorflow": Entry(
        "tensorflow",
        "unimem.backends.tensorflow_backend:TensorFlowBackend",
        "pip install 'unimem[tensorflow]' (tensorflow[and-cuda] for a GPU)",
    ),
    "jax": Entry("jax", "unimem.backends.jax_backend:JaxBackend", "pip install 'unimem[jax]' (jax[cuda12] for a GPU)"),
    "nvml": Entry("pynvml", "unimem.backends.nvml_backend:NvmlBackend", "pip install 'unimem[nvml]' (nvidia-ml-py)"),
}
FRAMEWORKS = ("torch", "tensorflow", "jax")
ALIASES = {"tf": "tensorflow", "pytorch": "torch", "pynvml": "nvml"}

_instances: dict[str, Backend] = {}
_lock = threading.Lock()


def canonical_name(name: object, parameter: str = "backend") -> str:
    """``"tf"`` -> ``"tensorflow"``; anything unknown is a ``ConfigError``."""
    if isinstance(name, str) and name in BACKENDS:  # already canonical: the common case in queries
        return name
    if not isinstance(name, str):
        raise ConfigError(parameter, f"backend names are strings, got {name!r}")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in BACKENDS:
        known = ", ".join([*BACKENDS, *ALIASES])
        raise ConfigError(parameter, f"unknown backend {name!r}; known: {known}")
    return key


def _installed(module: str) -> bool:
    if module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def available_backends() -> list[str]:
    """Backends whose framework (or NVML) is installed, found without importing it."""
    return [name for name, entry in BACKENDS.items() if _installed(entry.module)]


def imported_frameworks() -> list[str]:
    """Frameworks already imported in this process (never NVML)."""
    return [name for name in FRAMEWORKS if BACKENDS[name].module in sys.modules]


def get_backend(name: str) -> Backend:
    """The adapter for ``name`` (canonical or alias). Imports the adapter, not the framework."""
    backend = _instances.get(name) if isinstance(name, str) else None  # stats() in a loop: no parsing, no lock
    if backend is not None:
        return backend
    key = canonical_name(name)
    with _lock:
        backend = _instances.get(key)
        if backend is None:
            entry = BACKENDS[key]
            if not _installed(entry.module):
                raise BackendUnavailable(f"{key}: the '{entry.module}' module is not installed; {entry.install}")
            module_name, _, class_name = entry.adapter.partition(":")
            backend = getattr(importlib.import_module(module_name), class_name)()
            _instances[key] = backend
    return backend


def capability_table(name: str) -> dict[str, Support]:
    """The capability table of ``name``, installed or not (it is data)."""
    key = canonical_name(name)
    module_name, _, class_name = BACKENDS[key].adapter.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return dict(cls.CAPABILITIES)
