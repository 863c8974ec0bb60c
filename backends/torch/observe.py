"""torch under observation: the monitor's counter reader and the CUDA allocator's history profiler.

Imports torch only inside functions, and only where the caller asked for torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from unimem.backends.base import Observe
from unimem.backends.topics import Counters

from unimem.errors import UnimemError, UnsupportedFeature

__all__ = ["SNAPSHOT", "TorchObserve", "TorchProfiler"]

SNAPSHOT = "torch_memory_snapshot.pickle"  # the file stop() writes (open it at https://pytorch.org/memory_viz)


class TorchProfiler:
    """The CUDA caching allocator's history (``_record_memory_history``), bounded by ``max_entries``
    and dumped with ``_dump_snapshot``. CUDA only: torch keeps no history of CPU tensors."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def start(self, path: Path, max_entries: int) -> None:
        self._torch.cuda.memory._record_memory_history(max_entries=max_entries)

    def stop(self, path: Path) -> None:
        memory = self._torch.cuda.memory
        try:
            memory._dump_snapshot(str(path / SNAPSHOT))
        finally:
            memory._record_memory_history(enabled=None)  # stop recording (and its cost)

    def snapshot(self, path: Path, stem: str, running: bool) -> Path:
        if not running:
            raise UnimemError("torch's allocator history exists only while the profile runs: call start() first")
        target = path / f"torch_{stem}.pickle"
        self._torch.cuda.memory._dump_snapshot(str(target))
        return target


class TorchObserve(Observe):
    """torch under observation (``ObserveTopic``): its allocator's counters and its CUDA history profiler."""

    def counter_reader(self, device: int) -> tuple[Callable[[], Counters] | None, str]:
        """``(allocated, reserved)`` through ``stats(nvml=False)``: the raw C++ stats dict, the cheapest read."""
        torch = sys.modules.get("torch")
        if torch is not None and getattr(torch, "cuda", None) is not None and not torch.cuda.is_available():
            return None, "torch sees no CUDA device here: allocator figures are None"

        def read() -> Counters:
            snapshot = self.backend.stats(device, nvml=False)  # Nones until CUDA has started; never starts it
            return snapshot.allocated, snapshot.reserved

        return read, ""

    def profiler(self) -> TorchProfiler:
        """The profiler, importing torch; ``UnsupportedFeature`` without CUDA (a profile that records
        nothing would read as "no allocations")."""
        import torch

        if not torch.cuda.is_available():
            raise UnsupportedFeature(
                "torch",
                "profile",
                "torch records allocator history for CUDA memory only and sees no CUDA device here; "
                "run on a GPU machine, or profile host memory with a Python profiler (e.g. memray)",
            )
        return TorchProfiler(torch)
