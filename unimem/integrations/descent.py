"""The next batch size after an out-of-memory error, for a search that can only come down.

A decorated training loop (accelerate's ``find_executable_batch_size``) ends at the first size that
runs, so each failure is the only figure there is. What it says: when it failed the call held
``in_use`` bytes and asked for ``asked`` more, so at its size the call needs at least ``needed =
in_use + asked`` (or its peak so far, if higher), more than the process can hold (``capacity``).
Whatever part of the call is fixed, the bytes per sample are then at least ``(needed - baseline) /
size``, so no size above ``size × (capacity - baseline) / (needed - baseline)`` fits. The next
size is that bound, kept at or below accelerate's own next size (0.9 times, truncated): the
descent stops no later than accelerate's and at a size no smaller. A message whose figures cannot
all be true (more in use than the device holds) bounds nothing: the next size is accelerate's.

Framework-free: the figures come from torch's counters or, where it keeps none, from its
message, read by ``unimem.integrations.accelerate``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ACCELERATE_FACTOR", "Attempt", "message_figures", "next_size"]

# accelerate's own step after a failure: the size times 0.9, truncated.
ACCELERATE_FACTOR = 0.9

# The figures torch's CUDA out-of-memory message states, in torch's spelling of sizes.
_SIZE = r"([0-9.]+ ?(?:bytes|[KMGTP]i?B|B))"
_FREE = re.compile(r"of which " + _SIZE + r" is free")
_HELD = re.compile(
    r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch, and " + _SIZE + r" is reserved by PyTorch"
)
_TOTAL = re.compile(r"has a total capac\w* of " + _SIZE)  # "capacty" in older torch
_PROCESS = re.compile(r"this process has " + _SIZE + r" memory in use")
_ALLOWED = re.compile(_SIZE + r" allowed;")
# torch writes sizes in powers of 1024 whatever the spelling ("MB" on MPS, "MiB" on CUDA).
_UNITS = {"bytes": 1, "B": 1} | {
    f"{prefix}{infix}B": 1 << (10 * (i + 1)) for i, prefix in enumerate("KMGTP") for infix in ("", "i")
}


def _figure(text: str) -> tuple[int, int]:
    """``(bytes, slack)``: a size as torch writes it, and how far its rounding may put it from the true figure."""
    match = re.fullmatch(r"([0-9]+)(?:\.([0-9]*))? ?(bytes|[KMGTP]i?B|B)", text.strip())
    if match is None:  # _SIZE matched it, but "1.2.3 GiB" is no number
        raise ValueError(text)
    unit = _UNITS[match.group(3)]
    decimals = len(match.group(2) or "")
    return int(float(f"{match.group(1)}.{match.group(2) or 0}") * unit), -(-unit // (2 * 10**decimals))


def _stated(pattern: re.Pattern[str], message: str) -> tuple[int, int] | None:
    found = pattern.search(message)
    return _figure(found.group(1)) if found is not None else None


def _plus(*figures: tuple[int, int]) -> tuple[int, int]:
    return sum(value for value, _ in figures), sum(slack for _, slack in figures)


def _possible(message: str, pool: tuple[int, int], free: tuple[int, int] | None) -> bool:
    """Whether the message's figures can all be true at once, rounding aside: the pool within what the process
    holds and within its cap, the pool plus the free bytes within the device, the process's bytes plus the free
    within the device. A message that breaks one is distrusted whole."""
    total, process, allowed = (_stated(pattern, message) for pattern in (_TOTAL, _PROCESS, _ALLOWED))
    parts = [(pool, process), (pool, allowed), (free, total)]
    if free is not None:
        parts += [(_plus(pool, free), total), (_plus(process, free) if process else None, total)]
    return all(
        part[0] - part[1] <= whole[0] + whole[1] for part, whole in parts if part is not None and whole is not None
    )


def message_figures(message: str) -> tuple[int | None, int | None]:
    """``(in_use, capacity)`` as torch's CUDA out-of-memory message states them: the bytes allocated by
    PyTorch, and those plus the pool's unallocated bytes plus the device's free bytes; None where it
    does not say, and both None where its figures cannot all be true (``_possible``): they bound nothing."""
    held = _HELD.search(message)
    if held is None:
        return None, None
    try:
        allocated, unallocated = _figure(held.group(1)), _figure(held.group(2))
        free = _stated(_FREE, message)
        if not _possible(message, _plus(allocated, unallocated), free):
            return None, None
    except ValueError:  # a figure that is no number
        return None, None
    return allocated[0], (allocated[0] + unallocated[0] + free[0]) if free is not None else None


@dataclass(frozen=True)
class Attempt:
    """One call of the decorated function: its size, and for a failure the figures read from it.

    Attributes:
        batch_size: The size it ran at.
        error: None when it returned; else the first line of its error.
        needed: Bytes the call needed at least (in use when it failed, plus what it asked for); None if unknown.
        capacity: Bytes the process could hold then (the cap, or what it held plus the device's free bytes).
        baseline: Bytes in use before the call; None if unknown (counted as 0, which loosens the bound).
    """

    batch_size: int
    error: str | None = None
    needed: int | None = None
    capacity: int | None = None
    baseline: int | None = None

    @property
    def largest_possible(self) -> int | None:
        """The largest size these figures allow (see the module's docstring); None when a figure is missing or
        they do not show the call over the capacity."""
        if self.needed is None or self.capacity is None:
            return None
        base = self.baseline or 0
        if not base < self.capacity < self.needed:
            return None
        return self.batch_size * (self.capacity - base) // (self.needed - base)


def next_size(failed: Attempt, accelerate_next: int) -> int:
    """The size after ``failed``: accelerate's next size (``accelerate_next``), lowered to what the failure's
    figures allow; always below the failed size, 0 when nothing is left."""
    candidates = [accelerate_next, failed.batch_size - 1]
    if failed.largest_possible is not None:
        candidates.append(failed.largest_possible)
    return max(0, min(candidates))
