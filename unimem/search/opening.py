"""Opening a batch search: the framework whose figures it reads, the limit, the bytes in use before
it, and where each trial's peak will come from (on a host without device figures, the host's memory);
over ranks, agreed by all of them. Whatever cannot work is a ``ConfigError`` here, before any trial."""

from __future__ import annotations

from typing import TYPE_CHECKING

from unimem import ranks
from unimem.errors import ConfigError
from unimem.memory_stats import MemoryStats
from unimem.search.agreement import agree_open
from unimem.search.findings import Findings
from unimem.search.framework import Framework, framework_free_view, resolve
from unimem.search.host_limit import HostLimit, HostPeaks, read_limit
from unimem.search.limit import Limit
from unimem.search.predictions import new_scale
from unimem.search.progress import Progress
from unimem.search.settings import Settings
from unimem.search.state import Run, Start
from unimem.sizes import format_bytes

if TYPE_CHECKING:
    from unimem.search.ranks import Ranks

__all__ = ["open_run"]


def open_run(settings: Settings, step: object, over: Ranks | None, began: float) -> Run:
    """The search's record before its first trial (progress lines on rank 0 only)."""
    shown = settings.progress if over is None or over.rank == 0 else False
    framework = Framework.named(resolve(settings, step), settings.device)
    if framework.name is not None:
        framework.release()
    before = framework.snapshot()
    limit = Limit(settings.limit, "limit=") if settings.limit is not None else _capacity(framework.capacity(before))
    predicted = settings.lower is not None
    room = framework.largest_buffer(before) if predicted and settings.measure is None else None
    # The baseline turns one measured trial into a size that surely fits (see safe_size).
    baseline = settings.baseline
    if baseline is None and settings.measure is None and before is not None:
        baseline = before.allocated
    running_peak = before.peak_allocated if before is not None and settings.measure is None else None
    start = Start(before, baseline, running_peak, _measured_by(settings, framework, None))
    held = _host_limit(settings, framework, over, before, limit)
    if held is not None:
        limit = Limit(held.limit if settings.limit is None else min(settings.limit, held.limit), "host")
        peaks = HostPeaks()
        baseline = held.resident if settings.baseline is None else settings.baseline
        start = Start(before, baseline, peaks.so_far(), _measured_by(settings, framework, held), held, peaks)
    _check_peaks(settings, framework, start)
    if over is not None:
        limit, start = agree_open(settings, over, limit, start)
    run = Run(
        settings,
        framework,
        start,
        limit,
        over,
        Progress(shown),
        began,
        findings=Findings(running_peak=start.running_peak),
    )
    if predicted:
        # Held: this rank's bytes in use before the search, as read before the ranks agreed on the baseline.
        run.scale = new_scale(run, room, baseline)
    return run


def _capacity(capacity: int | None) -> Limit | None:
    return None if capacity is None else Limit(capacity, "capacity")


def _measured_by(settings: Settings, framework: Framework, host: HostLimit | None) -> str:
    if settings.measure is not None:
        return "measure="
    if host is not None:
        return "the process's resident peak (host memory)"
    if framework.name is not None:
        return framework.measured_by
    return "nothing (no framework in use, no measure=)"


def _no_device_figures(before: MemoryStats | None, device: int) -> bool:
    """Whether neither the framework nor the framework-free view knows a device: a host without a GPU."""
    view = before if before is not None else framework_free_view(device)
    return view.device_total is None and view.peak_allocated is None and view.limit is None


def _host_limit(
    settings: Settings, framework: Framework, over: Ranks | None, before: MemoryStats | None, limit: Limit | None
) -> HostLimit | None:
    """Where no device figure bounds the sizes or reads the peaks (a host without a GPU) and no
    ``measure=`` does, the host's memory does (``host_limit``): past it the kernel kills the process
    rather than the step raising. A ``limit=`` is then held against the same resident peak, and no
    higher than the host's (with ``lower=`` it holds the predicted peaks instead). Ranks of one host
    share it. A ``limit=`` the process passed before any trial is a ``ConfigError``. None: the host
    does not bound this search."""
    own = settings.limit is not None
    if settings.measure is not None or (own and settings.lower is not None) or (not own and limit is not None):
        return None
    if not _no_device_figures(before, framework.device):
        return None
    local = ranks.rank_info(runtime=False).local_world_size
    held = read_limit(local or (1 if over is None else over.world_size))
    if held is None:
        return None
    if settings.limit is not None and settings.limit <= held.resident:
        raise ConfigError(
            "limit",
            f"limit={format_bytes(settings.limit)} is no more than the {format_bytes(held.resident)} this process "
            "holds already: on a host without device figures a trial's peak is the process's resident peak "
            "(the interpreter and libraries count); pass a limit above it, or measure= with the step's own peak",
        )
    return held


def _check_peaks(settings: Settings, framework: Framework, start: Start) -> None:
    """``limit=`` needs each trial's peak: from ``measure=``, the framework, the host, or ``lower=``'s
    predictions. With none of them, a ``ConfigError`` before any trial."""
    if settings.limit is None or settings.measure is not None or settings.lower is not None or start.host is not None:
        return
    if start.before is not None and start.before.peak_allocated is not None:
        return
    name = framework.name
    where = "no framework is in use" if name is None else f"stats({name!r}) reads no peak here"
    raise ConfigError(
        "limit",
        f"a limit needs each trial's peak memory: {where}, and this host's memory figures cannot be read; "
        "pass measure= (a callable returning the last trial's peak bytes), or drop limit=",
    )
