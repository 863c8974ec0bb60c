"""What one batch search knows and reads: the run record, the framework's snapshots, the
capacity a trial's peak may reach, each trial's peak and what a failure left in use, and the
bounds the trials set on the answer."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from unimem import ranks
from unimem.errors import ConfigError
from unimem.memory_stats import MemoryStats
from unimem.search.framework import Framework, framework_free_view
from unimem.search.host_limit import HostLimit, HostPeaks, read_limit
from unimem.search.leak import Reading
from unimem.search.limit import Limit, bytes_of
from unimem.search.progress import Progress
from unimem.search.result import Trial
from unimem.search.rules import line_bound
from unimem.search.scale import Scale
from unimem.search.settings import Settings, measured
from unimem.sizes import format_bytes

if TYPE_CHECKING:
    from unimem.search.ranks import Ranks

__all__ = [
    "Run",
    "check_peaks",
    "capacity_of",
    "hold_to_host",
    "measured_by",
    "read_kept",
    "read_peak",
    "record",
    "release",
    "reread_capacity",
    "room_of",
    "scale_limit",
    "take_snapshot",
    "upper_bound",
]


@dataclass
class Run:
    """What one search knows so far; the trial runner and the conclusion update it."""

    settings: Settings
    framework: Framework = field(default_factory=lambda: Framework(None))  # whose figures are read
    limit: Limit | None = None  # bytes a trial's peak may reach, and where that figure came from
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
    # Where no device figure is known: the host's limit, and each trial's resident peak (``host_limit``).
    host: HostLimit | None = None
    host_peaks: HostPeaks | None = None
    began: float = 0.0  # clock() when the search began
    elapsed: float | None = None  # over ranks: the longest any rank has searched, as of the last agreement
    out_of_time: bool = False  # time_limit= passed before the answer was within the margin
    readings: list[Reading] = field(default_factory=list)  # what was read of every call, re-runs included
    kept_seen: int = 0  # bytes every failed call left in use, as measured after each (``leak``)

    @property
    def device(self) -> int:
        return self.settings.device


def take_snapshot(run: Run) -> MemoryStats | None:
    """What ``stats()`` says of the framework whose figures are read (None: none in use)."""
    return run.framework.snapshot()


def capacity_of(run: Run, snapshot: MemoryStats | None) -> int | None:
    """Bytes the measured peak may reach, as the framework reads its snapshot (its cap by
    default). With predictions and a largest buffer the allocator can hand out, the cap: the
    pool's pieces are then held against each size's largest buffer (``Scale.room``)."""
    return run.framework.capacity(snapshot, run.scale is not None and bool(run.scale.largest))


def room_of(run: Run, snapshot: MemoryStats | None) -> int | None:
    """The largest buffer the allocator can hand out now (figures from the framework only)."""
    return None if run.settings.measure is not None else run.framework.largest_buffer(snapshot)


def measured_by(run: Run) -> str:
    if run.settings.measure is not None:
        return "measure="
    if run.host is not None:
        return "the process's resident peak (host memory)"
    if run.framework.name is not None:
        return run.framework.measured_by
    return "nothing (no framework in use, no measure=)"


def _no_device_figures(run: Run) -> bool:
    """Whether neither the framework nor the framework-free view knows a device: a host without a GPU."""
    view = run.before if run.before is not None else framework_free_view(run.device)
    return view.device_total is None and view.peak_allocated is None and view.limit is None


def hold_to_host(run: Run) -> None:
    """Where no device figure bounds the sizes or reads the peaks (a host without a GPU) and no
    ``measure=`` does, the host's memory does (``host_limit``): past it the kernel kills the process
    rather than the step raising. A ``limit=`` is then held against the same resident peak, and no
    higher than the host's (with ``lower=`` it holds the predicted peaks instead). Ranks of one host
    share it. A ``limit=`` the process passed before any trial is a ``ConfigError``."""
    settings = run.settings
    own = settings.limit is not None
    if settings.measure is not None or (own and settings.lower is not None) or (not own and run.limit is not None):
        return
    if not _no_device_figures(run):
        return
    local = ranks.rank_info(runtime=False).local_world_size
    held = read_limit(local or (1 if run.ranks is None else run.ranks.world_size))
    if held is None:
        return
    if settings.limit is not None and settings.limit <= held.resident:
        raise ConfigError(
            "limit",
            f"limit={format_bytes(settings.limit)} is no more than the {format_bytes(held.resident)} this process "
            "holds already: on a host without device figures a trial's peak is the process's resident peak "
            "(the interpreter and libraries count); pass a limit above it, or measure= with the step's own peak",
        )
    run.host, run.host_peaks = held, HostPeaks()
    run.limit = Limit(held.limit if settings.limit is None else min(settings.limit, held.limit), "host")
    run.measured_by = measured_by(run)
    run.baseline = held.resident if settings.baseline is None else settings.baseline
    run.running_peak = run.host_peaks.so_far()
    if run.scale is not None:
        run.scale.held = run.baseline


def check_peaks(run: Run) -> None:
    """``limit=`` needs each trial's peak: from ``measure=``, the framework, the host, or ``lower=``'s
    predictions. With none of them, a ``ConfigError`` before any trial."""
    settings = run.settings
    if settings.limit is None or settings.measure is not None or settings.lower is not None or run.host is not None:
        return
    if run.before is not None and run.before.peak_allocated is not None:
        return
    name = run.framework.name
    where = "no framework is in use" if name is None else f"stats({name!r}) reads no peak here"
    raise ConfigError(
        "limit",
        f"a limit needs each trial's peak memory: {where}, and this host's memory figures cannot be read; "
        "pass measure= (a callable returning the last trial's peak bytes), or drop limit=",
    )


def reread_capacity(run: Run) -> bool:
    """Read the capacity again where it is the framework's (no ``limit=``, figures from the
    framework), and the largest buffer its allocator can hand out (with predictions):
    compilations and runs grow a pool taken on demand. Over ranks, the smallest any rank knows,
    so that every rank places the same size. True when either changed."""
    ours = run.limit is None or run.limit.source == "capacity"
    if run.settings.measure is not None or run.framework.name is None or not (ours or run.scale is not None):
        return False
    snapshot = take_snapshot(run)
    capacity = capacity_of(run, snapshot) if ours else bytes_of(run.limit)
    room = None if run.scale is None else room_of(run, snapshot)
    if run.ranks is not None:
        answers = run.ranks.exchange({"kind": "capacity", "size": run.good, "limit": capacity, "room": room})
        capacity = min((p["limit"] for p in answers.values() if p["limit"] is not None), default=None)
        room = min((p["room"] for p in answers.values() if p["room"] is not None), default=None)
    changed = False
    if ours and capacity is not None and capacity != bytes_of(run.limit):
        run.limit, changed = Limit(capacity, "capacity"), True
    if run.scale is not None and room != run.scale.room:
        run.scale.room = room
        changed = True
    return changed


def release(run: Run, *, failed: bool = False, final: bool = False) -> None:
    """Give back what the last trial left, outside any ``except`` block."""
    if failed or final:
        gc.collect()  # a failed step's objects may sit in reference cycles
    run.framework.release(final)


def read_peak(run: Run) -> tuple[int | None, int | None, int | None]:
    """The peak, the pool's peak and the pool's overhead of the trial that just fit (None: unknown)."""
    if run.settings.measure is not None:
        return measured(run.settings.measure()), None, None
    if run.host_peaks is not None:
        return run.host_peaks.read(), None, None
    return run.framework.peak()


def read_kept(run: Run, in_use: int | None) -> int | None:
    """Bytes still in use after a failed trial was released, above those in use before it."""
    if in_use is None:
        return None
    now = run.framework.in_use()
    return None if now is None else max(0, now - in_use)


def record(run: Run, size: int, fits: bool, peak: int | None) -> None:
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
        # What said this size would fit is refuted (see Run).
        if run.last_safe is not None and size <= run.last_safe:
            run.sure_refuted = True
        if run.last_predicted is not None and size <= run.last_predicted:
            run.line_refuted_at = len(run.points)
    high = upper_bound(run)
    if run.good and high is not None:
        run.brackets.append((run.good, high))


def scale_limit(run: Run) -> int | None:
    """The limit the predicted peaks are held against (the pool's own overhead apart)."""
    return None if run.limit is None else run.limit.bytes - run.overhead


def upper_bound(run: Run) -> int | None:
    """The largest size that can still fit: below the smallest failure, at most ``max_size``,
    and, while the predictions are used, below the smallest size predicted past the capacity."""
    bounds = [None if run.bad is None else run.bad - 1, run.settings.max_size, _line_bound(run)]
    if run.scale is not None and run.scale.trusted:
        bounds.append(run.scale.bound(scale_limit(run), run.kept_total, run.good))
    known = [x for x in bounds if x is not None]
    return min(known) if known else None


def _line_bound(run: Run) -> int | None:
    """Where a framework that never trades compute for memory (``adapter.search.rematerializes``) holds
    a step whose peaks grow at least linearly, the sizes above the largest measured one that the
    limit leaves room for: none past ``line_bound``. None unless a sure bound still stands."""
    if run.framework.name is None or run.framework.rematerializes or run.limit is None or run.sure_refuted:
        return None
    # What failed trials kept since the largest point ran is lost to every size above it.
    largest = max(run.points, default=None)
    kept = 0 if largest is None else run.kept_total - run.point_kept.get(largest[0], run.kept_total)
    return line_bound(run.points, run.limit.bytes - run.overhead - kept, run.baseline)
