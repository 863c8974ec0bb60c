"""The batch-size search's predicted scale: each size's peak as the framework predicts it from
the compiled step (``find_batch_size(lower=...)``), and what the runs say about the capacity.

A prediction costs a compilation and no run, so the search runs only sizes predicted to fit
the capacity it still believes in. That capacity is not the limit (a pool grown on demand
fits less than its limit), so the runs place it on the same scale: a size that ran says the
capacity holds its predicted peak, one that failed says it is below. Both are kept in
"fresh" bytes: the predicted peak, plus the bytes in use beside what the prediction counts
(``offset``, calibrated from measured peaks), plus what earlier failures left in use.

Where the framework also predicts the step's largest single buffer (XLA's temporaries come as
one) and reads the largest buffer its allocator can hand out now (``room``: a pool grown on
demand keeps its regions, so what is free is not all in one piece), a size fits only where both
hold: its peak under the capacity, and its largest buffer within the room.

No I/O, no framework, no clock: the predictor is a callable, so the scale is tested with
simulated predictions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from unimem.search.rules import closing, split, stalled

__all__ = ["OVER", "Prediction", "Scale"]

OVER = 1 << 62  # the predicted peak of a size whose lowering itself ran out of memory

# A step's measured peak beyond this share of its predicted one (after the offset) means the
# predictions miss what the step holds: the search stops using them.
MISS = 0.10
# What a measured peak may be off by (an allocator's rounding), as a share of it: the bytes
# beside the predictions bound the sizes only less this.
NOISE = 0.03
# Without a second predicted size, a size this many times larger is the next one compiled.
GROWTH = 32
# The most a line through the compiled sizes is extrapolated in one step.
REACH = 1024


# A predicted peak, or the pair (peak, largest single buffer; None when unknown).
Prediction = int | tuple[int, int | None]


@dataclass
class Scale:
    """What the search knows on the predicted scale. ``predictor(n)`` returns the predicted
    peak bytes of size ``n`` (``OVER`` when lowering it ran out of memory), or the pair (peak,
    largest single buffer), or None when it cannot be predicted."""

    predictor: Callable[[int], Prediction | None]
    budget: int  # compilations allowed in all
    # ``sizes -> predictions`` compiled at once (a round costs about one compilation), or None.
    predict_many: Callable[[list[int]], Sequence[Prediction | None]] | None = None
    # Sizes a round compiles at once: above 1, the size a line places comes with the size that
    # would close the bracket if it fits, so one round both places and closes.
    width: int = 1
    # Bytes the step holds at size 0 on the predicted scale (its parameters and state), where
    # known: a line from it through one compiled size places the first extrapolation.
    held: int | None = None
    memo: dict[int, int] = field(default_factory=dict)
    largest: dict[int, int] = field(default_factory=dict)  # the largest single buffer, where predicted
    # The largest buffer the allocator can hand out now; None: no bound beside the capacity.
    room: int | None = None
    compiles: int = 0
    unknown: set[int] = field(default_factory=set)  # sizes the framework could not size
    # Measured peak - predicted - bytes earlier failures left, per run that fit with a measured
    # peak: what is in use beside what the predictions count (other arrays, a dataset).
    besides: list[tuple[int, int]] = field(default_factory=list)  # (bytes beside, measured peak)
    fits: list[tuple[int, int]] = field(default_factory=list)  # (predicted, kept before) of runs that fit
    fails: list[tuple[int, int]] = field(default_factory=list)  # the same of runs that failed
    distrust: str | None = None  # why the predictions are no longer used

    @property
    def trusted(self) -> bool:
        return self.distrust is None

    @property
    def offset(self) -> int:
        """The bytes beside the predictions where the next run is placed: the least measured (0 before any)."""
        return max(0, min(b for b, _ in self.besides)) if self.besides else 0

    @property
    def sure_offset(self) -> int:
        """The bytes beside the predictions that surely are: the least measured, less what a
        measured peak may be off by, so that a noisy reading never rules out a size that fits."""
        return max(0, min(b - math.ceil(NOISE * m) for b, m in self.besides)) if self.besides else 0

    def peak(self, size: int) -> int | None:
        """The predicted peak of ``size``, compiled once; None when the budget is spent or it cannot be predicted."""
        self.peaks([size])
        return self.memo.get(size)

    def peaks(self, sizes: list[int]) -> None:
        """Compile each of ``sizes`` not compiled yet, as the budget allows: at once where the
        framework can (``predict_many``), else one after another."""
        todo = [n for n in dict.fromkeys(sizes) if n not in self.memo and n not in self.unknown]
        todo = todo[: max(0, self.budget - self.compiles)]
        if not todo:
            return
        self.compiles += len(todo)
        many = self.predict_many if self.predict_many is not None and len(todo) > 1 else None
        values = many(todo) if many is not None else [self.predictor(n) for n in todo]
        for size, value in zip(todo, values, strict=True):
            if value is None:
                self.unknown.add(size)
                continue
            if isinstance(value, tuple):
                value, largest = value
                if largest is not None:
                    self.largest[size] = int(largest)
            self.memo[size] = int(value)

    def squeezed(self, size: int) -> bool:
        """Whether ``size``'s largest buffer is predicted past the room the allocator has now."""
        return self.room is not None and self.largest.get(size, 0) > self.room

    def _value(self, size: int, allowed: int) -> int:
        """``size``'s predicted peak, raised so that it is over ``allowed`` exactly when its
        largest buffer is past the room: one number per size, at most ``allowed`` where both
        fit, near-linear in the size where each is (a secant can place it)."""
        peak = self.memo[size]
        if self.room is None or size not in self.largest or peak >= OVER:
            return peak
        return max(peak, allowed - self.room + self.largest[size])

    # --- what the runs say ---------------------------------------------------------------------

    def ran(self, size: int, fits: bool, kept_before: int, measured: int | None) -> None:
        """Record a run of ``size`` (compiled before it ran) with ``kept_before`` bytes left by
        earlier failures; a run that fit with a measured peak calibrates the offset."""
        predicted = self.memo.get(size)
        if predicted is None or not self.trusted:
            return
        if fits and measured is not None:
            beside = measured - predicted - kept_before
            if self.besides and abs(beside - self.offset) > MISS * max(measured, 1):
                self.distrust = (
                    f"a measured peak ({measured} B) is {abs(beside - self.offset) / max(measured, 1):.0%} away "
                    "from its prediction: the predictions miss what the step holds"
                )
                return
            self.besides.append((beside, measured))
        (self.fits if fits else self.fails).append((predicted, kept_before))
        if self.fits and self.fails and max(map(sum, self.fits)) >= min(map(sum, self.fails)):
            self.distrust = (
                "a size predicted to need no more than one that ran did not fit: the predictions do not "
                "order the sizes as the device does"
            )

    def ceiling(self, limit: int | None) -> int | None:
        """The most bytes (as a fresh process holds them) a run may reach: the limit, and less
        than every failure's."""
        bounds = ([] if limit is None else [limit]) + [p + self.offset + kept - 1 for p, kept in self.fails]
        return min(bounds) if bounds else None

    def allowed(self, limit: int | None, kept_now: int, share: float) -> int | None:
        """The predicted peak the next run may have: under the ceiling, or with failures ``share``
        of the way from the largest run that fit to it (a bisection on this scale at 0.5)."""
        top = self.ceiling(limit)
        if top is None:
            return None
        if self.fails and self.fits and share < 1:
            floor = max(p + self.offset + kept for p, kept in self.fits)
            top = floor + math.floor(share * (top - floor))
        return top - self.offset - kept_now

    def bound(self, limit: int | None, kept_now: int, above: int) -> int | None:
        """One below the smallest compiled size above ``above`` that cannot fit now: predicted past
        the limit, or past what a failure showed the device holds, beside what is in use now (a
        failure's outputs left in use take room from every later run), or with a buffer larger
        than the allocator can hand out. None when no compiled size is."""
        # A failure's own bound widens by how much the measured peaks have strayed from the
        # predictions (their spread): kept bytes move it by bytes the predictions may misscale.
        spread = max(b for b, _ in self.besides) - min(b for b, _ in self.besides) if self.besides else 0
        # With fewer than two measured runs the spread says nothing, so a failure bounds only
        # sizes beside the bytes that were in use at it: kept since then may be misscaled.
        calibrated = len(self.besides) >= 2
        tops = [(p + self.sure_offset + spread + kept - 1, kept_now if calibrated else kept) for p, kept in self.fails]
        tops += [] if limit is None else [(limit, kept_now)]
        over = [
            n
            for n, p in self.memo.items()
            if n > above and (self.squeezed(n) or any(p + self.sure_offset + kept > top for top, kept in tops))
        ]
        return min(over) - 1 if over else None

    # --- where the next run goes ------------------------------------------------------------------

    def locate(self, allowed: int, good: int, high: int | None, tolerance: float, most: int) -> int | None:
        """The largest size above ``good`` and at most ``high`` predicted at most ``allowed`` (and
        its largest buffer within the room), to within ``tolerance`` of the size (exactly at 0),
        in at most ``most`` compilations; None when none above ``good`` is. A secant on the
        compiled sizes, then the smallest size whose prediction would close the bracket, so a
        near-linear peak takes three."""
        low: int | None = None
        brackets: list[tuple[int, int]] = []  # (largest fitting, smallest not) after each round
        for attempt in range(most + 1):
            values = {n: self._value(n, allowed) for n in self.memo}
            inside = [n for n, v in values.items() if v <= allowed and n >= good and (high is None or n <= high)]
            if not inside:
                return None
            low = max(inside)
            above = [n for n, v in values.items() if n > low and v > allowed]
            out = min(above) if above else None
            ends = [x for x in (None if out is None else out - 1, high) if x is not None]
            top = min(ends) if ends else None
            if attempt == most or (top is not None and low >= (1 - tolerance) * top):
                break
            size, also = self._candidate(values, allowed, low, out, tolerance)
            brackets += [] if out is None else [(low, out)]
            # The size that closes the bracket is exempt: it ends the placement if it misses.
            if out is not None and size > closing(low, tolerance) and stalled(brackets, linear=True):
                # A flat stretch (XLA rematerializes) or a bend drags the line's crossing just
                # under the last size that missed, round after round: halve the bracket instead.
                size, also = max(closing(low, tolerance), split(low, out - 1, linear=True)), []
            if top is not None:
                size = min(size, top)
            if size <= low:
                break
            # Rounds wider than one compile the size placed with the one that would tell the most
            # beside it (``_candidate``): one round can both place and close the bracket.
            beside = [n for n in also if n > size and (top is None or n <= top)][: self.width - 1]
            self.peaks([size, *beside])
            if size not in self.memo:
                break
        return low if low is not None and low > good else None

    def _candidate(
        self, values: dict[int, int], allowed: int, low: int, out: int | None, tolerance: float
    ) -> tuple[int, list[int]]:
        """The next size to compile, at least the smallest one that would close the bracket, and
        the sizes worth compiling beside it: inside a bracket, where the line through its ends
        crosses ``allowed`` (regula falsi); past every compiled size, where the first of the
        lines through ``low`` and the compiled size predicted nearest ``allowed`` crosses its
        bound: the peaks ``allowed``, the largest buffers the room (growing at most ``REACH``
        times a step). A line's size comes a little under its crossing, with the size that
        closes the bracket if it fits beside it; from ``low`` alone, see ``_first_reach``."""
        close = closing(low, tolerance)
        at_low = values[low]
        if out is not None:
            at_out = values[out]
            if at_out >= OVER:
                return max(close, (low + out) // 2), []
            guess = low + (allowed - at_low) * (out - low) / (at_out - at_low)
            # Aim a little under the crossing, so that the size most likely fits and the closing
            # size above it ends the bracket: a secant from a far end of a bent line lands just
            # past the crossing again and again (seen on a GPU: three compilations 0.4% apart).
            fits_closes = math.ceil((1 - tolerance) * (out - 1))
            aim = fits_closes if guess >= fits_closes else guess * (1 - tolerance / 2)
            size = max(close, min(math.floor(aim), out - 1))
            return size, [closing(size, tolerance)]
        # The line's other end at least twice the tolerance under ``low``: XLA's predictions are
        # not smooth from one size to the next, and a short line would magnify their steps.
        others = [(abs(v - allowed), n) for n, v in values.items() if n < (1 - 2 * tolerance) * low and v < OVER]
        others = others or [(abs(v - allowed), n) for n, v in values.items() if n != low and v < OVER]
        if not others:
            size, also = self._first_reach(low, allowed)
            return max(close, size), also
        n = min(others)[1]
        # Each bound on its own line: the raised value is flat where a constant buffer (a
        # parameter) is the largest at small sizes, and its line would cross far past both.
        lines = [(self.memo, allowed)]
        if self.room is not None and low in self.largest and n in self.largest:
            lines.append((self.largest, self.room))
        slopes = [(line, top, (line[n] - line[low]) / (n - low)) for line, top in lines]
        crossings = [low + (top - line[low]) / slope for line, top, slope in slopes if slope > 0]
        if not crossings:
            return max(close, GROWTH * low), []
        crossing = min(min(crossings), REACH * low)
        size = max(close, math.floor(crossing * (1 - tolerance / 2)))
        return size, [closing(size, tolerance)]

    def _first_reach(self, low: int, allowed: int) -> tuple[int, list[int]]:
        """Where to compile next from one compiled size, and beside it: where the nearer of two
        lines crosses its bound, the peaks' from what the step holds at size 0 (steeper than
        the step's own where buffers held at every size add to ``low``'s peak) and the largest
        buffers' from zero (a buffer held at every size, a parameter, makes it steeper too; yet
        where XLA sizes its temporaries differently at small sizes it is flatter: seen on an
        H200, 54 MiB at 2 and 121.6 MB a sample from 24 on). The nearer one lands under the
        answer where both hold; twice it, or the farther crossing if nearer, comes beside it,
        so the next line runs between two sizes past the small-size effects. ``GROWTH`` times
        ``low`` where neither line rises."""
        crossings = []
        held = None if self.held is None else self.held - self.offset  # on the predicted scale
        if held is not None and self.memo[low] > held:
            crossings.append(low * (allowed - held) / (self.memo[low] - held))
        if self.room is not None and self.largest.get(low, 0) > 0:
            crossings.append(low * self.room / self.largest[low])
        if not crossings:
            return GROWTH * low, []
        near, far = (min(math.floor(c), REACH * low) for c in (min(crossings), max(crossings)))
        return near, [min(2 * near, far)] if far > near else []
