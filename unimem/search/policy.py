"""The batch search's next-size policy: whether the answer is within the margin, and which size
to try next, placed by the predictions while they hold, else by the measured peaks (the pure
rules it applies: ``unimem.search.rules``)."""

from __future__ import annotations

import math

from unimem.search.host_limit import GROWTH as HOST_GROWTH
from unimem.search.limit import bytes_of
from unimem.search.rules import (
    closing,
    knee,
    median,
    next_size,
    plateau_ratio,
    predict,
    safe_size,
    split,
    stalled,
)
from unimem.search.state import Run, reread_capacity, scale_limit, take_snapshot, upper_bound

__all__ = ["call_budget", "choose", "is_converged"]

# A failure this many times slower than a run that fit, and slower than a second in itself (JAX:
# XLA's allocator waits before it fails), makes the search approach the answer from below.
_COSTLY = 5.0
_COSTLY_SECONDS = 1.0
# Compilations of ``lower(n)`` allowed per size placed: on a GPU each costs seconds (a large step's
# tens of seconds), and from the start XLA's answer takes at most four (docs/explanation/batch-search.md);
# figures ``lower`` gives itself may bend any way, and get the six a bend takes.
_COMPILES_PER_PLACEMENT = 4
_COMPILES_PER_PLACEMENT_GIVEN = 6


def is_converged(run: Run) -> bool:
    """Whether the largest size that ran is within the margin of the largest that can fit."""
    high = upper_bound(run)
    return bool(run.good) and high is not None and run.good >= (1 - run.settings.margin) * high


def _cautious(run: Run) -> bool:
    """Whether a failure costs much more than a run that fit: in time (``_COSTLY`` times the
    median run's, and over ``_COSTLY_SECONDS``), or in what failures left in use for good (over
    1% of the limit)."""
    ran = [t.seconds for t in run.trials if t.fits]
    worst = max((t.seconds for t in run.trials if not t.fits), default=0.0)
    slow = bool(ran) and worst > max(_COSTLY * median(ran), _COSTLY_SECONDS)
    return slow or (run.limit is not None and run.kept_total > 0.01 * run.limit.bytes)


def choose(run: Run, convex: bool) -> tuple[int, str]:
    """The next size to try, and why: placed by the predictions while they hold, else as
    ``rules.next_size`` says, bisecting whenever the bracket stalls (``stalled``)."""
    if run.good == 0:
        assert run.bad is not None
        return max(1, run.bad // 2), "halve"
    if run.scale is not None and run.scale.trusted:
        placed = _place(run)
        if placed is not None:
            return placed
    elif _grows_in_regions(run):
        last = run.trials[-1]
        # A failed call took regions from a pool grown on demand (its compilation's autotuning, its
        # temporaries) and kept them: the room left for one buffer is read again, and the failure
        # refuted the sure bound only as it stood against the room before; one above it is capped by it.
        if not last.fits and reread_capacity(run) and run.sure_refuted:
            run.sure_refuted = False
        room = None if run.limit is None else (1 - run.settings.margin) * (run.limit.bytes - run.kept_total)
        took_it = last.peak is not None and room is not None and last.peak >= room
        if last.fits and last.batch_size == run.good and took_it:
            # The largest size that ran took about all the room left: the next is the size whose
            # failure ends the search (a failure costs seconds here).
            high = upper_bound(run)
            size = closing(run.good, run.settings.margin)
            return (size if high is None else min(size, high)), "close"
    # What failed trials kept for good is lost to every later trial (peaks measured after
    # it include it too: both err on the safe side).
    usable = None if run.limit is None else run.limit.bytes - run.overhead - run.kept_total
    refuted = run.line_refuted_at is not None and len(run.points) <= run.line_refuted_at
    run.last_predicted = None if refuted else predict(run.model, usable)
    run.last_safe = None if run.sure_refuted else safe_size(run.points + run.bounded, run.baseline, usable)
    last = run.trials[-1]
    cautious = _cautious(run)
    # A failure refuted the sure bound while the peaks follow a line: the capacity lies under
    # the limit, and the answer nearer the failure than ``good``.
    linear = run.sure_refuted and run.model is not None
    size, reason = next_size(
        run.good,
        run.bad,
        run.settings.max_size,
        run.last_predicted,
        run.settings.margin,
        run.last_safe,
        flat=plateau_ratio(run.points),
        convex=convex,
        saturated=run.bad is None and knee(run.points, bytes_of(run.limit)) is not None,
        streak=next((i for i, t in enumerate(reversed(run.trials)) if t.reason != "saturated"), len(run.trials)),
        refit=run.bad is not None and last.fits,
        jumped=last.fits and last.reason == "safe-jump",
        cautious=cautious,
        linear=linear,
        **_climb(run),
    )
    high = upper_bound(run)
    # The close step is exempt: it ends the search if it fails, and gains the margin if not.
    if high is not None and reason != "close" and stalled(run.brackets, linear):
        close = closing(run.good, run.settings.margin)
        size, reason = max(split(run.good, high, 1 / 3 if cautious else 0.5, linear), close), "bisect"
    if run.host is not None:
        size = min(size, HOST_GROWTH * run.good)  # on the host a size that does not fit kills the process
    return (size if high is None else min(size, high)), reason


def _climb(run: Run) -> dict[str, int]:
    """For a framework that saves memory to fit (``Framework.rematerializes``; any, read through
    ``measure=``): how many sizes in a row ran above the largest whose peak was read (their peak read
    no higher: None, below the process's peak so far), and that size."""
    top = max(run.points, default=None)
    if top is None or (run.framework.name is not None and not run.framework.rematerializes):
        return {"climb": 0, "peaked": 0}
    climb = 0
    for trial in reversed(run.trials):
        if not trial.fits or trial.batch_size <= top[0]:
            break
        climb += 1
    return {"climb": climb, "peaked": top[0]}


def _place(run: Run) -> tuple[int, str] | None:
    """With predictions: the largest size predicted under the limit; after the first failure,
    the smallest size that ends the search if it fits (the capacity lies under the limit, most
    often a little); after more, one predicted halfway (a third of the way when failures are
    costly) from the largest run that fit to the ceiling the failures set. None: they cannot place it."""
    scale, margin, good = run.scale, run.settings.margin, run.good
    assert scale is not None
    _read_room(run)  # the last run (and the compilations before it) may have grown the pool
    scale.after_round = lambda: _read_room(run)
    if len(scale.fails) == 1 and not run.trials[-1].fits and run.bad is not None:
        below = math.ceil((1 - margin) * (run.bad - 1))
        ceiling = scale.allowed(scale_limit(run), run.kept_total, 1.0)
        predicted = scale.peak(below) if good < below < run.bad else None
        # Only where it fits beside what the failure left in use (XLA keeps its outputs).
        if predicted is not None and ceiling is not None and predicted <= ceiling:
            return below, "predicted-below"
    share = 1.0 if not scale.fails else 1 / 3 if _cautious(run) else 0.5
    allowed = scale.allowed(scale_limit(run), run.kept_total, share)
    if allowed is None:
        scale.distrust = "no limit to hold the predicted peaks against"
        return None
    # On the host, no size more than ``HOST_GROWTH`` times the largest that ran, as in a measured search:
    # a size that does not fit kills the process, and each size costs the CPU in proportion.
    grown = HOST_GROWTH * good if run.host is not None else None
    bounds = [x for x in (None if run.bad is None else run.bad - 1, run.settings.max_size, grown) if x is not None]
    # At the ceiling the largest size is wanted to within the margin; a split needs only its region
    # (each compilation of a large step costs seconds on a GPU).
    most = (_COMPILES_PER_PLACEMENT if scale.rising else _COMPILES_PER_PLACEMENT_GIVEN) if share == 1 else 1
    first = allowed

    def now() -> int:  # a compilation may have taken from the pool (``_read_room`` after each)
        again = scale.allowed(scale_limit(run), run.kept_total, share)
        return first if again is None else min(first, again)

    found = scale.locate(now, good, min(bounds) if bounds else None, margin, most)
    high = upper_bound(run)  # the compilations just made may bound it
    close = closing(good, margin)
    if found is None or found < close:
        # Less than a margin to gain at the target: the smallest size that ends the search
        # either way, where it may still fit (compiled first: predicted past the limit, it
        # ends the search without a run).
        if high is None or close > high or scale.peak(close) is None:
            return None
        return close, "close"
    # The size compiled, and placed a little under its lines' crossing already: any other would cost
    # the step a compilation of its own (seconds to minutes on a GPU).
    return found, "predicted-split" if share < 1 else "predicted"


def _grows_in_regions(run: Run) -> bool:
    """Whether the framework's pool grew on demand in regions that its calls keep when the search
    began (JAX with growth on: ``search_room_after_region`` answered), with figures of its own (no
    ``limit=``, ``measure=``)."""
    if run.settings.limit is not None or run.settings.measure is not None:
        return False
    return run.framework.room_after_region(run.before) is not None


def _read_room(run: Run) -> None:
    """Read the capacity and the room again (``reread_capacity``), with what the framework says
    of them for the predictions: the room a compilation may leave (``search_room_after_region``),
    and the compiler's own limit where the framework sized the predictions and the limit is its
    own cap (``remat_share`` of it). Over ranks, the smallest any rank knows."""
    scale = run.scale
    assert scale is not None
    reread_capacity(run)
    snapshot = take_snapshot(run) if run.settings.measure is None else None
    after = run.framework.room_after_region(snapshot)
    if run.ranks is not None:
        answers = run.ranks.exchange({"kind": "room", "size": run.good, "room_after": after})
        after = min((p["room_after"] for p in answers.values() if p["room_after"] is not None), default=None)
    scale.room_after = after
    share, limit = scale.remat_share, bytes_of(run.limit)
    scale.remat_limit = None if share is None or limit is None or run.settings.limit is not None else int(share * limit)


def call_budget(run: Run) -> int:
    """The calls the search itself may make: ``max_trials``, less one kept for re-running the
    answer once a trial failed (``confirm``)."""
    settings = run.settings
    keep = 1 if settings.confirm and run.good and run.bad is not None and settings.max_trials > 1 else 0
    return settings.max_trials - keep
