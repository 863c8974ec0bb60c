"""One snapshot read the way ``stats()`` reads it, for internal code that has already resolved the
backend and checked the device: an adapter's figures with the host's resident memory, or the
framework-free view's.

Internal readers (diagnosis, the monitor, the batch search) use these, not the public functions,
which validate and resolve again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unimem import host_memory, registry
from unimem.errors import BackendUnavailable
from unimem.memory_stats import MemoryStats, with_host_rss

if TYPE_CHECKING:
    from unimem.backends.base import Backend

__all__ = ["adapter_stats", "framework_free_stats", "read_snapshot"]


def read_snapshot(name: str | None, device: int, *, nvml: bool = True) -> MemoryStats:
    """``name``'s snapshot (None: the framework-free view), with ``host_rss`` unless ``nvml=False``."""
    if name is None:
        return framework_free_stats(device)
    return adapter_stats(registry.get_backend(name), device, nvml=nvml)


def adapter_stats(adapter: Backend, device: int, *, nvml: bool = True) -> MemoryStats:
    """What ``stats()`` answers for an adapter already resolved and a device already checked: the
    adapter's snapshot, with ``host_rss`` unless ``nvml=False``. Internal code that holds the
    adapter (the batch search) reads through it, so nothing is validated or resolved twice."""
    snapshot = adapter.stats(device, nvml=nvml)
    return with_host_rss(snapshot, host_memory.rss()) if nvml else snapshot


def framework_free_stats(device: int) -> MemoryStats:
    """The framework-free view: NVML's figures and ``host_rss``; on a machine without a driver
    (or without nvidia-ml-py) the host figure alone rather than an error (an explicit
    ``backend="nvml"`` raises)."""
    name = registry.FRAMEWORK_FREE
    try:
        snapshot = registry.get_backend(name).stats(device)
    except BackendUnavailable:
        snapshot = MemoryStats(name, device)
    return with_host_rss(snapshot, host_memory.rss())
