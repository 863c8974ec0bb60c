"""The batch-size search's arithmetic: fitting peaks, predicting, and the steps the next size is
placed with (the rules that choose it: ``unimem.search.regimes``).

Pure functions of the trials' ``(batch size, peak bytes)`` points and the limit: no I/O,
no framework, no clock, so that the search's choices can be tested over many shapes.
"""

from __future__ import annotations

import itertools
import math

__all__ = [
    "FLAT_NOISE",
    "SATURATION_CAUSE",
    "fit",
    "fit_linear",
    "flat_past",
    "knee",
    "line_bound",
    "log_width",
    "median",
    "plateau_ratio",
    "predict",
    "ran_past_the_cap",
    "safe_size",
    "saturation_note",
    "split",
    "stalled",
]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def fit_linear(
    points: list[tuple[int, int]], *, largest: int = 5, baseline: int | None = None
) -> tuple[float, float] | None:
    """``(a, b)`` of ``bytes = a + b × batch`` by Theil–Sen over the ``largest`` biggest
    sizes (small batches are dominated by allocator granularity and by fixed costs, and
    the fit is used to extrapolate upwards), or None when memory does not grow with the
    batch there or fewer than two sizes are known. Among five sizes, one wild reading
    moves it little. A run of equal peaks at the small end (a plateau) is left out.

    With ``baseline`` (bytes in use before the search), sizes whose use above it is under
    a quarter of the largest's are left out: their peak is set by something that does
    not grow with the batch (an optimizer step's temporaries can top a small batch's
    activations), and a slope through such a plateau would predict far too much."""
    return fit(points, largest=largest, baseline=baseline)[0]


def fit(
    points: list[tuple[int, int]], *, largest: int = 5, baseline: int | None = None
) -> tuple[tuple[float, float] | None, bool]:
    """``fit_linear``'s model, and whether the peaks grew convexly (sizes under the
    plateau filter were left out, or the largest lies well above the line): then the
    model's slope is a lower bound and its prediction an upper estimate, not a point one."""
    chosen = sorted(points)[-largest:]
    # A run of equal peaks at the small end is a plateau of fixed costs: none of its
    # sizes lies on the line (a slope from its last one to the next would be too flat).
    plateau = False
    while len(chosen) >= 2 and chosen[1][1] <= chosen[0][1]:
        chosen.pop(0)
        plateau = True
    if plateau:
        chosen.pop(0)
    convex = False
    if baseline is not None and chosen:
        top = max(m for _, m in chosen) - baseline
        kept = [(n, m) for n, m in chosen if m - baseline >= top / 4]
        convex = len(kept) < len(chosen)
        chosen = kept
    slopes = [(m2 - m1) / (n2 - n1) for (n1, m1), (n2, m2) in itertools.combinations(chosen, 2) if n2 != n1]
    if not slopes:
        return None, convex
    b = median(slopes)
    if b <= 0:
        return None, convex
    a = median([m - b * n for n, m in chosen])
    # The largest size well above the line: the peaks steepen (the peak moved from a fixed
    # part to the activations), or one reading is wild. Either way the line is no point
    # estimate of what lies beyond.
    n, m = chosen[-1]
    convex = convex or m - (a + b * n) > 0.05 * b * n
    return (a, b), convex


# What a reading may be off by where peaks are read as flat, as a share of it: the noisiest readings
# the search is tested against (a peak that moves with the allocator's history).
FLAT_NOISE = 0.05
# A batch size past any device's memory: where a step of the search would go further, it goes here.
MOST = 1 << 62


def flat_past(
    points: list[tuple[int, int]], limit: int | None, size: int
) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The smallest and the largest measured ``(size, peak)`` when the peaks grew by less than a byte a
    sample between them and ``size`` lies further past the smallest than the bytes the limit leaves
    above its peak, each reading off by up to ``FLAT_NOISE`` the way that hides growth most: at a
    byte a sample or more it cannot fit, so the peaks do not see the step's memory (or it does not
    depend on the batch size) and say nothing of what fits. None otherwise."""
    if limit is None or len(points) < 2:
        return None
    (n1, p1), (n2, p2) = min(points), max(points)
    rose = p2 * (1 + FLAT_NOISE) - p1 * (1 - FLAT_NOISE)  # the most the step's own peak can have grown
    if n2 > n1 and rose < (1 - FLAT_NOISE) * (n2 - n1) and size - n1 > limit - p1 / (1 + FLAT_NOISE):
        return (n1, p1), (n2, p2)
    return None


def predict(model: tuple[float, float] | None, limit: int | None) -> int | None:
    if model is None or limit is None:
        return None
    a, b = model
    return max(0, math.floor((limit - a) / b))


def safe_size(points: list[tuple[int, int]], baseline: int | None, limit: int | None) -> int | None:
    """The largest size that surely fits if the use above ``baseline`` grows at most in
    proportion to the batch (true when it is fixed costs plus a per-sample part): from the
    largest measured size n with peak p, ``n × (limit - baseline) / (p - baseline)``."""
    if baseline is None or limit is None or not points:
        return None
    n, peak = max(points)
    if peak <= baseline or limit <= baseline:
        return None
    return math.floor(n * (limit - baseline) / (peak - baseline))


def plateau_ratio(points: list[tuple[int, int]]) -> float:
    """When the two largest sizes measured peaked the same, the ratio of those sizes; else 0."""
    if len(points) < 2:
        return 0.0
    (n1, m1), (n2, m2) = sorted(points)[-2:]
    return n2 / n1 if m2 <= m1 else 0.0


def log_width(good: int, high: int | None) -> float | None:
    """How far apart the bracket's ends are, in log-size (0 once they meet); None without an upper end."""
    if high is None or good < 1:
        return None
    return math.log(high / good) if high > good else 0.0


def closing(good: int, margin: float, margins: int = 1) -> int:
    """The smallest size whose failure to fit leaves ``good`` within ``margin`` of the largest
    that fits: trying it either ends the search or gains the margin. ``margins`` > 1: the size
    that many margins past ``good`` (the steps of a climb that doubles them), at most ``MOST``: a long
    climb's margins would otherwise shrink the divisor to 0."""
    shrink = (1 - margin) ** margins
    return MOST if shrink * MOST <= good else math.floor(good / shrink) + 1


def split(good: int, high: int, share: float = 0.5, linear: bool = False) -> int:
    """The size ``share`` of the way from ``good`` to ``high`` (0.5: the middle), in log-size
    (their geometric mean at 0.5) or, ``linear``, in size; strictly above ``good``, at most ``high``."""
    if linear:
        size = math.floor(good + share * (high - good))
    else:
        size = math.floor(math.exp((1 - share) * math.log(max(good, 1)) + share * math.log(high)))
    return min(high, max(good + 1, size))


def stalled(brackets: list[tuple[int, int]], linear: bool = False) -> bool:
    """Whether the last two trials left the bracket ``(good, high)`` more than half as wide as
    it was before them: in log-size, or ``linear``, in size. A model's choices can each shave a
    sliver off one end (a line refitted to each failure, a bound lowered by what each failure
    kept); a bisection after two such trials keeps the bracket shrinking geometrically, so the
    search always ends."""
    if len(brackets) < 3:
        return False
    widths = [float(h - g) if linear else (log_width(g, h) or 0.0) for g, h in brackets[-3:]]
    return widths[-1] > 0.5 * widths[0]


# What a measured peak may be off by, as a share of it, where ``line_bound`` is used: frameworks
# that count every allocation (torch, CuPy) read their peaks exactly, but for the pool's rounding.
PEAK_NOISE = 0.01
# Points this far apart at least (as a ratio of sizes) set a slope that a noisy peak barely moves.
SPREAD = 1.25
# A line is extrapolated over this share of the step's own bytes at most.
SHORT_REACH = 0.05


def line_bound(points: list[tuple[int, int]], usable: int, baseline: int | None) -> int | None:
    """The largest size that can fit if the peak grows at least as fast per sample above the
    largest size measured as it did just below it (a line or a convex curve: fixed costs plus
    activations, with nothing that saves memory near the limit): the largest size, plus the
    bytes left under ``usable`` over that slope (half again, for the slope's own error), and a
    noisy reading's worth more.
    None while the last three points, each ``SPREAD`` apart, do not show such growth well above
    the noise, or the largest peak is not within ``SHORT_REACH`` of ``usable`` (a line is trusted
    over a short reach only)."""
    ordered = sorted(points)
    if len(ordered) < 3:
        return None
    n2, p2 = ordered[-1]
    below = [(n, p) for n, p in ordered if n * SPREAD <= n2]
    further = [] if not below else [(n, p) for n, p in ordered if n * SPREAD <= below[-1][0]]
    if not further:
        return None
    (n1, p1), (n0, p0) = below[-1], further[-1]
    slope, before = (p2 - p1) / (n2 - n1), (p1 - p0) / (n1 - n0)
    own = p2 - (baseline if baseline is not None else p0)
    room = usable - p2
    # The rise the slope is read from must dwarf what noisy readings could make of it.
    steady = p2 - p1 >= 8 * PEAK_NOISE * own and p1 > p0
    if not steady or slope < 0.9 * before or room > SHORT_REACH * own:
        return None
    return n2 + math.floor((1.5 * max(room, 0) + PEAK_NOISE * own) / slope)


def knee(points: list[tuple[int, int]], limit: int | None, noise: float = PEAK_NOISE) -> int | None:
    """Where the peaks stopped growing with the batch near the limit, or None.

    XLA rematerializes a step whose peak would pass its limit (it recomputes activations),
    so near the limit the peak grows a small fraction as fast per sample as below it
    (docs/measurements.md, "batch-size search"). Then the peaks say nothing about how much more
    fits, and a line through them predicts far too much. The knee is where the steep line
    below meets the flat one at the top. Only over a step of 5% or more, 10x flatter as read,
    and still half as steep with each reading off by ``noise`` (a share of it) the way that
    hides a knee most: a step of 5% in a line whose readings are each 1% off can read flat
    (two readings moved 1% each move a rise of a few percent of the peak past zero)."""
    if limit is None or len(points) < 3:
        return None
    ordered = sorted(points)
    (m1, q1), (m2, q2) = ordered[-2:]
    if q2 < 0.9 * limit or m2 < 1.05 * m1:
        return None
    flat = (q2 - q1) / (m2 - m1)
    # The top's slope as steep as the readings allow; each slope below as flat as they allow.
    flat_most = (q2 * (1 + noise) - q1 * (1 - noise)) / (m2 - m1)
    for (n0, p0), (n1, p1) in reversed(list(itertools.pairwise(ordered[:-1]))):
        steep = (p1 - p0) / (n1 - n0)
        steep_least = (p1 * (1 - noise) - p0 * (1 + noise)) / (n1 - n0)
        if steep > 0 and flat < 0.1 * steep and flat_most < 0.5 * steep_least:
            knee = (q2 - p1 + steep * n1 - flat * m2) / (steep - flat)
            return int(min(max(knee, n0), m2))
    return None


def ran_past_the_cap(points: list[tuple[int, int]], limit: int, good: int) -> tuple[int, int] | None:
    """The smallest size whose peak reached the limit while ``good``, larger, still ran
    though the peaks' own slope below that size says it needs 2% more than the limit, even
    with each reading off by ``PEAK_NOISE`` the way that flattens the slope most. The slope
    runs from the nearest size ``SPREAD`` times smaller where there is one (two readings only
    5% apart, each 1% off, move a slope by 40%), else from the nearest 5% smaller. A peak above
    the limit does not count: the limit did not bind it (a noisy reading, or a limit under the
    real cap), so it shows no memory saved to fit."""
    ordered = sorted(points)
    for i, (n, peak) in enumerate(ordered):
        below = [(m, q) for m, q in ordered[:i] if SPREAD * m <= n] or [(m, q) for m, q in ordered[:i] if 1.05 * m <= n]
        if n >= good or not 0.99 * limit <= peak <= limit or not below:
            continue
        m, q = below[-1]
        low, high = peak * (1 - PEAK_NOISE), q * (1 + PEAK_NOISE)
        slope = (low - high) / (n - m)
        if slope > 0 and low + slope * (good - n) > 1.02 * limit:
            return n, peak
    return None


# What a saturation note says saves the memory where no framework names its own way.
SATURATION_CAUSE = "the step saves memory to fit near the limit (as a framework that recomputes activations does)"


def saturation_note(
    points: list[tuple[int, int]], limit: int | None, good: int, cause: str = SATURATION_CAUSE
) -> str | None:
    """Said when the peaks show the step saving memory to fit: a knee near the limit (see
    ``knee``), or a size whose peak reached the limit while a larger one, which the peaks'
    slope says cannot fit, still ran (clamped at the cap while the framework saves memory).
    ``cause`` names how it saves it (the framework's own words: ``adapter.search.saturation_cause``)."""
    if limit is None:
        return None
    bend = knee(points, limit)
    if bend is not None:
        top = max(points)
        return (
            f"above about {bend} the peak stopped growing with the batch ({top[1] / limit:.0%} of the limit at "
            f"{top[0]}): {cause}, so sizes above about {bend} may run slower per sample; time the step before "
            "taking the largest"
        )
    at_cap = ran_past_the_cap(points, limit, good)
    if at_cap is None:
        return None
    n, peak = at_cap
    return (
        f"at {n} the peak reached the limit ({peak / limit:.1%}), yet sizes up to {good} ran: {cause}, so "
        f"sizes above {n} may run slower per sample; time the step before taking the largest"
    )
