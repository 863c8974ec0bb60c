"""``find_batch_size``: the largest batch that fits, in few trials, leaving no memory behind.

How the search goes (every size tried is a real call of ``step``):

1. Run ``start`` and read its peak memory. (If it does not fit, halve until one does.)
2. With the bytes in use before the search (the baseline: parameters, optimizer state),
   one peak already bounds the answer from below: if what a trial adds above the
   baseline is fixed costs plus a per-sample part (or the larger of two such parts),
   ``n × (limit - baseline) / (peak - baseline)`` surely fits -- the "sure bound".
3. Fit ``bytes = a + b × batch`` to the trials that fit (Theil–Sen: the median of the
   pairwise slopes, so one noisy reading does not tip it; sizes whose peak is a plateau
   of fixed costs are left out) and predict the largest batch under the limit.
4. A step's peak is often convex in the batch: at small sizes a fixed part (gradients
   freed late, an optimizer step's temporaries) tops the activations, and a line through
   those sizes predicts several times the answer. So a prediction is
   trusted only when it agrees with the sure bound within a factor of two and the fit
   saw no steepening; otherwise the next size is the sure bound when the answer cannot
   be far above it, else the geometric mean of the two (a bisection in log-size, which
   halves the uncertainty whichever way the trial goes). A failure caps the upper
   estimate the same way. On a host without device figures (the CPU), with no ``limit=``
   nor ``measure=``, the figures are the process's resident peaks and the limit a share of
   the host's available memory (``search_host``): past it the kernel kills the process, so
   a peak over it counts as a failure. Without any figures (not even the host's) this
   becomes doubling until the first failure, then bisection.
5. Near the answer, try the smallest size whose failure would prove the largest size
   that ran is within ``margin`` of the largest that fits; stop once it is (one below
   the smallest failure, ``max_size``, or, for a framework that rematerializes nothing,
   the line through peaks that rose steadily to within 5% of the limit).
6. If a trial failed after the answer ran, re-run the answer (``confirm``): near the cap
   what fits depends on the pool's history.

Every call of ``step`` counts against ``max_trials``, the re-runs of step 6 included. A
failure refutes what said it would fit: the sure bound for good (the limit is not the
capacity), the fitted line until a size fits after it. Whichever way the model chooses,
a bracket ``[largest fit, smallest failure]`` that two trials did not halve is bisected
next, so the search always ends. When failures cost far more than runs (JAX), brackets are
split a third of the way up rather than halfway.

With ``lower=`` the framework predicts each size's peak from the compiled step
(``Backend.predict_peak``; ``search_scale``): every size run is compiled first and run only
if predicted under the capacity still believed in: the limit, then below each failure
beside what failures left in use. Without ``limit=`` that capacity is the framework's
(``Backend.search_capacity``), read again before each run: compilations and runs grow a pool
taken on demand. Where the framework also predicts each size's largest single buffer and reads
the largest its allocator can hand out now (JAX: XLA's temporaries come as one buffer, and a
pool grown on demand keeps regions too small for it), the peak is held against the cap and the
largest buffer against that room, both read again before each run. The first run after
``start`` is the largest size predicted under it; a failure there means the capacity is lower,
so the next is one margin down where it still fits beside the failure's outputs, then splits
of the predicted range. Runs that fit calibrate the
bytes beside the predictions; predictions the runs contradict are set aside, with a note, and
the measured search goes on.

Under a distributed runtime (several ranks: torch.distributed, jax.distributed) the search
is a collective: every rank calls it, and each trial's outcome is agreed through the
runtime's key-value store (the one ``cluster_stats`` gathers through), never through the
step's own collectives. A size fits only where it fit on every rank, peaks and times are
the largest over ranks, limits the smallest, so every rank takes the same next size and
returns the same answer. A rank that does not answer within ``timeout`` is named in a
``ClusterError``; a rank whose step raises tells the others, which stop at once.

``time_limit=`` bounds the whole search: checked after each call of the step, it ends the search
with the largest size that ran and a note (over ranks, the longest any rank has searched).
A step's own error (not out of memory) propagates as it came, with the batch size it came at.

Memory: an out-of-memory error's traceback holds the failed step's frames, and their
tensors (the leak of batch-size finders that retry inside the ``except``). A failed trial keeps only
a line of text: its frames are cleared inside the ``except``, and collection and
``clear_cache`` run after leaving it, once per trial and at the end.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, overload

from unimem import api, ranks, registry
from unimem.diagnose.guard import _message, clear_frames, find_oom
from unimem.errors import ConfigError, OutOfMemory, UnimemWarning
from unimem.memory_stats import MemoryStats
from unimem.search.compile import size_all
from unimem.search.host_limit import GROWTH as HOST_GROWTH
from unimem.search.host_limit import HostLimit, HostPeaks, read_limit
from unimem.search.progress import Progress, interrupted
from unimem.search.ranks import Outcome, Ranks, connect, known, worst
from unimem.search.rules import (
    SATURATION_CAUSE,
    closing,
    fit,
    knee,
    line_bound,
    median,
    next_size,
    plateau_ratio,
    predict,
    safe_size,
    saturation_note,
    split,
    stalled,
)
from unimem.search.rules import fit_linear as fit_linear  # re-exported: the fit's public helper
from unimem.search.scale import OVER, Scale
from unimem.sizes import format_bytes, parse_size
from unimem.training.accumulation import AccumulationPlan, plan_accumulation

if TYPE_CHECKING:
    from unimem.backends.base import Backend

__all__ = ["BatchSizeSearch", "Trial", "find_batch_size"]

# The fit uses the peak bytes in use (smooth in the batch size). torch's cap bounds the
# bytes its caching allocator reserves, which at small batches move in 2 and 20 MiB
# segments: the prediction holds the peak in use against the cap less the pool's
# overhead (peak reserved - peak in use) seen at the largest trial that fit.
_PEAK_FIELD = "peak_allocated"
# A failure this many times slower than a run that fit, and slower than a second in itself (JAX:
# XLA's allocator waits before it fails), makes the search approach the answer from below.
_COSTLY = 5.0
_COSTLY_SECONDS = 1.0
# Compilations of ``lower(n)`` allowed per trial allowed (``max_trials``), and per size placed.
_COMPILES_PER_TRIAL = 2
_COMPILES_PER_PLACEMENT = 6
# Sizes compiled at once where the framework sizes them in threads: a placed size and the one
# that closes its bracket (two took 1.3 times one compilation's time on an H200).
_COMPILE_WIDTH = 2
# The clock every trial is timed with (the simulated searches in the tests advance their own).
_clock = time.perf_counter
# Seconds each rank waits for the others at each agreement, from its own arrival: a trial can
# take minutes on a slow rank (a first compilation), and a rank that never comes must not hang the job.
DEFAULT_TIMEOUT = 600.0
# Every rank numbers its searches alike, so search n's keys meet in the store.


@dataclass(frozen=True)
class Trial:
    """One real call of ``step``.

    Attributes:
        batch_size (int): The size tried.
        fits (bool): Whether it ran without running out of memory.
        peak (int | None): Bytes the trial used at its peak; None when unknown.
        seconds (float): How long the call took.
        reason (str): Why this size was tried: ``start``, ``grow``, ``halve``,
            ``safe-jump``, ``predict``, ``predict-far``, ``close``, ``saturated``,
            ``bisect``, ``upper-bound``; with ``lower=`` also ``predicted``,
            ``predicted-below``, ``predicted-split``; after the search ``confirm`` or
            ``settle``.
        error (str | None): The out-of-memory message's first line when it did not fit.
        peak_reserved (int | None): torch: the pool's peak in the same trial, in bytes.
        kept (int | None): After a failure: bytes still in use once it was released,
            above those in use before it (JAX: XLA does not free a failed execution's
            output buffers). None: not read.
        predicted (int | None): With ``lower=``: the peak the compiled step predicted for
            this size, in bytes; None without a prediction.
    """

    batch_size: int
    fits: bool
    peak: int | None  # bytes the trial used at its peak; None when unknown
    seconds: float
    reason: str  # start, grow, halve, safe-jump, predict, predict-far, close, saturated, bisect, upper-bound,
    # predicted, predicted-below, predicted-split (with lower=); confirm, settle (after the search)
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


@dataclass(frozen=True)
class _Settings:
    start: int
    backend: str | None
    device: int
    max_size: int | None
    margin: float
    measure: Callable[[], int | None] | None
    limit: int | None
    baseline: int | None
    max_trials: int
    return_trials: bool
    confirm: bool = True
    lower: Callable[[int], Any] | None = None
    progress: bool | None = None
    model: Any = None
    target_global_batch: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    collective: bool | None = None
    time_limit: float | None = None

    def fingerprint(self) -> dict[str, Any]:
        """What every rank of a collective search must pass alike (the device may differ)."""
        return {
            "start": self.start,
            "backend": self.backend,
            "max_size": self.max_size,
            "margin": self.margin,
            "measure": self.measure is not None,
            "limit": self.limit,
            "baseline": self.baseline,
            "max_trials": self.max_trials,
            "confirm": self.confirm,
            "lower": self.lower is not None,
            "model": self.model is not None,
            "target_global_batch": self.target_global_batch,
            "time_limit": self.time_limit,
        }


def _check_ranks(target_global_batch: object, timeout: object, collective: object) -> float:
    """The arguments of a search over ranks; returns ``timeout`` as a float."""
    if target_global_batch is not None and (
        isinstance(target_global_batch, bool) or not isinstance(target_global_batch, int) or target_global_batch < 1
    ):
        raise ConfigError(
            "target_global_batch",
            f"expected None or the samples per optimizer step over all ranks (an int of 1 or more), "
            f"got {target_global_batch!r}",
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise ConfigError("timeout", f"expected the seconds to wait for the other ranks (above 0), got {timeout!r}")
    if collective is not None and not isinstance(collective, bool):
        raise ConfigError(
            "collective", f"expected None (agree when ranks run), True (must agree) or False, got {collective!r}"
        )
    return float(timeout)


def _check_time_limit(time_limit: object) -> float | None:
    """``time_limit`` as seconds (None: no bound)."""
    if time_limit is None:
        return None
    if (
        isinstance(time_limit, bool)
        or not isinstance(time_limit, (int, float))
        or not math.isfinite(time_limit)
        or time_limit <= 0
    ):
        raise ConfigError(
            "time_limit", f"expected None or the seconds the whole search may take (above 0), got {time_limit!r}"
        )
    return float(time_limit)


def _check(
    start: object,
    backend: object,
    device: object,
    max_size: object,
    margin: object,
    measure: object,
    limit: object,
    baseline: object,
    max_trials: object,
    return_trials: object,
    confirm: object = True,
    lower: object = None,
    progress: object = None,
    model: object = None,
    target_global_batch: object = None,
    timeout: object = DEFAULT_TIMEOUT,
    collective: object = None,
    time_limit: object = None,
) -> _Settings:
    def whole(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not whole(start) or start < 1:  # type: ignore[operator]
        raise ConfigError("start", f"expected the first batch size to try (an int of 1 or more), got {start!r}")
    assert isinstance(start, int)
    name = registry.canonical_name(backend) if backend is not None else None
    if not whole(device) or device < 0:  # type: ignore[operator]
        raise ConfigError("device", f"expected a device index (0 or more), got {device!r}")
    if max_size is not None and (not whole(max_size) or max_size < start):  # type: ignore[operator]
        raise ConfigError("max_size", f"expected None or an int of at least start={start}, got {max_size!r}")
    if (
        isinstance(margin, bool)
        or not isinstance(margin, (int, float))
        or not math.isfinite(margin)
        or not 0 <= margin < 1
    ):
        raise ConfigError("margin", f"expected a share in [0, 1), such as 0.05, got {margin!r}")
    if measure is not None and not callable(measure):
        raise ConfigError(
            "measure", f"expected None or a callable returning the last trial's peak bytes, got {measure!r}"
        )
    size = None if limit is None else parse_size(limit, "limit")
    base: int | None = None
    if baseline is not None:
        base = 0 if baseline == 0 and not isinstance(baseline, bool) else parse_size(baseline, "baseline")
    if not whole(max_trials) or max_trials < 1:  # type: ignore[operator]
        raise ConfigError("max_trials", f"expected an int of 1 or more, got {max_trials!r}")
    if not isinstance(return_trials, bool):
        raise ConfigError("return_trials", f"expected True or False, got {return_trials!r}")
    if not isinstance(confirm, bool):
        raise ConfigError("confirm", f"expected True or False, got {confirm!r}")
    if lower is not None and not callable(lower):
        raise ConfigError(
            "lower", f"expected None or a callable lower(batch_size) returning the lowered step, got {lower!r}"
        )
    if progress is not None and not isinstance(progress, bool):
        raise ConfigError("progress", f"expected None (on a terminal), True or False, got {progress!r}")
    wait = _check_ranks(target_global_batch, timeout, collective)
    bound = _check_time_limit(time_limit)
    assert isinstance(device, int) and isinstance(max_trials, int)
    assert max_size is None or isinstance(max_size, int)
    assert target_global_batch is None or isinstance(target_global_batch, int)
    assert collective is None or isinstance(collective, bool)
    checked_measure: Callable[[], int | None] | None = measure
    checked_lower: Callable[[int], Any] | None = lower
    return _Settings(
        start,
        name,
        device,
        max_size,
        float(margin),
        checked_measure,
        size,
        base,
        max_trials,
        return_trials,
        confirm,
        checked_lower,
        progress,
        model,
        target_global_batch,
        wait,
        collective,
        bound,
    )


# --- agreement over ranks (the transport: search_ranks.py) ------------------------------------


def _agree_open(run: _Run) -> None:
    """Before the first trial: the ranks passed the same arguments; the limit is the smallest
    over ranks, the bytes in use before the search the largest (so one model holds on every rank)."""
    assert run.ranks is not None
    mine = run.settings.fingerprint()
    payload = {"kind": "start", "size": 0, "settings": mine}  # the arguments are compared below, by name
    payload.update(limit=run.limit, baseline=run.baseline, running_peak=run.running_peak)
    answers = run.ranks.exchange(payload)
    for rank, theirs in sorted(answers.items()):
        for name, value in theirs["settings"].items():
            if value != mine.get(name):
                raise ConfigError(
                    name,
                    f"rank {rank} passed {name}={value!r} where rank {run.ranks.rank} passed {mine.get(name)!r}: "
                    "every rank of a collective search must pass the same arguments",
                )
    every = list(answers.values())
    run.limit = worst([p["limit"] for p in every], min)
    run.baseline = worst([p["baseline"] for p in every])
    run.running_peak = worst([p["running_peak"] for p in every])


def _agree(run: _Run, kind: str, size: int, outcome: Outcome) -> Outcome:
    """A call of the step as every rank saw it: it fit only where it fit on every rank, the figures
    are the largest over ranks, the limit (read again after the call) the smallest."""
    if run.ranks is None:
        return outcome
    elapsed = _clock() - run.began
    answers = run.ranks.exchange(
        {"kind": kind, "size": size, "limit": run.limit, "elapsed": elapsed, **outcome.__dict__}
    )
    every = [p for _, p in sorted(answers.items())]
    run.elapsed = max(p.get("elapsed", elapsed) for p in every)  # so that every rank stops at the same trial
    failed = [(rank, p["error"]) for rank, p in sorted(answers.items()) if p["error"] is not None]
    error = None
    if failed:
        rank, text = failed[0]
        more = f" (and rank(s) {', '.join(str(r) for r, _ in failed[1:])})" if len(failed) > 1 else ""
        error = f"rank {rank}{more}: {text}"
    run.limit = worst([p["limit"] for p in every], min)
    fits = error is None
    return Outcome(
        error,
        max(p["seconds"] for p in every),
        worst([p["peak"] for p in every]) if fits else None,
        worst([p["peak_reserved"] for p in every]) if fits else None,
        known([p["kept"] for p in every]),
        known([p["overhead"] for p in every]) if fits else None,
    )


# --- the state of one search -------------------------------------------------------------------


@dataclass
class _Run:
    """What one search knows so far; the trial runner and the conclusion update it."""

    settings: _Settings
    backend: str | None = None  # the framework whose figures are read; None: none in use
    adapter: Backend | None = None  # its adapter, asked what the search does differently for it
    limit: int | None = None  # bytes a trial's peak may reach
    measured_by: str = ""
    baseline: int | None = None  # bytes in use before the search, which every peak includes
    before: MemoryStats | None = None
    trials: list[Trial] = field(default_factory=list)
    points: list[tuple[int, int]] = field(default_factory=list)  # (size, peak) of the trials that fit
    # A framework that cannot reset its peak reads None for a trial below the process's peak
    # so far. That peak, while the search has seen every step since it was read (no failure,
    # whose partial allocations it would not see), bounds the trial's from above: a (size,
    # bound) point keeps the sure lower bound sure, though it is no point of the fit.
    bounded: list[tuple[int, int]] = field(default_factory=list)
    running_peak: int | None = None
    kept_total: int = 0  # bytes failed trials left in use for good (``failed_step_keeps_outputs``)
    overhead: int = 0  # the pool's bytes beyond those in use, at the largest trial that fit
    good: int = 0  # the largest size that ran
    bad: int | None = None  # the smallest size that did not
    model: tuple[float, float] | None = None
    last_oom: BaseException | None = None
    calls: int = 0  # every call of the step, re-runs after the search included (max_trials bounds it)
    failed_calls: int = 0
    scale: Scale | None = None  # with lower=: the predicted peaks, and what the runs say about them
    # A failure refutes what said it would fit: the sure bound for good (the limit is not the
    # capacity, or the use grew faster than the batch), the fitted line until a size fits after it.
    sure_refuted: bool = False
    line_refuted_at: int | None = None  # len(points) when a failure refuted the line
    last_safe: int | None = None  # the sure bound and the line's answer when the last size was chosen
    last_predicted: int | None = None
    brackets: list[tuple[int, int]] = field(default_factory=list)  # (good, high) after each trial
    point_kept: dict[int, int] = field(default_factory=dict)  # kept_total when each point's size ran
    progress: Progress = field(default_factory=lambda: Progress(False))
    ranks: Ranks | None = None  # the ranks every trial is agreed with; None: a single process
    # Where no device figure is known: the host's limit, and each trial's resident peak (search_host).
    host: HostLimit | None = None
    host_peaks: HostPeaks | None = None
    began: float = 0.0  # _clock() when the search began
    elapsed: float | None = None  # over ranks: the longest any rank has searched, as of the last agreement
    out_of_time: bool = False  # time_limit= passed before the answer was within the margin

    @property
    def device(self) -> int:
        return self.settings.device

    def use(self, backend: str | None) -> None:
        """Read ``backend``'s figures from now on (None: no framework's)."""
        self.backend = backend
        self.adapter = None if backend is None else registry.get_backend(backend)


def _framework(settings: _Settings) -> str | None:
    """The framework whose figures to read: the one named (None for the framework-free view),
    else the one an action means (``registry.resolve``); None while no framework is configured
    or imported (the first trial may import it). Several in use is a ``ConfigError``."""
    if settings.backend is not None:
        return settings.backend if registry.is_framework(settings.backend) else None
    try:
        return registry.resolve(None, "action")
    except ConfigError:
        if registry.imported_frameworks() or registry.configured():
            raise  # several in use: unimem never guesses
        return None


def _snapshot(run: _Run) -> MemoryStats | None:
    return None if run.backend is None else api.stats(run.backend, run.device)


def _capacity(run: _Run, snapshot: MemoryStats | None) -> int | None:
    """Bytes the measured peak may reach, as the framework reads its snapshot (its cap by
    default). With predictions and a largest buffer the allocator can hand out, the cap: the
    pool's pieces are then held against each size's largest buffer (``Scale.room``)."""
    if snapshot is None or run.adapter is None:
        return None
    if run.scale is not None and run.scale.largest and run.adapter.search_largest_buffer(snapshot) is not None:
        return snapshot.limit
    return run.adapter.search_capacity(snapshot)


def _room(run: _Run, snapshot: MemoryStats | None) -> int | None:
    """The largest buffer the allocator can hand out now (figures from the framework only)."""
    if snapshot is None or run.adapter is None or run.settings.measure is not None:
        return None
    return run.adapter.search_largest_buffer(snapshot)


def _measured_by(run: _Run) -> str:
    if run.settings.measure is not None:
        return "measure="
    if run.host is not None:
        return "the process's resident peak (host memory)"
    if run.backend is not None:
        return f"stats({run.backend!r}).{_PEAK_FIELD}"
    return "nothing (no framework in use, no measure=)"


def _open(settings: _Settings, over: Ranks | None = None) -> _Run:
    """The search's state before its first trial: the framework, the limit, the baseline; over
    ranks, agreed by all of them (progress lines on rank 0 only)."""
    shown = settings.progress if over is None or over.rank == 0 else False
    run = _Run(settings, progress=Progress(shown), ranks=over, began=_clock())
    run.use(_framework(settings))
    if settings.lower is not None:
        many = _predictor(run)
        run.scale = Scale(lambda n: many([n])[0], _COMPILES_PER_TRIAL * settings.max_trials, many)
    elif settings.limit is not None and settings.measure is None and run.backend is None:
        raise ConfigError(
            "limit",
            "a limit needs each trial's peak memory, and no framework is in use to report it; "
            "pass measure= (a callable returning the last trial's peak bytes) or backend=",
        )
    if run.backend is not None:
        _release(run)
    run.before = _snapshot(run)
    run.limit = settings.limit if settings.limit is not None else _capacity(run, run.before)
    if run.scale is not None:
        run.scale.room = _room(run, run.before)
    run.measured_by = _measured_by(run)
    # The baseline turns one measured trial into a size that surely fits (see safe_size).
    run.baseline = settings.baseline
    if run.baseline is None and settings.measure is None and run.before is not None:
        run.baseline = run.before.allocated
    if run.scale is not None:
        run.scale.held = run.baseline
    if run.before is not None and settings.measure is None:
        run.running_peak = run.before.peak_allocated
    _hold_to_host(run)
    if over is not None:
        _agree_open(run)
    return run


def _hold_to_host(run: _Run) -> None:
    """Where nothing bounds the sizes (no ``limit=``, no ``measure=``, and no device figure: a host
    without a GPU), the host's memory does (``search_host``): past it the kernel kills the process
    rather than the step raising. Ranks of one host share it."""
    settings = run.settings
    if settings.limit is not None or settings.measure is not None or run.limit is not None:
        return
    view = run.before if run.before is not None else api.framework_free_stats(run.device)
    if view.device_total is not None or view.peak_allocated is not None or view.limit is not None:
        return
    local = ranks.rank_info(runtime=False).local_world_size
    held = read_limit(local or (1 if run.ranks is None else run.ranks.world_size))
    if held is None:
        return
    run.host, run.host_peaks = held, HostPeaks()
    run.limit, run.measured_by = held.limit, _measured_by(run)
    run.baseline = held.resident if settings.baseline is None else settings.baseline
    run.running_peak = run.host_peaks.so_far()
    if run.scale is not None:
        run.scale.held = run.baseline


def _reread_capacity(run: _Run) -> bool:
    """Read the capacity again where it is the framework's (no ``limit=``, figures from the
    framework), and the largest buffer its allocator can hand out (with predictions):
    compilations and runs grow a pool taken on demand. Over ranks, the smallest any rank knows,
    so that every rank places the same size. True when either changed."""
    ours = run.settings.limit is None
    if run.settings.measure is not None or run.backend is None or not (ours or run.scale is not None):
        return False
    snapshot = _snapshot(run)
    capacity = _capacity(run, snapshot) if ours else run.limit
    room = None if run.scale is None else _room(run, snapshot)
    if run.ranks is not None:
        answers = run.ranks.exchange({"kind": "capacity", "size": run.good, "limit": capacity, "room": room})
        capacity = min((p["limit"] for p in answers.values() if p["limit"] is not None), default=None)
        room = min((p["room"] for p in answers.values() if p["room"] is not None), default=None)
    changed = ours and capacity is not None and capacity != run.limit
    if changed:
        run.limit = capacity
    if run.scale is not None and room != run.scale.room:
        run.scale.room = room
        changed = True
    return changed


def _adopt(run: _Run) -> None:
    """After the first trial, which may have imported the framework: read its figures from now on."""
    run.use(_framework(run.settings))
    if run.backend is not None and run.settings.measure is None:
        snapshot = _snapshot(run)
        limit = run.settings.limit if run.settings.limit is not None else _capacity(run, snapshot)
        if run.host is not None:
            if limit is None:
                return  # still no device figure: the host's
            # A device after all: its figures from now on, none of the host's.
            run.host = run.host_peaks = None
            run.points.clear()
            run.bounded.clear()
            run.baseline, run.running_peak = run.settings.baseline, None
        run.measured_by = _measured_by(run)
        run.limit = limit
        if run.scale is not None:
            run.scale.room = _room(run, snapshot)


# --- predictions (lower=) -----------------------------------------------------------------------


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _size_lowered(run: _Run, lowered: Any) -> tuple[int, int | None] | None:
    """The predicted peak and largest single buffer of what ``lower(n)`` returned: an int is
    taken as the peak's bytes, a pair of ints as both; else the search's framework sizes it,
    then each one imported (``Backend.predict_peak``, ``Backend.predict_largest_buffer``)."""
    pair = isinstance(lowered, tuple) and len(lowered) == 2 and all(map(_whole, lowered))
    if _whole(lowered) or pair:
        peak, largest = (lowered, None) if _whole(lowered) else lowered
        if peak < 0 or (largest is not None and not 0 <= largest <= peak):
            raise ConfigError(
                "lower",
                f"lower() returned {lowered!r}: a peak in bytes is at least 0, and a (peak, largest buffer) "
                "pair holds a largest buffer between 0 and the peak",
            )
        return peak, largest
    adapters = [run.adapter] if run.adapter is not None else []
    adapters += [registry.get_backend(name) for name in registry.imported_frameworks()]
    for adapter in dict.fromkeys(adapters):
        value = adapter.predict_peak(lowered)
        if value is not None:
            if run.scale is not None and adapter.predicts_concurrently:
                run.scale.width = _COMPILE_WIDTH
            return value, adapter.predict_largest_buffer(lowered)
    return None


def _predictor(run: _Run) -> Callable[[list[int]], list[tuple[int, int | None] | None]]:
    """``sizes -> predicted (peak, largest buffer)`` through ``lower=``, compiled at once where
    the scale's rounds are wider than one (``search_compile``); a lowering that itself runs out
    of memory predicts ``OVER`` (the size does not fit), any other error stops the search."""
    lower = run.settings.lower
    assert lower is not None

    def predict(sizes: list[int]) -> list[tuple[int, int | None] | None]:
        threads = 1 if run.scale is None else run.scale.width
        results: list[tuple[int, int | None] | None] = []
        for size, done in zip(sizes, size_all(lower, lambda x: _size_lowered(run, x), sizes, threads), strict=True):
            value, largest = (None, None) if done.value is None else done.value
            if done.error is not None:
                if find_oom(done.error) is None:
                    _mark(done.error, size, f"unimem.find_batch_size: lower({size}) raised this")
                    _tell_ranks(run.ranks, "compilation", size, done.error)
                    raise done.error
                clear_frames(done.error)  # the lowering's frames may hold arrays of that size
                value, largest = OVER, None
            if run.ranks is not None:
                # The largest over ranks, so every rank places the same sizes (None: one cannot size it).
                message = {"kind": "compilation", "size": size, "predicted": value, "largest": largest}
                answers = run.ranks.exchange(message)
                value = worst([p["predicted"] for p in answers.values()])
                largest = worst([p["largest"] for p in answers.values()])
            room = None if run.scale is None else run.scale.room
            run.progress.compiled(size, value, done.seconds, largest, room)
            results.append(None if value is None else (value, largest))
        return results

    return predict


def _predicted(run: _Run, size: int) -> int | None:
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


def _first(run: _Run) -> int:
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
    while size > 1 and run.limit is not None and predicted is not None and predicted > run.limit:
        size //= 2
        predicted = run.scale.peak(size)
    return size


# --- one trial ---------------------------------------------------------------------------------


def _step_error_note(adapter: Backend | None, exc: BaseException, after_oom: bool) -> str | None:
    """What a framework says caused a step's own error: the search's framework first, then each
    one imported (the step may run one whose figures the search does not read)."""
    classes: list[type[Backend]] = [type(adapter)] if adapter is not None else []
    classes += [registry.adapter_class(name) for name in registry.imported_frameworks()]
    for cls in dict.fromkeys(classes):
        note = cls.explain_step_error(exc, after_oom)
        if note is not None:
            return note
    return None


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``; on Python 3.10, the ``__notes__`` list it would add to (PEP 678)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        return
    with contextlib.suppress(AttributeError, TypeError):  # an exception type that takes no attributes
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]


def _mark(exc: BaseException, size: int, note: str) -> None:
    """Say at which batch size ``exc`` stopped the search: a note, and ``exc.unimem_batch_size``."""
    with contextlib.suppress(AttributeError, TypeError):
        exc.unimem_batch_size = size  # type: ignore[attr-defined]
    _add_note(exc, note)


def _tell_ranks(over: Ranks | None, kind: str, size: int, exc: BaseException) -> None:
    """Before this rank's own error propagates, post it as its answer to this round, so the
    other ranks stop at once instead of waiting out their timeout."""
    if over is not None:
        text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        with contextlib.suppress(Exception):  # the store may have gone: this rank's own error matters more
            over.post({"kind": kind, "size": size, "raised": text[:500]})


def _attempt(
    step: Callable[[int], Any],
    size: int,
    after_oom: bool,
    adapter: Backend | None,
    over: Ranks | None = None,
    kind: str = "trial",
) -> tuple[str | None, BaseException | None]:
    """Run ``step(size)``. Returns ``(None, None)`` when it fit; on an out-of-memory
    error, its first line and, for a final report only, the error with its frames cleared.
    ``after_oom``: an earlier trial failed, so a step that donates its state has lost it.
    Over ranks, any other error is posted to them (``kind``: the round) before it propagates."""
    try:
        step(size)
    except Exception as exc:
        oom = find_oom(exc)
        if oom is None:
            _mark(exc, size, f"unimem.find_batch_size: the step raised this at batch size {size}")
            note = _step_error_note(adapter, exc, after_oom)
            if note is not None:
                _add_note(exc, note)  # the framework's own message may name no cause
            _tell_ranks(over, kind, size, exc)
            raise
        text = _message(oom).strip().splitlines()
        # The frames hold the failed step's tensors: drop their locals here, so that
        # nothing but this line of text outlives the except block.
        clear_frames(exc)
        return (text[0][:300] if text else type(oom).__name__), (exc if size == 1 else None)
    return None, None


def _release(run: _Run, *, failed: bool = False, final: bool = False) -> None:
    """Give back what the last trial left, outside any ``except`` block."""
    if failed or final:
        gc.collect()  # a failed step's objects may sit in reference cycles
    if run.adapter is None:
        return
    if run.adapter.release_every_trial or final:
        # Every trial where that is cheap, so the next peak is measured from a clean pool;
        # elsewhere at the end only (clearing may drop compiled steps, or cannot free).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnimemWarning)
            api.clear_cache(run.backend, run.device)


def _read_peak(run: _Run) -> tuple[int | None, int | None, int | None]:
    """The peak, the pool's peak and the pool's overhead of the trial that just fit (None: unknown)."""
    if run.settings.measure is not None:
        value = run.settings.measure()
        return (None if value is None else int(value)), None, None
    if run.host_peaks is not None:
        return run.host_peaks.read(), None, None
    if run.backend is None or run.adapter is None:
        return None, None, None
    figures = api.stats(run.backend, run.device, nvml=False)
    peak, peak_reserved = figures.peak_allocated, figures.peak_reserved
    overhead = None
    if peak is not None and peak_reserved is not None:
        overhead = run.adapter.pool_overhead(peak, peak_reserved)
    return peak, peak_reserved, overhead


def _kept(run: _Run, in_use: int | None) -> int | None:
    """Bytes still in use after a failed trial was released, above those in use before it."""
    if in_use is None or run.adapter is None:
        return None
    now = api.stats(run.backend, run.device, nvml=False).allocated
    return None if now is None else max(0, now - in_use)


def _record(run: _Run, size: int, fits: bool, peak: int | None) -> None:
    """Update the bounds, the points and the process's running peak with a trial's outcome."""
    if fits and peak is None and run.running_peak is not None:
        run.bounded.append((size, run.running_peak))
    if not fits:
        run.running_peak = None
    elif peak is not None and run.running_peak is not None:
        run.running_peak = max(run.running_peak, peak)
    figures = run.points or run.bounded or run.scale is not None  # predicted peaks count as figures
    if fits and peak is None and run.settings.limit is not None and not figures:
        raise ConfigError(
            "limit",
            f"a limit needs each trial's peak memory, and {run.measured_by} gave none for batch size {size}; "
            "pass measure= as well (a callable returning the last trial's peak bytes), or drop limit=",
        )
    if fits:
        run.good = max(run.good, size)
        if peak is not None:
            run.points.append((size, peak))
    else:
        run.bad = size if run.bad is None else min(run.bad, size)
        # What said this size would fit is refuted (see _Run).
        if run.last_safe is not None and size <= run.last_safe:
            run.sure_refuted = True
        if run.last_predicted is not None and size <= run.last_predicted:
            run.line_refuted_at = len(run.points)
    high = _high(run)
    if run.good and high is not None:
        run.brackets.append((run.good, high))


def _trial(step: Callable[[int], Any], run: _Run, size: int, reason: str) -> None:
    """One real call of ``step``, measured, released and recorded."""
    predicted = _predicted(run, size)
    in_use = None
    if run.settings.measure is None and run.backend is not None:
        api.reset_peak(run.backend, run.device)
        in_use = api.stats(run.backend, run.device, nvml=False).allocated
    if run.host_peaks is not None:
        run.host_peaks.begin()
    kept_before = run.kept_total
    t0 = _clock()
    run.calls += 1
    error, run.last_oom = _attempt(step, size, run.bad is not None, run.adapter, run.ranks)
    seconds = _clock() - t0
    peak, peak_reserved, overhead = _read_peak(run) if error is None else (None, None, None)
    if error is None and run.host is not None and peak is not None and run.limit is not None and peak > run.limit:
        # It ran, but past what the host can spare: a larger size could make the kernel kill the process.
        error = f"its resident peak {format_bytes(peak)} passed the host limit {format_bytes(run.limit)}"
    _release(run, failed=error is not None)  # outside the except block: the frames are gone
    kept = _kept(run, in_use) if error is not None else None
    if run.backend is None and run.settings.backend is None and not run.trials:
        _adopt(run)
    agreed = _agree(run, "trial", size, Outcome(error, seconds, peak, peak_reserved, kept, overhead))
    error, seconds, peak, peak_reserved, kept = (
        agreed.error,
        agreed.seconds,
        agreed.peak,
        agreed.peak_reserved,
        agreed.kept,
    )
    run.failed_calls += error is not None
    if agreed.overhead is not None and size > run.good:
        run.overhead = agreed.overhead  # the pool's overhead at the largest trial that fit
    if error is not None and run.adapter is not None and run.adapter.failed_step_keeps_outputs:
        # Lost for good. Elsewhere what stays is the step's own state (gradients a failed
        # backward set), which the next step reuses.
        run.kept_total += kept or 0
    run.trials.append(Trial(size, error is None, peak, seconds, reason, error, peak_reserved, kept, predicted))
    run.progress.call(size, error is None, peak, seconds, reason, run.calls, run.settings.max_trials)
    if run.scale is not None:
        run.scale.ran(size, error is None, kept_before, peak)
    run.point_kept[size] = kept_before
    _record(run, size, error is None, peak)


# --- the search ----------------------------------------------------------------------------------


def _scale_limit(run: _Run) -> int | None:
    """The limit the predicted peaks are held against (the pool's own overhead apart)."""
    return None if run.limit is None else run.limit - run.overhead


def _high(run: _Run) -> int | None:
    """The largest size that can still fit: below the smallest failure, at most ``max_size``,
    and, while the predictions are used, below the smallest size predicted past the capacity."""
    bounds = [None if run.bad is None else run.bad - 1, run.settings.max_size, _line_bound(run)]
    if run.scale is not None and run.scale.trusted:
        bounds.append(run.scale.bound(_scale_limit(run), run.kept_total, run.good))
    known = [x for x in bounds if x is not None]
    return min(known) if known else None


def _line_bound(run: _Run) -> int | None:
    """Where a framework that never trades compute for memory (``Backend.rematerializes``) holds
    a step whose peaks grow at least linearly, the sizes above the largest measured one that the
    limit leaves room for: none past ``line_bound``. None unless a sure bound still stands."""
    adapter = run.adapter
    if adapter is None or adapter.rematerializes or run.limit is None or run.sure_refuted:
        return None
    # What failed trials kept since the largest point ran is lost to every size above it.
    largest = max(run.points, default=None)
    kept = 0 if largest is None else run.kept_total - run.point_kept.get(largest[0], run.kept_total)
    return line_bound(run.points, run.limit - run.overhead - kept, run.baseline)


def _converged(run: _Run) -> bool:
    """Whether the largest size that ran is within the margin of the largest that can fit."""
    high = _high(run)
    return bool(run.good) and high is not None and run.good >= (1 - run.settings.margin) * high


def _cautious(run: _Run) -> bool:
    """Whether a failure costs much more than a run that fit: in time (``_COSTLY`` times the
    median run's, and over ``_COSTLY_SECONDS``), or in what failures left in use for good (over
    1% of the limit)."""
    ran = [t.seconds for t in run.trials if t.fits]
    worst = max((t.seconds for t in run.trials if not t.fits), default=0.0)
    slow = bool(ran) and worst > max(_COSTLY * median(ran), _COSTLY_SECONDS)
    return slow or (run.limit is not None and run.kept_total > 0.01 * run.limit)


def _choose(run: _Run, convex: bool) -> tuple[int, str]:
    """The next size to try, and why: placed by the predictions while they hold, else as
    ``search_math.next_size`` says, bisecting whenever the bracket stalls (``stalled``)."""
    if run.good == 0:
        assert run.bad is not None
        return max(1, run.bad // 2), "halve"
    if run.scale is not None and run.scale.trusted:
        placed = _place(run)
        if placed is not None:
            return placed
    # What failed trials kept for good is lost to every later trial (peaks measured after
    # it include it too: both err on the safe side).
    usable = None if run.limit is None else run.limit - run.overhead - run.kept_total
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
        saturated=run.bad is None and knee(run.points, run.limit) is not None,
        streak=next((i for i, t in enumerate(reversed(run.trials)) if t.reason != "saturated"), len(run.trials)),
        refit=run.bad is not None and last.fits,
        jumped=last.fits and last.reason == "safe-jump",
        cautious=cautious,
        linear=linear,
    )
    high = _high(run)
    # The close step is exempt: it ends the search if it fails, and gains the margin if not.
    if high is not None and reason != "close" and stalled(run.brackets, linear):
        close = closing(run.good, run.settings.margin)
        size, reason = max(split(run.good, high, 1 / 3 if cautious else 0.5, linear), close), "bisect"
    if run.host is not None:
        size = min(size, HOST_GROWTH * run.good)  # on the host a size that does not fit kills the process
    return (size if high is None else min(size, high)), reason


def _place(run: _Run) -> tuple[int, str] | None:
    """With predictions: the largest size predicted under the limit; after the first failure,
    the smallest size that ends the search if it fits (the capacity lies under the limit, most
    often a little); after more, one predicted halfway (a third of the way when failures are
    costly) from the largest run that fit to the ceiling the failures set. None: they cannot place it."""
    scale, margin, good = run.scale, run.settings.margin, run.good
    assert scale is not None
    _reread_capacity(run)  # the last run (and the compilations before it) may have grown the pool
    if len(scale.fails) == 1 and not run.trials[-1].fits and run.bad is not None:
        below = math.ceil((1 - margin) * (run.bad - 1))
        ceiling = scale.allowed(_scale_limit(run), run.kept_total, 1.0)
        predicted = scale.peak(below) if good < below < run.bad else None
        # Only where it fits beside what the failure left in use (XLA keeps its outputs).
        if predicted is not None and ceiling is not None and predicted <= ceiling:
            return below, "predicted-below"
    share = 1.0 if not scale.fails else 1 / 3 if _cautious(run) else 0.5
    allowed = scale.allowed(_scale_limit(run), run.kept_total, share)
    if allowed is None:
        scale.distrust = "no limit to hold the predicted peaks against"
        return None
    bounds = [x for x in (None if run.bad is None else run.bad - 1, run.settings.max_size) if x is not None]
    # At the ceiling the largest size is wanted to within the margin; a split needs only its region
    # (each compilation of a large step costs seconds on a GPU).
    most = _COMPILES_PER_PLACEMENT if share == 1 else 1
    found = scale.locate(allowed, good, min(bounds) if bounds else None, margin / 2, most)
    if _reread_capacity(run):  # the compilations just made took from the pool
        again = scale.allowed(_scale_limit(run), run.kept_total, share)
        if again is not None:
            found = scale.locate(min(again, allowed), good, min(bounds) if bounds else None, margin / 2, most)
    high = _high(run)  # the compilations just made may bound it
    close = closing(good, margin)
    if found is None or found < close:
        # Less than a margin to gain at the target: the smallest size that ends the search
        # either way, where it may still fit (compiled first: predicted past the limit, it
        # ends the search without a run).
        if high is None or close > high or scale.peak(close) is None:
            return None
        return close, "close"
    if share < 1 or high is None:
        return found, "predicted-split" if share < 1 else "predicted"
    if scale.width > 1:
        # Placed a little under its line's crossing already, and compiled: a size under it would
        # cost a compilation more (seconds to minutes), for a hedge the line already took.
        return found, "predicted"
    # At the limit, a little under the largest size predicted to fit, as far as the answer
    # stays within the margin: the capacity may lie a little under the limit.
    aim = max(math.ceil((1 - margin) * high), math.floor(found * (1 - margin / 4)), good + 1)
    return min(aim, found), "predicted"


def _budget(run: _Run) -> int:
    """The calls the search itself may make: ``max_trials``, less one kept for re-running the
    answer once a trial failed (``confirm``)."""
    settings = run.settings
    keep = 1 if settings.confirm and run.good and run.bad is not None and settings.max_trials > 1 else 0
    return settings.max_trials - keep


def _nothing_fits(run: _Run) -> OutOfMemory:
    """The error when batch size 1 failed, with the report of its out-of-memory error (on a rank
    where it ran, naming the ranks where it did not)."""
    if run.last_oom is None:
        where = " on every rank" if run.ranks is not None else ""
        return OutOfMemory(f"even batch size 1 does not fit{where}: {run.trials[-1].error}", None)
    oom = find_oom(run.last_oom) or run.last_oom
    from unimem.diagnose.report import build_report

    report = build_report(oom, backend=run.backend, device=run.device, batch_size=1)
    return OutOfMemory(f"even batch size 1 does not fit.\n{report}", report)


def _quiet(step: Callable[[int], Any], model: Any) -> Callable[[int], Any]:
    """``step`` run inside the context the model's framework gives each trial (``Backend.trial_context``),
    in which the model makes no collective of its own."""
    for name in registry.imported_frameworks():
        enter = registry.get_backend(name).trial_context(model)
        if enter is not None:

            def quiet(size: int, enter: Callable[[], contextlib.AbstractContextManager[None]] = enter) -> Any:
                with enter():
                    return step(size)

            return quiet
    raise ConfigError(
        "model",
        f"expected the module the step trains (its data-parallel wrapper, of a framework in use), got "
        f"{type(model).__name__}; or leave model=None and run the step's forward and backward without "
        "gradient synchronisation yourself",
    )


def _aimed(settings: _Settings, over: Ranks | None) -> _Settings:
    """With ``target_global_batch``: no size above the target's share per rank is tried (no
    micro-batch of the plan would be larger). Checked against the world size before any trial."""
    target = settings.target_global_batch
    if target is None:
        return settings
    world = 1 if over is None else over.world_size
    if target < world:
        raise ConfigError(
            "target_global_batch",
            f"{world} ranks cannot share a global batch of {target}: pass at least the world size",
        )
    share = max(settings.start, math.ceil(target / world))
    return replace(settings, max_size=share if settings.max_size is None else min(settings.max_size, share))


def _search(step: Callable[[int], Any], settings: _Settings) -> BatchSizeSearch:
    began = time.perf_counter()
    if settings.model is not None:
        step = _quiet(step, settings.model)
    over = connect(settings.collective, settings.timeout)
    run = _open(_aimed(settings, over), over)
    try:
        size, reason = _first(run), "start"
        while True:
            _trial(step, run, size, reason)
            if run.good == 0 and run.bad == 1:
                raise _nothing_fits(run) from run.last_oom
            run.model, convex = fit(run.points, baseline=run.baseline)
            converged = _converged(run)
            if converged or run.calls >= _budget(run) or _out_of_time(run):
                break
            size, reason = _choose(run, convex)
            converged = _converged(run)  # the sizes compiled to place it may bound the answer
            if converged:
                break
        return _finish(step, run, converged, began)
    except KeyboardInterrupt as exc:
        interrupted(exc, run.good or None, run.calls)
        raise


def _out_of_time(run: _Run) -> bool:
    """Whether ``time_limit=`` has passed (over ranks: on any rank, as of the last trial's agreement,
    so that every rank stops after the same trial)."""
    bound = run.settings.time_limit
    if bound is None:
        return False
    elapsed = run.elapsed if run.ranks is not None and run.elapsed is not None else _clock() - run.began
    run.out_of_time = elapsed >= bound
    return run.out_of_time


def _finish(step: Callable[[int], Any], run: _Run, converged: bool, began: float) -> BatchSizeSearch:
    """After the last trial: the answer confirmed or not, the notes, memory given back."""
    settings = run.settings
    if run.good == 0:
        before = f" before time_limit={settings.time_limit:g} s passed" if run.out_of_time else ""
        raise OutOfMemory(
            f"no batch size fit in {len(run.trials)} trials{before} (smallest tried: "
            f"{min(t.batch_size for t in run.trials)}); start lower, or raise "
            + ("time_limit" if run.out_of_time else "max_trials"),
            None,
        )
    # stacklevel 4: _finish, _search, find_batch_size (or the decorated function), the caller.
    spent = (
        f"time_limit={settings.time_limit:g} s passed after {run.calls} call(s) of the step"
        if run.out_of_time
        else f"max_trials={settings.max_trials} calls of the step ran out"
    ) + (f" before the answer was within margin={settings.margin}; returning {run.good}, the largest size that ran")
    if not converged:
        warnings.warn(f"find_batch_size: {spent}", UnimemWarning, stacklevel=4)
    answer, confirmations, confirmed, notes = _conclude(step, run)
    if confirmed is False:
        warnings.warn(f"find_batch_size: {notes[-1]}", UnimemWarning, stacklevel=4)
    _release(run, final=True)
    after = _snapshot(run)
    if run.limit is None and settings.measure is None and run.scale is None:
        notes.append("no memory limit known: searched by doubling and bisection, without a model")
    if run.scale is not None and run.scale.distrust is not None:
        notes.append(f"predictions (lower=) set aside: {run.scale.distrust}")
    if run.host is not None:
        notes.append(run.host.note())
    if not converged:
        notes.insert(0, spent)
    scale = run.scale
    world = 1 if run.ranks is None else run.ranks.world_size
    target = settings.target_global_batch
    return BatchSizeSearch(
        batch_size=answer,
        trials=tuple(run.trials),
        smallest_failure=run.bad,
        converged=converged,
        margin=settings.margin,
        limit=run.limit,
        model=run.model,
        baseline=run.baseline,
        measured_by=run.measured_by,
        seconds=time.perf_counter() - began,
        before=run.before,
        after=after,
        notes=tuple(notes),
        confirmations=confirmations,
        confirmed=confirmed,
        step_calls=run.calls,
        failed_calls=run.failed_calls,
        compile_calls=0 if scale is None else scale.compiles,
        predictions=() if scale is None else tuple(sorted(scale.memo.items())),
        world_size=world,
        plan=None if target is None else plan_accumulation(target, answer, world),
        time_limit_passed=run.out_of_time,
    )


# --- the conclusion ------------------------------------------------------------------------------


def _conclude(step: Callable[[int], Any], run: _Run) -> tuple[int, tuple[Trial, ...], bool | None, list[str]]:
    """After the search: the answer re-run or not (see ``_confirm``), and the notes on what
    the peaks and the failed trials showed."""
    good, limit, kept_total = run.good, run.limit, run.kept_total
    cause = _saturation_cause(run)
    saturated = None if cause is None else saturation_note(run.points, limit, good, cause)
    notes = [note for note in (saturated, _kept_note(run)) if note]
    ran = max((t for t in run.trials if t.fits and t.batch_size == good), key=lambda t: t.peak or 0)
    if run.settings.confirm and limit is not None and kept_total and ran.peak and ran.peak + kept_total > limit:
        # Its peak no longer fits beside what the failed trials kept: re-running it (and one
        # size lower) would fail again, each failure costing seconds and maybe more memory.
        notes.append(
            f"{good} ran during the search (peak {format_bytes(ran.peak)}) but cannot run again in this process "
            f"beside the {format_bytes(kept_total)} the failed trials left in use (limit {format_bytes(limit)}); "
            f"start a fresh process with batch size {good}"
        )
        return good, (), False, notes
    answer, confirmations, confirmed = _confirm(step, run)
    spent = (
        f"time_limit={run.settings.time_limit:g} s passed"
        if run.out_of_time
        else f"max_trials={run.settings.max_trials} spent"
    )
    if confirmed is None and run.settings.confirm and _failed_after(run):
        notes.append(f"{good} was not re-run after the search's last failure: {spent}")
    if confirmed is False:
        why = "the failed trials left memory in use (above)" if kept_total else "the pool is left fragmented"
        lower = f", nor did {confirmations[-1].batch_size}" if len(confirmations) > 1 else f" (no size lower: {spent})"
        notes.append(
            f"{good} ran during the search but not again after its last out-of-memory error{lower}: {why}; "
            f"start a fresh process with batch size {good}"
        )
    return answer, confirmations, confirmed, notes


def _saturation_cause(run: _Run) -> str | None:
    """How the framework searched saves memory near its limit, in its own words; the neutral words
    where no framework's figures are read; None for a framework that never does (no note then)."""
    adapter = run.adapter
    if adapter is None:
        return SATURATION_CAUSE
    return adapter.saturation_cause if adapter.rematerializes else None


def _failed_after(run: _Run) -> bool:
    """Whether a trial failed after the answer last ran."""
    ran_at = max(i for i, t in enumerate(run.trials) if t.fits and t.batch_size == run.good)
    return not all(t.fits for t in run.trials[ran_at + 1 :])


def _kept_note(run: _Run) -> str | None:
    """What the failed trials left in use, when it is worth saying (over 1% of the limit)."""
    failed = [t for t in run.trials if t.kept]
    total = sum(t.kept or 0 for t in failed)
    if not failed or run.adapter is None or (run.limit and total < 0.01 * run.limit):
        return None
    return (
        f"{format_bytes(total)} stayed in use after {len(failed)} failed trial(s) "
        f"({', '.join(f'{t.batch_size}: {format_bytes(t.kept or 0)}' for t in failed)}): "
        f"{run.adapter.kept_outputs_note}"
    )


def _rerun(step: Callable[[int], Any], run: _Run, size: int, reason: str) -> Trial:
    """One call of ``step`` after the search, released like a trial; its peak is no point of the fit."""
    t0 = _clock()
    run.calls += 1
    error, _ = _attempt(step, size, True, run.adapter, run.ranks, "re-run")
    seconds = _clock() - t0
    if run.settings.measure is not None:
        run.settings.measure()  # drop this call's peak, so no later reading sees it
    _release(run, failed=error is not None)
    agreed = _agree(run, "re-run", size, Outcome(error, seconds))
    error, seconds = agreed.error, agreed.seconds
    run.failed_calls += error is not None
    run.progress.call(size, error is None, None, seconds, reason, run.calls, run.settings.max_trials)
    return Trial(size, error is None, None, seconds, reason, error)


def _settling(run: _Run) -> contextlib.AbstractContextManager[None]:
    """Where the framework has a better moment to release the pool during the settle call
    than before it (``Backend.settle``), the context that does so."""
    if run.adapter is None:
        return contextlib.nullcontext()
    return run.adapter.settle(lambda: _release(run))


def _confirm(step: Callable[[int], Any], run: _Run) -> tuple[int, tuple[Trial, ...], bool | None]:
    """Re-run the answer when a trial failed after it ran: what fits near the limit depends
    on the pool's history (cached segments split by the failed step; a pool after an OOM),
    and the caller will run it next. If it fails, one step down by the margin; after one
    that runs, a call at ``start`` ("settle") where the framework asks for one
    (``Backend.settle_call``). Every call counts against ``max_trials``.
    Returns the answer, the re-runs, and whether one ran (None: not needed, or no call left)."""
    settings, good = run.settings, run.good
    if not settings.confirm or run.out_of_time or not _failed_after(run):
        return good, (), None
    done: list[Trial] = []
    # One step down: the smallest size still within the margin of any size below ``good``.
    for size in dict.fromkeys((good, max(1, math.ceil((1 - settings.margin) * (good - 1))))):
        if run.calls >= settings.max_trials:
            break
        done.append(_rerun(step, run, size, "confirm"))
        if done[-1].fits:
            if settings.start < size and run.calls < settings.max_trials and run.adapter and run.adapter.settle_call:
                # What the step keeps between calls (gradients set to None at the next step's
                # start) was allocated inside the answer's large segments, which it now pins:
                # one call at ``start``, with the pool released where the framework says
                # (``settle``), moves it to small ones, so the pool shrinks back to its size
                # before the search (docs/measurements.md, "batch-size search").
                with _settling(run):
                    done.append(_rerun(step, run, settings.start, "settle"))
            return size, tuple(done), True
    return good, tuple(done), (False if done else None)


@overload
def find_batch_size(
    step: Callable[[int], Any],
    *,
    start: int,
    backend: str | None = ...,
    device: int = ...,
    max_size: int | None = ...,
    margin: float = ...,
    measure: Callable[[], int | None] | None = ...,
    limit: int | str | None = ...,
    baseline: int | str | None = ...,
    max_trials: int = ...,
    return_trials: Literal[False] = ...,
    confirm: bool = ...,
    lower: Callable[[int], Any] | None = ...,
    progress: bool | None = ...,
    model: Any = ...,
    target_global_batch: int | None = ...,
    timeout: float = ...,
    collective: bool | None = ...,
    time_limit: float | None = ...,
) -> int: ...


@overload
def find_batch_size(
    step: Callable[[int], Any],
    *,
    start: int,
    backend: str | None = ...,
    device: int = ...,
    max_size: int | None = ...,
    margin: float = ...,
    measure: Callable[[], int | None] | None = ...,
    limit: int | str | None = ...,
    baseline: int | str | None = ...,
    max_trials: int = ...,
    return_trials: Literal[True],
    confirm: bool = ...,
    lower: Callable[[int], Any] | None = ...,
    progress: bool | None = ...,
    model: Any = ...,
    target_global_batch: int | None = ...,
    timeout: float = ...,
    collective: bool | None = ...,
    time_limit: float | None = ...,
) -> BatchSizeSearch: ...


@overload
def find_batch_size(
    step: None = ...,
    *,
    start: int,
    backend: str | None = ...,
    device: int = ...,
    max_size: int | None = ...,
    margin: float = ...,
    measure: Callable[[], int | None] | None = ...,
    limit: int | str | None = ...,
    baseline: int | str | None = ...,
    max_trials: int = ...,
    return_trials: bool = ...,
    confirm: bool = ...,
    lower: Callable[[int], Any] | None = ...,
    progress: bool | None = ...,
    model: Any = ...,
    target_global_batch: int | None = ...,
    timeout: float = ...,
    collective: bool | None = ...,
    time_limit: float | None = ...,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def find_batch_size(
    step: Callable[[int], Any] | None = None,
    *,
    start: int,
    backend: str | None = None,
    device: int = 0,
    max_size: int | None = None,
    margin: float = 0.05,
    measure: Callable[[], int | None] | None = None,
    limit: int | str | None = None,
    baseline: int | str | None = None,
    max_trials: int = 20,
    return_trials: bool = False,
    confirm: bool = True,
    lower: Callable[[int], Any] | None = None,
    progress: bool | None = None,
    model: Any = None,
    target_global_batch: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    collective: bool | None = None,
    time_limit: float | None = None,
) -> int | BatchSizeSearch | Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The largest batch size for which ``step(batch_size)`` runs without running out of memory.

    Afterwards the process holds no more memory than before: the failed trials' references are
    dropped and ``clear_cache`` runs. Memory figures make it fast: each trial's peak, fitted
    linearly, predicts the size that reaches ``limit``; with ``baseline``, one trial already gives
    a size that surely fits. Every call of ``step`` counts against ``max_trials``, and the search
    always ends: a failure refutes what said it would fit, and a bracket two trials did not halve
    is bisected.

    On a host without device figures (no GPU: the frameworks keep none on the CPU) and without
    ``limit=`` or ``measure=``, a size that does not fit is no error the search can catch: the
    kernel kills the process. There the search holds the sizes to the host's memory: each trial's
    peak is the process's resident peak, and the limit is what the process held at the start plus
    80% of the host's available memory (its memory cgroup's room where less; shared by the ranks
    of one host), read once at the start and said in ``notes``. A trial whose resident peak passes
    it counts as one that did not fit, and no size grows more than 8 times past the largest that
    ran. Where even the host's figures cannot be read, the search doubles from ``start`` until a
    failure and then bisects.

    JAX: each failed trial costs about 10 s and keeps the step's outputs in use for good
    (XLA; measured, held against the cap, and named in ``notes``); when failures cost far more
    than runs, the search approaches from below. A step that donates its state
    (``donate_argnums``) loses it at the first failure: search with one that does not.
    ``lower=`` (below) lets it run only sizes predicted to fit.

    Under a distributed runtime with several ranks (``torch.distributed`` initialised, or
    ``jax.distributed``), the search is a collective: call it on every rank with the same
    arguments. Each trial's outcome is agreed through the runtime's key-value store (never
    through the step's own process group): a size fits only if it fit on every rank (one
    rank's out-of-memory error is every rank's failure), peaks and times are the largest over
    ranks and limits the smallest, so every rank tries the same sizes and returns the same
    answer. The step must then make no collective of its own, or one rank's failure leaves
    the others blocked in it: run the trial's forward and backward without gradient
    synchronisation (DDP's ``no_sync()``; ``model=ddp_model`` does it for you), and no
    all-reduce of the loss. A model whose forward itself communicates (FSDP, tensor-parallel
    parameters) cannot be searched this way (``model=`` refuses it); for JAX the step must be
    process-local (no computation spanning processes). Progress lines print on rank 0 only.

    Args:
        step: Runs one training step at the given batch size and lets the framework's
            out-of-memory error propagate (any framework: see ``unimem.is_oom``); other errors
            stop the search and propagate. None (default): return a decorator:
            ``@find_batch_size(start=8)`` over ``def step(batch_size, *args)`` gives a function
            of ``*args`` that runs the search and returns its answer (also kept as ``.last_search``).
        start: The first size to try, an int of 1 or more (required); halved until one fits.
        backend: The framework whose figures are read; None (default): the one configured, else
            the one imported, else the one the first trial imports.
        device: The device index (default 0).
        max_size: Bounds the answer from above (at least ``start``); None (default): no bound.
        margin: The answer is a size that ran, at least ``(1 - margin)`` × the largest that fits
            and never above it; a share in [0, 1) (default 0.05); ``margin=0`` searches to the
            exact size.
        measure: Called after each trial that fit, returns that trial's peak bytes; None
            (default): ``stats().peak_allocated`` after ``reset_peak()``.
        limit: Bytes (or a size such as ``"20GiB"``) a trial's peak may reach. Default: the
            framework's cap from ``stats().limit``; for torch no more than its pool plus the
            device's free bytes, less the pool's own overhead. On a host without device figures,
            the host's limit (above), against the process's resident peak.
        baseline: The bytes in use before the search that every peak includes (default:
            ``stats().allocated`` before the search; None with ``measure=`` unless given).
        max_trials: The most calls of ``step`` (default 20), counting every one: the trials and
            ``confirm``'s re-runs. When they run out, the answer is the largest size that ran.
        return_trials: True returns a ``BatchSizeSearch`` with every trial (size, fit or not,
            peak, seconds, why it was tried) instead of the int.
        confirm: Near the limit what fits depends on the pool's history: a size that ran may fail
            after a later trial's out-of-memory error (torch's split cached segments; JAX's pool
            after an OOM, which then fits about half as much: docs/measurements.md). With True
            (default) the answer is re-run once after the search when a trial failed after it
            ran; if that fails, one size lower by ``margin`` is tried and returned if it runs
            (then, for torch, one call at ``start`` lets go of the large blocks the step's kept
            state sat in); if neither runs, the answer is returned with ``confirmed=False``.
            These calls count against ``max_trials``, which keeps one for them once a trial failed.
        lower: ``lower(n)`` returns the step lowered for batch size ``n`` without running it, so
            the framework can predict its peak (``Backend.predict_peak``) and its largest single
            buffer, or that peak in bytes as an int, or the pair ``(peak, largest buffer)`` in
            bytes (any framework). None (default): no prediction (torch and TensorFlow have
            none to give: their search starts from a small real trial). See "What ``lower=``
            takes" below.
        progress: A line per call of ``step`` (and per compilation) on stderr: size, fit or
            out of memory, peak, seconds. None (default): when stderr is a terminal. Over ranks,
            rank 0 alone prints (the outcome agreed by all).
        model: The module ``step`` trains, for a search over ranks: each trial runs inside the
            context its framework gives so that it makes no collective (torch: every
            ``DistributedDataParallel`` in it under ``no_sync()``, with buffer broadcasting off).
            A model that communicates inside its forward (FSDP, ``DTensor`` parameters) is a
            ``ConfigError``. None (default): the step itself makes no collective.
        target_global_batch: Samples per optimizer step over all ranks. The result's ``plan``
            (``return_trials=True``; the int alone otherwise) is then
            ``plan_accumulation(target_global_batch, answer, world_size)``: the micro-batches
            each rank runs and accumulates. No size above ``ceil(target / world_size)`` is tried
            (no micro-batch would be larger), so the answer is at most that. An int of at least
            the world size; None (default): no plan.
        timeout: Seconds each rank waits for the others at each agreement, from its own
            arrival (default 600): a rank that does not answer by then is named in a
            ``ClusterError`` on the ranks that did. Raise it when one trial can take longer.
        collective: None (default): agree over ranks whenever a distributed runtime with
            several ranks is initialised (with a warning when a launcher started several
            but none is: each rank then searches alone). True: a ``ClusterError`` unless such a
            runtime is initialised. False: this process searches alone (one rank searching
            for all of them, say).
        time_limit: Seconds the whole search may take (a bound of its own: ``timeout`` is only
            how long ranks wait for each other). Checked after each call of the step, never
            inside one: once it has passed, no further call starts (nor ``confirm``'s re-run),
            and the answer is the largest size that ran, with ``converged=False``,
            ``time_limit_passed=True``, a note and a warning saying so. A call under way runs
            to its end, so the search can pass the bound by one call (and, with ``lower=``, the
            compilations placing it). Over ranks the longest any rank has searched counts, so
            every rank stops after the same call. None (default): no bound.

    Returns:
        The answer (``int``), the same on every rank; a ``BatchSizeSearch`` with
        ``return_trials=True`` (with ``plan`` under ``target_global_batch=``); a decorator
        without ``step``.

    Raises:
        ConfigError: Bad arguments, before any trial runs (``exc.parameter`` names it); also
            ``limit=`` without any figure to hold it against (no framework, no ``measure=``), and
            several frameworks in use with ``backend=None``: pass ``backend=``.
        OutOfMemory: Even batch size 1 does not fit (``exc.report`` explains it), or no size fit
            in ``max_trials`` trials (or before ``time_limit`` passed): start lower or raise them.
        Exception: The step's own error (not out of memory), re-raised as it came, with the
            batch size it was raised at as ``exc.unimem_batch_size`` and in a note
            (``exc.__notes__``, printed with the traceback on Python 3.11+).
        ClusterError: Over ranks: a rank did not answer within ``timeout`` (the message names
            it), another rank's step raised an error that is not out of memory (every rank
            stops at once, naming it), or the ranks are not at the same point of the search.
            Ranks that passed different arguments get a ``ConfigError`` naming the parameter.
        KeyboardInterrupt: Ctrl-C during the search, re-raised with the largest size that ran so
            far as ``exc.unimem_best_size`` (None when none ran) and, on Python 3.11+, a note
            saying so.

    Warns:
        UnimemWarning: ``max_trials`` ran out, or ``time_limit`` passed, before the answer was
            within ``margin``; or the answer did not run again (``confirmed=False``): start a
            fresh process with it.

    Example:
        ```python
        size = unimem.find_batch_size(lambda n: train_step(make_batch(n)), start=8, backend="torch")

        # On every rank of a DDP job: the same answer everywhere, and the accumulation to 1024.
        def trial(n):
            ddp(make_batch(n)).sum().backward()  # runs under ddp.no_sync(): model=ddp
            ddp.zero_grad(set_to_none=True)

        found = unimem.find_batch_size(trial, start=8, model=ddp, target_global_batch=1024, return_trials=True)
        for micro in found.plan.sizes(rank): ...
        ```

    What ``lower=`` takes: a callable of the batch size returning what the framework compiles
    and sizes without running it. For JAX, the jitted step lowered with the arguments it is
    called with, the batch given as shapes so that nothing is allocated, e.g.
    ``lambda n: train.lower(params, opt_state, jax.ShapeDtypeStruct((n, 1024), jnp.float32))``
    where ``step(n)`` calls ``train(params, opt_state, batch_of(n))`` (a ``jax.stages.Traced``,
    ``Lowered`` or ``Compiled`` all do). The peak is XLA's ``memory_analysis()``: its
    ``peak_memory_in_bytes`` on a GPU, arguments + outputs + temporaries - aliased on the CPU,
    where XLA's own field leaves the temporaries out; its largest buffer is the temporaries (one
    buffer) or the largest argument or output. The step runs the executable the prediction
    compiled (JAX caches it), so a size run costs no second compilation, provided the batch's
    shapes are given without a sharding, as above. Each size is compiled once, at most
    ``2 × max_trials`` of them (``compile_calls``); a lowering that runs out of memory means the
    size does not fit; one the framework cannot size is a ``ConfigError`` naming ``lower``
    before any call of ``step``. With ``lower=``, ``limit=`` needs no other figure; on a
    host without device figures and without ``limit=``, the predictions are held against the
    host's limit (above), beside the process's resident peaks. The predictions are held
    against the measured peaks where there are some, and set aside (with a note) when the runs
    contradict them.
    """
    settings = _check(
        start,
        backend,
        device,
        max_size,
        margin,
        measure,
        limit,
        baseline,
        max_trials,
        return_trials,
        confirm,
        lower,
        progress,
        model,
        target_global_batch,
        timeout,
        collective,
        time_limit,
    )
    if step is None:
        return _decorator(settings)
    if not callable(step):
        raise ConfigError("step", f"expected a callable step(batch_size), got {step!r}")
    result = _search(step, settings)
    return result if settings.return_trials else result.batch_size


def _decorator(settings: _Settings) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    import functools

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(function):
            raise ConfigError("step", f"expected a callable step(batch_size, ...), got {function!r}")

        @functools.wraps(function)
        def search(*args: Any, **kwargs: Any) -> int | BatchSizeSearch:
            result = _search(lambda size: function(size, *args, **kwargs), settings)
            search.last_search = result  # type: ignore[attr-defined]
            return result if settings.return_trials else result.batch_size

        search.last_search = None  # type: ignore[attr-defined]
        return search

    return decorate
