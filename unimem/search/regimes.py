"""The batch search's next size from the measured evidence: one rule per regime the search can be in,
behind one short dispatcher (``next_size``).

The evidence is a frozen record (``Evidence``) the policy gathers after each trial: the largest size
that ran and the smallest that did not, every bound on the answer, the line fitted through the peaks
and the sure bound (each dropped once a failure refuted it), and what the last trials showed (a
plateau, a knee, a climb past flat peaks, a costly failure, a stalled bracket). The regimes:

- ``halve``: nothing ran yet;
- ``close_after_filling``: the largest size that ran took about all the room a pool grown in
  regions has left (JAX with growth on), as the room counts it (all a step adds in one piece, where
  only its largest buffer needs one): two margins past the first such size while nothing failed, else
  the size whose failure ends the search;
- ``grow``: nothing above is known (no failure, no bound, no line), or only ``max_size`` far above the
  sure bound (a bound on the answer, no evidence memory reaches it): double, take the sure step, or
  stride over a plateau of fixed costs;
- ``reach_max_size``: ``max_size`` is within reach, or the sure bound covers it;
- ``under_the_miss``: the size the line placed failed, and the line says the bracket's top fits with the
  margin to spare: that top;
- ``extrapolate``: the line's answer is a point estimate: just under it;
- ``safe_jump``: the sure bound is a step up, and the answer not far above it;
- ``bisect``: the estimates are far apart, or a failure refuted the line: the bracket split in
  log-size (a third of the way where failures are costly; in size where a failure refuted the
  sure bound while the peaks follow a line);
- at the edge of the answer, whatever placed it: ``climb`` (the framework saves memory to fit, and
  sizes ran on above flat peaks), ``saturate`` (a knee near the limit), ``close`` (a smaller step
  than the margin gains: the size whose failure ends the search);
- ``unstall``: the last trials left the bracket more than half as wide: bisect it.

Placing sizes by predicted peaks (``lower=``) compiles sizes, so it is no pure rule: it comes first,
in ``predictions.place``. Pure functions: no I/O, no framework, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from unimem.search.rules import closing, split

__all__ = [
    "CLIMB",
    "MAX_EXTRAPOLATION",
    "Estimates",
    "Evidence",
    "Step",
    "bisect",
    "climbing",
    "close_after_filling",
    "estimates",
    "extrapolate",
    "grow",
    "halve",
    "next_size",
    "reach_max_size",
    "safe_jump",
    "saturate",
    "under_the_miss",
    "unstall",
]

# A line through sizes this many times smaller than its prediction is no point estimate
# while a sure step exists: a step's peaks steepen past small sizes, so such a line
# overshoots, and a failed trial costs seconds (docs/measurements.md, "batch-size search").
MAX_EXTRAPOLATION = 4.0
# Steps a framework that saves memory to fit ran past the last size whose peak rose, in margins: XLA's
# rematerialization ran three to four (15-23% at a 5% margin) on an H200.
CLIMB = 3


@dataclass(frozen=True)
class Evidence:
    """What the trials showed, as the next size is placed from it."""

    good: int  # the largest size that ran (0: none yet)
    bad: int | None = None  # the smallest size that did not
    margin: float = 0.05
    max_size: int | None = None
    high: int | None = None  # every bound on the answer together (``state.upper_bound``)
    # The line's answer under the limit (None: no line, or a failure at or below it refuted it), and
    # whether the peaks grew convexly: the answer is then an upper estimate, not a point one.
    predicted: int | None = None
    convex: bool = False
    # The largest size that surely fits if the use grows at most in proportion to the batch
    # (``rules.safe_size``; None: unknown, or a failure at or below it refuted it).
    safe: int | None = None
    flat: float = 0.0  # the two largest sizes measured peaked the same: the ratio of those sizes (else 0)
    saturated: bool = False  # the peaks stopped growing near the limit (``rules.knee``), and nothing failed
    streak: int = 0  # sizes in a row placed as saturated steps
    refit: bool = False  # a size fit after the smallest failure: the line comes from a point it did not
    jumped: bool = False  # the last trial was a sure step, and it fit
    cautious: bool = False  # a failure costs much more than a run that fits (``findings.failures_costly``)
    linear: bool = False  # a failure refuted the sure bound while the peaks follow a line
    # Where the framework saves memory to fit: how many sizes in a row ran above ``peaked`` (the largest
    # size whose peak was read) without their peak reading higher.
    climb: int = 0
    peaked: int = 0
    stalled: bool = False  # the last two trials left the bracket more than half as wide (``rules.stalled``)
    filled_room: bool = False  # the largest size that ran took about all the room a pool grown in regions left
    # Where it did: its peak stayed within the room as the framework counts it (all a step adds in one
    # piece), and whether the last size was itself placed past a size that filled it, or at the edge.
    within_room: bool = False
    refilled: bool = False
    # Where the last trial, placed just under the line's answer, failed: the largest size the line says
    # fits with the margin to spare (None otherwise).
    line_with_margin: int | None = None
    host_growth: int | None = None  # on a host without device figures: the most a size grows past ``good``


@dataclass(frozen=True)
class Step:
    """The next size, why, and whether it was placed on the measured peaks (then what said it would fit,
    the line's answer and the sure bound, is refuted by its failure)."""

    size: int
    reason: str
    relies: bool = True


@dataclass(frozen=True)
class Estimates:
    """The answer's estimates from the evidence: where the measured regimes place a size."""

    high: int | None  # below the smallest failure, at most ``max_size``
    low: int  # the lower estimate: ``good``, raised to the sure bound less half the margin
    safe: int | None  # the sure bound, where it still lies below ``high``
    top: int | None  # the upper estimate: the line's answer inside the bracket, else its top
    trusted: bool  # the line's answer is a point estimate
    aimed: bool  # ``top`` is the line's answer, or a near miss just above the failure


def next_size(e: Evidence) -> Step:
    """The next size to try, and why: the regime the evidence is in places it, the edge of the answer
    may move it, and every bound holds it."""
    if e.good == 0:
        return halve(e)
    if e.filled_room:
        return close_after_filling(e)
    est = estimates(e)
    size, reason = _place(e, est)
    size, reason = _at_the_edge(e, est.high, size, reason)
    if e.high is not None and reason != "close" and e.stalled and not _max_size_alone(e):
        # The close step is exempt: it ends the search if it fails, and gains the margin if not.
        size, reason = unstall(e)
    if e.host_growth is not None:
        size = min(size, e.host_growth * e.good)  # on the host a size that does not fit kills the process
    return Step(size if e.high is None else min(size, e.high), reason)


def _place(e: Evidence, est: Estimates) -> tuple[int, str]:
    """The size the measured regime places. The answer lies between the lower estimate and the upper
    one: above nothing known, grow; the user's bound in reach, take it; a trusted line, aim under it;
    the sure bound a step up, take it; else bisect between them."""
    if est.top is None or _only_max_size_far_above(e, est):
        return grow(e, est)
    if e.bad is None and est.top == e.max_size and (est.trusted or 2 * est.low >= est.top):
        return reach_max_size(est)
    if e.line_with_margin is not None and e.bad is not None and e.good < est.top <= e.line_with_margin:
        return under_the_miss(est)
    if est.aimed and est.trusted:
        return extrapolate(e, est)
    # Not for a second small step in a row: a sure bound that a fixed part keeps loose creeps up a few
    # percent a trial.
    if (
        est.low > e.good
        and est.top <= 4 * est.low
        and (est.low >= 1.15 * e.good or est.top <= 1.5 * est.low or not e.jumped)
    ):
        return safe_jump(est)
    return bisect(e, est)


def _max_size_alone(e: Evidence) -> bool:
    """Whether nothing failed and no bound but ``max_size`` lies above ``good``. ``max_size`` limits the
    answer and is no evidence that memory reaches it: no bracket under it stalls, and no step is placed
    from it that would not be placed without it."""
    return e.bad is None and e.max_size is not None and e.high == e.max_size


def _only_max_size_far_above(e: Evidence, est: Estimates) -> bool:
    """Whether ``max_size`` alone bounds the answer (``_max_size_alone``), the line gives no answer, and
    it lies more than 4 times above the sure step: the step taken without it, the sure step (a
    geometric mean of the sure step and a data set's size overshot GPT-2's answer many times over)."""
    far = e.max_size is not None and e.max_size > 4 * est.low
    return far and _max_size_alone(e) and e.predicted is None and est.safe is not None


def _at_the_edge(e: Evidence, high: int | None, size: int, reason: str) -> tuple[int, str]:
    """Near the answer: a climb past flat peaks or a knee sets the step, and a step smaller than the
    margin becomes the size whose failure ends the search; strictly above ``good``, within ``high``."""
    if e.climb and e.bad is None:
        size, reason = climbing(e.good, e.peaked, e.climb, e.margin), "saturated"
    elif e.saturated:
        size, reason = saturate(e)
    close = closing(e.good, e.margin)
    if size < close:
        # Near the edge: the smallest size whose failure ends the search beats a small
        # step up (it fails and ends it, or fits and gains more).
        size, reason = close, "close"
    size = max(e.good + 1, size)
    return (size if high is None else min(size, high)), reason


def estimates(e: Evidence) -> Estimates:
    """The lower and upper estimates of the answer, and whether the line's answer is trusted: a point
    estimate unless the peaks grew convexly, or (with a sure bound) it lies more than twice above that
    bound, or, when that bound is a step up, more than ``MAX_EXTRAPOLATION`` times the largest size that
    ran: a line through small sizes, whose peak a fixed part sets, predicts far too much."""
    bounds = [x for x in (None if e.bad is None else e.bad - 1, e.max_size) if x is not None]
    high = min(bounds) if bounds else None
    low, safe = e.good, None
    if e.safe is not None and (high is None or e.safe * (1 - e.margin / 2) < high):
        # A failure at or below the sure bound refutes it (the limit was optimistic).
        low, safe = max(e.good, math.floor(e.safe * (1 - e.margin / 2))), e.safe
    elif e.safe is not None and e.bad is None and high is not None:
        low = max(e.good, high)  # nothing failed, and the sure bound covers ``max_size``: it surely fits
    predicted = e.predicted
    trusted = (
        predicted is not None
        and not e.convex
        and (safe is None or predicted <= 2 * max(low, 1))
        and (safe is None or low <= e.good or predicted <= MAX_EXTRAPOLATION * e.good)
    )
    top = predicted if predicted is not None and (high is None or predicted <= high) else high
    # A prediction at most a margin above the smallest failure, still made after a size that
    # fit since that failure (a new point, and the line holds), is right but for noise: the
    # limit lies just under the failure, so aim there rather than bisect from ``good``.
    near_miss = e.refit and predicted is not None and e.bad is not None and e.bad <= predicted <= e.bad / (1 - e.margin)
    aimed = top is not None and (top == predicted or near_miss)
    return Estimates(high, low, safe, top, trusted, aimed)


# --- the regimes -----------------------------------------------------------------------------------


def halve(e: Evidence) -> Step:
    """Nothing ran yet: half the smallest size that failed."""
    assert e.bad is not None
    return Step(max(1, e.bad // 2), "halve", relies=False)


def close_after_filling(e: Evidence) -> Step:
    """The largest size that ran took about all the room a pool grown in regions has left, as the room
    counts it: all a step adds in one piece, where only its largest buffer needs one (XLA's temporaries;
    the step's inputs and outputs lie beside it). The first such size, its peak within that count and
    nothing failed, leaves room beside the piece: two margins past it (a Flax MLP on an H200 ran more
    than two past such a size); if that fails, the next size ends the search, two failures at most. Else
    the size whose failure ends the search (a failure costs seconds there). Within every bound."""
    if e.within_room and not e.refilled and e.bad is None:
        size, reason = closing(e.good, e.margin, 2), "past-room"
    else:
        size, reason = closing(e.good, e.margin), "close"
    return Step(size if e.high is None else min(size, e.high), reason, relies=False)


def grow(e: Evidence, est: Estimates) -> tuple[int, str]:
    """Nothing above is known: the sure step (it grows by the headroom's ratio), else double; or grow
    while a plateau of fixed costs keeps the sure step small, squaring the plateau's ratio at each step
    on it (a long plateau costs few trials)."""
    size, reason = (est.low, "safe-jump") if est.safe is not None else (2 * e.good, "grow")
    stride = min(16.0, max(2.0, e.flat**2))
    if e.flat and size < stride * e.good:
        size, reason = math.floor(stride * e.good), "grow"
    return size, reason


def reach_max_size(est: Estimates) -> tuple[int, str]:
    """Nothing failed and ``max_size`` is the upper estimate, trusted or within twice the lower one (the
    sure bound covering it)."""
    assert est.top is not None
    return est.top, "upper-bound"


def under_the_miss(est: Estimates) -> tuple[int, str]:
    """The size the line placed failed, just above the bracket's top: where the line says that top fits
    with the margin to spare (each sample a large share of the room), it missed by about a size, so that
    top (one trial that ends the search if it fits, where a bisection takes one a size)."""
    assert est.top is not None
    return est.top, "predict"


def extrapolate(e: Evidence, est: Estimates) -> tuple[int, str]:
    """The line's answer is a point estimate: just under it (half a margin), at least the lower estimate."""
    assert est.top is not None
    return max(est.low, math.floor(est.top * (1 - e.margin / 2))), "predict"


def safe_jump(est: Estimates) -> tuple[int, str]:
    """The sure bound is a step up and the answer not far above it: take it (it fits, and the next
    step starts from there)."""
    return est.low, "safe-jump"


def bisect(e: Evidence, est: Estimates) -> tuple[int, str]:
    """The estimates are far apart, or a failure below it refuted the line's answer: their geometric
    mean (a bisection in log-size, which halves the uncertainty whichever way the trial goes); a third of
    the way up where a failure costs much more than a run (approach from below); in size where a failure
    refuted the sure bound while the peaks follow a line (the answer lies near the top)."""
    assert est.top is not None
    base, top = max(est.low, 1), est.top
    share = 1 / 3 if e.cautious and e.bad is not None else 0.5
    if top <= base:
        middle = top
    elif e.linear or share < 0.5:
        middle = split(base, top, share, e.linear)
    else:
        middle = math.floor(math.sqrt(base * top))
    return max(est.low, middle), "predict-far" if top == e.predicted else "bisect"


def climbing(good: int, peaked: int, climb: int, margin: float) -> int:
    """The next size above ``good`` where the ``climb`` sizes in a row above ``peaked`` (the largest
    whose peak was read) ran without their peak reading higher: the step saves memory to fit (XLA
    rematerializes), and the peaks say nothing of how far it stretches. After the first, ``CLIMB``
    margins past ``peaked``; after the second, the size whose failure ends the search; past that,
    steps that double (1, 2, 4 margins): few sizes that fit, and one failure, reach the answer."""
    if climb == 1:
        return max(closing(peaked, margin, CLIMB), closing(good, margin))
    return closing(good, margin, 2 ** max(0, climb - 3))


def saturate(e: Evidence) -> tuple[int, str]:
    """The peaks stopped growing near the limit and nothing failed: only a step by the margin is safe (a
    failed trial can cost seconds and leave the step's outputs in use); past three such steps in a row
    (15% at a 5% margin, the stretch XLA's rematerialization gave on the GPU), each doubles."""
    return closing(e.good, e.margin, 2 ** max(0, e.streak - 2)), "saturated"


def unstall(e: Evidence) -> tuple[int, str]:
    """The bracket stalled (a model's choices each shaved a sliver off one end): split it (a third of the
    way up where failures are costly; in size after a refutation), at least the size whose failure ends
    the search, so that it keeps shrinking geometrically and the search always ends."""
    assert e.high is not None
    close = closing(e.good, e.margin)
    return max(split(e.good, e.high, 1 / 3 if e.cautious else 0.5, e.linear), close), "bisect"
