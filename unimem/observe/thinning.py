"""Fewer points that draw the same picture: a long timeline thinned to what a view's width can show.

A plot 1000 pixels wide cannot show a million samples, and drawing them all costs seconds for
nothing. The time axis is cut into buckets (about a pixel each); per bucket a line keeps its
first, lowest, highest and last point, so every peak and every dip survives and the line drawn
at that width is the same. A gap (a failed reading) is kept, so the line still breaks there.
Vertical lines and labels are thinned to those a view can tell apart, and a label is cut to what
a view can show. The time axis starts where ``axis_origin`` says, which refuses a timeline no run
could have (a damaged recording) before anything is drawn. Pure Python, no numpy: the PNG and
any other view (a browser page) draw the same points.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from itertools import compress, islice, repeat
from operator import is_, le

from unimem.errors import ConfigError

__all__ = ["MAX_SPAN", "axis_origin", "shortened", "spaced", "thin_line"]

MAX_SPAN = 1e9  # seconds, about 32 years: no recording spans more; a wider timeline is a damaged one


def thin_line(
    times: Sequence[float], values: Sequence[float | None], buckets: int
) -> tuple[list[float], list[float | None]]:
    """The points of one line that draw it the same at ``buckets`` columns.

    Args:
        times: Each point's position on the time axis (a point whose time is not a finite
            number cannot be placed and is left out; points out of order are put in order).
        values: Each point's value, a number; None is a gap: the line breaks there.
        buckets: How many columns the view has (its width in pixels, say); at least 1.

    Returns:
        ``(times, values)`` of the points kept, in time order: at most four per bucket
        (first, lowest, highest, last) between two gaps, and one None per run of gaps.
        A line of at most ``4 * buckets`` points comes back whole.

    Raises:
        ConfigError: ``buckets`` is not a whole number of 1 or more, or ``times`` and
            ``values`` differ in length.
    """
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1:
        raise ConfigError("buckets", f"expected a whole number of 1 or more, got {buckets!r}")
    if len(times) != len(values):
        raise ConfigError("values", f"expected one value per time: {len(times)} times, {len(values)} values")
    xs, ys = _in_order(times, values)
    if len(xs) <= 4 * buckets:
        return xs, ys
    out_times: list[float] = []
    out_values: list[float | None] = []
    gaps = list(compress(range(len(ys)), map(is_, ys, repeat(None))))  # found in C, not a loop per point
    width = (xs[-1] - xs[0]) / buckets
    start = following = 0  # following: the first gap at or after ``start``
    for bucket in range(1, buckets + 1):
        end = len(xs) if bucket == buckets else bisect.bisect_left(xs, xs[0] + bucket * width, start)
        run = start
        while run < end:
            gap = gaps[following] if following < len(gaps) and gaps[following] < end else end
            if gap > run:
                # A run between gaps is one slice: min, max and index run in C.
                part = ys[run:gap]
                low = part.index(min(part))  # type: ignore[type-var]  # no None in a run
                high = part.index(max(part))  # type: ignore[type-var]
                for offset in sorted({0, low, high, len(part) - 1}):
                    out_times.append(xs[run + offset])
                    out_values.append(part[offset])
            if gap < end:
                if not out_values or out_values[-1] is not None:  # a run of gaps is one break
                    out_times.append(xs[gap])
                    out_values.append(None)
                following += 1
            run = gap + 1
        start = end
    return out_times, out_values


def _in_order(times: Sequence[float], values: Sequence[float | None]) -> tuple[list[float], list[float | None]]:
    """The points with a finite time, as lists in time order (lists already in order come back as they are)."""
    xs = times if isinstance(times, list) else list(times)
    ys = values if isinstance(values, list) else list(values)
    # In order and finite at both ends: every time is finite (a NaN is out of order with anything).
    if all(map(le, xs, islice(xs, 1, None))) and (not xs or (math.isfinite(xs[0]) and math.isfinite(xs[-1]))):
        return xs, ys
    finite = [math.isfinite(t) for t in xs]
    xs = list(compress(xs, finite))
    ys = list(compress(ys, finite))
    order = sorted(range(len(xs)), key=xs.__getitem__)
    return [xs[i] for i in order], [ys[i] for i in order]


def spaced(positions: Sequence[float], gap: float) -> list[int]:
    """Indices of the positions to keep so that no two kept are closer than ``gap``.

    Left to right, a position is kept when it is at least ``gap`` past the last one kept:
    labels that would overlap, or lines that would fall in one pixel column, are drawn once.

    Args:
        positions: Where each item sits on the axis, in any order (one that is not a finite
            number is left out).
        gap: The least distance between two kept items; 0 or less keeps every finite one.

    Returns:
        The indices kept, in the order of their positions.
    """
    order = sorted((p, i) for i, p in enumerate(positions) if math.isfinite(p))
    kept: list[int] = []
    previous = 0.0
    for position, index in order:
        if not kept or position - previous >= gap:
            kept.append(index)
            previous = position
    return kept


def shortened(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, an ellipsis ending a cut one: a label of megabytes
    costs a view nothing more than one of a line."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def _seconds(value: object) -> float | None:
    """``value`` as a finite number of seconds; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # an integer past any float
        return None
    return seconds if math.isfinite(seconds) else None


def axis_origin(runs: Sequence[tuple[object, Sequence[float]]]) -> float:
    """Where a time axis of several runs starts: the earliest of their starts.

    A run's start is the start it states (``meta["started"]``) where that lies within ``MAX_SPAN``
    of its times, else its earliest time: a stated start of 1e308 (a damaged field) is not where
    its samples are drawn from.

    Args:
        runs: Per run, the start it states (a number, or anything else: none) and the times of its
            samples and marks (any order; one that is not a finite number is left out).

    Returns:
        The axis's origin; 0.0 when no run states a start or holds a time.

    Raises:
        ConfigError: The runs' times and starts span more than ``MAX_SPAN`` seconds: no run lasts
            that long, the recording is damaged (``exc.parameter`` is ``"recording"``).
    """
    starts: list[float] = []
    ends: list[float] = []
    for stated, times in runs:
        finite = [t for t in times if math.isfinite(t)]
        first, last = (min(finite), max(finite)) if finite else (None, None)
        given = _seconds(stated)
        if given is not None and first is not None and last is not None:
            given = given if max(abs(given - first), abs(given - last)) <= MAX_SPAN else None
        start = given if given is not None else first
        if start is not None:
            starts.append(start)
            ends.append(max(start, last) if last is not None else start)
    if not starts:
        return 0.0
    origin, end = min(starts), max(ends)
    if not end - origin <= MAX_SPAN:
        raise ConfigError(
            "recording",
            f"its times span {end - origin:.3g} s (from {origin!r} to {end!r}), more than any run "
            f"({MAX_SPAN:.0e} s, about 32 years): the recording is damaged; check its samples' and marks' times",
        )
    return origin
