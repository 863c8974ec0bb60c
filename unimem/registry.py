"""The registry: backend names, their lazily imported adapters, and the one rule for ``backend=None``.

This table is the only place in the front that names a framework, and nothing here imports a
framework or NVML. The rule ``resolve`` keeps, and why: docs/explanation/backend-rule.md;
plug-ins through the entry-point group ``unimem.backends``: docs/api/backends.md.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from unimem.errors import BackendUnavailable, ConfigError
from unimem.support import Phase, Support

if TYPE_CHECKING:
    from unimem.backends.base import Backend

__all__ = [
    "BACKENDS",
    "ENTRY_POINT_GROUP",
    "all_backends",
    "frameworks",
    "FRAMEWORKS",
    "FRAMEWORK_FREE",
    "adapter_class",
    "available_backends",
    "canonical_name",
    "configured",
    "framework_of_object",
    "get_backend",
    "imported_frameworks",
    "note_configured",
    "resolve",
    "started_frameworks",
    "topic_members",
]


@dataclass(frozen=True)
class Entry:
    module: str  # the top-level module the framework is imported as
    adapter: str  # "package.module:Class", imported on first use
    install: str  # what to run when it is missing
    framework: bool = True  # False for the framework-free view, which observes and runs nothing
    imported_by: tuple[str, ...] = ()  # modules that import this framework themselves when imported


BACKENDS: dict[str, Entry] = {
    "torch": Entry(
        "torch",
        "unimem.backends.torch.adapter:TorchBackend",
        "pip install 'unimem[torch]'",
        imported_by=("transformers",),
    ),
    "tensorflow": Entry(
        "tensorflow",
        "unimem.backends.tensorflow.adapter:TensorFlowBackend",
        "pip install 'unimem[tensorflow]' (tensorflow[and-cuda] for a GPU)",
    ),
    "jax": Entry(
        "jax",
        "unimem.backends.jax.adapter:JaxBackend",
        "pip install 'unimem[jax]' (jax[cuda12] for a GPU)",
        imported_by=("tensorflow", "keras"),
    ),
    "cupy": Entry("cupy", "unimem.backends.cupy.adapter:CupyBackend", "pip install 'unimem[cupy]' (cupy-cuda12x)"),
    "nvml": Entry(
        "pynvml",
        "unimem.backends.nvml.adapter:NvmlBackend",
        "pip install nvidia-ml-py (a dependency of unimem: reinstall unimem)",
        framework=False,
    ),
}
ALIASES = {"tf": "tensorflow", "pytorch": "torch", "pynvml": "nvml"}
# The libraries whose objects belong to one framework, by the top-level module their classes
# come from; Keras answers with the backend it runs on (``keras.config.backend()``).
OBJECT_LIBRARIES = {
    "torch": "torch",
    "tensorflow": "tensorflow",
    "tf_keras": "tensorflow",
    "jax": "jax",
    "jaxlib": "jax",
    "flax": "jax",
    "equinox": "jax",
    "haiku": "jax",
}
MULTI_BACKEND_LIBRARY = "keras"
FRAMEWORK_FREE = next(name for name, entry in BACKENDS.items() if not entry.framework)
FRAMEWORKS = tuple(name for name, entry in BACKENDS.items() if entry.framework)

ENTRY_POINT_GROUP = "unimem.backends"
_plugins: dict[str, Entry] = {}  # from entry points, once discovered
_discovered = False
_instances: dict[str, Backend] = {}
_configured: list[str] = []  # frameworks the user named to configure(), in order
_lock = threading.RLock()


def _discover() -> None:
    """Read the entry points of third-party backends, once per process."""
    global _discovered
    if _discovered:
        return
    with _lock:
        if _discovered:
            return
        from importlib.metadata import entry_points

        for point in entry_points(group=ENTRY_POINT_GROUP):
            if point.name in BACKENDS or point.name in ALIASES or point.name in _plugins:
                continue
            dist = getattr(point, "dist", None)
            source = f"the {dist.name} distribution" if dist is not None else "its distribution"
            try:
                module_name, _, class_name = point.value.partition(":")
                cls = getattr(importlib.import_module(module_name), class_name)
            except Exception as exc:  # a broken plug-in must not break unimem: it is left out, with the reason
                import warnings

                from unimem.errors import UnimemWarning

                warnings.warn(
                    f"backend plug-in {point.name!r} ({point.value}) not loaded: {exc}", UnimemWarning, stacklevel=3
                )
                continue
            _plugins[point.name] = Entry(cls.module, point.value, f"reinstall {source}")
        _discovered = True


def _entry(name: str) -> Entry:
    return BACKENDS[name] if name in BACKENDS else _plugins[name]


def all_backends() -> list[str]:
    """Every backend name: the built-in table, then plug-ins (entry points are read here)."""
    _discover()
    return [*BACKENDS, *_plugins]


def canonical_name(name: object, parameter: str = "backend") -> str:
    """``"tf"`` -> ``"tensorflow"``; anything unknown is a ``ConfigError``."""
    if isinstance(name, str) and (name in BACKENDS or name in _plugins):  # the common case in queries
        return name
    if not isinstance(name, str):
        raise ConfigError(parameter, f"backend names are strings, got {name!r}")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in BACKENDS:
        _discover()
        if key not in _plugins:
            known = ", ".join([*BACKENDS, *ALIASES, *_plugins])
            raise ConfigError(parameter, f"unknown backend {name!r}; known: {known}")
    return key


def is_framework(name: str) -> bool:
    """Whether ``name`` runs computations (every backend but the framework-free view)."""
    return (name in BACKENDS and BACKENDS[name].framework) or name in _plugins


def frameworks() -> list[str]:
    """Every framework backend, plug-ins included (entry points are read here)."""
    return [name for name in all_backends() if is_framework(name)]


def _installed(module: str) -> bool:
    if module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def available_backends() -> list[str]:
    """Backends whose framework (or NVML) is installed, found without importing it.

    Installed frameworks are found with ``importlib.util.find_spec``; plug-in backends
    registered in the entry-point group ``unimem.backends`` are included (their entry
    points are read here, once per process).

    Returns:
        Canonical backend names (``"torch"``, ``"tensorflow"``, ``"jax"``, ``"cupy"``,
        ``"nvml"``, then plug-ins), in registry order, for those whose module is installed.

    Warns:
        UnimemWarning: A plug-in's entry point cannot be loaded; it is left out, and the
            message says why.

    Example:
        ```python
        unimem.available_backends()  # e.g. ['torch', 'jax', 'nvml']
        ```
    """
    return [name for name in all_backends() if _installed(_entry(name).module)]


def installed_frameworks() -> list[str]:
    return [name for name in available_backends() if is_framework(name)]


def imported_frameworks() -> list[str]:
    """Frameworks already imported in this process (never NVML)."""
    return [name for name in frameworks() if _entry(name).module in sys.modules]


def started_frameworks() -> list[str]:
    """Imported frameworks whose device runtime has started (a query's evidence of use)."""
    return [name for name in imported_frameworks() if get_backend(name).phase() is Phase.INITIALIZED]


def user_imported() -> list[str]:
    """Imported frameworks less those another imported module brought in itself.

    TensorFlow imports JAX, transformers imports torch: imported alone, such a framework
    is no sign the script uses it. It still counts when nothing else is imported.
    """
    imported = imported_frameworks()
    own = [n for n in imported if not any(m in sys.modules for m in _entry(n).imported_by)]
    return own or imported


def framework_of_object(obj: object) -> str | None:
    """The framework a framework object belongs to (a torch Module or tensor, a Keras layer, a Flax module
    or module class; a bound method: its object's), read from its classes' modules as ``sys.modules``
    holds them, importing nothing; None for anything else (a plain function)."""
    for candidate in (obj, getattr(obj, "__self__", None)):
        if candidate is None:
            continue
        for klass in (candidate if isinstance(candidate, type) else type(candidate)).__mro__:
            top = (getattr(klass, "__module__", None) or "").partition(".")[0]
            if top == MULTI_BACKEND_LIBRARY and top in sys.modules:
                config = getattr(sys.modules[top], "config", None)  # Keras 2 has none: it runs on TensorFlow
                name = config.backend() if config is not None else OBJECT_LIBRARIES["tensorflow"]
                return name if isinstance(name, str) and name in BACKENDS else None
            if top in OBJECT_LIBRARIES:
                return OBJECT_LIBRARIES[top]
    return None


def configured() -> list[str]:
    """Frameworks the user named to ``configure()`` in this process, in order."""
    return list(_configured)


def note_configured(names: tuple[str, ...] | list[str]) -> None:
    for name in names:
        if is_framework(name) and name not in _configured:
            _configured.append(name)


def _one(candidates: list[str], evidence: str) -> str:
    if len(candidates) == 1:
        return candidates[0]
    both = " both" if len(candidates) == 2 else " all"
    which = " and ".join(candidates)
    raise ConfigError("backend", f"{which} {evidence.format(both=both)} in this process; pass backend= one of them")


def resolve(backend: object, kind: Literal["query", "action"]) -> str | None:
    """The backend ``backend`` means for a query or an action: the one ``backend=None`` rule.

    See docs/explanation/backend-rule.md for the rule and why.

    Args:
        backend: A name or alias (made canonical), or None to apply the rule.
        kind: ``"query"`` (falls back to the framework-free view) or ``"action"`` (never falls back).

    Returns:
        The canonical name; None from a query means the framework-free view.

    Raises:
        ConfigError: The name is unknown, several candidates are at one level, or an action has none.
    """
    if backend is not None:
        return canonical_name(backend)
    if _configured:
        return _one(list(_configured), "were{both} named to configure()")
    if kind == "query":
        started = started_frameworks()
        return _one(started, "have{both} started their device runtime") if started else None
    imported = user_imported()
    if imported:
        return _one(imported, "are{both} imported")
    candidates = ", ".join(installed_frameworks()) or "none installed"
    raise ConfigError(
        "backend",
        f"no framework is configured or imported yet, so unimem cannot tell which one this is for; "
        f"pass backend= one of: {candidates}",
    )


def adapter_class(name: str) -> type[Backend]:
    """The adapter class of ``name``, installed or not: it is data and methods, no framework."""
    key = canonical_name(name)
    module_name, _, class_name = _entry(key).adapter.partition(":")
    cls: type[Backend] = getattr(importlib.import_module(module_name), class_name)
    return cls


def get_backend(name: str) -> Backend:
    """The adapter for ``name`` (canonical or alias). Imports the adapter, not the framework."""
    backend = _instances.get(name) if isinstance(name, str) else None  # stats() in a loop: no parsing, no lock
    if backend is not None:
        return backend
    key = canonical_name(name)
    with _lock:
        backend = _instances.get(key)
        if backend is None:
            entry = _entry(key)
            if not _installed(entry.module):
                raise BackendUnavailable(f"{key}: the '{entry.module}' module is not installed; {entry.install}")
            backend = adapter_class(key)()
            _instances[key] = backend
    return backend


def capability_table(name: str) -> dict[str, Support]:
    """The capability table of ``name``, installed or not (it is data)."""
    return dict(adapter_class(name).CAPABILITIES)


def topic_members() -> dict[str, list[str]]:
    """Each topic accessor of ``Backend`` (``"diagnose"``, ``"search"``, ...) and the members its object
    must have, from the topic's Protocol (``unimem.backends.topics``); imports no framework."""
    topics = importlib.import_module("unimem.backends.topics")
    return {name: topics.members(protocol) for name, protocol in topics.TOPICS.items()}
