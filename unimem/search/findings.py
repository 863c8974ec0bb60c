"""What a batch search's trials showed: the trials, the largest size that ran and the smallest that
did not, the measured peaks and the line through them, what failures left in use, the brackets, and
what a failure refuted. ``Findings`` is written here only: the trial runner hands each trial to
``record`` and the bound it then computes to ``bracket``; the policy says what its next size relied on
(``rely``), and takes back a refutation the room it was made against no longer stands for
(``withdraw_sure_refutation``); a search sized from predictions takes back what its second call
disproved (``drop_point``, ``disown_good``). Pure: no I/O, no framework.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unimem.search.result import Trial
from unimem.search.rules import fit, median

# How a trial whose compiled program was rematerialized is recorded (it ran, but slower than the size's own).
REMATERIALIZED = "the compiler rematerialized the step"


def slower(trial: Trial) -> bool:
    """Whether the trial ran a program the compiler rematerialized: past the answer, though it fit."""
    return (trial.error or "").startswith(REMATERIALIZED)


__all__ = [
    "Findings",
    "bracket",
    "disown_good",
    "drop_point",
    "failures_costly",
    "figures_known",
    "record",
    "rely",
    "withdraw_sure_refutation",
]

# A failure this many times slower than a run that fit, and slower than a second in itself (JAX:
# XLA's allocator waits before it fails), makes the search approach the answer from below.
_COSTLY = 5.0
_COSTLY_SECONDS = 1.0


@dataclass
class Findings:
    """What the trials showed so far (see the module for who writes it)."""

    trials: list[Trial] = field(default_factory=list)
    good: int = 0  # the largest size that ran
    bad: int | None = None  # the smallest size that did not
    points: list[tuple[int, int]] = field(default_factory=list)  # (size, peak) of the trials that fit
    # A framework that cannot reset its peak reads None for a trial below the process's peak
    # so far. That peak, while the search has seen every step since it was read (no failure,
    # whose partial allocations it would not see), bounds the trial's from above: a (size,
    # bound) point keeps the sure lower bound sure, though it is no point of the fit.
    bounded: list[tuple[int, int]] = field(default_factory=list)
    running_peak: int | None = None
    line: tuple[float, float] | None = None  # the fit (a, b) of bytes = a + b x batch through the points
    convex: bool = False  # the peaks grew convexly: the line's answer is an upper estimate only
    kept_total: int = 0  # bytes failed trials left in use for good (``Framework.keeps_failed_outputs``)
    point_kept: dict[int, int] = field(default_factory=dict)  # kept_total when each size ran
    overhead: int = 0  # the pool's bytes beyond those in use, at the largest trial that fit
    brackets: list[tuple[int, int]] = field(default_factory=list)  # (good, high) after each trial
    # The sure bound and the line's answer the last size placed on the measured peaks relied on.
    last_safe: int | None = None
    last_predicted: int | None = None
    # A failure refutes what said it would fit: the sure bound for good (the limit is not the
    # capacity, or the use grew faster than the batch), the line until a size fits after it.
    sure_refuted: bool = False
    line_refuted_at: int | None = None  # len(points) when a failure refuted the line


def figures_known(findings: Findings) -> bool:
    """Whether any trial's peak, or a bound on one, is known (or the process's peak bounds the next)."""
    return bool(findings.points or findings.bounded) or findings.running_peak is not None


def failures_costly(findings: Findings, limit: int | None) -> bool:
    """Whether a failure costs much more than a run that fit: in time (``_COSTLY`` times the
    median run's, and over ``_COSTLY_SECONDS``), or in what failures left in use for good (over
    1% of ``limit``)."""
    ran = [t.seconds for t in findings.trials if t.fits]
    worst = max((t.seconds for t in findings.trials if not t.fits), default=0.0)
    slow = bool(ran) and worst > max(_COSTLY * median(ran), _COSTLY_SECONDS)
    return slow or (limit is not None and findings.kept_total > 0.01 * limit)


def record(
    findings: Findings,
    trial: Trial,
    kept_before: int,
    overhead: int | None,
    keeps_failed_outputs: bool,
    baseline: int | None,
) -> None:
    """Add a trial (``kept_before``: ``kept_total`` before it ran; ``overhead``: the pool's at it, where
    read): the bounds, the points and the line through them, the process's running peak, what it left in
    use, and what its failure refuted."""
    size, fits, peak = trial.batch_size, trial.fits, trial.peak
    if overhead is not None and size > findings.good:
        findings.overhead = overhead  # the pool's overhead at the largest trial that fit
    if not fits and keeps_failed_outputs:
        # Lost for good. Elsewhere what stays is the step's own state (gradients a failed
        # backward set), which the next step reuses.
        findings.kept_total += trial.kept or 0
    findings.trials.append(trial)
    findings.point_kept[size] = kept_before
    if fits and peak is None and findings.running_peak is not None:
        findings.bounded.append((size, findings.running_peak))
    if not fits:
        findings.running_peak = None
    elif peak is not None and findings.running_peak is not None:
        findings.running_peak = max(findings.running_peak, peak)
    if fits:
        findings.good = max(findings.good, size)
        if peak is not None:
            findings.points.append((size, peak))
    else:
        findings.bad = size if findings.bad is None else min(findings.bad, size)
        if slower(trial):  # it fit: the peaks and the line through them stand
            pass
        elif findings.last_safe is not None and size <= findings.last_safe:
            findings.sure_refuted = True
        if findings.last_predicted is not None and size <= findings.last_predicted:
            findings.line_refuted_at = len(findings.points)
    findings.line, findings.convex = fit(findings.points, baseline=baseline)


def bracket(findings: Findings, high: int | None) -> None:
    """Keep the bracket ``(good, high)`` after a trial (``high``: every bound on the answer)."""
    if findings.good and high is not None:
        findings.brackets.append((findings.good, high))


def drop_point(findings: Findings, size: int, peak: int | None, baseline: int | None) -> None:
    """Take back a trial's point that is no point of the fit (a sized search's first call, its peak read
    without the optimizer's state), its own, the first at that size; the line is fit again without it."""
    if peak is not None and (size, peak) in findings.points:
        findings.points.remove((size, peak))
        findings.line, findings.convex = fit(findings.points, baseline=baseline)


def disown_good(findings: Findings) -> None:
    """The largest size that ran is no answer: it ran only without the state the step holds from its
    second call on (a sized search's first call), and failed with it. The search goes on as though no
    size had run."""
    findings.good = 0


def rely(findings: Findings, safe: int | None, predicted: int | None) -> None:
    """The sure bound and the line's answer the next size, placed on the measured peaks, relies on:
    a failure at or below either refutes it."""
    findings.last_safe, findings.last_predicted = safe, predicted


def withdraw_sure_refutation(findings: Findings) -> None:
    """A failure refuted the sure bound only as it stood against the room before: where the room was
    read again after it (a pool grown on demand kept regions), the bound stands again, capped by it."""
    findings.sure_refuted = False
