"""Whether a step leaks: the memory it holds grew from call to call at the same batch size.

The search re-runs its answer after a later trial failed (``confirm``). A re-run that no longer
fits may mean the process fits less near the limit than when the answer ran (what failed trials
left), or that the step keeps memory from call to call: a list of outputs that grows, a loss
summed with its graph. The second is told apart by what the search reads before and during each
call: the bytes in use before it (the framework's, or the process's resident memory on a host),
less what the failed calls left in use as measured after each, and the call's own peak. When
either grew at the same size by more than the reading's noise and half the room the size had
under the limit, the step leaks, and the answer is no size the next call can count on.
"""

from __future__ import annotations

from dataclasses import dataclass

from unimem.search.rules import PEAK_NOISE
from unimem.sizes import format_bytes

__all__ = ["Reading", "growth", "leak_text"]


@dataclass(frozen=True)
class Reading:
    """What the search read of one call of the step (None: not read)."""

    size: int
    fits: bool
    in_use: int | None  # bytes in use before the call: the framework's, or the process's resident bytes
    peak: int | None  # the call's peak, read even where it passed the limit
    left: int  # bytes the failed calls before it left in use, as measured after each


def growth(before: Reading, after: Reading, limit: int | None) -> int | None:
    """How much more ``after`` held than ``before``, a call at the same size, where that is more
    than a reading's noise and half the room ``before`` left under ``limit``: before the call (less
    what failures left between them, measured apart), or at its peak. None: no such growth read."""
    grew: list[int] = []
    if before.in_use is not None and after.in_use is not None:
        grew.append(after.in_use - before.in_use - (after.left - before.left))
    if before.peak is not None and after.peak is not None:
        grew.append(after.peak - before.peak)
    reference = before.peak if before.peak is not None else before.in_use
    if not grew or reference is None:
        return None
    room = 0 if limit is None or before.peak is None else max(0, limit - before.peak)
    most = max(grew)
    return most if most > max(PEAK_NOISE * reference, room / 2) else None


def leak_text(size: int, grew: int, measured_by: str) -> str:
    """What a leak looks like in the search's words."""
    return (
        f"the step leaks memory: at batch size {size} the process held {format_bytes(grew)} more when the "
        f"answer was re-checked than when it first ran ({measured_by}), beyond what the failed trials left; "
        "a leak (outputs, losses or graphs kept from call to call) shrinks what fits with every step: fix it "
        "in the step, then search again"
    )
