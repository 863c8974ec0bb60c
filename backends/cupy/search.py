"""What ``find_batch_size`` asks of CuPy: the bytes its pool may reach, and the pool's overhead at a peak.

cupy is not read here: these work on the figures ``stats()`` gave.
"""

from __future__ import annotations

from unimem.backends.base import Search

from unimem.memory_stats import MemoryStats

__all__ = ["CupySearch"]


class CupySearch(Search):
    """CuPy in the batch search (``SearchTopic``): each trial measured against the pool's limit."""

    release_every_trial = True  # free_all_blocks() is cheap, and each peak starts clean

    def search_capacity(self, snapshot: MemoryStats) -> int | None:
        """The cap, and no more than the pool plus the device's free bytes: the pool can grow
        only into what the device still has, whatever the cap says."""
        bounds = [snapshot.limit]
        if snapshot.reserved is not None and snapshot.device_free is not None:
            bounds.append(snapshot.reserved + snapshot.device_free)
        known = [b for b in bounds if b is not None]
        return min(known) if known else None

    def pool_overhead(self, peak: int | None, peak_reserved: int | None) -> int:
        """The cap bounds the pool's total bytes: its unused part at the peak counts against it."""
        return 0 if peak is None or peak_reserved is None else max(0, peak_reserved - peak)
