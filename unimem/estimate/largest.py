"""The largest batch size that fits, found with few estimates: a step's peak is close to affine in
the batch size, so a line through two estimates places the boundary; once sizes on both sides of it
are known, the line through them (regula falsi, with the Illinois rule so that a bent curve cannot
hold one end still) narrows them until they are next to each other, or within half a percent."""

from __future__ import annotations

from collections.abc import Callable

from unimem.estimate.result import SizeEstimate

__all__ = ["largest_fitting"]

# How far past the largest size estimated one step may reach while no size was seen not to fit.
_REACH = 64
# The search stops when the largest size seen to fit and the smallest seen not to are this close (a share).
_CLOSE = 0.005


def _bracket(known: dict[int, SizeEstimate]) -> tuple[int, int | None]:
    """The largest size seen to fit (0: none) and the smallest above it seen not to (None: none)."""
    low = max((n for n, size in known.items() if size.fits), default=0)
    above = [n for n, size in known.items() if not size.fits and n > low]
    return low, min(above, default=None)


def _crossing(a: int, fa: float, b: int, fb: float) -> int | None:
    """Where the line through ``(a, fa)`` and ``(b, fb)`` (margins over the limit) crosses zero; None
    where it does not rise."""
    if fb <= fa or a == b:
        return None
    return a + int(-fa * (b - a) // (fb - fa))


def _placed(known: dict[int, SizeEstimate], limit: int) -> int:
    """The next size while no size was seen not to fit: on the line through the two largest, at most
    ``_REACH`` times the largest (doubled where the peak does not rise; the size past the largest where
    the line says the largest is the answer)."""
    a, b = sorted(known)[-2:] if len(known) > 1 else (0, max(known))
    top = max(known)
    guess = None if a == 0 else _crossing(a, known[a].required - limit, b, known[b].required - limit)
    if guess is None:
        return min(2 * top, _REACH * top)
    return top + 1 if guess <= top else min(guess, _REACH * top)


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
        return None, None
    weights = {"low": 1.0, "high": 1.0}  # the Illinois rule: an end kept twice counts half as far
    moved = ""
    while runs > 0:
        low, high = _bracket(known)
        if low == 0:  # nothing fits: halve the smallest, down to one sample
            smallest = min(known)
            size = smallest // 2
            if smallest == 1 or size in known:
                break
        elif high is None:
            size = _placed(known, limit)
        elif high - low <= max(1, int(low * _CLOSE)):
            break
        else:
            fa = weights["low"] * (known[low].required - limit)
            fb = weights["high"] * (known[high].required - limit)
            guess = _crossing(low, fa, high, fb)
            size = (low + high) // 2 if guess is None else min(max(guess, low + 1), high - 1)
        if size in known or size < 1:
            break
        known[size] = measure(size)
        runs -= 1
        side = "low" if known[size].fits else "high"
        other = "high" if side == "low" else "low"
        weights[side] = 1.0
        weights[other] = weights[other] / 2 if moved == side else 1.0
        moved = side
    low, high = _bracket(known)
    return (low or None), high
