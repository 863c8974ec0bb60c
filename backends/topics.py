"""The topics a backend answers beyond its core, each typed by a Protocol, and their small types.

The front asks a backend for a topic through one accessor (``adapter.search``,
``adapter.diagnose``, ...) and calls that topic's methods; a backend's author reads one
protocol per topic. ``unimem.backends.base`` gives each topic a default that answers
"this framework cannot".
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from unimem.training.loss_scaling import LossScaler, ScalerConfig

__all__ = ["Counters", "KeyValueStore", "PrecisionHelpers", "Profiler"]

Counters = tuple[int | None, int | None]  # (allocated, reserved) as a monitor samples them


class PrecisionHelpers(Protocol):
    """What a backend's ``precision`` module offers ``unimem.mixed_precision`` (imports the framework)."""

    def device(self) -> str: ...
    def dtype(self, name: str) -> Any: ...
    def check(self, precision: str, compute_dtype: str, device: str) -> None: ...
    def cast(self, tree: Any, name: str) -> Any: ...
    def enable(self, precision: str, compute_dtype: str, device: str) -> Callable[[], None]: ...
    def loss_scaler(self, config: ScalerConfig, enabled: bool) -> LossScaler: ...


class Profiler(Protocol):
    """A framework's own memory profiler, driven by ``unimem.profile``."""

    def start(self, path: Path, max_entries: int) -> None: ...
    def stop(self, path: Path) -> None: ...
    def snapshot(self, path: Path, stem: str, running: bool) -> Path: ...


class KeyValueStore(Protocol):
    """The key-value store of a framework's initialised distributed runtime, as
    ``unimem.cluster_stats`` gathers through it: every rank sets its key, then reads the others'
    with a bounded wait, so a rank that never calls cannot hang the others.

    Attributes:
        rank (int): This process's rank in the runtime.
        world_size (int): The runtime's process count.
    """

    rank: int
    world_size: int

    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str, timeout: float) -> str | None: ...  # None: not set within ``timeout`` seconds
