"""``MemoryStats``: one set of field names for every framework.

A figure unimem cannot know is ``None``, never 0 and never a guess.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from unimem.sizes import format_bytes

__all__ = ["MemoryStats", "with_host_rss"]


@dataclass(frozen=True, init=False)
class MemoryStats:
    """A snapshot of one device's memory as one backend (and NVML) sees it.

    Returned by ``unimem.stats()``. Byte counts are ``int`` bytes, or ``None`` when the
    figure is unknown here (the framework does not keep it, its device runtime has not
    started, no GPU, no NVML): never 0 and never a guess. ``capabilities(backend)`` says
    which figures each backend keeps. Frozen: fields cannot be assigned.

    Attributes:
        backend (str): The backend whose figures these are (``"torch"``, ``"nvml"``, ...).
        device (int): The device index, as the backend counts devices.
        allocated (int | None): Bytes in live tensors/arrays.
        reserved (int | None): Bytes the framework's pool holds from the device.
        peak_allocated (int | None): Highest ``allocated`` since start or ``reset_peak()``, in bytes.
        peak_reserved (int | None): Highest ``reserved`` since start or ``reset_peak()``, in bytes.
        limit (int | None): Most the framework will take, in bytes (a cap, or its pool limit).
        largest_free_block (int | None): Biggest contiguous free block inside the pool, in bytes.
        num_allocs (int | None): Allocation calls counted.
        num_ooms (int | None): Out-of-memory events counted.
        device_total (int | None): The driver's total for the whole device, in bytes.
        device_free (int | None): The driver's free bytes on the whole device.
        process_used (int | None): NVML's figure for this process on that device, in bytes.
        host_rss (int | None): This process's resident set size in host memory, in bytes (read
            from ``/proc/self/statm`` on Linux, psutil elsewhere); never part of ``allocated``.
            None with ``stats(nvml=False)`` (the framework's counters only) or where it cannot
            be read. On a host without a GPU it is the one figure ``stats()`` knows.
        timestamp (float): When the snapshot was taken (Unix time, seconds).

    Example:
        ```python
        snapshot = unimem.stats("torch")
        if snapshot.allocated is not None:  # None: unknown, e.g. on the CPU
            print(unimem.format_bytes(snapshot.allocated))
        print(snapshot.as_dict())
        ```
    """

    backend: str
    device: int
    allocated: int | None = None
    reserved: int | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    limit: int | None = None
    largest_free_block: int | None = None
    num_allocs: int | None = None
    num_ooms: int | None = None
    device_total: int | None = None
    device_free: int | None = None
    process_used: int | None = None
    host_rss: int | None = None
    timestamp: float = field(default_factory=time.time)

    def __init__(
        self,
        backend: str,
        device: int,
        allocated: int | None = None,
        reserved: int | None = None,
        peak_allocated: int | None = None,
        peak_reserved: int | None = None,
        limit: int | None = None,
        largest_free_block: int | None = None,
        num_allocs: int | None = None,
        num_ooms: int | None = None,
        device_total: int | None = None,
        device_free: int | None = None,
        process_used: int | None = None,
        host_rss: int | None = None,
        timestamp: float | None = None,
    ) -> None:
        # One assignment of the instance's dict instead of one object.__setattr__ per field:
        # the generated frozen __init__ costs more than a framework's own counter read, in a
        # call polled in loops (docs/measurements.md, "stats() latency").
        object.__setattr__(
            self,
            "__dict__",
            {
                "backend": backend,
                "device": device,
                "allocated": allocated,
                "reserved": reserved,
                "peak_allocated": peak_allocated,
                "peak_reserved": peak_reserved,
                "limit": limit,
                "largest_free_block": largest_free_block,
                "num_allocs": num_allocs,
                "num_ooms": num_ooms,
                "device_total": device_total,
                "device_free": device_free,
                "process_used": process_used,
                "host_rss": host_rss,
                "timestamp": time.time() if timestamp is None else timestamp,
            },
        )

    @property
    def fragmentation(self) -> float | None:
        """Share of the pool's free bytes that the largest free block cannot use.

        ``0`` means all free pool memory is one block (or none is free); near ``1`` means
        it is in pieces too small for a large request. ``None`` when the pool's free bytes
        (``reserved - allocated``) or its largest block are unknown.
        """
        if self.reserved is None or self.allocated is None or self.largest_free_block is None:
            return None
        free_in_pool = self.reserved - self.allocated
        if free_in_pool <= 0:
            return 0.0
        return max(0.0, min(1.0, 1.0 - self.largest_free_block / free_in_pool))

    def as_dict(self) -> dict[str, Any]:
        """Every field plus ``fragmentation``, JSON-ready.

        Returns:
            ``{field: value}`` for every field, and ``"fragmentation"``; unknown figures
            are None (``null`` in JSON).
        """
        data = dataclasses.asdict(self)
        data["fragmentation"] = self.fragmentation
        return data

    def rows(self) -> list[tuple[str, str]]:
        """The figures as ``(label, value)`` pairs for tables, as ``unimem.summary()`` prints them.

        Returns:
            One pair per figure (fragmentation included, backend, device and timestamp
            left out), values formatted with ``format_bytes``; unknown figures read ``n/a``.
        """
        fragmentation = self.fragmentation
        return [
            ("allocated", format_bytes(self.allocated)),
            ("reserved", format_bytes(self.reserved)),
            ("peak allocated", format_bytes(self.peak_allocated)),
            ("peak reserved", format_bytes(self.peak_reserved)),
            ("limit", format_bytes(self.limit)),
            ("largest free block", format_bytes(self.largest_free_block)),
            ("fragmentation", "n/a" if fragmentation is None else f"{fragmentation:.1%}"),
            ("allocations", "n/a" if self.num_allocs is None else str(self.num_allocs)),
            ("OOMs", "n/a" if self.num_ooms is None else str(self.num_ooms)),
            ("device total", format_bytes(self.device_total)),
            ("device free", format_bytes(self.device_free)),
            ("process used (NVML)", format_bytes(self.process_used)),
            ("host RSS (this process)", format_bytes(self.host_rss)),
        ]


def with_host_rss(snapshot: MemoryStats, host_rss: int | None) -> MemoryStats:
    """``snapshot`` with ``host_rss`` set, for a snapshot just made and not yet handed out.

    Set in place: a copy (``dataclasses.replace``) would cost more than the read itself, in a
    call polled in loops.
    """
    snapshot.__dict__["host_rss"] = host_rss
    return snapshot
