"""The bytes a batch search holds each trial's peak to, with where that figure came from, and the
one check that holds a call to it.

A limit comes from one of three places, and that decides what a peak past it means:

- ``"limit="``: the user's ``limit=``. Nothing but the search enforces it: a call whose peak
  passes it ran, and does not fit all the same.
- ``"capacity"``: the framework's own cap as its adapter reads it (``search_capacity``). The
  framework enforces it itself (what ran fit under it); the search only places sizes against it,
  and reads it again where a pool grown on demand changes it.
- ``"host"``: on a host without device figures, a share of the host's available memory (with a
  ``limit=``, no higher than the host's). Past it the kernel kills the process instead of the step
  raising, so the search enforces it.

Over ranks every rank holds the smallest limit any rank knows; it keeps its own source (every rank
passed the same arguments, so each reads its limit from the same place).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from unimem.sizes import format_bytes

__all__ = ["Limit", "Source", "bytes_of", "passed"]

Source = Literal["limit=", "capacity", "host"]


@dataclass(frozen=True)
class Limit:
    """Bytes a trial's peak may reach, and where the figure came from (see the module)."""

    bytes: int
    source: Source

    @property
    def enforced(self) -> bool:
        """Whether a call whose peak passes it did not fit: the framework enforces its own cap."""
        return self.source != "capacity"


def bytes_of(limit: Limit | None) -> int | None:
    """The limit's bytes; None where no limit is known."""
    return None if limit is None else limit.bytes


def passed(limit: Limit | None, peak: int | None, measured_by: str) -> str | None:
    """Why a call that ran does not fit all the same: its peak passed the user's ``limit=`` or the
    host's limit, whatever measured it. The step ran only because nothing else enforces such a limit,
    and an answer whose own peak is over it is no answer. None: within it, unknown, or the framework's
    own cap (what ran fit under it)."""
    if peak is None or limit is None or peak <= limit.bytes or not limit.enforced:
        return None
    if limit.source == "host":
        # Past what the host can spare: a larger size could make the kernel kill the process.
        return f"its resident peak {format_bytes(peak)} passed the host limit {format_bytes(limit.bytes)}"
    return f"its peak {format_bytes(peak)} ({measured_by}) passed limit={format_bytes(limit.bytes)}"
