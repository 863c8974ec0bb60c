"""What one batch search knows, as records each written in one place, and what it reads through the
framework: snapshots, the capacity and room (read again as a pool grows), each trial's peak, what a
failure left in use, the release of the pool, and the bound every record together sets on the answer.

The run record's parts and their one writer each: ``settings`` (frozen), ``framework`` (frozen; asked
through ``search.framework``), ``start`` (frozen; ``search.opening``), ``limit`` (set at the opening,
read again by ``reread_capacity`` here), ``scale`` (``search.predictions``; its room is read with the
capacity here), ``findings`` (``search.findings``), ``calls`` (the trial runner).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from unimem.memory_stats import MemoryStats
from unimem.search.findings import Findings
from unimem.search.framework import Framework
from unimem.search.host_limit import HostLimit, HostPeaks
from unimem.search.leak import Reading
from unimem.search.limit import Limit, bytes_of
from unimem.search.progress import Progress
from unimem.search.rules import line_bound
from unimem.search.scale import Scale
from unimem.search.settings import Settings, measured

if TYPE_CHECKING:
    from unimem.backends.base import CompiledProgram
    from unimem.search.ranks import Ranks

__all__ = [
    "Calls",
    "Run",
    "Start",
    "capacity_of",
    "read_kept",
    "read_peak",
    "release",
    "reread_capacity",
    "room_of",
    "scale_limit",
    "take_snapshot",
    "upper_bound",
]


@dataclass(frozen=True)
class Start:
    """What the search began with, read before its first trial (``search.opening``); over ranks, agreed."""

    before: MemoryStats | None = None  # stats() before the search
    baseline: int | None = None  # bytes in use before the search, which every peak includes
    running_peak: int | None = None  # the process's peak then, where a trial's cannot be read apart from it
    measured_by: str = ""  # where each trial's peak comes from
    # Where no device figure is known: the host's limit, and each trial's resident peak (``host_limit``).
    host: HostLimit | None = None
    host_peaks: HostPeaks | None = None


@dataclass
class Calls:
    """Every call of the step, re-runs after the search included: written by the trial runner only."""

    made: int = 0  # ``max_trials`` bounds it
    failed: int = 0  # those that ran out of memory
    readings: list[Reading] = field(default_factory=list)  # what was read of each (``leak``)
    kept_seen: int = 0  # bytes every failed call left in use, as measured after each
    last_oom: BaseException | None = None  # the last trial's out-of-memory error, for a report when 1 failed
    elapsed: float | None = None  # over ranks: the longest any rank has searched, as of the last agreement
    out_of_time: bool = False  # time_limit= passed before the answer was within the margin
    # Per size, the largest program a call of it compiled elsewhere (``Framework.compiled_call``): its
    # peak where the framework's reads none, whether it was rematerialized or refused.
    compiled: dict[int, CompiledProgram] = field(default_factory=dict)


@dataclass
class Run:
    """What one search knows so far (see the module for each part's writer)."""

    settings: Settings
    framework: Framework = field(default_factory=lambda: Framework(None))  # whose figures are read
    start: Start = field(default_factory=Start)
    limit: Limit | None = None  # bytes a trial's peak may reach, and where that figure came from
    ranks: Ranks | None = None  # the ranks every trial is agreed with; None: a single process
    progress: Progress = field(default_factory=lambda: Progress(False))
    began: float = 0.0  # clock() when the search began
    scale: Scale | None = None  # with lower=: the predicted peaks, and what the runs say about them
    findings: Findings = field(default_factory=Findings)
    calls: Calls = field(default_factory=Calls)

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


def remat_limit(run: Run) -> int | None:
    """Once a measured call's compiled program was rematerialized: the bytes past which the compiler does
    so, the framework's share of its pool's limit (``Framework.remat_share``), which the next sizes are
    placed under (sizes above it run, but slower). None before, or where unknown. Only a placement: what
    fits is still held to the capacity."""
    share, before = run.framework.remat_share, run.start.before
    if share is None or before is None or before.limit is None:
        return None
    return int(share * before.limit) if any(program.rematerialized for program in run.calls.compiled.values()) else None


def room_of(run: Run, snapshot: MemoryStats | None) -> int | None:
    """The largest buffer the allocator can hand out now (figures from the framework only)."""
    return None if run.settings.measure is not None else run.framework.largest_buffer(snapshot)


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
        answers = run.ranks.exchange({"kind": "capacity", "size": run.findings.good, "limit": capacity, "room": room})
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
    if run.start.host_peaks is not None:
        return run.start.host_peaks.read(), None, None
    return run.framework.peak()


def read_kept(run: Run, in_use: int | None) -> int | None:
    """Bytes still in use after a failed trial was released, above those in use before it."""
    if in_use is None:
        return None
    now = run.framework.in_use()
    return None if now is None else max(0, now - in_use)


def grows_in_regions(run: Run) -> bool:
    """Whether the framework's pool grew on demand in regions that its calls keep when the search
    began (JAX with growth on: ``room_after_region`` answered), with figures of its own (no
    ``limit=``, ``measure=``)."""
    if run.settings.limit is not None or run.settings.measure is not None:
        return False
    return run.framework.room_after_region(run.start.before) is not None


def scale_limit(run: Run) -> int | None:
    """The limit the predicted peaks are held against (the pool's own overhead apart)."""
    return None if run.limit is None else run.limit.bytes - run.findings.overhead


def upper_bound(run: Run) -> int | None:
    """The largest size that can still fit: below the smallest failure, at most ``max_size``,
    and, while the predictions are used, below the smallest size predicted past the capacity."""
    found = run.findings
    bounds = [None if found.bad is None else found.bad - 1, run.settings.max_size, _line_bound(run)]
    if run.scale is not None and run.scale.trusted:
        bounds.append(run.scale.bound(scale_limit(run), found.kept_total, found.good))
    known = [x for x in bounds if x is not None]
    return min(known) if known else None


def _line_bound(run: Run) -> int | None:
    """Where a framework that never trades compute for memory (``Framework.rematerializes``) holds
    a step whose peaks grow at least linearly, the sizes above the largest measured one that the
    limit leaves room for: none past ``line_bound``. None unless a sure bound still stands."""
    found = run.findings
    if run.framework.name is None or run.framework.rematerializes or run.limit is None or found.sure_refuted:
        return None
    # What failed trials kept since the largest point ran is lost to every size above it.
    largest = max(found.points, default=None)
    kept = 0 if largest is None else found.kept_total - found.point_kept.get(largest[0], found.kept_total)
    return line_bound(found.points, run.limit.bytes - found.overhead - kept, run.start.baseline)
