"""Every plot of a recording: the one module that draws (matplotlib).

``Recording.plot`` and ``plot_recordings`` (in ``unimem.observe.recording``) check the paths and
read the files; the figures are drawn here. Plots are an extra: matplotlib (and numpy, pillow,
fonttools with it) stays out of training environments that never draw, so it is imported inside
the functions that draw, and a plot request without it says what to install.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unimem.errors import BackendUnavailable, ConfigError

if TYPE_CHECKING:
    from unimem.observe.recording import Recording

__all__ = ["PLOT_EXTRA", "RANK_FIGURES", "RankLine", "RanksPlot", "plot_ranks", "plot_recording", "require_matplotlib"]

PLOT_EXTRA = "pip install 'unimem[plot]'"


def require_matplotlib(what: str = "plot") -> None:
    """Raise ``BackendUnavailable`` naming the extra when matplotlib is not installed."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise BackendUnavailable(f"{what}: matplotlib is not installed; {PLOT_EXTRA}")


# The figure drawn per rank when none is asked for: the first every recording knows, in this
# order (what the GPU holds for the process, then the framework's view, then the host's).
RANK_FIGURES = ("process_used", "allocated", "reserved", "device_used", "host_rss")
_FIGURE_LABELS = {
    "process_used": "process memory (NVML)",
    "allocated": "allocated (framework)",
    "reserved": "reserved (framework pool)",
    "device_used": "device used (NVML)",
    "host_rss": "host RSS",
    "peak": "peak per step",
    "host_peak": "host peak per step",
}
_RANK_IN_NAME = re.compile(r"\.rank(\d+)$")
_MARK_TEXTS = 12  # more marks than this over all ranks are drawn without their labels, to stay readable


@dataclass(frozen=True)
class RankLine:
    """One recording drawn by ``plot_recordings``.

    Attributes:
        label (str): Its legend entry (``"rank 3"``).
        rank (int | None): The rank, from the recording's metadata or else its file name.
        file (str | None): The file it was read from; None for a ``Recording`` passed in.
        samples (int): Its samples carrying the figure drawn (0: no line).
    """

    label: str
    rank: int | None
    file: str | None
    samples: int


@dataclass(frozen=True)
class RanksPlot:
    """What ``plot_recordings`` wrote.

    Attributes:
        path (Path): The PNG.
        figure (str | None): The ``Sample`` field drawn; None when no recording has any.
        lines (tuple[RankLine, ...]): One per recording, in rank order.
        notes (tuple[str, ...]): What did not match between the recordings (a rank named
            twice, no rank in the metadata, different world sizes, a figure one lacks).
    """

    path: Path
    figure: str | None
    lines: tuple[RankLine, ...]
    notes: tuple[str, ...]


# --- one recording ------------------------------------------------------------------------

# The lines of one recording's plot: (figure, legend label, line style), in drawing order.
_RECORDING_LINES = (
    ("allocated", "allocated (framework)", "-"),
    ("reserved", "reserved (framework pool)", "-"),
    ("peak", "peak per step", ":"),
    ("process_used", "process (NVML)", "-"),
    ("device_used", "device used (NVML)", "--"),
)


def plot_recording(
    recording: Recording, target: Path, *, title: str | None, figsize: tuple[float, float], dpi: int
) -> None:
    """Write ``recording``'s PNG timeline to ``target`` (a path already checked); see ``Recording.plot``.

    Raises:
        BackendUnavailable: matplotlib is not installed.
    """
    require_matplotlib("plot")  # one check for every plot, made before any part of matplotlib is imported
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    start = recording.start_time or 0.0
    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    samples = recording.samples
    everything = [v for s in samples for v in (s.allocated, s.reserved, s.process_used, s.peak) if v]
    everything += [v for s in samples for v in (s.device_used, s.host_rss) if v]
    limit = recording.meta.get("limit")
    if isinstance(limit, int):
        everything.append(limit)
    scale, unit = _unit(max(everything) if everything else 0)

    drawn = sum(_draw_line(ax, recording, name, label, style, start, scale) for name, label, style in _RECORDING_LINES)
    if drawn == 0 or all(s.process_used is None and s.allocated is None for s in samples):
        drawn += _draw_line(ax, recording, "host_rss", "host RSS (no GPU figures)", "-", start, scale)
    if isinstance(limit, int):
        ax.axhline(limit / scale, color="black", linestyle="-.", linewidth=1, label=f"cap {limit / scale:.2f} {unit}")
    gaps = recording.gaps
    if gaps:
        # One collection for every gap: a run with thousands of failed readings still plots fast.
        ax.vlines(
            [t - start for t, _ in gaps],
            0,
            1,
            transform=ax.get_xaxis_transform(),
            color="orange",
            alpha=0.6,
            linewidth=1,
            label=f"gaps ({len(gaps)} failed readings)",
        )
    _draw_marks(ax, recording, start)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel(unit)
    backend = recording.meta.get("backend") or "no framework"
    ax.set_title(title or f"unimem: {backend}, device {recording.meta.get('device', 0)}")
    ax.grid(True, alpha=0.3)
    top = max(everything) / scale if everything else 1.0
    ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)  # headroom: a flat line must not sit on the frame
    if drawn or isinstance(limit, int):
        ax.legend(loc="lower right", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no figures known", ha="center", va="center", transform=ax.transAxes)
    fig.savefig(target, format="png", dpi=dpi)


def _draw_line(ax: Any, recording: Recording, name: str, label: str, style: str, start: float, scale: int) -> int:
    """One figure of ``recording`` as a line on ``ax``; 1 if drawn, 0 if the figure is never known."""
    rows = recording.samples
    # Each figure comes from one stream (the framework's counters, the NVML sampler, the step
    # boundaries); the other streams' samples leave it None. Interleaved, those Nones would break
    # the line at every point (the line would vanish), so only the streams that carry the figure
    # are drawn, and only their failed readings break the line.
    carriers = {s.source for s in rows if getattr(s, name) is not None}
    points = [s for s in rows if s.source in carriers and (getattr(s, name) is not None or s.error)]
    if not points:
        return 0
    # A failed reading becomes NaN: matplotlib breaks the line there, which is what a gap is.
    ys = [math.nan if getattr(s, name) is None else getattr(s, name) / scale for s in points]
    xs = [s.time - start for s in points]
    ax.plot(xs, ys, style, label=label, linewidth=1.2)
    return 1


def _draw_marks(ax: Any, recording: Recording, start: float) -> None:
    """Marks as labelled vertical lines."""
    times = [s.time - start for s in recording.samples] + [m.time - start for m in recording.marks]
    span = (max(times) - min(times)) if times else 0.0
    previous, level = None, 0
    for mark in sorted(recording.marks, key=lambda m: m.time):
        x = mark.time - start
        # Marks close together get their labels stepped down so they stay readable.
        level = (level + 1) % 3 if previous is not None and x - previous < 0.03 * span else 0
        previous = x
        ax.axvline(x, color="grey", linestyle=":", linewidth=1)
        _mark_text(ax, x, mark.label, "dimgray", 1.0 - 0.3 * level)


def _mark_text(ax: Any, x: float, text: str, colour: Any, height: float = 1.0) -> None:
    """A mark's label, upright beside its line at ``x``, ``height`` up the axes."""
    ax.annotate(
        text,
        xy=(x, height),
        xycoords=("data", "axes fraction"),
        xytext=(2, -2),
        textcoords="offset points",
        rotation=90,
        va="top",
        fontsize=7,
        color=colour,
    )


def _unit(biggest: int) -> tuple[int, str]:
    """The unit the axis counts in: the largest binary unit not above ``biggest``."""
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if biggest >= scale:
            return scale, unit
    return 1, "bytes"


# --- several recordings, one per rank ----------------------------------------------------------


def _rank_of(recording: Recording, file: str | None) -> tuple[int | None, str | None]:
    """The rank and, when it is not in the metadata, a note on where it came from."""
    rank = recording.meta.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool):
        return rank, None
    found = _RANK_IN_NAME.search(Path(file).stem) if file else None
    if found:
        return int(found.group(1)), f"{file}: no rank in its metadata; rank {found.group(1)} read from its name"
    return None, f"{file or 'a recording'}: no rank in its metadata or its name; labelled by its name"


def _lines(loaded: list[tuple[Recording, str | None]]) -> tuple[list[tuple[str, int | None]], list[str]]:
    """A legend label and rank per recording (same order), and the notes on what did not match."""
    notes: list[str] = []
    found = []
    for position, (recording, file) in enumerate(loaded):
        rank, note = _rank_of(recording, file)
        notes += [note] if note else []
        found.append((f"rank {rank}" if rank is not None else (file or f"recording {position + 1}"), rank))
    labels = [label for label, _ in found]
    for position, (label, rank) in enumerate(found):
        if labels.count(label) > 1:  # two recordings of one rank: the file (or position) tells them apart
            found[position] = (f"{label} ({loaded[position][1] or f'#{position + 1}'})", rank)
    for label in sorted({label for label in labels if labels.count(label) > 1}):
        notes.append(f"{label} is named by {labels.count(label)} recordings; each is labelled with its file")
    sizes = sorted({r.meta["world_size"] for r, _ in loaded if isinstance(r.meta.get("world_size"), int)})
    if len(sizes) > 1:
        notes.append(f"the recordings name different world sizes ({', '.join(map(str, sizes))}): several runs?")
    return found, notes


def _choose_figure(loaded: list[tuple[Recording, str | None]], figure: str | None) -> str | None:
    if figure is not None:
        if figure not in _FIGURE_LABELS:
            raise ConfigError("figure", f"unknown figure {figure!r}; pick one of {', '.join(_FIGURE_LABELS)}")
        return figure

    def known(recording: Recording, name: str) -> bool:
        return any(getattr(s, name) is not None for s in recording.samples)

    for pick in (all, any):
        for name in RANK_FIGURES:
            if pick(known(recording, name) for recording, _ in loaded):
                return name
    return None


def _ranks_figure(
    loaded: list[tuple[Recording, str | None]],
    figure: str | None,
    title: str | None,
    figsize: tuple[float, float],
    dpi: int,
) -> tuple[Any, str | None, list[RankLine], list[str]]:
    """The matplotlib figure of every recording's line on one wall-clock axis, and what was drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    name = _choose_figure(loaded, figure)
    labelled, notes = _lines(loaded)
    order = sorted(range(len(loaded)), key=lambda i: (labelled[i][1] is None, labelled[i][1] or 0, i))
    starts = [start for recording, _ in loaded if (start := recording.start_time) is not None]
    origin = min(starts) if starts else 0.0  # every line on the same clock: seconds since the earliest start
    values = [getattr(s, name) for r, _ in loaded for s in r.samples] if name else []
    scale, unit = _unit(max([v for v in values if v is not None], default=0))
    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    drawn: list[RankLine] = []
    marks = sum(len(recording.marks) for recording, _ in loaded)
    for i in order:
        recording, file = loaded[i]
        label, rank = labelled[i]
        count = sum(getattr(s, name) is not None for s in recording.samples) if name else 0
        drawn.append(RankLine(label, rank, file, count))
        if not name or not count:
            if name:
                notes.append(f"{label} has no {name} figures: no line")
            continue
        _draw_line(ax, recording, name, label, "-", origin, scale)
        colour = ax.lines[-1].get_color()
        for mark in recording.marks:
            ax.axvline(mark.time - origin, color=colour, linestyle=":", linewidth=0.8, alpha=0.7)
            if marks <= _MARK_TEXTS:
                _mark_text(ax, mark.time - origin, f"{label}: {mark.label}", colour)
    ax.set_xlabel("seconds since the earliest start (wall clock)")
    ax.set_ylabel(f"{_FIGURE_LABELS.get(name, name) if name else 'memory'}, {unit}")
    what = "ranks" if all(line.rank is not None for line in drawn) else "recordings"
    ax.set_title(title or f"unimem: {len(loaded)} {what}, {_FIGURE_LABELS.get(name, name) if name else 'no figures'}")
    ax.grid(True, alpha=0.3)
    top = max([v for v in values if v is not None], default=0) / scale
    ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)  # from 0, as one recording's plot: heights compare by eye
    if any(not str(line.get_label()).startswith("_") for line in ax.lines):
        ax.legend(loc="lower right", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no figures known", ha="center", va="center", transform=ax.transAxes)
    return fig, name, drawn, notes


def plot_ranks(
    loaded: list[tuple[Recording, str | None]],
    target: Path,
    *,
    figure: str | None,
    title: str | None,
    figsize: tuple[float, float],
    dpi: int,
) -> RanksPlot:
    """Write the PNG of several recordings (each with the file it was read from, or None) to
    ``target`` (a path already checked); see ``plot_recordings``.

    Raises:
        ConfigError: ``figure`` is not a figure a rank's line can show.
        BackendUnavailable: matplotlib is not installed.
    """
    require_matplotlib("plot_recordings")
    fig, name, drawn, notes = _ranks_figure(loaded, figure, title, figsize, dpi)
    fig.savefig(target, format="png", dpi=dpi)
    return RanksPlot(target, name, tuple(drawn), tuple(notes))
