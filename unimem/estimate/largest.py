"""The largest batch size that fits, found with few estimates: a step's peak is close to affine in
the batch size, so a line through two estimates places the boundary, and the sizes at and just past
it are estimated to check it (the allocator's rounding bends the line a little)."""

from __future__ import annotations

from collections.abc import Callable

from unimem.estimate.result import SizeEstimate

__all__ = ["largest_fitting"]

# How far past the largest size estimated one step of the search may reach, where none was seen not to fit.
_REACH = 4096
# The search stops when the largest size seen to fit and the smallest seen not to are this close (a share).
_CLOSE = 0.005


def _bracket(known: dict[int, SizeEstimate]) -> tuple[int, int | None]:
    """The largest size seen to fit (0: none) and the smallest above it seen not to (None: none)."""
    low = max((n for n, size in known.items() if size.fits), default=0)
    above = [n for n, size in known.items() if not size.fits and n > low]
    return low, min(above, default=None)


def _on_the_line(known: dict[int, SizeEstimate], limit: int) -> int | None:
    """The size where the line through the two estimates nearest the limit reaches it (the secant method:
    a curve's bend pulls the two ends of a bracket apart, its two nearest points together); None where
    the peak does not grow with the size."""
    picked = sorted(known, key=lambda n: (abs(known[n].required - limit), -n))[:2]
    if len(picked) < 2:
        return None
    a, b = sorted(picked)
    rise = known[b].required - known[a].required
    if rise <= 0:
        return None
    return a + int((limit - known[a].required) * (b - a) // rise)


def _next_size(known: dict[int, SizeEstimate], limit: int) -> int | None:
    """The next size to estimate, or None when the boundary is found: the sizes seen to fit and not to
    fit are next to each other, or within ``_CLOSE`` of each other (the line is then bent by the allocator's
    rounding more than it says: further runs buy little)."""
    low, high = _bracket(known)
    if high is not None and high - low <= max(1, int(low * _CLOSE)):
        return None
    guess = _on_the_line(known, limit)
    if guess is None or (high is not None and guess >= high):
        guess = 2 * low if high is None else (low + high) // 2
    if guess <= low:
        guess = low + 1  # the line says low is the answer: check the size past it
    # Inside the bracket; with no size seen not to fit, at most a few times past the largest seen.
    return min(guess, high - 1) if high is not None else min(guess, _REACH * max(known))


def largest_fitting(
    measure: Callable[[int], SizeEstimate], known: dict[int, SizeEstimate], limit: int, runs: int
) -> tuple[int | None, int | None]:
    """The largest batch size that fits ``limit``, estimating at most ``runs`` more sizes into ``known``.

    Args:
        measure: Estimates one size.
        known: The sizes estimated so far (their ``fits`` set against ``limit``); sizes estimated here are
            added to it.
        limit: The target in bytes.
        runs: How many more sizes may be estimated.

    Returns:
        ``(largest, above)``: the largest size seen to fit (None: none did, down to 1), and the smallest size
        above it seen not to fit (None: none was).
    """
    if not known:
        return None, False
    if len(known) == 1:  # a second point for the line: double a size that fits, halve one that does not
        (only,) = known
        other = 2 * only if known[only].fits else max(1, only // 2)
        if other not in known and runs > 0:
            known[other] = measure(other)
            runs -= 1
    while runs > 0:
        low, _ = _bracket(known)
        if low == 0 and 1 in known:
            break  # not even one sample fits
        size = _next_size(known, limit)
        if size is None or size in known:
            break
        known[size] = measure(size)
        runs -= 1
    low, high = _bracket(known)
    return (low or None), high
