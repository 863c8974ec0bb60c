"""JAX under observation: the monitor's counter reader and the device memory profile.

Imports jax only inside functions, and never starts its backend: asking JAX for its
devices before it has run anything would start it (and, on a GPU, preallocate).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from unimem.backends.base import Backend, Observe
from unimem.backends.topics import Counters

from unimem.errors import NoFigures, UnimemWarning
from unimem.support import Phase

__all__ = ["PROFILE", "JaxObserve", "JaxProfiler"]

PROFILE = "jax_memory.prof"  # the file stop() writes (pprof format: ``pprof -http : FILE``)


class JaxProfiler:
    """``jax.profiler.save_device_memory_profile``: a picture of the live buffers at one moment
    (not a history), written at stop() and at each snapshot. Works on the CPU too."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    def start(self, path: Path, max_entries: int) -> None:
        return None  # nothing records between pictures

    def stop(self, path: Path) -> None:
        self._save(path / PROFILE)

    def snapshot(self, path: Path, stem: str, running: bool) -> Path:
        target = path / f"jax_{stem}.prof"
        self._save(target)
        return target

    def _save(self, target: Path) -> None:
        if self._backend.phase() is not Phase.INITIALIZED:
            # Saving would start JAX (and, on a GPU, preallocate 75% of it) to profile nothing.
            warnings.warn(
                "jax: no device memory profile written: JAX has not run anything in this process yet",
                UnimemWarning,
                stacklevel=4,  # the caller of Profile.stop() or Profile.snapshot()
            )
            return
        import jax

        jax.profiler.save_device_memory_profile(str(target))


class JaxObserve(Observe):
    """JAX under observation (``ObserveTopic``): XLA's pool counters and the device memory profile."""

    def counter_reader(self, device: int) -> tuple[Callable[[], Counters] | None, str]:
        """``(allocated, reserved)`` of JAX device ``device``; ``(None, None)`` until JAX has started,
        ``NoFigures`` once it is known to run on the CPU (XLA keeps no stats there)."""
        found: list[Any] = []

        def read() -> Counters:
            if not found:
                if self.backend.phase() is not Phase.INITIALIZED:
                    return None, None  # asking for devices would start JAX (and preallocate)
                import jax

                devices = jax.local_devices()
                if device >= len(devices):
                    raise NoFigures(f"jax has no device {device}")
                if devices[device].platform == "cpu":
                    raise NoFigures("jax runs on the CPU here: allocator figures are None")
                found.append(devices[device])
            snapshot = self.backend.stats(device, nvml=False)  # None, None with allocator='uncached': no stats kept
            return snapshot.allocated, snapshot.reserved

        return read, ""

    def profiler(self) -> JaxProfiler:
        """``jax.profiler.save_device_memory_profile``, at stop() and at each snapshot."""
        return JaxProfiler(self.backend)
