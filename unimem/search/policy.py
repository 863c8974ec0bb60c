"""The batch search's next-size policy: whether the answer is within the margin, and which size
to try next: placed by the predictions while they hold (``predictions.place``), else from the
evidence the trials gathered (``Evidence``), by the rule of the regime it shows
(``regimes.next_size``)."""

from __future__ import annotations

import math

from unimem.search.findings import Findings, failures_costly, rely, withdraw_sure_refutation
from unimem.search.host_limit import GROWTH as HOST_GROWTH
from unimem.search.limit import bytes_of
from unimem.search.predictions import place, start_after_placed_failure
from unimem.search.regimes import Evidence, next_size
from unimem.search.rules import knee, plateau_ratio, predict, safe_size, stalled
from unimem.search.state import Run, grows_in_regions, remat_limit, reread_capacity, upper_bound

__all__ = ["call_budget", "choose", "evidence", "is_converged"]


def is_converged(run: Run) -> bool:
    """Whether the largest size that ran is within the margin of the largest that can fit."""
    high = upper_bound(run)
    good = run.findings.good
    return bool(good) and high is not None and good >= (1 - run.settings.margin) * high


def choose(run: Run) -> tuple[int, str]:
    """The next size to try, and why: placed by the predictions while they hold, else by the
    regime the evidence shows (``regimes.next_size``)."""
    found = run.findings
    filled = False
    restart = start_after_placed_failure(run)
    if restart is not None:
        return restart
    if found.good and run.scale is not None and run.scale.trusted:
        placed = place(run)
        if placed is not None:
            return placed
    elif found.good and grows_in_regions(run):
        filled = _filled_the_room(run)
    gathered = evidence(run, filled)
    step = next_size(gathered)
    if step.relies:
        rely(found, gathered.safe, gathered.predicted)
    return step.size, step.reason


def evidence(run: Run, filled_room: bool = False) -> Evidence:
    """What the trials showed, for the rules: the line's answer and the sure bound (each dropped
    once a failure refuted it), every bound on the answer, and what the last trials showed."""
    found, limit, settings = run.findings, bytes_of(run.limit), run.settings
    # What failed trials kept for good is lost to every later trial (peaks measured after
    # it include it too: both err on the safe side).
    usable = None if limit is None else limit - found.overhead - found.kept_total
    rematerializing = remat_limit(run)
    if usable is not None and rematerializing is not None:
        usable = min(usable, rematerializing)
    refuted = found.line_refuted_at is not None and len(found.points) <= found.line_refuted_at
    # A failure refuted the sure bound while the peaks follow a line: the capacity lies under
    # the limit, and the answer nearer the failure than ``good``.
    linear = found.sure_refuted and found.line is not None
    last = found.trials[-1]
    climb, peaked = _climb(run)
    return Evidence(
        good=found.good,
        bad=found.bad,
        margin=settings.margin,
        max_size=settings.max_size,
        high=upper_bound(run),
        predicted=None if refuted else predict(found.line, usable),
        convex=found.convex,
        safe=None if found.sure_refuted else safe_size(found.points + found.bounded, run.start.baseline, usable),
        flat=plateau_ratio(found.points),
        saturated=found.bad is None and knee(found.points, limit) is not None,
        streak=_streak(found),
        refit=found.bad is not None and last.fits,
        jumped=last.fits and last.reason == "safe-jump",
        cautious=failures_costly(found, limit),
        linear=linear,
        climb=climb,
        peaked=peaked,
        # A bracket up to ``max_size`` alone is none: ``max_size`` is no evidence that memory reaches it.
        stalled=stalled([(g, h) for g, h in found.brackets if h != settings.max_size], linear),
        filled_room=filled_room,
        within_room=filled_room and _within_room(run),
        refilled=last.reason in ("close", "past-room"),
        line_with_margin=_line_with_margin(found, usable, settings.margin),
        host_growth=HOST_GROWTH if run.start.host is not None else None,
    )


def _line_with_margin(found: Findings, usable: int | None, margin: float) -> int | None:
    """Where the last trial, placed just under the line's answer, failed: the largest size the line
    says fits with the margin to spare, the bytes it leaves under the limit (None otherwise)."""
    last = found.trials[-1]
    if last.fits or last.reason != "predict" or usable is None:
        return None
    return predict(found.line, math.floor((1 - margin) * usable))


def _streak(found: Findings) -> int:
    """How many sizes in a row, up to the last trial, were placed as saturated steps."""
    return next((i for i, t in enumerate(reversed(found.trials)) if t.reason != "saturated"), len(found.trials))


def _climb(run: Run) -> tuple[int, int]:
    """For a framework that saves memory to fit (``Framework.rematerializes``; any, read through
    ``measure=``): how many sizes in a row ran above the largest whose peak was read (their peak read
    no higher: None, below the process's peak so far), and that size."""
    found = run.findings
    top = max(found.points, default=None)
    if top is None or (run.framework.name is not None and not run.framework.rematerializes):
        return 0, 0
    climb = 0
    for trial in reversed(found.trials):
        if not trial.fits or trial.batch_size <= top[0]:
            break
        climb += 1
    return climb, top[0]


def _filled_the_room(run: Run) -> bool:
    """In a pool grown in regions: whether the largest size that ran took about all the room left.
    Every call took regions from the pool (its compilation's autotuning, its temporaries) and kept
    them: the room left for one buffer is read again first (a sure step against the room as it was
    before they were taken overshoots: docs/measurements.md, "A step policy for max_size and a growing
    pool"). A failure refuted the sure bound only as it stood against the room before; one above it is
    capped by it."""
    found = run.findings
    last = found.trials[-1]
    if reread_capacity(run) and not last.fits and found.sure_refuted:
        withdraw_sure_refutation(found)
    limit = bytes_of(run.limit)
    room = None if limit is None else (1 - run.settings.margin) * (limit - found.kept_total)
    took_it = last.peak is not None and room is not None and last.peak >= room
    return last.fits and last.batch_size == found.good and took_it


def _within_room(run: Run) -> bool:
    """Whether the last size's peak stayed within the room as the framework counts it."""
    limit, peak = bytes_of(run.limit), run.findings.trials[-1].peak
    return peak is not None and limit is not None and peak <= limit - run.findings.kept_total


def call_budget(run: Run) -> int:
    """The calls the search itself may make: ``max_trials``, less one kept for re-running the
    answer once a trial failed (``confirm``)."""
    settings, found = run.settings, run.findings
    keep = 1 if settings.confirm and found.good and found.bad is not None and settings.max_trials > 1 else 0
    return settings.max_trials - keep
