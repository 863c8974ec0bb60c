"""What a batch search returns with ``return_trials=True``: every call of the step as a
``Trial``, and the whole search as a ``BatchSizeSearch`` that reads as a report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from unimem.memory_stats import MemoryStats
from unimem.search.scale import OVER
from unimem.sizes import format_bytes
from unimem.training.accumulation import AccumulationPlan

__all__ = ["BatchSizeSearch", "Trial"]


@dataclass(frozen=True)
class Trial:
    """One real call of ``step``.

    Attributes:
        batch_size (int): The size tried.
        fits (bool): Whether it ran without running out of memory.
        peak (int | None): Bytes the trial used at its peak; None when unknown.
        seconds (float): How long the call took.
        reason (str): Why this size was tried: ``start``, ``grow``, ``halve``,
            ``safe-jump``, ``predict``, ``predict-far``, ``close``, ``past-room``, ``saturated``,
            ``bisect``, ``upper-bound``; with ``lower=`` also ``predicted``,
            ``predicted-below``, ``predicted-split``, and ``steady`` (the predicted size
            again, confirming predictions given in bytes); after the search ``confirm`` or
            ``settle``.
        error (str | None): The out-of-memory message's first line when it did not fit.
        peak_reserved (int | None): torch: the pool's peak in the same trial, in bytes.
        kept (int | None): After a failure: bytes still in use once it was released,
            above those in use before it (JAX: XLA does not free a failed execution's
            output buffers). None: not read.
        predicted (int | None): With ``lower=``: the peak the compiled step predicted for
            this size, in bytes (an estimate's least memory the step runs in, where the
            framework's cap is the limit); None without a prediction.
    """

    batch_size: int
    fits: bool
    peak: int | None  # bytes the trial used at its peak; None when unknown
    seconds: float
    reason: str  # start, grow, halve, safe-jump, predict, predict-far, close, past-room, saturated, bisect,
    # upper-bound; predicted, predicted-below, predicted-split, steady (with lower=); confirm, settle (after)
    error: str | None = None  # the out-of-memory message's first line when it did not fit
    peak_reserved: int | None = None  # torch: the pool's peak in the same trial
    # After a failure: bytes still in use once it was released, above those in use before
    # it (JAX: XLA does not free a failed execution's output buffers). None: not read.
    kept: int | None = None
    predicted: int | None = None  # with lower=: the peak the compiled step predicted for this size


@dataclass(frozen=True)
class BatchSizeSearch:
    """The outcome of ``find_batch_size(..., return_trials=True)``.

    ``batch_size`` is the answer: the largest size that ran. ``smallest_failure`` is the
    smallest that did not (None if none failed). ``converged`` says the answer is
    within ``margin`` of the largest that fits (or is ``max_size``); False when
    ``max_trials`` ran out first, or ``time_limit`` passed (``time_limit_passed``).
    ``model`` is the last fit ``(a, b)`` of ``bytes = a + b × batch``, ``limit`` the bytes
    it was held against, ``measured_by`` where the peaks came from.
    ``before``/``after``: ``stats()`` around the search.
    ``confirmations``: the answer re-run after the search's last failure (``confirm=True``),
    and ``confirmed`` whether it ran then (None when nothing failed after it ran).
    ``step_calls`` counts every call of ``step`` (trials and re-runs), ``failed_calls`` those
    that ran out of memory, ``compile_calls`` the sizes ``lower=`` compiled.
    ``world_size`` counts the ranks that agreed on every trial (1: a single process);
    ``plan`` is the gradient accumulation that meets ``target_global_batch=`` with the answer.
    ``int()`` of it is the answer; ``str()`` reads as a report of every trial.

    Attributes:
        batch_size (int): The answer: the largest size that ran (after ``confirm``, one
            size lower by ``margin`` if only that ran again).
        trials (tuple[Trial, ...]): Every trial of the search, in order.
        smallest_failure (int | None): The smallest size that did not fit; None if none failed.
        converged (bool): Whether the answer is within ``margin`` of the largest that fits
            (or is ``max_size``); False when ``max_trials`` calls ran out first, or
            ``time_limit`` passed (the answer is then the largest size that ran, with a note
            saying so).
        margin (float): The margin searched to.
        limit (int | None): The bytes the fit was held against; None when unknown.
        model (tuple[float, float] | None): The last fit ``(a, b)`` of
            ``bytes = a + b × batch``; None without one.
        measured_by (str): Where the peaks came from (``"measure="``,
            ``"stats('torch').peak_allocated"``, or nothing).
        seconds (float): How long the search took.
        baseline (int | None): Bytes in use before the search, which every peak includes.
        before (MemoryStats | None): ``stats()`` before the search.
        after (MemoryStats | None): ``stats()`` after the search (memory given back).
        notes (tuple[str, ...]): What the peaks and the failed trials showed (a peak that
            saturates at the cap, bytes failed trials left in use, a fresh process needed).
        confirmations (tuple[Trial, ...]): The re-runs after the search (``confirm=True``).
        confirmed (bool | None): Whether the answer ran again then; None when nothing
            failed after it ran (or no call was left for it).
        step_calls (int): Every call of ``step``: the trials and the re-runs after them; at
            most ``max_trials``.
        failed_calls (int): Those of them that ran out of memory.
        compile_calls (int): With ``lower=``: the sizes compiled to predict their peaks.
        predictions (tuple[tuple[int, int], ...]): With ``lower=``: ``(size, predicted peak
            bytes)`` of every size compiled, by size.
        world_size (int): The ranks that agreed on every trial (every figure above is theirs
            combined: a size fit on all of them, peaks the largest); 1 in a single process.
        plan (AccumulationPlan | None): With ``target_global_batch=``:
            ``plan_accumulation(target_global_batch, batch_size, world_size)``, the micro-batches
            each rank runs per optimizer step; None without it.
        time_limit_passed (bool): ``time_limit=`` ended the search before the answer was within
            ``margin`` (then ``converged`` is False, and a note says so).
    """

    batch_size: int
    trials: tuple[Trial, ...]
    smallest_failure: int | None
    converged: bool
    margin: float
    limit: int | None
    model: tuple[float, float] | None
    measured_by: str
    seconds: float
    baseline: int | None = None
    before: MemoryStats | None = None
    after: MemoryStats | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    confirmations: tuple[Trial, ...] = ()
    confirmed: bool | None = None
    step_calls: int = 0  # every call of the step: the trials and the re-runs after the search
    failed_calls: int = 0  # those that ran out of memory
    compile_calls: int = 0  # with lower=: the sizes compiled to predict their peaks
    predictions: tuple[tuple[int, int], ...] = ()  # with lower=: (size, predicted peak bytes), by size
    world_size: int = 1  # ranks that agreed on every trial
    plan: AccumulationPlan | None = None  # with target_global_batch=: the accumulation that meets it
    time_limit_passed: bool = False  # time_limit= ended the search before the answer was within the margin

    def __int__(self) -> int:
        return self.batch_size

    def as_dict(self) -> dict[str, Any]:
        """The search as plain data, JSON-ready.

        Returns:
            Every field; trials as dicts, ``model`` as ``{"a": ..., "b": ...}``,
            ``before``/``after`` as ``MemoryStats.as_dict()``.
        """
        return {
            "batch_size": self.batch_size,
            "trials": [t.__dict__ for t in self.trials],
            "smallest_failure": self.smallest_failure,
            "converged": self.converged,
            "margin": self.margin,
            "limit": self.limit,
            "model": None if self.model is None else {"a": self.model[0], "b": self.model[1]},
            "measured_by": self.measured_by,
            "baseline": self.baseline,
            "seconds": self.seconds,
            "before": None if self.before is None else self.before.as_dict(),
            "after": None if self.after is None else self.after.as_dict(),
            "notes": list(self.notes),
            "confirmations": [t.__dict__ for t in self.confirmations],
            "confirmed": self.confirmed,
            "step_calls": self.step_calls,
            "failed_calls": self.failed_calls,
            "compile_calls": self.compile_calls,
            "predictions": [list(p) for p in self.predictions],
            "world_size": self.world_size,
            "plan": None if self.plan is None else dict(self.plan.__dict__),
            "time_limit_passed": self.time_limit_passed,
        }

    def __str__(self) -> str:
        compiled = f", {self.compile_calls} compiled" if self.compile_calls else ""
        lines = [
            f"batch size {self.batch_size} in {len(self.trials)} trials ({self.seconds:.2f} s; "
            f"{self.step_calls} calls of the step, {self.failed_calls} failed{compiled}); "
            + (f"smallest failure {self.smallest_failure}" if self.smallest_failure else "no failure")
            + (
                ""
                if self.converged
                else f"; NOT converged ({'time_limit passed' if self.time_limit_passed else 'max_trials ran out'})"
            )
            + (f"; agreed by {self.world_size} ranks" if self.world_size > 1 else "")
        ]
        if self.model is not None:
            a, b = self.model
            lines.append(f"  memory ≈ {format_bytes(int(a))} + {format_bytes(int(b))} × batch ({self.measured_by})")
        if self.limit is not None:
            lines.append(
                f"  limit {format_bytes(self.limit)}"
                + (f", in use before {format_bytes(self.baseline)}" if self.baseline is not None else "")
            )
        for t in self.trials:
            peak = f", peak {format_bytes(t.peak)}" if t.peak is not None else ""
            peak += f", predicted {format_bytes(t.predicted)}" if t.predicted is not None and t.predicted < OVER else ""
            peak += f", {format_bytes(t.kept)} left in use" if t.kept else ""
            lines.append(
                f"  {t.batch_size:>8}  {'fits' if t.fits else 'OOM ':<4}  {t.reason:<11} {t.seconds:.3f} s{peak}"
            )
        for t in self.confirmations:
            lines.append(f"  {t.batch_size:>8}  {'fits' if t.fits else 'OOM ':<4}  {t.reason:<11} {t.seconds:.3f} s")
        if self.plan is not None:
            plan = self.plan
            lines.append(
                f"  plan: global batch {plan.global_batch} = {plan.world_size} rank(s) x {plan.steps} micro-batch(es) "
                f"of at most {plan.micro_batch} (rank 0: {', '.join(map(str, plan.sizes(0)))})"
            )
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)
