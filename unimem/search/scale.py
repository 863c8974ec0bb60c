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

A size whose compiled program the compiler rematerialized (recomputes values to fit under its
own limit, and runs slower; or could not bring it under) is beyond the answer, however low its
flattened peak reads, and so is every size above the smallest such one.

Each compilation of a large step costs seconds, so the sizes are placed to need few: from the
start, one more small size where the start says nothing of the bytes per sample; then a first
guess a line from them cannot overshoot; then the answer from lines through sizes whose bytes
per sample have levelled off, first under the room a compilation may leave.

No I/O, no framework, no clock: the predictor is a callable, so the scale is tested with
simulated predictions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

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
# A compiled size whose predicted peak grew this share of the way from the smallest compiled size's
# to the limit, or whose largest buffer is this share of the room, has levelled off: XLA's bytes per
# sample rise with the size and settle once its temporaries are large (on an H200 by 15-25% of the room).
SETTLED = 0.15
# A line through sizes that have not levelled off crosses the limit at most this many times past
# the answer (on an H200 two to four times: small sizes underestimate the bytes per sample).
OVERSHOOT = 4.0
# The one more small size compiled from the start alone is at most this many times the start: farther,
# XLA may size the temporaries otherwise (on an H200 a Flax MLP's 8192, 1024 times its start, held 9 kB
# a sample where 1024 held 33 kB and the sizes from 65536 on 66 kB: the line through it crossed the
# limit seven times past the answer, and a quarter of that crossing was rematerialized).
FIRST_REACH = 128
# What a line through levelled-off sizes may be off in its slope (on an H200 0.5-2.4%): it bounds
# the answer from above only this much less steep.
SLACK = 0.02


# A predicted peak, the pair (peak, largest single buffer; None when unknown), or the triple that
# adds whether the compiler rematerialized the program (None when unknown).
Prediction = int | tuple[int, int | None] | tuple[int, int | None, bool | None]


@dataclass
class Scale:
    """What the search knows on the predicted scale. ``predictor(n)`` returns the predicted
    peak bytes of size ``n`` (``OVER`` when lowering it ran out of memory), or the pair (peak,
    largest single buffer), or the triple (peak, largest buffer, rematerialized), or None when
    it cannot be predicted."""

    predictor: Callable[[int], Prediction | None]
    budget: int  # compilations allowed in all
    # ``sizes -> predictions`` compiled at once (a round costs about one compilation), or None.
    predict_many: Callable[[list[int]], Sequence[Prediction | None]] | None = None
    # Sizes a round may compile at once: above 1, where compilations take nothing from the pool
    # (``room_after`` None), the size placed on a levelled-off line comes with the size one margin
    # under it, so that one round ends the search whether the placed size fits or not.
    width: int = 1
    # Bytes the step holds at size 0 on the predicted scale (its parameters and state), where
    # known: a line from it through one compiled size places the first extrapolation.
    held: int | None = None
    memo: dict[int, int] = field(default_factory=dict)
    largest: dict[int, int] = field(default_factory=dict)  # the largest single buffer, where predicted
    # The largest buffer the allocator can hand out now; None: no bound beside the capacity.
    room: int | None = None
    # The largest buffer it could hand out after one more compilation took a region from the pool
    # (a pool grown on demand); None where compilations take nothing from it.
    room_after: int | None = None
    # The share of the pool's limit past which the framework's compiler rematerializes (where the
    # framework sized the predictions), and the predicted peak that makes on the pool's limit.
    remat_share: float | None = None
    remat_limit: int | None = None
    remat: set[int] = field(default_factory=set)  # sizes whose compiled program was rematerialized
    probed: bool = False  # a size placed on levelled-off lines was compiled: the room it leaves is known
    # Whether the bytes per sample the predictions add never fall much with the size, so that a line
    # through a compiled size bounds the sizes above it (``line_bound``): true of XLA's compiled
    # programs (they rise and level off), set where the framework sized them; not of figures given.
    rising: bool = False
    after_round: Callable[[], None] | None = None  # reads the room again after each round of compilations
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
        framework can (``predict_many``), else one after another; then read the room again."""
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
                if len(value) == 3 and value[2]:
                    self.remat.add(size)
                if value[1] is not None:
                    self.largest[size] = int(value[1])
                value = value[0]
            self.memo[size] = int(value)
        if self.after_round is not None:
            self.after_round()  # a compilation may have taken a region from the pool

    def squeezed(self, size: int) -> bool:
        """Whether ``size``'s largest buffer is predicted past the room the allocator has now."""
        return self.room is not None and self.largest.get(size, 0) > self.room

    def rematerialized(self, size: int) -> bool:
        """Whether the compiler rematerialized ``size``'s program, or its predicted peak passes the
        compiler's limit (it could not bring it under): no size that fits at full speed."""
        return size in self.remat or (self.remat_limit is not None and self.memo[size] > self.remat_limit)

    def _value(self, size: int, allowed: int) -> int:
        """``size``'s predicted peak, raised so that it is over ``allowed`` exactly when its
        largest buffer is past the room: one number per size, at most ``allowed`` where both
        fit, near-linear in the size where each is (a secant can place it)."""
        peak = self.memo[size]
        if self.room is None or size not in self.largest or peak >= OVER:
            return peak
        return max(peak, allowed - self.room + self.largest[size])

    def _fits(self, size: int, allowed: int) -> bool:
        return self._value(size, allowed) <= allowed and not self.rematerialized(size)

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

    def given(self, sizes: list[int]) -> None:
        """Read the predictions of ``sizes`` known already (an estimate's sizes): outside the budget,
        as nothing is compiled for them."""
        known = [n for n in sorted(sizes) if n not in self.memo]
        self.budget += len(known)
        self.peaks(known)

    def overrule(self, why: str | None) -> None:
        """Another's verdict on the runs replaces the scale's own (``ran``): ``why`` the predictions
        are set aside, or None: they hold."""
        self.distrust = why

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
        than the allocator can hand out, or rematerialized; and no further than the lines through
        the compiled sizes leave room for (``line_bound``). None when nothing bounds it."""
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
            if n > above
            and (
                self.squeezed(n)
                or self.rematerialized(n)
                or any(p + self.sure_offset + kept > top for top, kept in tops)
            )
        ]
        bounds = [min(over) - 1] if over else []
        if tops:
            line = self.line_bound(min(top - self.sure_offset - kept for top, kept in tops))
            bounds += [] if line is None else [line]
        return min(bounds) if bounds else None

    # --- lines through the compiled sizes ----------------------------------------------------------

    def _inside(self, allowed: int, good: int, high: int | None) -> tuple[list[int], int | None]:
        """The compiled sizes from ``good`` up that fit, below the smallest that does not (no size
        past one known to be too big fits), and that smallest one (None: none)."""
        over = [n for n in self.memo if n >= good and not self._fits(n, allowed)]
        out = min(over) if over else None
        inside = [
            n
            for n in sorted(self.memo)
            if n >= good and (out is None or n < out) and (high is None or n <= high) and self._fits(n, allowed)
        ]
        return inside, out

    def _bounds(self, allowed: int, room: int | None) -> list[tuple[dict[int, int], int]]:
        """Each line and the bytes it may reach: the peaks the limit (and the compiler's own limit),
        the largest buffers the room."""
        bounds = [(self.memo, allowed)]
        if self.remat_limit is not None:
            bounds.append((self.memo, self.remat_limit))
        if room is not None and self.largest:
            bounds.append((self.largest, room))
        return bounds

    @staticmethod
    def _below(fitting: list[int], low: int) -> int | None:
        """The other end of a line from ``low``: the largest fitting size at least 5% under it (XLA's
        predictions are not smooth from one size to the next, and a short line magnifies their
        steps), else the largest under it."""
        under = [n for n in fitting if n < low]
        far = [n for n in under if n <= 0.95 * low]
        return max(far) if far else max(under) if under else None

    def line_bound(self, allowed: int) -> int | None:
        """The largest size the compiled sizes leave room for, where the bytes per sample do not
        fall with the size (XLA's rise and level off): the largest buffer's line from zero through
        the largest compiled size that fits (where that buffer grew with the size: the temporaries)
        to the room, and the peaks' line through it at the bytes per sample it adds over the
        smallest compiled size, to the limit and the compiler's own limit; each ``SLACK`` less
        steep. None without two compiled sizes that fit, or where the bytes per sample may fall
        (``rising``)."""
        fitting, _ = self._inside(allowed, 0, None)
        if len(fitting) < 2 or not self.rising:
            return None
        low, first = fitting[-1], min(self.memo)
        slopes = [
            (self.memo, top, (self.memo[low] - self.memo[first]) / low) for line, top in self._bounds(allowed, None)
        ]
        grew = self.largest.get(low, 0) > self.largest.get(first, 0)
        if self.room is not None and grew:
            slopes.append((self.largest, self.room, self.largest[low] / low))
        crossings = [
            low + (top - line[low]) / (slope * (1 - SLACK))
            for line, top, slope in slopes
            if slope > 0 and top >= line[low]
        ]
        return math.floor(min(crossings)) if crossings else None

    def _crossing(self, low: int, fitting: list[int], allowed: int, room: int | None) -> int | None:
        """Where the lines from ``low`` cross their bounds, the nearest: each line through ``low``
        and the size ``_below`` it; from ``low`` alone, the peaks' from what the step holds at size
        0 and the largest buffers' from zero. At most ``REACH`` times ``low``; None where no line rises."""
        other = self._below(fitting, low)
        held = None if self.held is None else self.held - self.offset  # on the predicted scale
        crossings = []
        for line, top in self._bounds(allowed, room):
            if low not in line:
                continue
            if other is not None and other in line:
                slope = (line[low] - line[other]) / (low - other)
            elif line is self.memo:
                slope = (line[low] - held) / low if held is not None else 0.0
            else:
                slope = line[low] / low
            if slope > 0:
                crossings.append(low + max(0, top - line[low]) / slope)
        return None if not crossings else math.floor(min(min(crossings), REACH * low))

    def _settled(self, size: int, allowed: int) -> bool:
        """Whether ``size``'s bytes per sample have levelled off (``SETTLED``): its predicted peak
        grew that share of the way from the smallest compiled size's (from what the step holds at
        size 0, for that size itself) to the limit, or its largest buffer, grown with the size, is
        that share of the room."""
        first = min(self.memo)
        base: int | None = self.memo[first]
        if size == first:
            base = None if self.held is None else self.held - self.offset
        if base is not None and allowed > base and self.memo[size] - base >= SETTLED * (allowed - base):
            return True
        grown = self.largest.get(size, 0) > self.largest.get(first, 0) or size == first
        return self.room is not None and grown and self.largest.get(size, 0) >= SETTLED * self.room

    def fresh_bound(self, limit: int, room: int) -> int | None:
        """The largest size a fresh process would fit by the compiled sizes: its predicted peak, with the
        bytes beside the predictions, under ``limit``, its largest buffer within ``room`` (what a fresh
        pool has for one buffer), not rematerialized; from the largest compiled size that fits so, on its
        lines to those bounds (as ``_crossing`` places the search's sizes), below the smallest compiled
        size that does not. None while the predictions are set aside, after a run predicted to fit failed
        (the predictions then overstate what the device fits, fresh or not: on an H200 a JAX MLP's 59,975
        failed in a pool holding little more than its step, and a fresh process fitted 42,197), or where
        nothing bounds it."""
        if not self.trusted or self.fails:
            return None
        fresh = replace(self, room=room)  # the same scale, its largest buffers held to ``room``
        allowed = limit - self.offset
        fitting, out = fresh._inside(allowed, 0, None)
        crossing = fresh._crossing(fitting[-1], fitting, allowed, room) if fitting else None
        tops = [top for top in (crossing, None if out is None else out - 1) if top is not None]
        return max(fitting[-1], min(tops)) if fitting and tops else None

    def remat_onset(self) -> int | None:
        """About where the compiler would begin to rematerialize: where the peaks' line through the
        two largest sizes compiled without it passes the compiler's limit. None without that limit
        or such a line."""
        clean = sorted(n for n in self.memo if not self.rematerialized(n) and self.memo[n] < OVER)
        if self.remat_limit is None or len(clean) < 2:
            return None
        low = clean[-1]
        other = self._below(clean, low)
        assert other is not None
        slope = (self.memo[low] - self.memo[other]) / (low - other)
        return None if slope <= 0 else low + math.floor((self.remat_limit - self.memo[low]) / slope)

    def _straight(self, fitting: list[int]) -> bool:
        """Whether the peaks of the three largest compiled sizes that fit lie on one line (the
        slopes either side of the middle one within a tenth of each other): bytes per sample that
        no longer rise, so a line through them overshoots nothing, however small the sizes."""
        if len(fitting) < 3:
            return False
        a, b, c = fitting[-3:]
        before = (self.memo[b] - self.memo[a]) / (b - a)
        after = (self.memo[c] - self.memo[b]) / (c - b)
        return after > 0 and abs(after - before) <= 0.1 * after

    # --- where the next compilation goes -----------------------------------------------------------

    def locate(
        self, allowed: int | Callable[[], int], good: int, high: int | None, margin: float, most: int
    ) -> int | None:
        """The largest compiled size above ``good`` and at most ``high`` predicted to fit (at most
        ``allowed``, its largest buffer within the room, not rematerialized), placed until the
        answer is within ``margin`` of it (below the smallest compiled size that does not fit, or
        ``line_bound``), in at most ``most`` compilations; None when none above ``good`` fits.
        ``allowed`` may be read again after each compilation (a callable): they may take from the pool."""
        low: int | None = None
        brackets: list[tuple[int, int]] = []  # (largest fitting, smallest not) after each round
        given = allowed
        for attempt in range(most + 1):
            cap = given() if callable(given) else given
            inside, out = self._inside(cap, good, high)
            if not inside:
                return None
            low = inside[-1]
            ends = [x for x in (None if out is None else out - 1, high) if x is not None]
            top = min(ends) if ends else None
            line = self.line_bound(cap)
            known = [x for x in (top, line) if x is not None]
            if attempt == most or (known and low >= (1 - margin) * min(known)):
                break
            size, also = self._candidate(cap, low, out, margin)
            brackets += [] if out is None else [(low, out)]
            # The size that ends the bracket is exempt: it ends the placement if it misses.
            if out is not None and size > closing(low, margin) and stalled(brackets, linear=True):
                # A flat stretch or a bend drags a line's crossing just under the last size that
                # missed, round after round: halve the bracket instead.
                size, also = max(closing(low, margin), split(low, out - 1, linear=True)), []
            if top is not None:
                size = min(size, top)
            if size <= low:
                break
            beside = [n for n in also if n != size and low < n and (top is None or n <= top)][: self.width - 1]
            self.peaks([size, *beside])
            if size not in self.memo:
                break
        return low if low is not None and low > good else None

    def _candidate(self, allowed: int, low: int, out: int | None, margin: float) -> tuple[int, list[int]]:
        """The next size to compile, and any to compile beside it (see ``width``). Inside a bracket
        (``out`` did not fit): where the line through its ends crosses (regula falsi), or where the
        lines from below do when ``out`` was rematerialized (its flattened peak is on no line).
        Above every compiled size: from sizes that have not levelled off, one more small size (from
        the start alone) or a quarter of the lines' crossing (``OVERSHOOT``); from levelled-off ones,
        a little under the crossing, first under the room a compilation may leave (``room_after``)."""
        inside, _ = self._inside(allowed, 0, None)
        fitting = [n for n in inside if n <= low]
        close = closing(low, margin / 2)
        if out is not None:
            return self._in_bracket(allowed, low, out, fitting, margin)
        settled = self._settled(low, allowed) or self._straight(fitting)
        room = self.room
        pessimistic = settled and not self.probed and self.room_after is not None and room is not None
        if pessimistic and room is not None and self.room_after is not None:
            room = min(room, self.room_after)
        crossing = self._crossing(low, fitting, allowed, room)
        if pessimistic and (crossing is None or crossing * (1 - margin / 4) <= close):
            # The room a compilation may leave holds nothing above ``low``: hold to the room there is.
            room, pessimistic = self.room, False
            crossing = self._crossing(low, fitting, allowed, room)
        if crossing is None:
            return max(close, GROWTH * low), []
        if not settled:
            if len(fitting) == 1:
                return max(close, self._first_small(low, allowed)), []
            return max(close, math.floor(crossing / OVERSHOOT)), []
        self.probed = True
        size = max(close, math.floor(crossing * (1 - margin / 4)))
        hedge = [math.ceil((1 - margin) * (size - 1))] if self.width > 1 and self.room_after is None else []
        return size, hedge

    def _first_small(self, low: int, allowed: int) -> int:
        """From the start alone, whose bytes per sample have not levelled off: the nearer of the
        line from what the step holds at size 0 through the start (its outputs and fixed costs make
        it steep: it lands under the answer) and a quarter of the largest buffers' line from zero, at
        most ``FIRST_REACH`` times ``low``; ``GROWTH`` times ``low`` where neither rises."""
        sizes = []
        held = None if self.held is None else self.held - self.offset
        if held is not None and self.memo[low] > held:
            sizes.append(low * (allowed - held) / (self.memo[low] - held))
        if self.room is not None and self.largest.get(low, 0) > 0:
            sizes.append(low * self.room / self.largest[low] / OVERSHOOT)
        return math.floor(min(min(sizes), FIRST_REACH * low)) if sizes else GROWTH * low

    def _in_bracket(self, allowed: int, low: int, out: int, fitting: list[int], margin: float) -> tuple[int, list[int]]:
        """The next size inside ``(low, out)``: aimed a little under the crossing so that it most
        likely fits, or at the smallest size that ends the search if it fits where the crossing
        lies within the margin of ``out``."""
        ends_it = max(low + 1, math.ceil((1 - margin) * (out - 1)))
        at_out = self.memo[out]
        if self.rematerialized(out) or at_out >= OVER:
            # A flattened or unknown peak lies on no line: the lines from below, under ``out``.
            crossing = self._crossing(low, fitting, allowed, self.room)
            guess = float(out - 1) if crossing is None else float(min(crossing, out - 1))
            if at_out >= OVER and crossing is None:
                guess = (low + out) / 2
        else:
            at_low, at_high = self._value(low, allowed), self._value(out, allowed)
            guess = low + (allowed - at_low) * (out - low) / max(at_high - at_low, 1)
        aim = ends_it if guess >= ends_it else guess * (1 - margin / 4)
        return max(closing(low, margin / 2), min(math.floor(aim), out - 1)), []
