"""The framework-free device view (NVML) as unimem's observing tools reach it: through the registry.

``unimem info``, ``stats`` and ``watch``, and the monitor's sampler process, read devices and
processes with no framework in the process. They ask the framework-free adapter, which
forwards to the one NVML gate; nothing here imports NVML.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from unimem import registry
from unimem.errors import BackendUnavailable

if TYPE_CHECKING:
    from unimem.backends.nvml.adapter import NvmlBackend

__all__ = ["adapter", "usable"]


def adapter() -> NvmlBackend:
    """The framework-free view's adapter; ``BackendUnavailable`` when its library is not installed."""
    return cast("NvmlBackend", registry.get_backend(registry.FRAMEWORK_FREE))


def usable() -> tuple[NvmlBackend | None, str]:
    """The adapter and ``"ok"``, or None and the reason the device view cannot be read here (callers label it)."""
    try:
        view = adapter()
    except BackendUnavailable as exc:
        return None, str(exc).removeprefix(f"{registry.FRAMEWORK_FREE}: ")
    status = view.status()
    return (view, status) if status == "ok" else (None, status)
