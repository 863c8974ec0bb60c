"""Run a callback right after a module is imported, without importing it.

This is how an API-only setting (torch's fraction cap, TensorFlow's memory_limit) is made
for a framework the script has not imported yet: the callback waits in a meta-path finder
that wraps the module's loader, and runs once the module has executed. Framework-free
machinery: the adapters and the front both use it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["pending_hooks", "when_imported"]


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
