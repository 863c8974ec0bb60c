"""The batch search's next-size policy: whether the answer is within the margin, and which size
to try next, placed by the predictions while they hold (``predictions.place``), else by the
measured peaks (the pure rules it applies: ``unimem.search.rules``)."""

from __future__ import annotations

from unimem.search.findings import failures_costly, rely, withdraw_sure_refutation
from unimem.search.host_limit import GROWTH as HOST_GROWTH
from unimem.search.limit import bytes_of
from unimem.search.predictions import place
from unimem.search.rules import (
    closing,
    knee,
    next_size,
    plateau_ratio,
    predict,
    safe_size,
    split,
    stalled,
)
from unimem.search.state import Run, reread_capacity, upper_bound

__all__ = ["call_budget", "choose", "is_converged"]


def is_converged(run: Run) -> bool:
    """Whether the largest size that ran is within the margin of the largest that can fit."""
    high = upper_bound(run)
    good = run.findings.good
    return bool(good) and high is not None and good >= (1 - run.settings.margin) * high


def choose(run: Run) -> tuple[int, str]:
    """The next size to try, and why: placed by the predictions while they hold, else as
    ``rules.next_size`` says, bisecting whenever the bracket stalls (``stalled``)."""
    found = run.findings
    if found.good == 0:
        assert found.bad is not None
        return max(1, found.bad // 2), "halve"
    if run.scale is not None and run.scale.trusted:
        placed = place(run)
        if placed is not None:
            return placed
    elif _grows_in_regions(run):
        last = found.trials[-1]
        # A failed call took regions from a pool grown on demand (its compilation's autotuning, its
        # temporaries) and kept them: the room left for one buffer is read again, and the failure
        # refuted the sure bound only as it stood against the room before; one above it is capped by it.
        if not last.fits and reread_capacity(run) and found.sure_refuted:
            withdraw_sure_refutation(found)
        limit = bytes_of(run.limit)
        room = None if limit is None else (1 - run.settings.margin) * (limit - found.kept_total)
        took_it = last.peak is not None and room is not None and last.peak >= room
        if last.fits and last.batch_size == found.good and took_it:
            # The largest size that ran took about all the room left: the next is the size whose
            # failure ends the search (a failure costs seconds here).
            high = upper_bound(run)
            size = closing(found.good, run.settings.margin)
            return (size if high is None else min(size, high)), "close"
    return _measured(run)


def _measured(run: Run) -> tuple[int, str]:
    found, limit = run.findings, bytes_of(run.limit)
    # What failed trials kept for good is lost to every later trial (peaks measured after
    # it include it too: both err on the safe side).
    usable = None if limit is None else limit - found.overhead - found.kept_total
    refuted = found.line_refuted_at is not None and len(found.points) <= found.line_refuted_at
    predicted = None if refuted else predict(found.line, usable)
    safe = None if found.sure_refuted else safe_size(found.points + found.bounded, run.start.baseline, usable)
    rely(found, safe, predicted)
    last = found.trials[-1]
    cautious = failures_costly(found, limit)
    # A failure refuted the sure bound while the peaks follow a line: the capacity lies under
    # the limit, and the answer nearer the failure than ``good``.
    linear = found.sure_refuted and found.line is not None
    size, reason = next_size(
        found.good,
        found.bad,
        run.settings.max_size,
        predicted,
        run.settings.margin,
        safe,
        flat=plateau_ratio(found.points),
        convex=found.convex,
        saturated=found.bad is None and knee(found.points, limit) is not None,
        streak=next((i for i, t in enumerate(reversed(found.trials)) if t.reason != "saturated"), len(found.trials)),
        refit=found.bad is not None and last.fits,
        jumped=last.fits and last.reason == "safe-jump",
        cautious=cautious,
        linear=linear,
        **_climb(run),
    )
    high = upper_bound(run)
    # The close step is exempt: it ends the search if it fails, and gains the margin if not.
    if high is not None and reason != "close" and stalled(found.brackets, linear):
        close = closing(found.good, run.settings.margin)
        size, reason = max(split(found.good, high, 1 / 3 if cautious else 0.5, linear), close), "bisect"
    if run.start.host is not None:
        size = min(size, HOST_GROWTH * found.good)  # on the host a size that does not fit kills the process
    return (size if high is None else min(size, high)), reason


def _climb(run: Run) -> dict[str, int]:
    """For a framework that saves memory to fit (``Framework.rematerializes``; any, read through
    ``measure=``): how many sizes in a row ran above the largest whose peak was read (their peak read
    no higher: None, below the process's peak so far), and that size."""
    found = run.findings
    top = max(found.points, default=None)
    if top is None or (run.framework.name is not None and not run.framework.rematerializes):
        return {"climb": 0, "peaked": 0}
    climb = 0
    for trial in reversed(found.trials):
        if not trial.fits or trial.batch_size <= top[0]:
            break
        climb += 1
    return {"climb": climb, "peaked": top[0]}


def _grows_in_regions(run: Run) -> bool:
    """Whether the framework's pool grew on demand in regions that its calls keep when the search
    began (JAX with growth on: ``room_after_region`` answered), with figures of its own (no
    ``limit=``, ``measure=``)."""
    if run.settings.limit is not None or run.settings.measure is not None:
        return False
    return run.framework.room_after_region(run.start.before) is not None


def call_budget(run: Run) -> int:
    """The calls the search itself may make: ``max_trials``, less one kept for re-running the
    answer once a trial failed (``confirm``)."""
    settings, found = run.settings, run.findings
    keep = 1 if settings.confirm and found.good and found.bad is not None and settings.max_trials > 1 else 0
    return settings.max_trials - keep
