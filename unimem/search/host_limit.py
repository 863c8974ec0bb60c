"""The batch-size search on a host without device figures: the process's resident memory as each
trial's peak, and the host's available memory as the limit.

Where a step's memory is host memory (no GPU: the frameworks keep no figures on the CPU), a size
past what the host has is no exception the search can catch: the kernel kills the process (or
another one). So where neither ``limit=`` nor ``measure=`` nor the framework bounds the sizes, the
search holds them to a share of what the host can still give (``host_memory.available``: the
host's available memory, or its memory cgroup's room where less), read once at its start, with
each trial's peak read as the process's resident high-water mark. A trial whose peak passes that
limit counts as one that did not fit, and no size grows more than ``GROWTH`` times past the
largest that ran: a small step's resident peak is a coarse reading (the kernel counts resident
pages in per-CPU batches, and freed memory the allocator keeps is reused unseen), and a size
extrapolated far from it could need more than the host has.
"""

from __future__ import annotations

from dataclasses import dataclass

from unimem import host_memory
from unimem.sizes import format_bytes

__all__ = ["GROWTH", "SHARE", "HostLimit", "HostPeaks", "read_limit"]

# The share of the host's available memory a search may take: the rest is the other processes'
# (and the page cache the kernel needs to keep working).
SHARE = 0.8
# The most a size grows past the largest that ran, where the host's figures place it.
GROWTH = 8


@dataclass(frozen=True)
class HostLimit:
    """The bytes a trial's resident peak may reach, and what they were read from."""

    limit: int  # the process's resident bytes may reach this
    resident: int  # the process's resident bytes when read
    available: int  # what the host (or its cgroup) could still give then
    processes: int  # the processes of this host the available memory is shared by

    def note(self, limit: int | None = None) -> str:
        """Said in the search's notes; ``limit``: the ``limit=`` held against the same resident peak."""
        shared = f" shared by {self.processes} processes of this host" if self.processes > 1 else ""
        host = (
            f"a resident peak of at most {format_bytes(self.limit)} ({format_bytes(self.resident)} in use + "
            f"{SHARE:.0%} of the {format_bytes(self.available)} available{shared})"
        )
        if limit is not None:
            return (
                f"no device figures: limit={format_bytes(limit)} held against the process's resident peak "
                f"(the host's memory), and no higher than {host}"
            )
        return f"no device figures: sizes held to the host's memory, {host}; pass limit= or measure= for another"


def read_limit(processes: int = 1) -> HostLimit | None:
    """The host limit now, for one of ``processes`` searching on this host at once; None where
    the host's figures cannot be read."""
    resident, room = host_memory.rss(), host_memory.available()
    if resident is None or room is None:
        return None
    processes = max(1, processes)
    return HostLimit(resident + int(SHARE * room / processes), resident, room, processes)


class HostPeaks:
    """Each trial's resident peak: the high-water mark restarted before it where that works,
    else the mark only when it rose during the trial (None otherwise: the trial stayed under
    the process's peak so far, which then bounds it)."""

    def __init__(self) -> None:
        self._mark: int | None = None
        self._reset = False

    def so_far(self) -> int | None:
        """The process's resident peak so far, where a trial's peak cannot be read apart from it."""
        return None if host_memory.can_reset_peak() else host_memory.peak()

    def begin(self) -> None:
        """Before a trial."""
        self._reset = host_memory.reset_peak()
        self._mark = None if self._reset else host_memory.peak()

    def read(self) -> int | None:
        """After a trial: its resident peak, or None when unknown."""
        mark = host_memory.peak()
        if mark is None or self._reset:
            return mark
        return mark if self._mark is not None and mark > self._mark else None
