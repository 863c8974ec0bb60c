"""Every plot of a recording: the one module that draws (matplotlib).

``Recording.plot`` and ``plot_recordings`` (in ``unimem.observe.recording``) check the paths and
read the files; the figures are drawn here. Plots are an extra: matplotlib (and numpy, pillow,
fonttools with it) stays out of training environments that never draw, so it is imported inside
the functions that draw, and a plot request without it says what to install.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from itertools import compress, repeat
from operator import attrgetter, eq, is_not, or_
from pathlib import Path
from typing import Any, Protocol

from unimem.errors import BackendUnavailable, ConfigError
from unimem.observe.samples import Mark, Sample
from unimem.observe.thinning import axis_origin, shortened, spaced, thin_line

__all__ = [
    "FIGURE_LABELS",
    "PLOT_EXTRA",
    "ComparisonRuns",
    "Plottable",
    "RANK_FIGURES",
    "RankLine",
    "RanksPlot",
    "Streams",
    "plot_comparison",
    "plot_ranks",
    "plot_recording",
    "rank_labels",
    "require_matplotlib",
    "times_of",
]


class Plottable(Protocol):
    """What a plot reads of a recording: ``unimem.observe.recording.Recording`` is one (named here by
    what it offers, so that the module that keeps recordings may import this one, not the reverse)."""

    @property
    def samples(self) -> list[Sample]: ...

    @property
    def marks(self) -> list[Mark]: ...

    @property
    def meta(self) -> dict[str, Any]: ...

    @property
    def start_time(self) -> float | None: ...

    @property
    def gaps(self) -> list[tuple[float, str]]: ...


class ComparisonRuns(Protocol):
    """What a comparison's chart reads: ``unimem.compare.harness.Comparison`` is one (named here by
    what it offers, so that compare may read its files through this folder, never the reverse)."""

    @property
    def results(self) -> list[dict[str, Any]]: ...

    @property
    def machine(self) -> dict[str, Any]: ...

    @property
    def has_gpu(self) -> bool: ...

    @property
    def times_comparable(self) -> bool: ...

    @property
    def configs(self) -> list[str]: ...


PLOT_EXTRA = "pip install 'unimem[plot]'"


def require_matplotlib(what: str = "plot") -> None:
    """Raise ``BackendUnavailable`` naming the extra when matplotlib is not installed."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise BackendUnavailable(f"{what}: matplotlib is not installed; {PLOT_EXTRA}")


# The figure drawn per rank when none is asked for: the first every recording knows, in this
# order (what the GPU holds for the process, then the framework's view, then the host's).
RANK_FIGURES = ("process_used", "allocated", "reserved", "device_used", "host_rss")
FIGURE_LABELS = {
    "process_used": "process memory (NVML)",
    "allocated": "allocated (framework)",
    "reserved": "reserved (framework pool)",
    "device_used": "device used (NVML)",
    "host_rss": "host RSS",
    "peak": "peak per step",
    "host_peak": "host peak per step",
}
_RANK_IN_NAME = re.compile(r"\.rank(\d+)$")
_MARK_FONT = 7  # points: a mark's label, upright beside its line
_LABEL_CHARS = 80  # a mark's label drawn: more would not fit the height of any plot
_TITLE_CHARS = 200  # a title made from a recording's metadata
_LABEL_ROOM = 1.4  # a label's column is this many times its text's height: neighbours stay readable
_MOST_BYTES = 1 << 60  # no machine holds an exbibyte: a figure above it is a damaged recording


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
    recording: Plottable, target: Path, *, title: str | None, figsize: tuple[float, float], dpi: int
) -> None:
    """Write ``recording``'s PNG timeline to ``target`` (a path already checked); see ``Recording.plot``.

    Lines are thinned to the image's width (``unimem.observe.thinning``): a million samples draw
    as fast as a few thousand, every peak kept.

    Raises:
        BackendUnavailable: matplotlib is not installed.
        ConfigError: A figure of the recording is beyond any machine's memory (a damaged file).
    """
    require_matplotlib("plot")  # one check for every plot, made before any part of matplotlib is imported
    _recording_figure(recording, title, figsize, dpi).savefig(target, format="png", dpi=dpi)


def _recording_figure(recording: Plottable, title: str | None, figsize: tuple[float, float], dpi: int) -> Any:
    """The matplotlib figure of one recording's timeline."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    start = _origin([recording])
    columns = _columns(figsize, dpi)
    streams = Streams(recording.samples, columns)
    limit = recording.meta.get("limit")
    limit = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
    shown = list(_RECORDING_LINES)
    if not streams.known("process_used") and not streams.known("allocated"):  # no GPU figures: the host's
        shown.append(("host_rss", "host RSS (no GPU figures)", "-"))
    biggest = max(streams.biggest([name for name, _, _ in shown]) or 0, _within_reason(limit or 0, "its cap"))
    scale, unit = _unit(biggest)
    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    drawn = sum(_draw_line(ax, streams, name, label, style, start, scale, columns) for name, label, style in shown)
    if limit is not None:
        ax.axhline(limit / scale, color="black", linestyle="-.", linewidth=1, label=f"cap {limit / scale:.2f} {unit}")
    gaps = [time - start for time, _ in recording.gaps]
    if gaps:
        # One collection, thinned to a line per pixel column: thousands of failed readings plot fast.
        ax.vlines(
            _one_per_column(gaps, columns),
            0,
            1,
            transform=ax.get_xaxis_transform(),
            color="orange",
            alpha=0.6,
            linewidth=1,
            label=f"gaps ({len(gaps)} failed readings)",
        )
    _draw_marks(ax, [(mark.time - start, mark.label, "grey") for mark in recording.marks], columns)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel(unit)
    backend = recording.meta.get("backend") or "no framework"
    ax.set_title(title or shortened(f"unimem: {backend}, device {recording.meta.get('device', 0)}", _TITLE_CHARS))
    ax.grid(True, alpha=0.3)
    top = biggest / scale
    ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)  # headroom: a flat line must not sit on the frame
    if drawn or limit is not None:
        ax.legend(loc="lower right", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no figures known", ha="center", va="center", transform=ax.transAxes)
    return fig


def _origin(recordings: Sequence[Plottable]) -> float:
    """Where the time axis starts: the earliest start of the recordings (0 when none is known), checked
    by ``axis_origin`` (a damaged recording's span is a ``ConfigError``, never matplotlib's error)."""
    return axis_origin([(recording.meta.get("started"), times_of(recording)) for recording in recordings])


def times_of(recording: Plottable) -> list[float]:
    """The times of a recording's samples and marks (a gap is a sample)."""
    return [*map(attrgetter("time"), recording.samples), *map(attrgetter("time"), recording.marks)]


def _columns(figsize: tuple[float, float], dpi: int) -> int:
    """The image's width in pixels: the buckets a line is thinned to."""
    return max(1, int(figsize[0] * dpi))


class Streams:
    """A recording's samples split by stream (``Sample.source``), each figure's line read and
    thinned to ``columns`` once.

    Each figure comes from one stream (the framework's counters, the NVML sampler, the step
    boundaries); the other streams' samples leave it None. Every pass over the samples here is a
    ``map``, ``compress`` or list method, run in C: a million samples cost tenths of a second.
    """

    def __init__(self, samples: Sequence[Any], columns: int) -> None:
        sources = list(map(attrgetter("source"), samples))
        distinct = list(dict.fromkeys(sources))
        self._rows: dict[Any, list[Any]] = (
            {distinct[0]: list(samples)}
            if len(distinct) == 1
            else {source: list(compress(samples, map(eq, sources, repeat(source)))) for source in distinct}
        )
        self._columns = columns
        self._lines: dict[str, tuple[list[float], list[Any], int]] = {}
        self._fields: dict[tuple[Any, str], list[Any]] = {}

    def _field(self, source: Any, name: str) -> list[Any]:
        """Field ``name`` (``time``, ``error``: read for every line) of stream ``source``'s samples."""
        if (source, name) not in self._fields:
            self._fields[source, name] = list(map(attrgetter(name), self._rows[source]))
        return self._fields[source, name]

    def line(self, name: str) -> tuple[list[float], list[Any]]:
        """Figure ``name``'s thinned ``(times, values)``, None at a failed reading; empty when never known.

        Interleaved, the other streams' Nones would break the line at every point (the line
        would vanish), so only the streams that carry the figure count, and only their failed
        readings break the line.
        """
        if name not in self._lines:
            times: list[float] = []
            values: list[Any] = []
            count = 0
            for source, rows in self._rows.items():
                stream = list(map(attrgetter(name), rows))
                unknown = stream.count(None)
                if unknown == len(stream):
                    continue  # another stream's figure
                count += len(stream) - unknown
                if not unknown:
                    times += self._field(source, "time")
                    values += stream
                    continue
                failed = map(is_not, self._field(source, "error"), repeat(None))
                kept = list(map(or_, map(is_not, stream, repeat(None)), failed))
                times += compress(self._field(source, "time"), kept)
                values += compress(stream, kept)
            self._lines[name] = (*thin_line(times, values, self._columns), count)
        times, values, _ = self._lines[name]
        return times, values

    def known(self, name: str) -> int:
        """How many samples know figure ``name``."""
        self.line(name)
        return self._lines[name][2]

    def biggest(self, names: Sequence[str]) -> int | None:
        """The largest value of these figures (a thinned line keeps each bucket's highest); None
        when none is ever known.

        Raises:
            ConfigError: A value is beyond any machine's memory (a damaged recording).
        """
        found = [max(filter(partial(is_not, None), self.line(name)[1]), default=None) for name in names]
        known = [value for value in found if value is not None]
        return _within_reason(max(known), "a figure") if known else None


def _within_reason(count: Any, what: str) -> int:
    """``count`` of bytes, refused when no machine could hold it (the recording is damaged)."""
    if count > _MOST_BYTES:
        raise ConfigError("recording", f"{what} is beyond any machine's memory (over 1 EiB): the recording is damaged")
    return int(count)


def _draw_line(
    ax: Any,
    recording: Plottable | Streams,
    name: str,
    label: str,
    style: str,
    start: float,
    scale: int,
    columns: int = 2000,
) -> int:
    """One figure of a recording as a line on ``ax``, thinned to ``columns``; 1 if drawn, 0 if never known."""
    streams = recording if isinstance(recording, Streams) else Streams(recording.samples, columns)
    times, values = streams.line(name)
    if not times:
        return 0
    # A failed reading becomes NaN: matplotlib breaks the line there, which is what a gap is.
    ax.plot(
        [time - start for time in times],
        [math.nan if value is None else value / scale for value in values],
        style,
        label=label,
        linewidth=1.2,
    )
    return 1


def _one_per_column(positions: list[float], columns: int) -> list[float]:
    """The positions of vertical lines, one per pixel column: more would draw the same image."""
    finite = [p for p in positions if math.isfinite(p)]
    if len(finite) <= columns:
        return finite
    return [finite[i] for i in spaced(finite, (max(finite) - min(finite)) / columns)]


def _draw_marks(ax: Any, marks: list[tuple[float, str, Any]], columns: int) -> None:
    """Marks ``(x, label, colour)``: the labels that fit side by side, each beside a dotted
    vertical line; when some do not fit, every mark is a tick along the top and the legend says
    how many are labelled (thousands of full-height lines would hide the figures)."""
    if not marks:
        return
    ticks = _vertical_lines(ax, marks, range(len(marks)), columns, 0.97, linestyle="-", linewidth=0.8)
    fig = ax.get_figure()
    left, right = ax.get_xlim()  # after the ticks: the axis spans every mark
    width = ax.get_position().width * fig.get_figwidth() * fig.dpi
    room = _LABEL_ROOM * _MARK_FONT * fig.dpi / 72 * (right - left) / max(width, 1.0)
    labelled = spaced([x for x, _, _ in marks], room)
    _vertical_lines(ax, marks, labelled, columns, 0.0, linestyle=":", linewidth=1, alpha=0.8)
    for index in labelled:
        x, text, colour = marks[index]
        _mark_text(ax, x, text, colour)
    if len(labelled) == len(marks):
        for collection in ticks:
            collection.remove()
    else:
        ax.plot([], [], color="grey", linestyle="-", label=f"{len(marks)} marks ({len(labelled)} labelled)")


def _vertical_lines(
    ax: Any, marks: list[tuple[float, str, Any]], chosen: Sequence[int], columns: int, low: float, **style: Any
) -> list[Any]:
    """The chosen marks as vertical lines from ``low`` (a fraction of the axes' height) to the
    top: one collection per colour, one line per pixel column."""
    colours: dict[Any, list[float]] = {}
    for index in chosen:
        x, _, colour = marks[index]
        colours.setdefault(colour, []).append(x)
    return [
        ax.vlines(_one_per_column(xs, columns), low, 1, transform=ax.get_xaxis_transform(), color=colour, **style)
        for colour, xs in colours.items()
    ]


def _mark_text(ax: Any, x: float, text: str, colour: Any) -> None:
    """A mark's label, upright beside its line at ``x``, from the top of the axes."""
    ax.annotate(
        shortened(text, _LABEL_CHARS),
        xy=(x, 1.0),
        xycoords=("data", "axes fraction"),
        xytext=(2, -2),
        textcoords="offset points",
        rotation=90,
        va="top",
        fontsize=_MARK_FONT,
        color=colour,
        annotation_clip=True,
    )


def _unit(biggest: int) -> tuple[int, str]:
    """The unit the axis counts in: the largest binary unit not above ``biggest``."""
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if biggest >= scale:
            return scale, unit
    return 1, "bytes"


# --- several recordings, one per rank ----------------------------------------------------------


def _rank_of(recording: Plottable, file: str | None) -> tuple[int | None, str | None]:
    """The rank and, when it is not in the metadata, a note on where it came from."""
    rank = recording.meta.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool):
        return rank, None
    found = _RANK_IN_NAME.search(Path(file).stem) if file else None
    if found:
        return int(found.group(1)), f"{file}: no rank in its metadata; rank {found.group(1)} read from its name"
    return None, f"{file or 'a recording'}: no rank in its metadata or its name; labelled by its name"


def rank_labels(loaded: Sequence[tuple[Plottable, str | None]]) -> tuple[list[tuple[str, int | None]], list[str]]:
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


def _choose_figure(loaded: Sequence[tuple[Plottable, str | None]], figure: str | None) -> str | None:
    if figure is not None:
        if figure not in FIGURE_LABELS:
            raise ConfigError("figure", f"unknown figure {figure!r}; pick one of {', '.join(FIGURE_LABELS)}")
        return figure

    def known(recording: Plottable, name: str) -> bool:
        return any(getattr(s, name) is not None for s in recording.samples)

    for pick in (all, any):
        for name in RANK_FIGURES:
            if pick(known(recording, name) for recording, _ in loaded):
                return name
    return None


def _ranks_figure(
    loaded: Sequence[tuple[Plottable, str | None]],
    figure: str | None,
    title: str | None,
    figsize: tuple[float, float],
    dpi: int,
) -> tuple[Any, str | None, list[RankLine], list[str]]:
    """The matplotlib figure of every recording's line on one wall-clock axis, and what was drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    name = _choose_figure(loaded, figure)
    labelled, notes = rank_labels(loaded)
    order = sorted(range(len(loaded)), key=lambda i: (labelled[i][1] is None, labelled[i][1] or 0, i))
    origin = _origin([recording for recording, _ in loaded])  # every line on the same clock
    columns = _columns(figsize, dpi)
    streams = [Streams(recording.samples, columns) for recording, _ in loaded]
    biggest = max((each.biggest([name]) or 0 for each in streams), default=0) if name else 0
    scale, unit = _unit(biggest)
    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    drawn: list[RankLine] = []
    marks: list[tuple[float, str, Any]] = []
    for i in order:
        recording, file = loaded[i]
        label, rank = labelled[i]
        count = streams[i].known(name) if name else 0
        drawn.append(RankLine(label, rank, file, count))
        if not name or not count:
            if name:
                notes.append(f"{label} has no {name} figures: no line")
            continue
        _draw_line(ax, streams[i], name, label, "-", origin, scale, columns)
        colour = ax.lines[-1].get_color()
        marks += [(mark.time - origin, f"{label}: {mark.label}", colour) for mark in recording.marks]
    _draw_marks(ax, marks, columns)
    ax.set_xlabel("seconds since the earliest start (wall clock)")
    ax.set_ylabel(f"{FIGURE_LABELS.get(name, name) if name else 'memory'}, {unit}")
    what = "ranks" if all(line.rank is not None for line in drawn) else "recordings"
    ax.set_title(title or f"unimem: {len(loaded)} {what}, {FIGURE_LABELS.get(name, name) if name else 'no figures'}")
    ax.grid(True, alpha=0.3)
    top = biggest / scale
    ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)  # from 0, as one recording's plot: heights compare by eye
    if any(not str(line.get_label()).startswith("_") for line in ax.lines):
        ax.legend(loc="lower right", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no figures known", ha="center", va="center", transform=ax.transAxes)
    return fig, name, drawn, notes


def plot_ranks(
    loaded: Sequence[tuple[Plottable, str | None]],
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


def plot_comparison(comparison: ComparisonRuns, path: str | os.PathLike[str]) -> None:
    """A PNG of a ``unimem compare`` run (``unimem.compare.harness.Comparison``): memory (device
    peak, or host peak RSS without a GPU) and step time per run, one column per workload.

    Raises ``BackendUnavailable`` naming the ``plot`` extra when matplotlib is not installed.
    """
    require_matplotlib("compare plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({r["workload"] for r in comparison.results})
    fig, axes = plt.subplots(2, len(workloads), figsize=(6.5 * len(workloads), 7), squeeze=False)
    memory_key = "process_peak" if comparison.has_gpu else "host_peak_rss"
    memory_label = "process peak on the GPU (NVML), GiB" if comparison.has_gpu else "host peak RSS, GiB (no GPU here)"
    frameworks = sorted({r["framework"] for r in comparison.results})
    configs = comparison.configs
    width = 0.8 / max(1, len(frameworks))
    for col, workload in enumerate(workloads):
        for row, (key, label, scale) in enumerate(
            [(memory_key, memory_label, 2**30), ("step_ms", "median step time, ms", 1)]
        ):
            ax = axes[row][col]
            for i, fw in enumerate(frameworks):
                values = []
                for config in configs:
                    match = [
                        r
                        for r in comparison.results
                        if r["framework"] == fw and r["workload"] == workload and r["config"] == config
                    ]
                    value = match[0].get(key) if match and match[0].get("ok") else None
                    values.append(float("nan") if value is None else value / scale)
                ax.bar([x + i * width for x in range(len(configs))], values, width, label=fw)
            ax.set_xticks([x + width * (len(frameworks) - 1) / 2 for x in range(len(configs))], configs)
            ax.set_ylabel(label)
            ax.set_title(f"{workload}")
            ax.legend(fontsize=8)
    device = comparison.machine.get("device", "?")
    title = f"unimem compare · {device} · size {comparison.machine.get('size', '?')}"
    if not comparison.times_comparable:
        title += "\nstep times not comparable: loaded machine or widely spread steps (see the notes)"
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
