"""A memory timeline's data and files: samples, marks, the CSV/JSON round trip, the PNG's path.

``monitor()``, ``MemoryHook`` and the Keras callback all produce a ``Recording``;
``load_recording(path)`` reads one back from the JSON or CSV it was saved to.
Figures unimem could not know are ``None`` in memory, empty cells in CSV and
``null`` in JSON, never 0. The plots are drawn by ``unimem.observe.plotting``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unimem.errors import ConfigError
from unimem.observe.plotting import RanksPlot, plot_ranks, plot_recording
from unimem.sizes import format_bytes

__all__ = ["BoundedSeries", "Mark", "Recorder", "Recording", "Sample", "load_recording", "plot_recordings"]

FORMAT = "unimem.recording/1"

# Where a sample came from.
SOURCE_FRAMEWORK = "framework"  # the framework's allocator counters, read in this process
SOURCE_DEVICE = "device"  # NVML (device and this process) and host RSS, read by the sampler process
SOURCE_STEP = "step"  # a training step boundary (MemoryHook, Keras callback)
CSV_META_PREFIX = "# unimem.observe.recording "  # the first line of a CSV: the recording's metadata as JSON


@dataclass(frozen=True)
class Sample:
    """One reading. ``time`` is Unix time; byte counts are int or None (unknown).

    ``peak`` is the highest ``allocated`` since the previous step sample (step
    samples only); ``peak_exact`` is False when it is a lower bound (JAX); ``host_peak``
    is the same for the process's resident host memory.
    ``error`` is set when the reading failed: the sample is a gap in the data.
    Each source fills only the figures it reads; the others stay None.

    Attributes:
        time (float): When it was read (Unix time, seconds).
        source (str): ``"framework"`` (allocator counters, read in this process),
            ``"device"`` (NVML and host RSS, read by the sampler process) or ``"step"``
            (a training step boundary: ``MemoryHook``, the Keras callback).
        allocated (int | None): Bytes in live tensors/arrays.
        reserved (int | None): Bytes the framework's pool holds.
        peak (int | None): Highest ``allocated`` since the previous step sample, in bytes
            (step samples only).
        peak_exact (bool | None): False when ``peak`` is a lower bound (JAX).
        process_used (int | None): NVML's bytes for this process on the device.
        device_used (int | None): Bytes in use on the whole device.
        device_total (int | None): The device's total bytes.
        host_rss (int | None): This process's resident host memory (resident set size), in bytes.
        host_peak (int | None): Highest ``host_rss`` since the previous step sample, in bytes
            (step samples only; a lower bound where the host's high-water mark cannot be reset).
        step (int | None): The step number (step samples only).
        error (str | None): Why the reading failed; None for a good reading.
    """

    time: float
    source: str
    allocated: int | None = None
    reserved: int | None = None
    peak: int | None = None
    peak_exact: bool | None = None
    process_used: int | None = None
    device_used: int | None = None
    device_total: int | None = None
    host_rss: int | None = None
    host_peak: int | None = None
    step: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Mark:
    """An event (``monitor.mark("epoch 2")``) with the framework's counters at that moment.

    Attributes:
        time (float): When it was marked (Unix time, seconds).
        label (str): The event's name.
        allocated (int | None): Bytes in live tensors/arrays then; None if unknown.
        reserved (int | None): Bytes the framework's pool held then; None if unknown.
    """

    time: float
    label: str
    allocated: int | None = None
    reserved: int | None = None


SAMPLE_FIELDS = [f.name for f in dataclasses.fields(Sample)]
_MARK_FIGURES = ("allocated", "reserved")  # the figures a mark carries
_INT_FIELDS = {
    "allocated",
    "reserved",
    "peak",
    "process_used",
    "device_used",
    "device_total",
    "host_rss",
    "host_peak",
    "step",
}


def _primary(sample: Sample) -> int:
    """The figure decimation keeps the maximum of (its peaks must survive)."""
    for value in (sample.peak, sample.allocated, sample.process_used, sample.reserved, sample.device_used):
        if value is not None:
            return value
    host = sample.host_peak if sample.host_peak is not None else sample.host_rss
    return -1 if host is None else host


def _keep(a: Sample, b: Sample) -> Sample:
    """Of two neighbours, the one decimation keeps: a gap first (gaps must stay visible), then the higher."""
    if (a.error is None) != (b.error is None):
        return a if a.error is not None else b
    return a if _primary(a) >= _primary(b) else b


class BoundedSeries:
    """A list of samples that never holds more than ``capacity`` of them.

    When full, neighbouring pairs are merged (keeping the gap, else the higher
    reading, so peaks survive) and from then on every ``stride`` incoming samples
    are merged into one: resolution stays uniform over the whole run and halves
    each time the series fills, memory stays fixed.
    """

    def __init__(self, capacity: int, keep: Callable[[Any, Any], Any] = _keep) -> None:
        if capacity < 2:
            raise ConfigError("max_samples", f"expected at least 2, got {capacity}")
        self.capacity = capacity
        self.stride = 1
        self._keep = keep
        self._items: list[Any] = []
        self._pending: Any = None
        self._pending_count = 0
        self.seen = 0

    def add(self, item: Any) -> None:
        self.seen += 1
        self._pending = item if self._pending is None else self._keep(self._pending, item)
        self._pending_count += 1
        if self._pending_count < self.stride:
            return
        self._items.append(self._pending)
        self._pending, self._pending_count = None, 0
        if len(self._items) >= self.capacity:
            items = self._items
            merged = [self._keep(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]
            if len(items) % 2:
                merged.append(items[-1])
            self._items = merged
            self.stride *= 2

    def items(self) -> list[Any]:
        return [*self._items, self._pending] if self._pending is not None else list(self._items)

    def __len__(self) -> int:
        return len(self._items) + (self._pending is not None)


def counted(count: int, noun: str) -> str:
    """``"1 sample"``, ``"3 samples"``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


# The peaks a recording's repr names, where known: the device's view, the framework's, the host's.
_SUMMARY_PEAKS = (
    ("process_used", "process peak (NVML)"),
    ("allocated", "peak allocated"),
    ("host_rss", "host peak RSS"),
)


def _num(value: float) -> str:
    return repr(float(value))  # shortest text that reads back as the same float


@dataclass
class Recording:
    """Samples and marks of one run, with what is known about it.

    ``monitor()``, ``MemoryHook`` and the Keras callback all produce one;
    ``load_recording(path)`` reads one back from the JSON or CSV it was saved to.
    Figures unimem could not know are ``None`` in memory, empty cells in CSV and
    ``null`` in JSON, never 0.

    Attributes:
        samples (list[Sample]): The readings, in time order.
        marks (list[Mark]): The events marked, in order.
        meta (dict[str, Any]): ``backend``, ``device``, ``interval``, ``limit`` (the cap,
            bytes), ``device_total``, ``started``/``stopped`` (Unix time),
            ``decimation`` and ``notes`` (what was unavailable and why, NVML errors seen).

    Example:
        ```python
        recording = unimem.load_recording("memory.json")
        print(unimem.format_bytes(recording.peak("allocated")))
        times, used = recording.series("process_used")
        recording.plot("memory.png", title="epoch 1")
        ```
    """

    samples: list[Sample] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        """A summary, not the samples: ``Recording(backend='torch', device=0, 1200 samples over
        12.0 s, 3 marks, peak allocated 1.20 GiB)``; the samples are in ``samples``."""
        parts = [f"backend={self.meta.get('backend')!r}", f"device={self.meta.get('device')!r}"]
        if self.meta.get("rank") is not None:
            parts.append(f"rank={self.meta['rank']!r}")
        span = self._span()
        parts.append(counted(len(self.samples), "sample") + (f" over {span:.1f} s" if span is not None else ""))
        parts.append(counted(len(self.marks), "mark"))
        gaps = sum(1 for s in self.samples if s.error is not None)
        if gaps:
            parts.append(counted(gaps, "gap"))
        for name, label in _SUMMARY_PEAKS:
            value = self.peak(name)
            if value is not None:
                parts.append(f"{label} {format_bytes(value)}")
        return f"Recording({', '.join(parts)})"

    def _span(self) -> float | None:
        """Seconds the run lasted: ``started`` to ``stopped`` when known, else first to last reading."""
        started, stopped = self.meta.get("started"), self.meta.get("stopped")
        if isinstance(started, (int, float)) and isinstance(stopped, (int, float)):
            return float(stopped) - float(started)
        times = [s.time for s in self.samples] + [m.time for m in self.marks]
        return max(times) - min(times) if len(times) > 1 else None

    # --- views ------------------------------------------------------------------
    @property
    def start_time(self) -> float | None:
        """When the run started (Unix time): ``meta["started"]``, else the earliest sample
        or mark; None for an empty recording."""
        started = self.meta.get("started")
        if isinstance(started, (int, float)):
            return float(started)
        times = [s.time for s in self.samples] + [m.time for m in self.marks]
        return min(times) if times else None

    @property
    def gaps(self) -> list[tuple[float, str]]:
        """``(time, error)`` of every sample that failed (a gap in the data)."""
        return [(s.time, s.error) for s in self.samples if s.error is not None]

    @property
    def notes(self) -> list[str]:
        """What was unavailable during the run and why (``meta["notes"]``)."""
        return list(self.meta.get("notes", []))

    def series(self, name: str, source: str | None = None) -> tuple[list[float], list[int | None]]:
        """``(times, values)`` of one figure (``"allocated"``, ``"process_used"``, ...).

        Args:
            name: A ``Sample`` field (``"allocated"``, ``"reserved"``, ``"peak"``,
                ``"process_used"``, ``"device_used"``, ``"host_rss"``, ...).
            source: Only samples of this source (``"framework"``, ``"device"``,
                ``"step"``); None (default): every sample.

        Returns:
            The samples' Unix times and the figure's values (None where unknown).

        Raises:
            ConfigError: ``name`` is not a ``Sample`` field.
        """
        if name not in SAMPLE_FIELDS:
            raise ConfigError("name", f"unknown figure {name!r}; known: {', '.join(SAMPLE_FIELDS)}")
        rows = [s for s in self.samples if source is None or s.source == source]
        return [s.time for s in rows], [getattr(s, name) for s in rows]

    def peak(self, name: str = "allocated") -> int | None:
        """Highest value of one figure over the recording (None if never known).

        Args:
            name: A ``Sample`` field (default ``"allocated"``).

        Returns:
            The highest known value, or None if the figure was never known.

        Raises:
            ConfigError: ``name`` is not a ``Sample`` field.
        """
        values = [v for v in self.series(name)[1] if v is not None]
        return max(values) if values else None

    def peak_between(self, start: str, end: str | None = None, field: str = "allocated") -> int | None:
        """Highest value of one figure between two marks: an epoch's peak from one monitor.

        The window runs from the first mark labelled ``start`` to the first mark labelled
        ``end`` after it, both included (to the recording's end when ``end`` is None). Samples
        in it count, and marks in it for the figures a mark carries (``allocated``,
        ``reserved``). A figure read at intervals (the monitor's) can miss a spike between two
        readings; a step sample's ``peak`` and ``host_peak`` cover its whole step.

        Args:
            start: The label of the mark that opens the window (``"epoch 1"``).
            end: The label of the mark that closes it; None (default): the recording's end.
            field: A ``Sample`` field (default ``"allocated"``; ``"host_rss"`` for host memory).

        Returns:
            The highest known value in the window, in bytes; None if it was never known there.

        Raises:
            ConfigError: ``field`` is not a ``Sample`` field, no mark is labelled ``start``, or
                none labelled ``end`` follows it (``exc.parameter`` names which); the message
                lists the labels there are.

        Example:
            ```python
            with unimem.monitor(0.01) as m:
                for epoch in range(3):
                    m.mark(f"epoch {epoch}")
                    train_one_epoch()
                m.mark("done")
            m.recording.peak_between("epoch 1", "epoch 2", field="host_rss")
            ```
        """
        if field not in SAMPLE_FIELDS:
            raise ConfigError("field", f"unknown figure {field!r}; known: {', '.join(SAMPLE_FIELDS)}")
        marks = sorted(self.marks, key=lambda m: m.time)
        labels = ", ".join(repr(m.label) for m in marks) or "none"
        opening = next((m for m in marks if m.label == start), None)
        if opening is None:
            raise ConfigError("start", f"no mark is labelled {start!r}; the marks are: {labels}")
        closing = None
        if end is not None:
            closing = next((m for m in marks if m.label == end and m.time >= opening.time and m is not opening), None)
            if closing is None:
                raise ConfigError("end", f"no mark labelled {end!r} follows {start!r}; the marks are: {labels}")
        last = closing.time if closing is not None else math.inf
        values = [getattr(s, field) for s in self.samples if opening.time <= s.time <= last]
        if field in _MARK_FIGURES:
            values += [getattr(m, field) for m in marks if opening.time <= m.time <= last]
        known = [v for v in values if v is not None]
        return max(known) if known else None

    # --- saving -----------------------------------------------------------------
    def to_json(self, path: str | os.PathLike[str]) -> Path:
        """Everything (samples, marks, meta) as JSON; ``load_recording`` reads it back.

        Args:
            path: The file to write, in a folder that exists, named with the format's suffix.

        Returns:
            The path written.

        Raises:
            ConfigError: ``path`` is not a file path, is a directory, lacks the format's suffix, or its
                folder does not exist.
        """
        target = _target(path, ".json")
        data = {
            "format": FORMAT,
            "meta": self.meta,
            "samples": [dataclasses.asdict(s) for s in self.samples],
            "marks": [dataclasses.asdict(m) for m in self.marks],
        }
        target.write_text(json.dumps(data, indent=1, allow_nan=False), encoding="utf-8")
        return target

    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """Samples and marks as one table (a mark is a row with ``source=mark`` and a ``label``).

        Empty cells are unknown figures. The first line is a comment holding ``meta``
        (backend, device, cap, interval, notes) as JSON, which ``load_recording`` reads back.

        Args:
            path: The file to write, in a folder that exists, named with the format's suffix.

        Returns:
            The path written. Columns: ``time``, ``elapsed`` (seconds since the start),
            the ``Sample`` fields, ``label``; rows in time order.

        Raises:
            ConfigError: ``path`` is not a file path, is a directory, lacks the format's suffix, or its
                folder does not exist.
        """
        target = _target(path, ".csv")
        columns = ["time", "elapsed", *SAMPLE_FIELDS[1:], "label"]
        start = self.start_time or 0.0
        rows: list[tuple[float, dict[str, str]]] = []
        for s in self.samples:
            row = {name: _cell(getattr(s, name)) for name in SAMPLE_FIELDS}
            row.update(time=_num(s.time), elapsed=f"{s.time - start:.6f}", label="")
            rows.append((s.time, row))
        for m in self.marks:
            row = {name: "" for name in columns}
            row.update(
                time=_num(m.time),
                elapsed=f"{m.time - start:.6f}",
                source="mark",
                label=m.label,
                allocated=_cell(m.allocated),
                reserved=_cell(m.reserved),
            )
            rows.append((m.time, row))
        rows.sort(key=lambda pair: pair[0])
        with target.open("w", newline="", encoding="utf-8") as handle:
            # The metadata (backend, device, cap, interval, notes) on a first comment line, so a
            # recording read back from CSV still names its framework and draws its cap.
            handle.write(f"{CSV_META_PREFIX}{json.dumps(self.meta, default=str)}\n")
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(row for _, row in rows)
        return target

    def plot(
        self,
        path: str | os.PathLike[str],
        *,
        title: str | None = None,
        figsize: tuple[float, float] = (10.0, 5.0),
        dpi: int = 100,
    ) -> Path:
        """A PNG timeline: allocated, reserved, NVML process and device lines, host RSS
        when nothing else is known, the cap, marks as labelled vertical lines, gaps
        as breaks. The image is ``figsize × dpi`` pixels (1000 × 500 by default).

        Uses matplotlib's Agg canvas directly: no pyplot, no global backend change.

        Args:
            path: The PNG file to write (``.png``), in a folder that exists.
            title: The plot's title; None (default): the backend and device.
            figsize: Width and height in inches (default ``(10.0, 5.0)``).
            dpi: Pixels per inch (default 100).

        Returns:
            The path written.

        Raises:
            ConfigError: ``path`` is not a file path, is a directory, lacks the format's suffix, or its
                folder does not exist.
            BackendUnavailable: matplotlib is not installed.
        """
        target = _target(path, ".png")
        plot_recording(self, target, title=title, figsize=figsize, dpi=dpi)
        return target


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _target(path: object, suffix: str) -> Path:
    """The file to write: its folder must exist (a typo must not create folders anywhere) and
    its suffix must say what it holds (a PNG under a .json name misleads every reader)."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ConfigError("path", f"expected a file path, got {path!r}")
    target = Path(path)
    if target.is_dir():
        raise ConfigError("path", f"{target} is a directory; pass a file name")
    if target.suffix.lower() != suffix:
        raise ConfigError("path", f"{target} would hold {suffix[1:].upper()}; name it with the {suffix} suffix")
    if not target.parent.is_dir():
        raise ConfigError("path", f"{target.parent} does not exist; create the folder first")
    return target


def _parse_cell(name: str, text: str) -> Any:
    if text == "":
        return None
    if name in _INT_FIELDS:
        return int(text)
    if name == "time":
        return float(text)
    if name == "peak_exact":
        return text == "true"
    return text


def load_recording(path: str | os.PathLike[str]) -> Recording:
    """Read a recording saved with ``to_json`` or ``to_csv`` (by file suffix).

    A ``.csv`` file is read as CSV (samples and marks; its ``meta`` is empty, since
    CSV does not keep it); any other suffix as JSON.

    Args:
        path: The file ``to_json`` or ``to_csv`` wrote.

    Returns:
        The recording, with unknown figures as None.

    Raises:
        ConfigError: ``path`` is not a file, is not a unimem JSON recording (no
            ``"format"``), or is a CSV without ``time`` and ``source`` columns.

    Example:
        ```python
        recording = unimem.load_recording("memory.json")
        recording.plot("memory.png")
        ```
    """
    source = Path(path)
    if not source.is_file():
        raise ConfigError("path", f"{source} is not a file")
    if source.suffix.lower() == ".csv":
        return _load_csv(source)
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("path", f"{source} is not a JSON recording ({exc}); save one with to_json()") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError("path", f"{source} is not a unimem recording (no 'format': {FORMAT!r})")
    samples = [Sample(**_known(row, SAMPLE_FIELDS)) for row in data.get("samples", [])]
    marks = [Mark(**_known(row, ["time", "label", "allocated", "reserved"])) for row in data.get("marks", [])]
    return Recording(samples, marks, dict(data.get("meta", {})))


def _known(row: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    return {key: value for key, value in row.items() if key in names}


def _load_csv(source: Path) -> Recording:
    samples: list[Sample] = []
    marks: list[Mark] = []
    meta: dict[str, Any] = {}
    with source.open(newline="", encoding="utf-8") as handle:
        first = handle.readline()
        if first.startswith(CSV_META_PREFIX):
            meta = json.loads(first[len(CSV_META_PREFIX) :])
        else:
            handle.seek(0)  # a CSV written without the metadata line
        reader = csv.DictReader(handle)
        missing = {"time", "source"} - set(reader.fieldnames or [])
        if missing:
            raise ConfigError("path", f"{source} is not a unimem CSV (no {', '.join(sorted(missing))} column)")
        for row in reader:
            if row["source"] == "mark":
                marks.append(
                    Mark(
                        float(row["time"]),
                        row.get("label", ""),
                        _parse_cell("allocated", row.get("allocated", "")),
                        _parse_cell("reserved", row.get("reserved", "")),
                    )
                )
                continue
            samples.append(Sample(**{name: _parse_cell(name, row.get(name, "")) for name in SAMPLE_FIELDS}))
    return Recording(samples, marks, meta)


def merge_samples(*streams: Iterable[Sample]) -> list[Sample]:
    """Samples of several streams as one list in time order."""
    merged = [sample for stream in streams for sample in stream]
    merged.sort(key=lambda s: s.time)
    return merged


def _loaded(recordings: Sequence[Any]) -> list[tuple[Recording, str | None]]:
    """Each recording with the name of the file it was read from (None for one passed in)."""
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
    return plot_ranks(loaded, target, figure=figure, title=title, figsize=figsize, dpi=dpi)


class Recorder:
    """What every maker of a ``Recording`` offers (``Monitor``, ``MemoryHook``): its recording
    saved as CSV, JSON or a PNG timeline, each written by the ``Recording`` itself."""

    @property
    def recording(self) -> Recording:
        """The run so far as a ``Recording``."""
        raise NotImplementedError

    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """Save the recording as CSV (see ``Recording.to_csv``).

        Args:
            path: The file to write, in a folder that exists, named with the format's suffix.

        Returns:
            The path written.
        """
        return self.recording.to_csv(path)

    def to_json(self, path: str | os.PathLike[str]) -> Path:
        """Save the recording as JSON (see ``Recording.to_json``); ``load_recording`` reads it back.

        Args:
            path: The file to write, in a folder that exists, named with the format's suffix.

        Returns:
            The path written.
        """
        return self.recording.to_json(path)

    def plot(
        self,
        path: str | os.PathLike[str],
        *,
        title: str | None = None,
        figsize: tuple[float, float] = (10.0, 5.0),
        dpi: int = 100,
    ) -> Path:
        """Save the recording as a PNG timeline (see ``Recording.plot``).

        Args:
            path: The file to write, in a folder that exists, named with the format's suffix.
            title: The plot's title; None (default): the backend and device.
            figsize: Width and height in inches (default ``(10.0, 5.0)``).
            dpi: Pixels per inch (default 100).

        Returns:
            The path written.
        """
        return self.recording.plot(path, title=title, figsize=figsize, dpi=dpi)
