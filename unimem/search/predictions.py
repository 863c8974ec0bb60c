"""A batch search with ``lower=``: each size's peak predicted from the compiled step, before it
runs, and the sizes placed by those predictions while they hold (what the runs say about the
predictions: ``unimem.search.scale``; compiling several sizes at once: ``unimem.search.compile``).
The scale's fields are written here and by the scale itself; its room is read with the capacity
(``state.reread_capacity``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from unimem.diagnose.guard import clear_frames, find_oom
from unimem.errors import ConfigError
from unimem.search.attempt import mark, tell_ranks
from unimem.search.compile import size_all
from unimem.search.findings import failures_costly
from unimem.search.framework import size_lowered
from unimem.search.host_limit import GROWTH as HOST_GROWTH
from unimem.search.limit import bytes_of
from unimem.search.predicted import FIRST, predictor_of
from unimem.search.ranks import known, worst
from unimem.search.rules import closing
from unimem.search.scale import OVER, Scale
from unimem.search.state import Run, grows_in_regions, reread_capacity, scale_limit, take_snapshot, upper_bound
from unimem.sizes import format_bytes

__all__ = [
    "first_size",
    "fresh_note",
    "make_room",
    "new_scale",
    "place",
    "placed_first",
    "predicted_peak",
    "prediction_notes",
    "read_room",
    "start_after_placed_failure",
]

# Compilations of ``lower(n)`` allowed per call of the step the search may make (``max_trials``).
_COMPILES_PER_TRIAL = 2
# Sizes compiled at once where the framework sizes them in threads and compilations take nothing
# from the pool: a placed size and the one a margin under it (two took 1.3 times one compilation's
# time on an H200).
_COMPILE_WIDTH = 2
# Compilations of ``lower(n)`` allowed per size placed: on a GPU each costs seconds (a large step's
# tens of seconds), and from the start XLA's answer takes at most four (docs/explanation/batch-search.md);
# figures ``lower`` gives itself may bend any way, and get the six a bend takes.
_COMPILES_PER_PLACEMENT = 4
_COMPILES_PER_PLACEMENT_GIVEN = 6


def new_scale(run: Run, room: int | None, held: int | None) -> Scale:
    """The predicted scale of a search with ``lower=``, sizes compiled through ``lower``: ``room``, the
    largest buffer the allocator could hand out when the search began, ``held`` the bytes in use then."""
    many = _predictor(run)
    scale = Scale(lambda n: many([n])[0], _COMPILES_PER_TRIAL * run.settings.max_trials, many)
    scale.room, scale.held = room, held
    return scale


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# What the framework says of one compiled size: its peak, its largest single buffer, and whether
# the compiler rematerialized it (None: unknown).
Figures = tuple[int, int | None, bool | None]


def _given(lowered: object) -> Figures | None:
    """What ``lower(n)`` returned when it is the prediction itself: the peak's bytes (an int), the
    pair (peak, largest buffer) or the triple (peak, largest buffer, rematerialized); None when it
    is something for the framework to size. A figure no pool can hold is a ``ConfigError``."""
    if _whole(lowered):
        peak: Any = lowered
        largest: Any = None
        remat: Any = None
    elif isinstance(lowered, tuple) and len(lowered) in (2, 3) and all(map(_whole, lowered[:2])):
        peak, largest, remat = (*lowered, None)[:3]
        if len(lowered) == 3 and not isinstance(remat, bool):
            raise ConfigError(
                "lower",
                f"lower() returned {lowered!r}: the third of (peak, largest buffer, rematerialized) says whether "
                "the compiler rematerialized the step, True or False",
            )
    else:
        return None
    if peak < 0 or (largest is not None and not 0 <= largest <= peak):
        raise ConfigError(
            "lower",
            f"lower() returned {lowered!r}: a peak in bytes is at least 0, and a (peak, largest buffer) "
            "pair holds a largest buffer between 0 and the peak",
        )
    return peak, largest, remat


def _size_lowered(run: Run, lowered: Any) -> Figures | None:
    """The predicted peak, largest single buffer and rematerialization of what ``lower(n)``
    returned (``_given``); else the search's framework sizes it, then each one imported
    (``framework.size_lowered``)."""
    given = _given(lowered)
    if given is not None:
        return given
    sized = size_lowered(run.framework, lowered)
    if sized is None:
        return None
    if run.scale is not None:
        run.scale.width = _COMPILE_WIDTH if sized.concurrent else 1
        run.scale.remat_share = sized.remat_share
        run.scale.rising = True  # a compiled program's figures: XLA's bytes per sample rise and level off
    return sized.peak, sized.largest, sized.rematerialized


def _predictor(run: Run) -> Callable[[list[int]], list[Figures | None]]:
    """``sizes -> predicted (peak, largest buffer, rematerialized)`` through ``lower=``, compiled at
    once where the scale's rounds are wider than one (``unimem.search.compile``); a lowering that
    itself runs out of memory predicts ``OVER`` (the size does not fit), any other error stops the search."""
    lower = predictor_of(run.settings)  # an estimate: the figure held against the limit

    def predict(sizes: list[int]) -> list[Figures | None]:
        threads = 1 if run.scale is None else run.scale.width
        results: list[Figures | None] = []
        for size, done in zip(sizes, size_all(lower, lambda x: _size_lowered(run, x), sizes, threads), strict=True):
            value, largest, remat = (None, None, None) if done.value is None else done.value
            if done.error is not None:
                if find_oom(done.error) is None:
                    mark(done.error, size, f"unimem.find_batch_size: lower({size}) raised this")
                    tell_ranks(run.ranks, "compilation", size, done.error)
                    raise done.error
                clear_frames(done.error)  # the lowering's frames may hold arrays of that size
                value, largest, remat = OVER, None, None
            if run.ranks is not None:
                # The largest over ranks, so every rank places the same sizes (None: one cannot size it);
                # rematerialized where any rank's compiler did.
                message = {"kind": "compilation", "size": size, "predicted": value, "largest": largest, "remat": remat}
                answers = run.ranks.exchange(message)
                value = worst([p["predicted"] for p in answers.values()])
                largest = worst([p["largest"] for p in answers.values()])
                remat = known([p.get("remat") for p in answers.values()])
            room = None if run.scale is None else run.scale.room
            run.progress.compiled(size, value, done.seconds, largest, room)
            results.append(None if value is None else (value, largest, remat))
        return results

    return predict


def predicted_peak(run: Run, size: int) -> int | None:
    """The predicted peak of a size about to run, while the predictions are used."""
    if run.scale is None or not run.scale.trusted:
        return None
    value = run.scale.peak(size)
    if value is None:
        run.scale.distrust = (
            f"no prediction for batch size {size} (compilations spent, or the framework could not size what "
            "lower() returned): searched on the measured peaks from there"
        )
    return value


def make_room(run: Run, predicted: int | None) -> None:
    """Before a call predicted to reach ``predicted`` bytes, in a pool grown in regions: one region that
    holds all the call adds to what is in use (``framework.make_room``), so that its inputs, made first,
    do not take a region of their own and leave its largest buffer too little beside them."""
    if predicted is not None and predicted < OVER and grows_in_regions(run):
        run.framework.make_room(predicted)


def first_size(run: Run) -> int:
    """The first size to run: ``start``, halved while predicted above the limit. What ``lower``
    returns for it must be something the framework can size: else a ``ConfigError`` before any run."""
    size = run.settings.start
    if run.scale is None:
        return size
    predicted = run.scale.peak(size)
    if predicted is None:
        raise ConfigError(
            "lower",
            f"lower({size}) returned nothing the framework in use can size: return the step lowered for that "
            "size (jax: jax.jit(step).lower(...)), or its predicted peak bytes as an int",
        )
    # Past the limit, or rematerialized (no size that runs at full speed): halved until it is not.
    while (
        size > 1
        and predicted is not None
        and ((run.limit is not None and predicted > run.limit.bytes) or size in run.scale.remat)
    ):
        size //= 2
        predicted = run.scale.peak(size)
    return size


def prediction_notes(run: Run) -> list[str]:
    """What the predictions showed, for the search's notes: the sizes the compiler rematerialized
    (the smallest compiled with it, the largest without), or where it would begin to; and why the
    predictions were set aside, if they were."""
    scale = run.scale
    if scale is None:
        return []
    notes = [] if scale.distrust is None else [f"predictions (lower=) set aside: {scale.distrust}"]
    remat = sorted(n for n in scale.memo if scale.rematerialized(n))
    clean = sorted(n for n in scale.memo if n not in remat and scale.memo[n] < OVER)
    if remat:
        below = [n for n in clean if n < remat[0]]
        under = f"; the largest compiled without it: {below[-1]}" if below else ""
        notes.append(
            f"the compiler rematerializes the step from batch size {remat[0]} (the smallest size compiled that it "
            f"rematerialized, or predicted past its limit{under}): such a size recomputes to fit and runs slower, "
            "so none was run and the answer lies below it"
        )
    elif clean and scale.remat_limit is not None and scale.remat_share is not None:
        onset = scale.remat_onset()
        if onset is not None:
            notes.append(
                f"no size compiled was rematerialized (the largest: {clean[-1]}); the compiler would rematerialize "
                f"from about batch size {onset} (the predicted peak past {scale.remat_share:.0%} of the pool's limit)"
            )
    return notes


def fresh_note(run: Run, answer: int) -> str | None:
    """In a pool grown on demand (regions the calls took stay in it), how much more a fresh process
    would fit by the compiled sizes, where that is more than two margins above ``answer``: its pool holds
    only what the step holds at the start, so one buffer may take all the rest of the limit. None
    elsewhere, or where the predictions say nothing of it."""
    scale, limit, before = run.scale, bytes_of(run.limit), run.start.before
    if scale is None or limit is None or before is None or before.allocated is None or not grows_in_regions(run):
        return None  # no pool grown in regions (or figures given): a fresh process fits what this one does
    fresh = scale.fresh_bound(limit, limit - before.allocated)
    if fresh is None or (1 - 2 * run.settings.margin) * fresh <= answer:
        return None  # within what the lines' error and the margin explain
    after = take_snapshot(run)
    held = "" if after is None or after.reserved is None else f" now holds {format_bytes(after.reserved)} and"
    advice = run.framework.fresh_process_advice
    # Bounded by a compiled size the compiler rematerialized, the bound is that size, not an estimate:
    # where rematerialization begins under it is not known (XLA's own estimate of a peak runs higher).
    edge = fresh + 1 in scale.memo and scale.rematerialized(fresh + 1)
    where = (
        f"more, below batch size {fresh + 1} (where the compiler rematerializes; {fresh / answer - 1:.0%} more "
        f"than {answer} at most)"
        if edge
        else f"up to about batch size {fresh} by the compiled sizes ({fresh / answer - 1:.0%} more than {answer})"
    )
    return (
        f"a fresh process would fit {where}: this process's pool{held} keeps the regions its calls took, so a "
        "larger size needs a fresh process that runs it first" + ("" if advice is None else f"; {advice}")
    )


def place(run: Run) -> tuple[int, str] | None:
    """With predictions: the largest size predicted under the limit; after the first failure,
    the smallest size that ends the search if it fits (the capacity lies under the limit, most
    often a little); after more, one predicted halfway (a third of the way when failures are
    costly) from the largest run that fit to the ceiling the failures set. None: they cannot place it."""
    scale, margin, found = run.scale, run.settings.margin, run.findings
    assert scale is not None
    read_room(run)  # the last run (and the compilations before it) may have grown the pool
    scale.after_round = lambda: read_room(run)
    below = _below_the_failure(run, scale)
    if below is not None:
        return below, "predicted-below"
    costly = failures_costly(found, bytes_of(run.limit))
    share = 1.0 if not scale.fails else 1 / 3 if costly else 0.5
    allowed = scale.allowed(scale_limit(run), found.kept_total, share)
    if allowed is None:
        scale.distrust = "no limit to hold the predicted peaks against"
        return None
    # On the host, no size more than ``HOST_GROWTH`` times the largest that ran, as in a measured search:
    # a size that does not fit kills the process, and each size costs the CPU in proportion.
    grown = HOST_GROWTH * found.good if run.start.host is not None else None
    bounds = [x for x in (None if found.bad is None else found.bad - 1, run.settings.max_size, grown) if x is not None]
    # At the ceiling the largest size is wanted to within the margin; a split needs only its region
    # (each compilation of a large step costs seconds on a GPU).
    most = (_COMPILES_PER_PLACEMENT if scale.rising else _COMPILES_PER_PLACEMENT_GIVEN) if share == 1 else 1
    first = allowed

    def now() -> int:  # a compilation may have taken from the pool (``read_room`` after each)
        again = scale.allowed(scale_limit(run), found.kept_total, share)
        return first if again is None else min(first, again)

    located = scale.locate(now, found.good, min(bounds) if bounds else None, margin, most)
    high = upper_bound(run)  # the compilations just made may bound it
    close = closing(found.good, margin)
    if located is None or located < close:
        # Less than a margin to gain at the target: the smallest size that ends the search
        # either way, where it may still fit (compiled first: predicted past the limit, it
        # ends the search without a run).
        if high is None or close > high or scale.peak(close) is None:
            return None
        return close, "close"
    # The size compiled, and placed a little under its lines' crossing already: any other would cost
    # the step a compilation of its own (seconds to minutes on a GPU).
    return located, "predicted-split" if share < 1 else "predicted"


def placed_first(run: Run, first: int) -> tuple[int, str] | None:
    """In a pool grown in regions, with the compiled step's predictions: the size placed from them
    (``place``), to run before ``first``. A run keeps the regions it took, so a smaller size run
    first cuts the room the placed one needs (simulated from an H200's figures, the JAX transformer's
    search from a start of 1024 answered 556 where one from 2 answered 722). None elsewhere, or where
    nothing above ``first`` is placed at the limit, or over ranks (each rank's pool says for itself whether
    it grows in regions, and every rank must open alike)."""
    scale = run.scale
    if scale is None or not scale.trusted or not scale.rising or run.ranks is not None or not grows_in_regions(run):
        return None
    placed = place(run)
    return placed if placed is not None and placed[1] == FIRST and placed[0] > first else None


def start_after_placed_failure(run: Run) -> tuple[int, str] | None:
    """After the first call, placed from the compiled sizes (``placed_first``), failed with nothing run
    yet: the start (``first_size``), as a search that opened with it runs it. The splits after need a size
    that fit below the failure; without one each is placed just under the last failure, a margin at a
    time, and every failure keeps its outputs. None otherwise."""
    found, scale = run.findings, run.scale
    if found.good or len(found.trials) != 1 or found.trials[0].reason != FIRST:
        return None
    if scale is None or not scale.rising or found.trials[0].fits:
        return None
    return first_size(run), "start"


def _below_the_failure(run: Run, scale: Scale) -> int | None:
    """After the first failure, which refuted the limit: the smallest size that ends the search if it
    fits, where it is predicted to fit beside what the failure left in use (XLA keeps its outputs). Right
    after that failure, or after the start run below a placed first call that failed."""
    found = run.findings
    if len(scale.fails) != 1 or found.bad is None:
        return None
    last = found.trials[-1]
    after_start = last.reason == "start" and len(found.trials) == 2 and found.trials[0].reason == FIRST
    if last.fits and not after_start:
        return None
    below = math.ceil((1 - run.settings.margin) * (found.bad - 1))
    ceiling = scale.allowed(scale_limit(run), found.kept_total, 1.0)
    predicted = scale.peak(below) if found.good < below < found.bad else None
    return below if predicted is not None and ceiling is not None and predicted <= ceiling else None


def read_room(run: Run) -> None:
    """Read the capacity and the room again (``reread_capacity``), with what the framework says
    of them for the predictions: the room a compilation may leave (``room_after_region``),
    and the compiler's own limit where the framework sized the predictions and the limit is its
    own cap (``remat_share`` of it). Over ranks, the smallest any rank knows."""
    scale = run.scale
    assert scale is not None
    reread_capacity(run)
    snapshot = take_snapshot(run) if run.settings.measure is None else None
    after = run.framework.room_after_region(snapshot)
    if run.ranks is not None:
        answers = run.ranks.exchange({"kind": "room", "size": run.findings.good, "room_after": after})
        after = min((p["room_after"] for p in answers.values() if p["room_after"] is not None), default=None)
    scale.room_after = after
    share, limit = scale.remat_share, bytes_of(run.limit)
    scale.remat_limit = None if share is None or limit is None or run.settings.limit is not None else int(share * limit)
