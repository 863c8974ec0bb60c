"""A batch search sized from predictions given in bytes (``lower=`` an estimate, or a callable that
returns each size's peak), run only to confirm them.

Where the predictions come as bytes (nothing to compile) and the framework neither rematerializes
nor leaves its sizes to the host's memory (torch), the first call of the step is at the largest size
predicted to fit the limit (located to within the search's margin), and the second at the same size:
the step's steady state, its optimizer state made by the first call, as an estimate predicts it.
Where both run and the second's peak is within ``TOLERANCE`` of the prediction, that size is the
answer, in two calls. A call that contradicts the predictions (it fails, or its peak strays past the
tolerance; the first call's only upwards, as a first step lacks the optimizer's state) sets them
aside with a note saying what was predicted and what was measured, and the measured search takes over.

With a ``MemoryEstimate`` (or its ``peak_at``), the figure held against the limit is the one that
decides whether the step runs: against the framework's own cap, the least memory the step runs in
(``required``: the caching allocator gives its cache back before it fails); against ``limit=``, the
bytes in use (``peak``), which is what ``limit=`` holds. The measured peak is compared with ``peak``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unimem.estimate.result import MemoryEstimate
from unimem.search.findings import disown_good, drop_point
from unimem.search.limit import bytes_of
from unimem.search.settings import Settings
from unimem.search.state import Run, scale_limit
from unimem.sizes import format_bytes

__all__ = ["TOLERANCE", "confirming", "estimate_of", "opening", "predictor_of"]

# How far the step's measured peak may be from the predicted one, as a share of it, before the
# predictions are set aside: an estimate's torch peaks were within 2.7% of the measured on an H200.
TOLERANCE = 0.05
# Predictions the placement of the first call may ask for beyond those known (each may cost an estimate).
_PLACEMENTS = 8
# The reasons of the two calls, as the trials record them.
FIRST, STEADY = "predicted", "steady"


def estimate_of(lower: object) -> MemoryEstimate | None:
    """The estimate behind ``lower=``: the ``MemoryEstimate`` itself, or its bound ``peak_at``; else None."""
    if isinstance(lower, MemoryEstimate):
        return lower
    owner = getattr(lower, "__self__", None)
    if isinstance(owner, MemoryEstimate) and getattr(lower, "__func__", None) is MemoryEstimate.peak_at:
        return owner
    return None


def predictor_of(settings: Settings) -> Callable[[int], Any]:
    """What the search asks each size's prediction of: ``lower`` itself, or for an estimate the figure
    held against the limit (``required`` against the framework's cap, ``peak`` against ``limit=``)."""
    lower = settings.lower
    estimate = estimate_of(lower)
    if estimate is not None:
        reserved = settings.limit is None
        return lambda n: estimate.peak_at(n, reserved=reserved)
    assert callable(lower)
    return lower


def _sized(run: Run) -> bool:
    """Whether the search is sized from the predictions: given in bytes (the framework compiled
    nothing: ``Scale.rising`` is set only where it did), held against a known limit, for a framework
    that does not rematerialize, its sizes not left to the host's memory. Whether they are still
    trusted is the caller's to ask."""
    scale, framework = run.scale, run.framework
    return (
        scale is not None
        and not scale.rising
        and run.limit is not None
        and run.start.host is None
        and framework.name is not None
        and not framework.rematerializes
    )


def opening(run: Run, first: int) -> tuple[int, str]:
    """The first size to run and why: ``first`` (``start``, halved while predicted past the limit)
    and ``"start"``; sized from the predictions, the largest size predicted to fit, ``"predicted"``."""
    scale, estimate = run.scale, estimate_of(run.settings.lower)
    if scale is None or not scale.trusted or not _sized(run):
        return first, "start"
    if estimate is not None:
        scale.given(list(estimate.sizes))  # what the estimate knows costs nothing: no prediction of the budget
    allowed = scale.allowed(scale_limit(run), run.findings.kept_total, 1.0)
    if allowed is None or first not in scale.memo or scale.memo[first] > allowed:
        return first, "start"
    found = scale.locate(allowed, 0, run.settings.max_size, run.settings.margin, _PLACEMENTS)
    return (first if found is None else max(found, first)), FIRST


def _compared(run: Run, size: int) -> int | None:
    """The predicted peak a measured one is compared with: an estimate's ``peak``, else the prediction."""
    estimate = estimate_of(run.settings.lower)
    if estimate is not None:
        return estimate.peak_at(size, reserved=False)
    return None if run.scale is None else run.scale.memo.get(size)


def _contradiction(run: Run, steady: bool) -> str | None:
    """How the last call contradicts the predictions, for the note; None where it does not."""
    trial = run.findings.trials[-1]
    size, predicted = trial.batch_size, _compared(run, trial.batch_size)
    call = "its second call" if steady else "its first call"
    said = f"batch size {size} was predicted to fit the limit {format_bytes(bytes_of(run.limit))}"
    if predicted is not None:
        said += f" at a peak of {format_bytes(predicted)}"
    if not trial.fits:
        return f"{said}, but {call} did not fit ({trial.error})"
    if predicted is None or trial.peak is None:
        return None
    off = (trial.peak - predicted) / max(predicted, 1)
    if off > TOLERANCE or (steady and off < -TOLERANCE):
        return (
            f"{said}, but {call} peaked at {format_bytes(trial.peak)} ({run.start.measured_by}), {abs(off):.1%} "
            f"{'above' if off > 0 else 'below'} it, past the {TOLERANCE:.0%} tolerance"
        )
    return None


def confirming(run: Run) -> int | None:
    """After each call of a search sized from the predictions: the size to run again to confirm them
    (the first call's, once, with ``confirm=True`` and a call left), or None. A call that contradicts
    them sets them aside (``Scale.overrule``, said in the notes; this module's verdict replaces the
    scale's own) and the measured peaks place the next size; where the second call failed, the first
    call's fit is no answer (it ran without the optimizer's state)."""
    scale, trials = run.scale, run.findings.trials
    if scale is None or [t.reason for t in trials] not in ([FIRST], [FIRST, STEADY]) or not _sized(run):
        return None
    steady = len(trials) == 2
    if steady:
        # The first call's peak was read without the optimizer's state: no point of the measured fit
        # (nor a second one at the same size, which a line through the points cannot take).
        drop_point(run.findings, trials[0].batch_size, trials[0].peak, run.start.baseline)
    wrong = _contradiction(run, steady)
    if wrong is not None:
        scale.overrule(f"{wrong}: the search switched to the measured peaks")
        if steady and not trials[-1].fits:
            disown_good(run.findings)
        return None
    # The scale compares the measured peak with the figure held to the limit, which for an estimate
    # under the cap is the least memory the step runs in (15% above its peak, seen): its verdict on
    # these calls is this module's to give.
    scale.overrule(None)
    if steady or not run.settings.confirm or run.calls.made >= run.settings.max_trials:
        return None
    return trials[-1].batch_size
