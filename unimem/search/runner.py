"""The batch search's trial runner: open the search (``opening``), run, release and record each
trial (the one writer of ``Run.calls``), ask the policy for the next size, and conclude (re-running
the answer where a later failure may have changed what fits)."""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

from unimem.diagnose.guard import find_oom
from unimem.errors import ConfigError, OutOfMemory, SearchError, UnimemWarning
from unimem.search.agreement import agree
from unimem.search.attempt import attempt, tell_ranks
from unimem.search.findings import REMATERIALIZED, bracket, figures_known, record
from unimem.search.findings import slower as ran_slower
from unimem.search.framework import trial_context
from unimem.search.leak import Reading, growth, leak_text
from unimem.search.limit import bytes_of, passed
from unimem.search.opening import open_run
from unimem.search.policy import call_budget, choose, is_converged
from unimem.search.predicted import STEADY, confirming, opening
from unimem.search.predictions import (
    first_size,
    fresh_note,
    make_room,
    placed_first,
    predicted_peak,
    prediction_notes,
)
from unimem.search.progress import interrupted
from unimem.search.ranks import Outcome, connect
from unimem.search.result import BatchSizeSearch, Trial
from unimem.search.rules import flat_past, saturation_note
from unimem.search.settings import Settings, aimed
from unimem.search.state import Run, grows_in_regions, read_kept, read_peak, release, take_snapshot, upper_bound
from unimem.sizes import format_bytes
from unimem.training.accumulation import plan_accumulation

__all__ = ["clock", "run_search"]

# The clock every trial is timed with (the simulated searches in the tests advance their own).
clock = time.perf_counter


def _call(step: Callable[[int], Any], run: Run, size: int, kind: str) -> tuple[Outcome, BaseException | None]:
    """One real call of ``step``: the bytes in use read and the peak restarted before it, the peak
    read after it and held to the limit, released (outside the except block: the frames are gone),
    and agreed over ranks. Returns the outcome and, for a final report, the out-of-memory error."""
    calls = run.calls
    in_use = run.framework.restart_peak() if run.settings.measure is None else None
    if run.start.host_peaks is not None:
        run.start.host_peaks.begin()
    t0 = clock()
    calls.made += 1
    # Sized as it runs: a measured call (no lower=) whose peak the framework's own figures read.
    sized = in_use is not None and run.start.host_peaks is None and run.scale is None
    with run.framework.compiled_call() if sized else contextlib.nullcontext(None) as compiled:
        error, oom = attempt(step, size, run.findings.bad is not None, run.framework, run.ranks, kind)
    seconds = clock() - t0
    peak, peak_reserved, overhead = _read_peak(run, size, kind) if error is None else (None, None, None)
    if compiled:
        calls.compiled[size] = max(compiled)._replace(refused=any(program.refused for program in compiled))
    peak, slower = _as_compiled(run, size, in_use, peak) if error is None else (peak, False)
    if slower:
        error = f"{REMATERIALIZED} at batch size {size}: it recomputes to fit, and runs slower"
    if kind == "trial" or run.settings.measure is not None:  # a re-run's own figures: not held, read only
        error = error or passed(run.limit, peak, run.start.measured_by)
    release(run, failed=error is not None)
    kept = read_kept(run, in_use) if error is not None and not slower else None
    outcome = Outcome(error, seconds, peak, peak_reserved, kept, overhead, in_use)
    agreed, longest = agree(run.ranks, kind, size, outcome, clock() - run.began)
    if longest is not None:
        calls.elapsed = longest
    calls.failed += agreed.error is not None and not slower
    # The host's resident figures count the process's own growth (compiled programs, pages the allocator
    # keeps): no reading of a leak. The framework's and measure='s count the step's.
    read = agreed.peak if run.start.host is None else None
    calls.readings.append(Reading(size, agreed.error is None, agreed.in_use, read, calls.kept_seen))
    calls.kept_seen += agreed.kept or 0
    return agreed, oom


def _as_compiled(run: Run, size: int, in_use: int | None, peak: int | None) -> tuple[int | None, bool]:
    """What the largest program a call of ``size`` compiled elsewhere says of a call that ran: its peak,
    where the framework read none (the program's peak counts its arguments, of which those in use
    before the call are in ``in_use`` too), and whether the compiler rematerialized it (it ran slower
    than the size's own program: past the answer, as with lower=)."""
    program = run.calls.compiled.get(size)
    if program is None:
        return peak, False
    if peak is None and in_use is not None:
        peak = program.peak + max(0, in_use - program.arguments)
    return peak, program.rematerialized


def _trial(step: Callable[[int], Any], run: Run, size: int, reason: str) -> None:
    """One call of ``step`` that the search places the next size from, recorded. Once calls were sized as
    they ran (``Calls.compiled``), a measured call in a pool grown in regions gets one region of all the
    room first: a call that grew a region of its own would hold every later one to it, and the peaks it
    hides are read from the compiled programs."""
    predicted = predicted_peak(run, size)
    make_room(run, predicted)
    if predicted is None and run.calls.compiled and grows_in_regions(run):
        run.framework.make_room()
    kept_before = run.findings.kept_total
    agreed, run.calls.last_oom = _call(step, run, size, "trial")
    fits, peak = agreed.error is None, agreed.peak
    trial = Trial(size, fits, peak, agreed.seconds, reason, agreed.error, agreed.peak_reserved, agreed.kept, predicted)
    run.progress.call(size, fits, peak, agreed.seconds, reason, run.calls.made, run.settings.max_trials)
    if run.scale is not None:
        run.scale.ran(size, fits, kept_before, peak)
    _need_peak(run, size, fits, peak)
    record(run.findings, trial, kept_before, agreed.overhead, run.framework.keeps_failed_outputs, run.start.baseline)
    bracket(run.findings, upper_bound(run))


def _need_peak(run: Run, size: int, fits: bool, peak: int | None) -> None:
    """``limit=`` needs each trial's peak: a trial that ran and read none, with nothing else known of
    the peaks (no earlier one, no bound from the process's peak, no predicted peaks), is a ``ConfigError``."""
    if not fits or peak is not None or run.settings.limit is None:
        return
    if figures_known(run.findings) or run.scale is not None:  # predicted peaks count as figures
        return
    raise ConfigError(
        "limit",
        f"a limit needs each trial's peak memory, and {run.start.measured_by} gave none for batch size {size}; "
        "pass measure= as well (a callable returning the last trial's peak bytes), or drop limit=",
    )


def _read_peak(run: Run, size: int, kind: str = "trial") -> tuple[int | None, int | None, int | None]:
    """``read_peak``; over ranks, a bad ``measure()`` is posted to the others before it propagates."""
    try:
        return read_peak(run)
    except ConfigError as exc:
        tell_ranks(run.ranks, kind, size, exc)
        raise


def _nothing_fits(run: Run) -> OutOfMemory:
    """The error when batch size 1 failed, with the report of its out-of-memory error (on a rank
    where it ran, naming the ranks where it did not)."""
    if run.calls.last_oom is None:
        where = " on every rank" if run.ranks is not None else ""
        return OutOfMemory(f"even batch size 1 does not fit{where}: {run.findings.trials[-1].error}", None)
    oom = find_oom(run.calls.last_oom) or run.calls.last_oom
    from unimem.diagnose.report import build_report

    report = build_report(oom, backend=run.framework.name, device=run.device, batch_size=1)
    return OutOfMemory(f"even batch size 1 does not fit.\n{report}", report)


def _quiet(step: Callable[[int], Any], model: Any) -> Callable[[int], Any]:
    """``step`` run inside the context the model's framework gives each trial (``framework.trial_context``),
    in which the model makes no collective of its own."""
    enter = trial_context(model)
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


def run_search(step: Callable[[int], Any], settings: Settings) -> BatchSizeSearch:
    began, original = time.perf_counter(), step
    if settings.model is not None:
        step = _quiet(step, settings.model)
    over = connect(settings.collective, settings.timeout)
    run = open_run(aimed(settings, over), original, over, clock())
    try:
        first = first_size(run)
        size, reason = placed_first(run, first) or opening(run, first)
        while True:
            _trial(step, run, size, reason)
            again = confirming(run)  # sized from the predictions: the size to run again to confirm them
            if run.findings.good == 0 and run.findings.bad == 1:
                raise _nothing_fits(run) from run.calls.last_oom
            converged = again is None and is_converged(run)
            if converged or run.calls.made >= call_budget(run) or _out_of_time(run):
                break
            if again is not None:
                size, reason = again, STEADY
                continue
            size, reason = choose(run)
            converged = is_converged(run)  # the sizes compiled to place it may bound the answer
            if converged:
                break
            _refuse_flat(run, size)
        return _finish(step, run, converged, began)
    except KeyboardInterrupt as exc:
        interrupted(exc, run.findings.good or None, run.calls.made)
        raise


def _refuse_flat(run: Run, size: int) -> None:
    """A ``SearchError`` before a size that cannot fit at a byte a sample while the peaks grew less
    than that (``rules.flat_past``): they do not see the step's memory, and a size placed on them
    would grow until the calls ran out, far past what anything can allocate."""
    limit, found = bytes_of(run.limit), run.findings
    flat = flat_past(found.points + found.bounded, limit, size)
    if flat is None or limit is None:
        return
    (n1, p1), (n2, p2) = flat
    raise SearchError(
        f"find_batch_size: the peaks did not grow with the batch size: from {n1} to {n2} they rose "
        f"{format_bytes(max(0, p2 - p1))} ({run.start.measured_by}), less than a byte a sample, and the next size, "
        f"{size}, could not fit under the limit {format_bytes(limit)} even at a byte a sample ({len(found.trials)} "
        f"trials, {found.trials[0].batch_size} to {n2}). The figures read do not see the step's memory, or it does "
        "not depend on the batch size: pass measure= returning the step's peak bytes (with limit=), or max_size= "
        "to bound the answer"
    )


def _out_of_time(run: Run) -> bool:
    """Whether ``time_limit=`` has passed (over ranks: on any rank, as of the last trial's agreement,
    so that every rank stops after the same trial)."""
    bound = run.settings.time_limit
    if bound is None:
        return False
    elapsed = run.calls.elapsed if run.ranks is not None and run.calls.elapsed is not None else clock() - run.began
    run.calls.out_of_time = elapsed >= bound
    return run.calls.out_of_time


def _finish(step: Callable[[int], Any], run: Run, converged: bool, began: float) -> BatchSizeSearch:
    """After the last trial: the answer confirmed or not, the notes, memory given back."""
    settings, found = run.settings, run.findings
    if found.good == 0:
        before = f" before time_limit={settings.time_limit:g} s passed" if run.calls.out_of_time else ""
        raise OutOfMemory(
            f"no batch size fit in {len(found.trials)} trials{before} (smallest tried: "
            f"{min(t.batch_size for t in found.trials)}); start lower, or raise "
            + ("time_limit" if run.calls.out_of_time else "max_trials"),
            None,
        )
    # stacklevel 4: _finish, run_search, find_batch_size (or the decorated function), the caller.
    spent = (
        f"time_limit={settings.time_limit:g} s passed after {run.calls.made} call(s) of the step"
        if run.calls.out_of_time
        else f"max_trials={settings.max_trials} calls of the step ran out"
    ) + (f" before the answer was within margin={settings.margin}; returning {found.good}, the largest size that ran")
    if not converged:
        warnings.warn(f"find_batch_size: {spent}", UnimemWarning, stacklevel=4)
    answer, confirmations, confirmed, notes, warning = _conclude(step, run)
    if warning is not None:
        warnings.warn(f"find_batch_size: {warning}", UnimemWarning, stacklevel=4)
    release(run, final=True)
    after = take_snapshot(run)
    if run.limit is None and settings.measure is None and run.scale is None:
        notes.append("no memory limit known: searched by doubling and bisection, without a model")
    notes += prediction_notes(run) + _slower_note(run)
    fresh = fresh_note(run, answer)
    notes += [] if fresh is None else [fresh]
    notes += run.framework.search_notes()
    if run.start.host is not None:
        notes.append(run.start.host.note(settings.limit))
    if not converged:
        notes.insert(0, spent)
    scale = run.scale
    world = 1 if run.ranks is None else run.ranks.world_size
    target = settings.target_global_batch
    return BatchSizeSearch(
        batch_size=answer,
        trials=tuple(run.findings.trials),
        smallest_failure=run.findings.bad,
        converged=converged,
        margin=settings.margin,
        limit=bytes_of(run.limit),
        model=run.findings.line,
        baseline=run.start.baseline,
        measured_by=run.start.measured_by,
        seconds=time.perf_counter() - began,
        before=run.start.before,
        after=after,
        notes=tuple(notes),
        confirmations=confirmations,
        confirmed=confirmed,
        step_calls=run.calls.made,
        failed_calls=run.calls.failed,
        compile_calls=0 if scale is None else scale.compiles,
        predictions=() if scale is None else tuple(sorted(scale.memo.items())),
        world_size=world,
        plan=None if target is None else plan_accumulation(target, answer, world),
        time_limit_passed=run.calls.out_of_time,
    )


def _slower_note(run: Run) -> list[str]:
    """Where a measured call's compiled program was rematerialized: the smallest such size (none: no note)."""
    slower = sorted(t.batch_size for t in run.findings.trials if ran_slower(t))
    if not slower:
        return []
    return [
        f"the compiler rematerialized the step at batch size {slower[0]} (it recomputes to fit, and runs slower): "
        "the answer lies below it"
    ]


def _conclude(
    step: Callable[[int], Any], run: Run
) -> tuple[int, tuple[Trial, ...], bool | None, list[str], str | None]:
    """After the search: the answer re-run or not (see ``_confirm``), the notes on what the peaks
    and the failed trials showed, and the one of them to warn with (None: none)."""
    good, limit, kept_total = run.findings.good, bytes_of(run.limit), run.findings.kept_total
    cause = _saturation_cause(run)
    saturated = None if cause is None else saturation_note(run.findings.points, limit, good, cause)
    notes = [note for note in (saturated, _kept_note(run)) if note]
    ran = max((t for t in run.findings.trials if t.fits and t.batch_size == good), key=lambda t: t.peak or 0)
    if run.settings.confirm and limit is not None and kept_total and ran.peak and ran.peak + kept_total > limit:
        # Its peak no longer fits beside what the failed trials kept: re-running it (and one
        # size lower) would fail again, each failure costing seconds and maybe more memory.
        notes.append(
            f"{good} ran during the search (peak {format_bytes(ran.peak)}) but cannot run again in this process "
            f"beside the {format_bytes(kept_total)} the failed trials left in use (limit {format_bytes(limit)}); "
            f"start a fresh process with batch size {good}"
        )
        return good, (), False, notes, notes[-1]
    answer, confirmations, confirmed = _confirm(step, run)
    said = _rechecked(run, answer, confirmations, confirmed)
    notes += [] if said is None else [said]
    return answer, confirmations, confirmed, notes, said if said is not None and confirmed is not None else None


def _rechecked(run: Run, answer: int, confirmations: tuple[Trial, ...], confirmed: bool | None) -> str | None:
    """What the re-runs of the answer say: that none was left for it, that the step leaks (a
    ``SearchError`` where no size ran again), or why the answer did not run again; None: it ran."""
    good = run.findings.good
    spent = (
        f"time_limit={run.settings.time_limit:g} s passed"
        if run.calls.out_of_time
        else f"max_trials={run.settings.max_trials} spent"
    )
    if confirmed is None:
        unchecked = run.settings.confirm and _failed_after(run)
        return f"{good} was not re-run after the search's last failure: {spent}" if unchecked else None
    leaked = _leaked(run, confirmations)
    if leaked is not None:
        text = leak_text(good, leaked, run.start.measured_by)
        if confirmed is not True:
            raise SearchError(f"find_batch_size: {text} (no size ran again: {_sizes(confirmations)})")
        return f"{text}; {answer} ran again, one size lower, but fits less with every call"
    if confirmed is True:
        return None
    why = "the failed trials left memory in use (above)" if run.findings.kept_total else _why_not_again(run)
    lower = f", nor did {confirmations[-1].batch_size}" if len(confirmations) > 1 else f" (no size lower: {spent})"
    return (
        f"{good} ran during the search but not again after its last out-of-memory error{lower}: {why}; "
        f"start a fresh process with batch size {good}"
    )


def _sizes(trials: tuple[Trial, ...]) -> str:
    return ", ".join(f"{t.batch_size} {'fits' if t.fits else 'failed'}" for t in trials)


def _leaked(run: Run, confirmations: tuple[Trial, ...]) -> int | None:
    """The bytes the step held more when the answer failed its re-check than when it ran in the
    search (``leak.growth``); None when the re-check ran, or no growth past the noise was read."""
    readings, trials = run.calls.readings, len(run.findings.trials)
    if not confirmations or confirmations[0].fits or len(readings) <= trials:
        return None
    again = readings[trials]  # the re-check's: the readings of the re-runs follow the trials'
    ran = [r for r in readings[:trials] if r.size == again.size and r.fits]
    return None if not ran else growth(ran[-1], again, bytes_of(run.limit))


def _why_not_again(run: Run) -> str:
    """Why the answer did not run again, as far as the readings say: with the bytes in use read before
    each call (and no growth, or ``_leaked`` had found it), what fits changed with the failed trials."""
    if any(r.in_use is not None for r in run.calls.readings[len(run.findings.trials) :]):
        return "the memory in use before it had not grown enough to explain that (no leak)"
    return "what fits changed after the failed trials (no figure of the step's memory in use was read)"


def _saturation_cause(run: Run) -> str | None:
    """How the framework searched saves memory near its limit, in its own words; the neutral words
    where no framework's figures are read; None for a framework that never does (no note then)."""
    return run.framework.saturation_cause


def _failed_after(run: Run) -> bool:
    """Whether a trial failed after the answer last ran."""
    ran_at = max(i for i, t in enumerate(run.findings.trials) if t.fits and t.batch_size == run.findings.good)
    later = run.findings.trials[ran_at + 1 :]
    return not all(t.fits or _changed_nothing(run, t) for t in later)


def _changed_nothing(run: Run, trial: Trial) -> bool:
    """Whether a trial that did not fit changed nothing of what fits: its rematerialized program ran, or
    its program was refused before it ran (``CompiledProgram.refused``)."""
    program = run.calls.compiled.get(trial.batch_size)
    return ran_slower(trial) or (program is not None and program.refused)


def _kept_note(run: Run) -> str | None:
    """What the failed trials left in use, when it is worth saying (over 1% of the limit)."""
    failed = [t for t in run.findings.trials if t.kept]
    total = sum(t.kept or 0 for t in failed)
    note = run.framework.kept_outputs_note
    if not failed or note is None or (run.limit and total < 0.01 * run.limit.bytes):
        return None
    return (
        f"{format_bytes(total)} stayed in use after {len(failed)} failed trial(s) "
        f"({', '.join(f'{t.batch_size}: {format_bytes(t.kept or 0)}' for t in failed)}): "
        f"{note}"
    )


def _rerun(step: Callable[[int], Any], run: Run, size: int, reason: str) -> Trial:
    """One call of ``step`` after the search, measured and released like a trial; its peak is no point of the fit."""
    agreed, _ = _call(step, run, size, "re-run")
    fits = agreed.error is None
    run.progress.call(size, fits, agreed.peak, agreed.seconds, reason, run.calls.made, run.settings.max_trials)
    return Trial(size, fits, agreed.peak, agreed.seconds, reason, agreed.error)


def _settling(run: Run) -> contextlib.AbstractContextManager[None]:
    """Where the framework has a better moment to release the pool during the settle call
    than before it (``Framework.settling``), the context that does so."""
    return run.framework.settling(lambda: release(run))


def _confirm(step: Callable[[int], Any], run: Run) -> tuple[int, tuple[Trial, ...], bool | None]:
    """Re-run the answer when a trial failed after it ran: what fits near the limit depends
    on the pool's history (cached segments split by the failed step; a pool after an OOM),
    and the caller will run it next. If it fails, one step down by the margin; after one
    that runs, a call at ``start`` ("settle") where the framework asks for one
    (``Framework.settle_call``). Every call counts against ``max_trials``.
    Returns the answer, the re-runs, and whether one ran (None: not needed, or no call left)."""
    settings, good = run.settings, run.findings.good
    if not settings.confirm or run.calls.out_of_time or not _failed_after(run):
        return good, (), None
    done: list[Trial] = []
    # One step down: the smallest size still within the margin of any size below ``good``.
    for size in dict.fromkeys((good, max(1, math.ceil((1 - settings.margin) * (good - 1))))):
        if run.calls.made >= settings.max_trials:
            break
        done.append(_rerun(step, run, size, "confirm"))
        if done[-1].fits:
            if settings.start < size and run.calls.made < settings.max_trials and run.framework.settle_call:
                # What the step keeps between calls (gradients set to None at the next step's
                # start) was allocated inside the answer's large segments, which it now pins:
                # one call at ``start``, with the pool released where the framework says
                # (``settle``), moves it to small ones, so the pool shrinks back to its size
                # before the search (docs/measurements.md, "batch-size search").
                with _settling(run):
                    done.append(_rerun(step, run, settings.start, "settle"))
            return size, tuple(done), True
    return good, tuple(done), (False if done else None)
