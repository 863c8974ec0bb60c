"""What every backend adapter is: a capability table, a phase, a plan, and queries.

Configuration is two-step so that ``configure`` can validate everything before it
changes anything: ``plan()`` is pure and returns ``Step`` objects; the front runs
their ``run`` callables only once every backend's plan succeeded.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import threading
import types
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from unimem.config import Settings
from unimem.errors import ConfigError
from unimem.stats import MemoryStats
from unimem.support import Phase, Support, When

__all__ = ["Backend", "Step", "env_step", "when_imported"]

STATUS_APPLIED = "applied"  # took effect now
STATUS_PENDING = "pending"  # set; takes effect when the framework starts
STATUS_UNCHANGED = "unchanged"  # already so; nothing was done
STATUS_SKIPPED = "skipped"  # not applied (strict=False, or nothing to act on); see note


@dataclass
class Step:
    """One planned change: what, how, and the callable that makes it."""

    backend: str
    setting: str
    value: object
    method: str  # "api", "env", "hook" (an API call made when the framework starts), "none"
    target: str  # the exact call or ``VAR=value``, for humans and for Applied
    run: Callable[[], None] | None = None
    status: str = STATUS_APPLIED  # what it will be once run
    too_late: str | None = None  # why it can no longer take effect, with the fix
    unsupported: str | None = None  # why the framework can never do this, with an alternative
    note: str = ""
    when: When = When.ANYTIME


class Backend(ABC):
    """Base of the four adapters. Subclasses fill the class attributes and methods."""

    name: ClassVar[str]
    module: ClassVar[str]  # top-level module of the framework
    distributions: ClassVar[tuple[str, ...]]  # pip distributions that carry it, first found wins
    CAPABILITIES: ClassVar[dict[str, Support]]

    # --- identity ---------------------------------------------------------
    def version(self) -> str | None:
        """Installed version, read from package metadata without importing."""
        for dist in self.distributions:
            try:
                return importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
        return None

    def imported(self) -> bool:
        return self.module in sys.modules

    def framework(self) -> Any:
        """The framework module, imported on demand (explicit backend calls only)."""
        return sys.modules.get(self.module) or importlib.import_module(self.module)

    @abstractmethod
    def phase(self) -> Phase:
        """How far the framework has got; must not import or start it."""

    # --- configuration ----------------------------------------------------
    def check(self, settings: Settings) -> None:
        """Refuse combinations this framework cannot take, from the settings alone.

        Runs for every backend of a ``configure`` call before any ``plan()``, so a
        refusal comes before anything (NVML included) is asked.
        """
        return None  # most frameworks take any combination the config model allows

    @abstractmethod
    def plan(self, settings: Settings) -> list[Step]:
        """Steps that apply ``settings``. Pure: reads state, changes nothing.

        Raises ``ConfigError`` for combinations the framework cannot take and
        ``UnsupportedFeature`` for settings it can never do; marks ``too_late``
        on steps whose moment has passed.
        """

    # --- queries ------------------------------------------------------------
    @abstractmethod
    def stats(self, device: int = 0, *, nvml: bool = True) -> MemoryStats:
        """A snapshot; never starts the framework's device runtime.

        ``nvml=False`` skips the NVML queries (device and process figures are then None):
        the framework's own counters only, for hot loops.
        """

    @abstractmethod
    def reset_peak(self, device: int = 0) -> None: ...

    @abstractmethod
    def clear_cache(self, device: int = 0) -> int:
        """Give cached memory back to the device; return the bytes measured going back."""


def no_such_device(backend: str, device: int, count: int) -> ConfigError:
    """The error for a query on a device index the started framework does not have."""
    return ConfigError("device", f"{backend} sees {count} device(s), numbered from 0; there is no device {device}")


# --- environment helpers -------------------------------------------------------


def env_step(
    backend: str,
    setting: str,
    value: object,
    var: str,
    new: str | None,
    *,
    phase: Phase,
    when: When,
    fix: str,
    note: str = "",
) -> Step:
    """A step that sets (or, with ``new=None``, removes) an environment variable.

    The variable counts only if set before ``when``; once that is past, a value
    that differs from the one in force is too late.
    """
    current = os.environ.get(var)
    target = f"{var}={new}" if new is not None else f"unset {var}"
    if current == new:
        return Step(backend, setting, value, "env", target, status=STATUS_UNCHANGED, note=note, when=when)
    if not phase.allows(when):
        if when is When.BEFORE_IMPORT:
            reason = f"{var} is read only at import, and {backend} is already imported; {fix}"
        else:
            reason = f"{var} is read only when the device starts, and {backend} has already started it; {fix}"
        return Step(backend, setting, value, "env", target, too_late=reason, note=note, when=when)

    def run() -> None:
        if new is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = new

    return Step(backend, setting, value, "env", target, run=run, status=STATUS_PENDING, note=note, when=when)


_visible: dict[str, str | None] = {"original": None, "written": None}


def _visible_base() -> str | None:
    """The CUDA_VISIBLE_DEVICES value indices count in: the one before unimem wrote the
    variable, unless the user has set it since (then theirs)."""
    current = os.environ.get("CUDA_VISIBLE_DEVICES")
    if current is None or current != _visible["written"]:
        return current
    return _visible["original"]


def visible_devices_value(devices: tuple[int, ...]) -> str:
    """The CUDA_VISIBLE_DEVICES value that shows ``devices``. Pure: changes nothing.

    Indices count among the devices this process can already see: under a scheduler's
    ``CUDA_VISIBLE_DEVICES=3,5``, ``devices=[1]`` means physical GPU 5 (value ``"5"``).
    The base is the value before unimem wrote it, so configuring twice gives the same
    answer; a value the user set since then becomes the new base.
    """
    base = _visible_base()
    if base is None:
        return ",".join(str(d) for d in devices)
    entries: list[str] = []
    for part in base.split(","):
        part = part.strip()
        if not (part.isdigit() or part.startswith(("GPU-", "MIG-"))):
            break  # CUDA stops reading at the first invalid entry
        entries.append(part)
    hidden = [d for d in devices if d >= len(entries)]
    if hidden:
        raise ConfigError(
            "devices",
            f"device {hidden[0]} is not visible: CUDA_VISIBLE_DEVICES={base!r} shows {len(entries)} "
            "device(s), and indices count from 0 among those",
        )
    return ",".join(entries[d] for d in devices)


def devices_step(backend: str, devices: tuple[int, ...], *, phase: Phase, when: When, fix: str) -> Step:
    """The env step for ``devices``; the base it counted from is remembered only when it runs."""
    base = _visible_base()
    value = visible_devices_value(devices)
    step = env_step(backend, "devices", list(devices), "CUDA_VISIBLE_DEVICES", value, phase=phase, when=when, fix=fix)
    inner = step.run
    if inner is not None:

        def run() -> None:
            inner()
            _visible["original"], _visible["written"] = base, value

        step.run = run
    return step


def merge_conf(current: str | None, updates: dict[str, str | None]) -> str:
    """Merge ``key:value`` pairs into a comma-separated conf string such as
    PYTORCH_CUDA_ALLOC_CONF, keeping keys the user set that unimem does not own."""
    pairs: dict[str, str] = {}
    for part in (current or "").split(","):
        key, sep, value = part.strip().partition(":")
        if sep and key:
            pairs[key.strip()] = value.strip()
    for key, update in updates.items():
        if update is None:
            pairs.pop(key, None)
        else:
            pairs[key] = update
    return ",".join(f"{key}:{value}" for key, value in pairs.items())


# --- run a callback right after a framework is imported -------------------------

_post_import: dict[str, list[Callable[[types.ModuleType], None]]] = {}
_post_import_lock = threading.RLock()


class _LoaderProxy(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        with _post_import_lock:
            callbacks = _post_import.pop(self._name, [])
        for callback in callbacks:
            callback(module)

    def __getattr__(self, attr: str) -> Any:  # resource readers, is_package, ...
        return getattr(self._loader, attr)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Wraps the loader of a watched top-level module so callbacks run after it loads.

    This is how an API-only setting (torch's fraction cap, TF's memory_limit) is
    made for a framework the script has not imported yet, without importing it.
    """

    def __init__(self) -> None:
        self._resolving: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _post_import or fullname in self._resolving:
            return None
        self._resolving.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._resolving.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _LoaderProxy(spec.loader, fullname)
        return spec


_finder = _PostImportFinder()


def when_imported(module: str, callback: Callable[[types.ModuleType], None], key: str) -> None:
    """Run ``callback(module)`` once ``module`` is imported (now, if it already is).

    ``key`` identifies the callback: registering the same key again replaces it,
    so a second ``configure`` before the import updates rather than stacks.
    """
    loaded = sys.modules.get(module)
    if loaded is not None:
        callback(loaded)
        return
    with _post_import_lock:
        callbacks = _post_import.setdefault(module, [])
        callbacks[:] = [cb for cb in callbacks if getattr(cb, "_unimem_key", None) != key]
        callback._unimem_key = key  # type: ignore[attr-defined]
        callbacks.append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def pending_hooks(module: str) -> list[str]:
    """Keys of callbacks still waiting for ``module`` to be imported."""
    with _post_import_lock:
        return [getattr(cb, "_unimem_key", "?") for cb in _post_import.get(module, [])]
