"""Plots are an extra: matplotlib (and numpy, pillow, fonttools with it) stays out of
training environments that never draw. A plot request without it says what to install."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unimem.errors import BackendUnavailable, ConfigError
from unimem.observe.recording import Recording, _mark_text, _target, _unit, load_recording

__all__ = ["PLOT_EXTRA", "RANK_FIGURES", "RankLine", "RanksPlot", "plot_recordings", "require_matplotlib"]

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


def _loaded(recordings: Sequence[Any]) -> list[tuple[Recording, str | None]]:
    if isinstance(recordings, (str, os.PathLike, Recording)) or not recordings:
        raise ConfigError("recordings", "expected a list of recordings or their files, e.g. [r0, r1]")
    out: list[tuple[Recording, str | None]] = []
    for item in recordings:
        if isinstance(item, Recording):
            out.append((item, None))
        elif isinstance(item, (str, os.PathLike)):
            out.append((load_recording(item), Path(item).name))
        else:
            raise ConfigError("recordings", f"expected Recording objects or paths, got {type(item).__name__}")
    return out


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
        recording._draw(ax, name, None, label, "-", origin, scale)
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


def plot_recordings(
    recordings: Sequence[Recording | str | os.PathLike[str]],
    path: str | os.PathLike[str],
    *,
    figure: str | None = None,
    title: str | None = None,
    figsize: tuple[float, float] = (10.0, 5.0),
    dpi: int = 100,
) -> RanksPlot:
    """Several recordings (one per rank) as one PNG: one line per rank on one wall-clock axis.

    Each line is labelled by its rank, read from the recording's metadata (``monitor()`` writes
    it under a launcher), else from a ``.rankN`` in its file name (``unimem.rank_path``), else
    by the file's name. Samples carry Unix times, so the lines are aligned on the wall clock:
    x is seconds since the earliest start. Marks are dotted lines in their rank's colour, gaps
    break the line.

    Args:
        recordings: ``Recording`` objects, or the JSON/CSV files they were saved to.
        path: The PNG file to write (``.png``), in a folder that exists.
        figure: The ``Sample`` field drawn per rank; None (default): the first of
            ``process_used``, ``allocated``, ``reserved``, ``device_used``, ``host_rss`` that
            every recording has (else that any has).
        title: The plot's title; None (default): how many recordings and the figure.
        figsize: Width and height in inches (default ``(10.0, 5.0)``).
        dpi: Pixels per inch (default 100).

    Returns:
        The PNG's path, the figure drawn, each line's label, rank and file, and notes on what
        did not match between the recordings.

    Raises:
        ConfigError: ``path`` is not a PNG path in a folder that exists, ``recordings`` is not a
            list of recordings or files, a file is not a recording, or ``figure`` is unknown.
        BackendUnavailable: matplotlib is not installed.

    Example:
        ```python
        # each rank: m.to_json(unimem.rank_path("memory.json"))
        unimem.plot_recordings(["memory.rank0.json", "memory.rank1.json"], "ranks.png")
        ```
    """
    target = _target(path, ".png")
    loaded = _loaded(recordings)
    require_matplotlib("plot_recordings")
    fig, name, drawn, notes = _ranks_figure(loaded, figure, title, figsize, dpi)
    fig.savefig(target, format="png", dpi=dpi)
    return RanksPlot(target, name, tuple(drawn), tuple(notes))
