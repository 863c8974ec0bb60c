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
   estimate the same way. Without memory figures (no ``measure=`` and the framework
   keeps none, as on the CPU) this becomes doubling until the first failure, then
   bisection.
5. Near the answer, try the smallest size whose failure would prove the largest size
   that ran is within ``margin`` of the largest that fits; stop once it is (one below
   the smallest failure, or ``max_size``).
6. If a trial failed after the answer ran, re-run the answer (``confirm``): near the cap
   what fits depends on the pool's history.

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, overload

from . import api, registry
from .errors import ConfigError, OutOfMemory, UnimemWarning
from .oom import _message, clear_frames, find_oom
from .search_math import fit, knee, next_size, plateau_ratio, predict, safe_size, saturation_note
from .search_math import fit_linear as fit_linear  # re-exported: the fit's public helper
from .sizes import format_bytes, parse_size
from .memory_stats import MemoryStats

if TYPE_CHECKING:
    from unimem.backends.base import Backend

__all__ = ["BatchSizeSearch", "Trial", "find_batch_size"]

# The fit uses the peak bytes in use (smooth in the batch size). torch's cap bounds the
# bytes its caching allocator reserves, which at small batches move in 2 and 20 MiB
# segments: the prediction holds the peak in use against the cap less the pool's
# overhead (peak reserved - peak in use) seen at the largest trial that fit.
_PEAK_FIELD = "peak_allocated"


@dataclass(frozen=True)
class Trial:
    """One real call of ``step``."""

    batch_size: int
    fits: bool
    peak: int | None  # bytes the trial used at its peak; None when unknown
    seconds: float
    reason: str  # start, grow, halve, safe-jump, predict, predict-far, close, saturated, bisect, upper-bound;
    # confirm, settle (after the search)
    error: str | None = None  # the out-of-memory message's first line when it did not fit
    peak_reserved: int | None = None  # torch: the pool's peak in the same trial
    # After a failure: bytes still in use once it was released, above those in use before
    # it (JAX: XLA does not free a failed execution's output buffers). None: not read.
    kept: int | None = None


@dataclass(frozen=True)
class BatchSizeSearch:
    """The outcome of ``find_batch_size(..., return_trials=True)``.

    ``batch_size`` is the answer: the largest size that ran. ``smallest_failure`` is the
    smallest that did not (None if none failed). ``converged`` says the answer is
    within ``margin`` of the largest that fits (or is ``max_size``); False when
    ``max_trials`` ran out first. ``model`` is the last fit ``(a, b)`` of
    ``bytes = a + b × batch``, ``limit`` the bytes it was held against, ``measured_by``
    where the peaks came from. ``before``/``after``: ``stats()`` around the search.
    ``confirmations``: the answer re-run after the search's last failure (``confirm=True``),
    and ``confirmed`` whether it ran then (None when nothing failed after it ran).
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

    def __int__(self) -> int:
        return self.batch_size

    def as_dict(self) -> dict[str, Any]:
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
        }

    def __str__(self) -> str:
        lines = [
            f"batch size {self.batch_size} in {len(self.trials)} trials ({self.seconds:.2f} s); "
            + (f"smallest failure {self.smallest_failure}" if self.smallest_failure else "no failure")
            + ("" if self.converged else "; NOT converged (max_trials ran out)")
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
            peak += f", {format_bytes(t.kept)} left in use" if t.kept else ""
            lines.append(
                f"  {t.batch_size:>8}  {'fits' if t.fits else 'OOM ':<4}  {t.reason:<11} {t.seconds:.3f} s{peak}"
            )
        for t in self.confirmations:
            lines.append(f"  {t.batch_size:>8}  {'fits' if t.fits else 'OOM ':<4}  {t.reason:<11} {t.seconds:.3f} s")
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
    assert isinstance(device, int) and isinstance(max_trials, int)
    assert max_size is None or isinstance(max_size, int)
    checked_measure: Callable[[], int | None] | None = measure
    return _Settings(
        start, name, device, max_size, float(margin), checked_measure, size, base, max_trials, return_trials, confirm
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
    """Bytes the measured peak may reach, as the framework reads its snapshot (its cap by default)."""
    if snapshot is None or run.adapter is None:
        return None
    return run.adapter.search_capacity(snapshot)


def _measured_by(run: _Run) -> str:
    if run.settings.measure is not None:
        return "measure="
    if run.backend is not None:
        return f"stats({run.backend!r}).{_PEAK_FIELD}"
    return "nothing (no framework in use, no measure=)"


def _open(settings: _Settings) -> _Run:
    """The search's state before its first trial: the framework, the limit, the baseline."""
    run = _Run(settings)
    run.use(_framework(settings))
    if settings.limit is not None and settings.measure is None and run.backend is None:
        raise ConfigError(
            "limit",
            "a limit needs each trial's peak memory, and no framework is in use to report it; "
            "pass measure= (a callable returning the last trial's peak bytes) or backend=",
        )
    if run.backend is not None:
        _release(run)
    run.before = _snapshot(run)
    run.limit = settings.limit if settings.limit is not None else _capacity(run, run.before)
    run.measured_by = _measured_by(run)
    # The baseline turns one measured trial into a size that surely fits (see safe_size).
    run.baseline = settings.baseline
    if run.baseline is None and settings.measure is None and run.before is not None:
        run.baseline = run.before.allocated
    if run.before is not None and settings.measure is None:
        run.running_peak = run.before.peak_allocated
    return run


def _adopt(run: _Run) -> None:
    """After the first trial, which may have imported the framework: read its figures from now on."""
    run.use(_framework(run.settings))
    if run.backend is not None and run.settings.measure is None:
        run.measured_by = _measured_by(run)
        run.limit = run.settings.limit if run.settings.limit is not None else _capacity(run, _snapshot(run))


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


def _attempt(
    step: Callable[[int], Any], size: int, after_oom: bool, adapter: Backend | None
) -> tuple[str | None, BaseException | None]:
    """Run ``step(size)``. Returns ``(None, None)`` when it fit; on an out-of-memory
    error, its first line and, for a final report only, the error with its frames cleared.
    ``after_oom``: an earlier trial failed, so a step that donates its state has lost it."""
    try:
        step(size)
    except Exception as exc:
        oom = find_oom(exc)
        if oom is None:
            note = _step_error_note(adapter, exc, after_oom)
            if note is not None and hasattr(exc, "add_note"):
                exc.add_note(note)  # the framework's own message may name no cause
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


def _read_peak(run: _Run, size: int) -> tuple[int | None, int | None]:
    """The peak (and the pool's peak) of the trial that just fit; notes the pool's overhead."""
    if run.settings.measure is not None:
        value = run.settings.measure()
        return (None if value is None else int(value)), None
    if run.backend is None or run.adapter is None:
        return None, None
    figures = api.stats(run.backend, run.device, nvml=False)
    peak, peak_reserved = figures.peak_allocated, figures.peak_reserved
    if peak is not None and peak_reserved is not None and size > run.good:
        run.overhead = run.adapter.pool_overhead(peak, peak_reserved)
    return peak, peak_reserved


def _kept(run: _Run, in_use: int | None) -> int | None:
    """Bytes still in use after a failed trial was released, above those in use before it."""
    if in_use is None or run.adapter is None:
        return None
    now = api.stats(run.backend, run.device, nvml=False).allocated
    kept = None if now is None else max(0, now - in_use)
    if run.adapter.failed_step_keeps_outputs:
        # Lost for good. Elsewhere what stays is the step's own state (gradients a failed
        # backward set), which the next step reuses.
        run.kept_total += kept or 0
    return kept


def _record(run: _Run, size: int, fits: bool, peak: int | None) -> None:
    """Update the bounds, the points and the process's running peak with a trial's outcome."""
    if fits and peak is None and run.running_peak is not None:
        run.bounded.append((size, run.running_peak))
    if not fits:
        run.running_peak = None
    elif peak is not None and run.running_peak is not None:
        run.running_peak = max(run.running_peak, peak)
    if fits and peak is None and run.settings.limit is not None and not run.points and not run.bounded:
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


def _trial(step: Callable[[int], Any], run: _Run, size: int, reason: str) -> None:
    """One real call of ``step``, measured, released and recorded."""
    in_use = None
    if run.settings.measure is None and run.backend is not None:
        api.reset_peak(run.backend, run.device)
        in_use = api.stats(run.backend, run.device, nvml=False).allocated
    t0 = time.perf_counter()
    error, run.last_oom = _attempt(step, size, run.bad is not None, run.adapter)
    seconds = time.perf_counter() - t0
    peak, peak_reserved = _read_peak(run, size) if error is None else (None, None)
    _release(run, failed=error is not None)  # outside the except block: the frames are gone
    kept = _kept(run, in_use) if error is not None else None
    run.trials.append(Trial(size, error is None, peak, seconds, reason, error, peak_reserved, kept))
    if run.backend is None and run.settings.backend is None and len(run.trials) == 1:
        _adopt(run)
    _record(run, size, error is None, peak)


# --- the search ----------------------------------------------------------------------------------


def _converged(run: _Run) -> bool:
    """Whether the largest size that ran is within the margin of the largest that can fit."""
    bounds = [x for x in (None if run.bad is None else run.bad - 1, run.settings.max_size) if x is not None]
    high = min(bounds) if bounds else None
    return bool(run.good) and high is not None and run.good >= (1 - run.settings.margin) * high


def _choose(run: _Run, convex: bool) -> tuple[int, str]:
    """The next size to try, and why (see ``search_math.next_size``)."""
    if run.good == 0:
        assert run.bad is not None
        return max(1, run.bad // 2), "halve"
    # What failed trials kept for good is lost to every later trial (peaks measured after
    # it include it too: both err on the safe side).
    usable = None if run.limit is None else run.limit - run.overhead - run.kept_total
    last = run.trials[-1]
    return next_size(
        run.good,
        run.bad,
        run.settings.max_size,
        predict(run.model, usable),
        run.settings.margin,
        safe_size(run.points + run.bounded, run.baseline, usable),
        flat=plateau_ratio(run.points),
        convex=convex,
        saturated=run.bad is None and knee(run.points, run.limit) is not None,
        refit=run.bad is not None and last.fits,
        jumped=last.fits and last.reason == "safe-jump",
    )


def _nothing_fits(run: _Run) -> OutOfMemory:
    """The error when batch size 1 failed, with the report of its out-of-memory error."""
    assert run.last_oom is not None
    oom = find_oom(run.last_oom) or run.last_oom
    from .oom_report import build_report

    report = build_report(oom, backend=run.backend, device=run.device, batch_size=1)
    return OutOfMemory(f"even batch size 1 does not fit.\n{report}", report)


def _search(step: Callable[[int], Any], settings: _Settings) -> BatchSizeSearch:
    began = time.perf_counter()
    run = _open(settings)
    size, reason = settings.start, "start"
    while True:
        _trial(step, run, size, reason)
        if run.good == 0 and run.bad == 1:
            raise _nothing_fits(run) from run.last_oom
        run.model, convex = fit(run.points, baseline=run.baseline)
        converged = _converged(run)
        if converged or len(run.trials) >= settings.max_trials:
            break
        size, reason = _choose(run, convex)
    return _finish(step, run, converged, began)


def _finish(step: Callable[[int], Any], run: _Run, converged: bool, began: float) -> BatchSizeSearch:
    """After the last trial: the answer confirmed or not, the notes, memory given back."""
    settings = run.settings
    if run.good == 0:
        raise OutOfMemory(
            f"no batch size fit in {len(run.trials)} trials (smallest tried: "
            f"{min(t.batch_size for t in run.trials)}); raise max_trials or start lower",
            None,
        )
    # stacklevel 4: _finish, _search, find_batch_size (or the decorated function), the caller.
    if not converged:
        warnings.warn(
            f"find_batch_size: max_trials={settings.max_trials} ran out before the answer was within "
            f"margin={settings.margin}; returning {run.good}, the largest size that ran",
            UnimemWarning,
            stacklevel=4,
        )
    answer, confirmations, confirmed, notes = _conclude(step, run)
    if confirmed is False:
        warnings.warn(f"find_batch_size: {notes[-1]}", UnimemWarning, stacklevel=4)
    _release(run, final=True)
    after = _snapshot(run)
    if run.limit is None and settings.measure is None:
        notes.append("no memory limit known: searched by doubling and bisection, without a model")
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
    )


# --- the conclusion ------------------------------------------------------------------------------


def _conclude(step: Callable[[int], Any], run: _Run) -> tuple[int, tuple[Trial, ...], bool | None, list[str]]:
    """After the search: the answer re-run or not (see ``_confirm``), and the notes on what
    the peaks and the failed trials showed."""
    good, limit, kept_total = run.good, run.limit, run.kept_total
    notes = [note for note in (saturation_note(run.points, limit, good), _kept_note(run)) if note]
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
    if confirmed is False:
        why = "the failed trials left memory in use (above)" if kept_total else "the pool is left fragmented"
        notes.append(
            f"{good} ran during the search but not again after its last out-of-memory error, nor did "
            f"{confirmations[-1].batch_size}: {why}; start a fresh process with batch size {good}"
        )
    return answer, confirmations, confirmed, notes


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
    t0 = time.perf_counter()
    error, _ = _attempt(step, size, True, run.adapter)
    seconds = time.perf_counter() - t0
    if run.settings.measure is not None:
        run.settings.measure()  # drop this call's peak, so no later reading sees it
    _release(run, failed=error is not None)
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
    that runs, a call at ``start`` ("settle"). Returns the answer, the re-runs, and whether
    one ran (None: not needed)."""
    settings, good = run.settings, run.good
    ran_at = max(i for i, t in enumerate(run.trials) if t.fits and t.batch_size == good)
    if not settings.confirm or all(t.fits for t in run.trials[ran_at + 1 :]):
        return good, (), None
    done: list[Trial] = []
    for size in dict.fromkeys((good, max(1, math.floor(good * (1 - settings.margin))))):
        done.append(_rerun(step, run, size, "confirm"))
        if done[-1].fits:
            if settings.start < size:
                # What the step keeps between calls (gradients set to None at the next step's
                # start) was allocated inside the answer's large segments, which it now pins:
                # one call at ``start``, with the pool released where the framework says
                # (``settle``), moves it to small ones, so the pool shrinks back to its size
                # before the search (docs/measurements.md, "batch-size search").
                with _settling(run):
                    done.append(_rerun(step, run, settings.start, "settle"))
            return size, tuple(done), True
    return good, tuple(done), False


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
) -> int | BatchSizeSearch | Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The largest batch size for which ``step(batch_size)`` runs without running out of memory.

    ``step`` runs one training step at the given batch size and lets the framework's
    out-of-memory error propagate (any framework: see ``unimem.is_oom``); other errors
    stop the search and propagate. The answer is a size that ran, at least
    ``(1 - margin)`` × the largest that fits and never above it; ``margin=0`` searches to
    the exact size. ``max_size`` bounds it from above. Afterwards the process holds no
    more memory than before: the failed trials' references are dropped and
    ``clear_cache`` runs.

    Memory figures make it fast: each trial's peak (``stats().peak_allocated`` after
    ``reset_peak()``, or ``measure()``, called after each trial that fit and returning that
    trial's peak bytes), fitted linearly, predicts the size that reaches ``limit``
    (default: the framework's cap from ``stats().limit``; for torch no more than its pool
    plus the device's free bytes, less the pool's own overhead). ``baseline`` is the bytes
    in use before the search that every peak includes (default: ``stats().allocated``
    before the search; None with ``measure=`` unless given): with it, one trial already
    gives a size that surely fits. Where the figures are None (the CPU, a framework that
    keeps none) and no ``measure=`` is given, the search doubles from ``start`` until a
    failure and then bisects: it still finds the size, in more trials. ``limit=`` without
    any figure to hold against it is a ``ConfigError``.

    Near the limit, what fits depends on the pool's history: a size that ran during the
    search may fail after a later trial's out-of-memory error (torch's split cached
    segments; JAX's pool after an OOM, which then fits about half as much: docs/measurements.md).
    With ``confirm=True`` (the default) the answer is re-run once after the search when a
    trial failed after it ran (not counted in ``trials``); if that fails, one size lower by
    ``margin`` is tried and returned if it runs (then one call at ``start`` lets go of the
    large blocks the step's kept state sat in); if neither runs, the answer is returned
    with a ``UnimemWarning`` and ``confirmed=False``: start a fresh process with it.

    JAX: each failed trial costs about 10 s and keeps the step's outputs in use for good
    (XLA; measured, held against the cap, and named in ``notes``). A step that donates its
    state (``donate_argnums``) loses it at the first failure: search with one that does not.

    ``return_trials=True`` returns a ``BatchSizeSearch`` with every trial (size, fit or
    not, peak, seconds, why it was tried) instead of the int. Without ``step`` it is a
    decorator: ``@find_batch_size(start=8)`` over ``def step(batch_size, *args)`` gives a
    function of ``*args`` that runs the search and returns its answer (also kept as
    ``.last_search``). Bad arguments raise ``ConfigError`` before any trial runs.
    """
    settings = _check(
        start, backend, device, max_size, margin, measure, limit, baseline, max_trials, return_trials, confirm
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
