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
tensors (the leak other batch-size finders have, DESIGN.md). A failed trial keeps only
a line of text: its frames are cleared inside the ``except``, and collection and
``clear_cache`` run after leaving it, once per trial and at the end.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from . import api, registry
from .errors import ConfigError, OutOfMemory, UnimemWarning
from .oom import _message, clear_frames, find_oom
from .sizes import format_bytes, parse_size
from .stats import MemoryStats

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


# --- the fit ---------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def fit_linear(
    points: list[tuple[int, int]], *, largest: int = 5, baseline: int | None = None
) -> tuple[float, float] | None:
    """``(a, b)`` of ``bytes = a + b × batch`` by Theil–Sen over the ``largest`` biggest
    sizes (small batches are dominated by allocator granularity and by fixed costs, and
    the fit is used to extrapolate upwards), or None when memory does not grow with the
    batch there or fewer than two sizes are known. Among five sizes, one wild reading
    moves it little. A run of equal peaks at the small end (a plateau) is left out.

    With ``baseline`` (bytes in use before the search), sizes whose use above it is under
    a quarter of the largest's are left out: their peak is set by something that does
    not grow with the batch (an optimizer step's temporaries can top a small batch's
    activations), and a slope through such a plateau would predict far too much."""
    return _fit(points, largest=largest, baseline=baseline)[0]


def _fit(
    points: list[tuple[int, int]], *, largest: int = 5, baseline: int | None = None
) -> tuple[tuple[float, float] | None, bool]:
    """``fit_linear``'s model, and whether the peaks grew convexly (sizes under the
    plateau filter were left out, or the largest lies well above the line): then the
    model's slope is a lower bound and its prediction an upper estimate, not a point one."""
    chosen = sorted(points)[-largest:]
    # A run of equal peaks at the small end is a plateau of fixed costs: none of its
    # sizes lies on the line (a slope from its last one to the next would be too flat).
    plateau = False
    while len(chosen) >= 2 and chosen[1][1] <= chosen[0][1]:
        chosen.pop(0)
        plateau = True
    if plateau:
        chosen.pop(0)
    convex = False
    if baseline is not None and chosen:
        top = max(m for _, m in chosen) - baseline
        kept = [(n, m) for n, m in chosen if m - baseline >= top / 4]
        convex = len(kept) < len(chosen)
        chosen = kept
    slopes = [(m2 - m1) / (n2 - n1) for (n1, m1), (n2, m2) in itertools.combinations(chosen, 2) if n2 != n1]
    if not slopes:
        return None, convex
    b = _median(slopes)
    if b <= 0:
        return None, convex
    a = _median([m - b * n for n, m in chosen])
    # The largest size well above the line: the peaks steepen (the peak moved from a fixed
    # part to the activations), or one reading is wild. Either way the line is no point
    # estimate of what lies beyond.
    n, m = chosen[-1]
    convex = convex or m - (a + b * n) > 0.05 * b * n
    return (a, b), convex


def _predict(model: tuple[float, float] | None, limit: int | None) -> int | None:
    if model is None or limit is None:
        return None
    a, b = model
    return max(0, math.floor((limit - a) / b))


def _safe_size(points: list[tuple[int, int]], baseline: int | None, limit: int | None) -> int | None:
    """The largest size that surely fits if the use above ``baseline`` grows at most in
    proportion to the batch (true when it is fixed costs plus a per-sample part): from the
    largest measured size n with peak p, ``n × (limit - baseline) / (p - baseline)``."""
    if baseline is None or limit is None or not points:
        return None
    n, peak = max(points)
    if peak <= baseline or limit <= baseline:
        return None
    return math.floor(n * (limit - baseline) / (peak - baseline))


def _plateau_ratio(points: list[tuple[int, int]]) -> float:
    """When the two largest sizes measured peaked the same, the ratio of those sizes; else 0."""
    if len(points) < 2:
        return 0.0
    (n1, m1), (n2, m2) = sorted(points)[-2:]
    return n2 / n1 if m2 <= m1 else 0.0


# A line through sizes this many times smaller than its prediction is no point estimate
# while a sure step exists: XLA's peaks on the H200 grew 30 kB/sample up to 9278, then 41
# and 55, so a prediction of 89840 from 9278 failed (10 s and 40 MB of kept outputs),
# where the sure step (58613) fit. Over 3000 random convex needs: trials unchanged (mean
# 4.62), failures 1.16 -> 1.12 per search.
_MAX_EXTRAPOLATION = 4.0


def _next_size(
    good: int,
    bad: int | None,
    upper: int | None,
    predicted: int | None,
    margin: float,
    safe: int | None = None,
    flat: float = 0.0,
    convex: bool = False,
    jumped: bool = False,
    saturated: bool = False,
    refit: bool = False,
) -> tuple[int, str]:
    """The next size to try, and why. ``good`` >= 1 is the largest that fit, ``bad`` the
    smallest that did not; ``predicted`` is the linear fit's answer and ``safe`` the
    proportional lower bound (both may be None); ``flat``: when the two largest sizes
    measured peaked the same (a plateau of fixed costs), the ratio of those sizes, else 0;
    ``convex``: the fit saw the peaks grow faster at larger sizes, so ``predicted`` is only
    an upper estimate; ``jumped``: the last trial was a sure step, and it fit;
    ``saturated``: the peaks stopped growing near the limit (see ``_knee``) and nothing
    failed yet: only a step by the margin is safe (a failed JAX trial costs 10 s and keeps
    the step's outputs); ``refit``: a size fit after the smallest failure, so ``predicted``
    comes from a point the failure did not.

    The answer lies between a lower estimate (``good``, raised to ``safe``) and an upper
    one (the prediction, else one below the smallest failure). A step's peak is often
    convex in the batch: at small sizes a fixed part (gradients, an optimizer step's
    temporaries) tops the activations, so a line through small sizes predicts too much.
    Hence: when the two estimates are within a factor of two, aim just under the upper
    one; when they are further apart, aim at their geometric mean (a bisection in
    log-size, which halves the uncertainty whichever way the trial goes)."""
    bounds = [x for x in (None if bad is None else bad - 1, upper) if x is not None]
    high = min(bounds) if bounds else None
    low = good
    if safe is not None and (high is None or safe * (1 - margin / 2) < high):
        # (A failure at or below the sure bound refutes it: the limit was optimistic.)
        low = max(low, math.floor(safe * (1 - margin / 2)))
    else:
        safe = None
    # A prediction is a point estimate unless the peaks grew convexly, or (with a sure
    # bound) it lies more than twice above that bound, or, when that bound is a step up,
    # more than _MAX_EXTRAPOLATION times the largest size that ran: a line through small
    # sizes, whose peak a fixed part sets, predicts far too much.
    trusted = (
        predicted is not None
        and not convex
        and (safe is None or predicted <= 2 * max(low, 1))
        and (safe is None or low <= good or predicted <= _MAX_EXTRAPOLATION * good)
    )
    top = predicted if predicted is not None and (high is None or predicted <= high) else high
    # A prediction at most a margin above the smallest failure, still made after a size that
    # fit since that failure (a new point, and the line holds), is right but for noise: the
    # limit lies just under the failure, so aim there rather than bisect from ``good``.
    near_miss = refit and predicted is not None and bad is not None and bad <= predicted <= bad / (1 - margin)
    aimed = top is not None and (top == predicted or near_miss)
    if top is None:
        # Nothing above is known: the sure step (it grows by the headroom's ratio), or
        # grow while a plateau of fixed costs keeps the sure step small, squaring the
        # ratio at each step on the plateau (a long plateau costs few trials).
        size, reason = (low, "safe-jump") if safe is not None else (2 * good, "grow")
        stride = min(16.0, max(2.0, flat**2))
        if flat and size < stride * good:
            size, reason = math.floor(stride * good), "grow"
    elif bad is None and top == upper and (trusted or 2 * low >= top):
        size, reason = top, "upper-bound"
    elif aimed and trusted:
        size, reason = max(low, math.floor(top * (1 - margin / 2))), "predict"
    elif low > good and top <= 4 * low and (low >= 1.15 * good or top <= 1.5 * low or not jumped):
        # The sure bound is a step up and the answer is not far above it: take it (it
        # fits, and the next step starts from there). Not for a second small step in a
        # row: a sure bound that a fixed part keeps loose creeps up a few percent a trial.
        size, reason = low, "safe-jump"
    else:
        # Far apart, or the prediction was refuted by a failure below it: log-bisect.
        base = max(low, 1)
        size = max(low, math.floor(math.sqrt(base * top)) if top > base else top)
        reason = "predict-far" if top == predicted else "bisect"
    close = math.floor(good / (1 - margin)) + 1
    if saturated:
        size, reason = close, "saturated"
    if size < close:
        # Near the edge: the smallest size whose failure ends the search beats a small
        # step up (it fails and ends it, or fits and gains more).
        size, reason = close, "close"
    size = max(good + 1, size)
    if high is not None:
        size = min(size, high)
    return size, reason


# --- one trial ---------------------------------------------------------------------------------


_DONATED = (
    "unimem.find_batch_size: an earlier trial ran out of memory, and a JAX call that fails deletes "
    "the arrays it was given to donate (donate_argnums; on the H200 every failed call deleted its "
    "donated input). Search with a step that does not donate (or passes copies), then donate in "
    "training with the size found"
)


def _attempt(step: Callable[[int], Any], size: int, after_oom: bool) -> tuple[str | None, BaseException | None]:
    """Run ``step(size)``. Returns ``(None, None)`` when it fit; on an out-of-memory
    error, its first line and, for a final report only, the error with its frames cleared.
    ``after_oom``: an earlier trial failed, so a step that donates its state has lost it."""
    try:
        step(size)
    except Exception as exc:
        oom = find_oom(exc)
        if oom is None:
            if after_oom and "has been deleted" in str(exc) and hasattr(exc, "add_note"):
                exc.add_note(_DONATED)  # JAX's own message names no cause: "Array has been deleted"
            raise
        text = _message(oom).strip().splitlines()
        # The frames hold the failed step's tensors: drop their locals here, so that
        # nothing but this line of text outlives the except block.
        clear_frames(exc)
        return (text[0][:300] if text else type(oom).__name__), (exc if size == 1 else None)
    return None, None


def _release(backend: str | None, device: int, *, failed: bool = False, final: bool = False) -> None:
    """Give back what the last trial left, outside any ``except`` block."""
    if failed or final:
        gc.collect()  # a failed step's objects may sit in reference cycles
    if backend is None:
        return
    if backend == "torch" or final:
        # torch: every trial, so the next peak is measured from a clean pool. JAX/TF:
        # at the end only (JAX's clear drops compiled steps; TF warns it cannot free).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnimemWarning)
            api.clear_cache(backend, device)


def _framework(settings: _Settings) -> str | None:
    """The framework whose figures to read: the one named, else the one in use (like
    ``stats()``; several in use without ``backend=`` is a ``ConfigError``); None if none."""
    if settings.backend is not None:
        return settings.backend if settings.backend in registry.FRAMEWORKS else None
    if not registry.imported_frameworks() and not api.configured_backends():
        return None
    name = api._resolve_query(None)
    return name if name in registry.FRAMEWORKS else None


def _snapshot(backend: str | None, device: int) -> MemoryStats | None:
    return None if backend is None else api.stats(backend, device)


def _capacity(snapshot: MemoryStats | None, backend: str | None) -> int | None:
    """Bytes the measured peak may reach: the framework's cap, and for torch no more
    than its pool plus what the device has free."""
    if snapshot is None:
        return None
    bounds = [snapshot.limit]
    if backend == "torch" and snapshot.reserved is not None and snapshot.device_free is not None:
        bounds.append(snapshot.reserved + snapshot.device_free)
    known = [b for b in bounds if b is not None]
    return min(known) if known else None


def _search(step: Callable[[int], Any], settings: _Settings) -> BatchSizeSearch:
    began = time.perf_counter()
    backend = _framework(settings)
    device = settings.device
    notes: list[str] = []
    if settings.limit is not None and settings.measure is None and backend is None:
        raise ConfigError(
            "limit",
            "a limit needs each trial's peak memory, and no framework is in use to report it; "
            "pass measure= (a callable returning the last trial's peak bytes) or backend=",
        )
    if backend is not None:
        _release(backend, device)
    before = _snapshot(backend, device)
    limit = settings.limit if settings.limit is not None else _capacity(before, backend)
    if settings.measure is not None:
        measured_by = "measure="
    elif backend is not None:
        measured_by = f"stats({backend!r}).{_PEAK_FIELD}"
    else:
        measured_by = "nothing (no framework in use, no measure=)"
    overhead = 0  # torch: the pool's bytes beyond those in use, at the largest trial that fit
    # Bytes in use before the search, which every trial's peak includes: it turns one
    # measured trial into a size that surely fits (see _safe_size).
    baseline = settings.baseline
    if baseline is None and settings.measure is None and before is not None:
        baseline = before.allocated

    trials: list[Trial] = []
    points: list[tuple[int, int]] = []
    # JAX cannot reset its peak: a trial that stays below the process's peak so far reads
    # None. That peak, while the search has seen every step since it was read (no failure,
    # whose partial allocations it would not see), bounds the trial's from above: a
    # (size, bound) point keeps the sure lower bound sure, though it is no point of the fit.
    bounded: list[tuple[int, int]] = []
    running_peak = before.peak_allocated if before is not None and settings.measure is None else None
    kept_total = 0
    good, bad = 0, None
    size, reason = settings.start, "start"
    last_oom: BaseException | None = None
    model: tuple[float, float] | None = None
    while True:
        in_use = None
        if settings.measure is None and backend is not None:
            api.reset_peak(backend, device)
            in_use = api.stats(backend, device, nvml=False).allocated
        t0 = time.perf_counter()
        error, last_oom = _attempt(step, size, after_oom=bad is not None)
        seconds = time.perf_counter() - t0
        peak: int | None = None
        peak_reserved: int | None = None
        if error is None:
            if settings.measure is not None:
                value = settings.measure()
                peak = None if value is None else int(value)
            elif backend is not None:
                figures = api.stats(backend, device, nvml=False)
                peak, peak_reserved = figures.peak_allocated, figures.peak_reserved
                if backend == "torch" and peak is not None and peak_reserved is not None and size > good:
                    overhead = max(0, peak_reserved - peak)
        _release(backend, device, failed=error is not None)  # outside the except block: the frames are gone
        kept = None
        if error is not None and in_use is not None:
            now = api.stats(backend, device, nvml=False).allocated
            kept = None if now is None else max(0, now - in_use)
            if backend == "jax":
                # XLA's are lost for good. Elsewhere what stays is the step's own state
                # (torch: gradients a failed backward set), which the next step reuses.
                kept_total += kept or 0
        trials.append(Trial(size, error is None, peak, seconds, reason, error, peak_reserved, kept))

        if backend is None and settings.backend is None and len(trials) == 1:
            # The first trial may have imported the framework: read its figures from now on.
            backend = _framework(settings)
            if backend is not None and settings.measure is None:
                measured_by = f"stats({backend!r}).{_PEAK_FIELD}"
                limit = settings.limit if settings.limit is not None else _capacity(_snapshot(backend, device), backend)
        if error is None and peak is None and running_peak is not None:
            bounded.append((size, running_peak))
        if error is not None:
            running_peak = None
        elif peak is not None and running_peak is not None:
            running_peak = max(running_peak, peak)
        if error is None and peak is None and settings.limit is not None and not points and not bounded:
            raise ConfigError(
                "limit",
                f"a limit needs each trial's peak memory, and {measured_by} gave none for batch size {size}; "
                "pass measure= as well (a callable returning the last trial's peak bytes), or drop limit=",
            )
        if error is None:
            good = max(good, size)
            if peak is not None:
                points.append((size, peak))
        else:
            bad = size if bad is None else min(bad, size)

        if good == 0 and bad == 1:
            assert last_oom is not None
            oom = find_oom(last_oom) or last_oom
            from .oom_report import build_report

            report = build_report(oom, backend=backend, device=device, batch_size=1)
            raise OutOfMemory(f"even batch size 1 does not fit.\n{report}", report) from last_oom
        model, convex = _fit(points, baseline=baseline)
        bounds = [x for x in (None if bad is None else bad - 1, settings.max_size) if x is not None]
        high = min(bounds) if bounds else None
        if good and high is not None and good >= (1 - settings.margin) * high:
            converged = True
            break
        if len(trials) >= settings.max_trials:
            converged = False
            break
        if good == 0:
            assert bad is not None
            size, reason = max(1, bad // 2), "halve"
            continue
        # What XLA kept after failed trials is lost to every later trial (peaks measured
        # after it include it too: both err on the safe side).
        usable = None if limit is None else limit - overhead - kept_total
        size, reason = _next_size(
            good,
            bad,
            settings.max_size,
            _predict(model, usable),
            settings.margin,
            _safe_size(points + bounded, baseline, usable),
            flat=_plateau_ratio(points),
            convex=convex,
            saturated=bad is None and _knee(points, limit) is not None,
            refit=bad is not None and trials[-1].fits,
            jumped=trials[-1].fits and trials[-1].reason == "safe-jump",
        )

    if good == 0:
        raise OutOfMemory(
            f"no batch size fit in {len(trials)} trials (smallest tried: {min(t.batch_size for t in trials)}); "
            "raise max_trials or start lower",
            None,
        )
    if not converged:
        warnings.warn(
            f"find_batch_size: max_trials={settings.max_trials} ran out before the answer was within "
            f"margin={settings.margin}; returning {good}, the largest size that ran",
            UnimemWarning,
            stacklevel=3,
        )
    answer, confirmations, confirmed, more = _conclude(step, settings, backend, trials, points, good, limit, kept_total)
    notes += more
    if confirmed is False:
        warnings.warn(f"find_batch_size: {notes[-1]}", UnimemWarning, stacklevel=3)
    _release(backend, device, final=True)
    after = _snapshot(backend, device)
    if limit is None and settings.measure is None:
        notes.append("no memory limit known: searched by doubling and bisection, without a model")
    return BatchSizeSearch(
        batch_size=answer,
        trials=tuple(trials),
        smallest_failure=bad,
        converged=converged,
        margin=settings.margin,
        limit=limit,
        model=model,
        baseline=baseline,
        measured_by=measured_by,
        seconds=time.perf_counter() - began,
        before=before,
        after=after,
        notes=tuple(notes),
        confirmations=confirmations,
        confirmed=confirmed,
    )


def _conclude(
    step: Callable[[int], Any],
    settings: _Settings,
    backend: str | None,
    trials: list[Trial],
    points: list[tuple[int, int]],
    good: int,
    limit: int | None,
    kept_total: int,
) -> tuple[int, tuple[Trial, ...], bool | None, list[str]]:
    """After the search: the answer re-run or not (see ``_confirm``), and the notes on what
    the peaks and the failed trials showed."""
    notes = [note for note in (_saturation_note(points, limit, good), _kept_note(backend, trials, limit)) if note]
    ran = max((t for t in trials if t.fits and t.batch_size == good), key=lambda t: t.peak or 0)
    if settings.confirm and limit is not None and kept_total and ran.peak and ran.peak + kept_total > limit:
        # Its peak no longer fits beside what XLA kept: re-running it (and one size lower)
        # would fail again, each failure costing 10 s and another copy of the outputs.
        notes.append(
            f"{good} ran during the search (peak {format_bytes(ran.peak)}) but cannot run again in this process "
            f"beside the {format_bytes(kept_total)} the failed trials left in use (limit {format_bytes(limit)}); "
            f"start a fresh process with batch size {good}"
        )
        return good, (), False, notes
    answer, confirmations, confirmed = _confirm(step, settings, backend, trials, good)
    if confirmed is False:
        why = "the failed trials left memory in use (above)" if kept_total else "the pool is left fragmented"
        notes.append(
            f"{good} ran during the search but not again after its last out-of-memory error, nor did "
            f"{confirmations[-1].batch_size}: {why}; start a fresh process with batch size {good}"
        )
    return answer, confirmations, confirmed, notes


def _knee(points: list[tuple[int, int]], limit: int | None) -> int | None:
    """Where the peaks stopped growing with the batch near the limit, or None.

    XLA rematerializes a step whose peak would pass its limit (it recomputes activations),
    so near the limit the peak grows a small fraction as fast per sample as below it (on
    the H200: 36.9 kB/sample, then 2.0). Then the peaks say nothing about how much more
    fits, and a line through them predicts far too much. The knee is where the steep line
    below meets the flat one at the top. Only over a step of 5% or more, and 10x flatter:
    noise in the peaks (allocator rounding) makes a shorter step of a straight need look
    flat."""
    if limit is None or len(points) < 3:
        return None
    ordered = sorted(points)
    (m1, q1), (m2, q2) = ordered[-2:]
    if q2 < 0.9 * limit or m2 < 1.05 * m1:
        return None
    flat = (q2 - q1) / (m2 - m1)
    for (n0, p0), (n1, p1) in reversed(list(itertools.pairwise(ordered[:-1]))):
        steep = (p1 - p0) / (n1 - n0)
        if steep > 0 and flat < 0.1 * steep:
            knee = (q2 - p1 + steep * n1 - flat * m2) / (steep - flat)
            return int(min(max(knee, n0), m2))
    return None


def _ran_past_the_cap(points: list[tuple[int, int]], limit: int, good: int) -> tuple[int, int] | None:
    """The smallest size whose peak reached the limit while ``good``, larger, still ran
    though the peaks' own slope just below that size says it needs 2% more than the limit."""
    ordered = sorted(points)
    for i, (n, peak) in enumerate(ordered):
        below = [(m, q) for m, q in ordered[:i] if 1.05 * m <= n]
        if n >= good or peak < 0.99 * limit or not below:
            continue
        m, q = below[-1]
        slope = (peak - q) / (n - m)
        if slope > 0 and peak + slope * (good - n) > 1.02 * limit:
            return n, peak
    return None


def _saturation_note(points: list[tuple[int, int]], limit: int | None, good: int) -> str | None:
    """Said when the peaks show the framework saving memory to fit: a knee near the limit
    (see ``_knee``), or a size whose peak reached the limit while a larger one, which the
    peaks' slope says cannot fit, still ran (on the H200, XLA: 66784 peaked at 99.7% of the
    cap, 55 kB/sample above 58613, and 70299 and 73999 ran)."""
    if limit is None:
        return None
    why = "the framework saves memory to fit (XLA rematerializes: it recomputes activations)"
    knee = _knee(points, limit)
    if knee is not None:
        top = max(points)
        return (
            f"above about {knee} the peak stopped growing with the batch ({top[1] / limit:.0%} of the limit at "
            f"{top[0]}): {why}, so sizes above about {knee} may run slower per sample; time the step before "
            "taking the largest"
        )
    at_cap = _ran_past_the_cap(points, limit, good)
    if at_cap is None:
        return None
    n, peak = at_cap
    return (
        f"at {n} the peak reached the limit ({peak / limit:.1%}), yet sizes up to {good} ran: {why}, so "
        f"sizes above {n} may run slower per sample; time the step before taking the largest"
    )


def _kept_note(backend: str | None, trials: list[Trial], limit: int | None) -> str | None:
    """What the failed trials left in use, when it is worth saying (over 1% of the limit)."""
    failed = [t for t in trials if t.kept]
    total = sum(t.kept or 0 for t in failed)
    if not failed or (limit and total < 0.01 * limit):
        return None
    cause = (
        "XLA does not free a failed execution's output buffers, which stay in use until the process ends; "
        "this process now fits less than a fresh one"
        if backend == "jax"
        else "something still references what the failed steps allocated (gradients set in a failed backward, "
        "which the next step reuses, or a caught exception, a list of outputs)"
    )
    return (
        f"{format_bytes(total)} stayed in use after {len(failed)} failed trial(s) "
        f"({', '.join(f'{t.batch_size}: {format_bytes(t.kept or 0)}' for t in failed)}): {cause}"
    )


def _rerun(step: Callable[[int], Any], settings: _Settings, backend: str | None, size: int, reason: str) -> Trial:
    """One call of ``step`` after the search, released like a trial; its peak is no point of the fit."""
    t0 = time.perf_counter()
    error, _ = _attempt(step, size, after_oom=True)
    seconds = time.perf_counter() - t0
    if settings.measure is not None:
        settings.measure()  # drop this call's peak, so no later reading sees it
    _release(backend, settings.device, failed=error is not None)
    return Trial(size, error is None, None, seconds, reason, error)


def _settling(backend: str | None, device: int) -> contextlib.AbstractContextManager[None]:
    """torch: release the pool as the settle call's forward starts, when a step that sets its
    gradients to None first holds none, so the new ones land in segments of their own size
    (emptying the cache before the call cannot: the old ones pin the large segments)."""
    if backend != "torch":
        return contextlib.nullcontext()
    from unimem.backends.torch_backend import at_first_forward

    return at_first_forward(lambda: _release(backend, device))


def _confirm(
    step: Callable[[int], Any], settings: _Settings, backend: str | None, trials: list[Trial], good: int
) -> tuple[int, tuple[Trial, ...], bool | None]:
    """Re-run the answer when a trial failed after it ran: what fits near the limit depends
    on the pool's history (torch's cached segments split by the failed step; JAX's pool
    after an OOM), and the caller will run it next. If it fails, one step down by the
    margin; after one that runs, a call at ``start`` ("settle"). Returns the answer, the
    re-runs, and whether one ran (None: not needed)."""
    ran_at = max(i for i, t in enumerate(trials) if t.fits and t.batch_size == good)
    if not settings.confirm or all(t.fits for t in trials[ran_at + 1 :]):
        return good, (), None
    done: list[Trial] = []
    for size in dict.fromkeys((good, max(1, math.floor(good * (1 - settings.margin))))):
        done.append(_rerun(step, settings, backend, size, "confirm"))
        if done[-1].fits:
            if settings.start < size:
                # What the step keeps between calls (torch's gradients, set to None at the
                # next step's start) was allocated inside the answer's large segments, which
                # it now pins: one call at ``start``, with the cache emptied as its forward
                # starts, moves it to small ones, so that the pool shrinks back to its size
                # before the search (on the H200: 1.12 GB reserved after against 0.26 GB
                # before without the call; 0.64 GB with it but without emptying the cache).
                with _settling(backend, settings.device):
                    done.append(_rerun(step, settings, backend, settings.start, "settle"))
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
    segments; JAX's pool after an OOM, seen on the H200 to fit only about half as much).
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
