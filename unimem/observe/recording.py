"""A memory timeline's data and files: samples, marks, the CSV/JSON round trip, the PNG's path.

``monitor()``, ``MemoryHook`` and the Keras callback all produce a ``Recording``;
``load_recording(path)`` reads one back from the JSON or CSV it was saved to, or from the
JSON Lines a monitor streamed (``unimem.observe.stream``).
Figures unimem could not know are ``None`` in memory, empty cells in CSV and
``null`` in JSON, never 0. The plots are drawn by ``unimem.observe.plotting``.

Every file says whether it is whole: JSON counts its samples and marks, CSV its rows (on its
first line), a stream ends with an end record. A file cut short loads what it holds with a
``UnimemWarning`` saying what was recovered; any other malformed file is a ``ConfigError``
naming the file and the problem (the checks on what is read: ``unimem.observe.files``).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import gc
import io
import json
import math
import os
import re
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, TypeVar

from unimem.errors import ConfigError, UnimemWarning
from unimem.observe.files import (
    MAX_SAVED_BYTES,
    MAX_STREAM_BYTES,
    check_meta,
    check_target,
    figure,
    figures_ok,
    flags_ok,
    moment,
    moments_ok,
    open_recording,
    parse_document,
    parse_json,
    read_recording,
    shown,
    text,
    texts_ok,
    write_atomically,
)
from unimem.observe.plotting import RanksPlot, plot_ranks, plot_recording
from unimem.observe.stream import DEVICE, FRAMEWORK, MARK, StreamReader
from unimem.sizes import format_bytes

__all__ = ["BoundedSeries", "Mark", "Recorder", "Recording", "Sample", "load_recording", "plot_recordings"]

FORMAT = "unimem.recording/1"

# Where a sample came from.
SOURCE_FRAMEWORK = "framework"  # the framework's allocator counters, read in this process
SOURCE_DEVICE = "device"  # NVML (device and this process) and host RSS, read by the sampler process
SOURCE_STEP = "step"  # a training step boundary (MemoryHook, Keras callback)
CSV_META_PREFIX = "# unimem.observe.recording "  # an older CSV's first line: the recording's metadata as JSON
CSV_HEADER = "# unimem.recording/2 "  # a CSV's first line: {"rows": n, "meta": {...}} as JSON
DEFAULT_MAX_SAMPLES = 20_000


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

    def extend(self, items: Sequence[Any]) -> None:
        """``add`` each of ``items`` in turn; at once while they fit without a merge."""
        if self.stride == 1 and len(self._items) + len(items) < self.capacity:
            self._items.extend(items)
            self.seen += len(items)
            return
        for item in items:
            self.add(item)

    def items(self) -> list[Any]:
        return [*self._items, self._pending] if self._pending is not None else list(self._items)

    def __len__(self) -> int:
        return len(self._items) + (self._pending is not None)


def counted(count: int, noun: str) -> str:
    """``"1 sample"``, ``"3 samples"``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def failed_readings_note(count: int, first: str) -> str:
    """The note a recording carries when device readings failed: how often, and the first error."""
    return f"device readings failed {count} times (gaps in the data); first error: {first}"


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

        One sample or mark a line, with their counts, so a copy cut short is told from a whole
        one. Written to a temporary file in the same folder, then renamed over ``path``: a
        process killed while saving leaves the previous file whole.

        Args:
            path: The file to write, in a folder that exists, named with the format's suffix.

        Returns:
            The path written.

        Raises:
            ConfigError: ``path`` is not a file path, is a directory, lacks the format's suffix, its
                folder does not exist, or the folder cannot be written to (nothing is changed).
        """
        target = check_target(path, ".json")
        return write_atomically(target, self._json_text().encode())

    def _json_text(self) -> str:
        """The JSON document, one sample or mark a line: a copy cut short still yields every whole line."""

        def dump(value: Any) -> str:
            return json.dumps(value, allow_nan=False)

        samples = ",\n".join(dump({name: getattr(s, name) for name in SAMPLE_FIELDS}) for s in self.samples)
        marks = ",\n".join(dump(dataclasses.asdict(m)) for m in self.marks)
        count = {"samples": len(self.samples), "marks": len(self.marks)}
        return (
            f'{{"format": {dump(FORMAT)},\n"count": {dump(count)},\n"meta": {dump(self.meta)},\n'
            f'"samples": [\n{samples}\n],\n"marks": [\n{marks}\n]}}\n'
        )

    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """Samples and marks as one table (a mark is a row with ``source=mark`` and a ``label``).

        Empty cells are unknown figures. The first line is a comment holding the row count and
        ``meta`` (backend, device, cap, interval, notes) as JSON, which ``load_recording`` reads
        back. Written to a temporary file in the same folder, then renamed over ``path``: a
        process killed while saving leaves the previous file whole.

        Args:
            path: The file to write, in a folder that exists, named with the format's suffix.

        Returns:
            The path written. Columns: ``time``, ``elapsed`` (seconds since the start),
            the ``Sample`` fields, ``label``; rows in time order.

        Raises:
            ConfigError: ``path`` is not a file path, is a directory, lacks the format's suffix, its
                folder does not exist, or the folder cannot be written to (nothing is changed).
        """
        target = check_target(path, ".csv")
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
        handle = io.StringIO(newline="")
        # The row count and the metadata (backend, device, cap, interval, notes) on a first comment
        # line: a recording read back from CSV still names its framework and draws its cap, and a
        # copy cut short at a row's end is told from a whole one.
        handle.write(f"{CSV_HEADER}{json.dumps({'rows': len(rows), 'meta': self.meta}, default=str)}\n")
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(row for _, row in rows)
        return write_atomically(target, handle.getvalue().encode())

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
        target = check_target(path, ".png")
        plot_recording(self, target, title=title, figsize=figsize, dpi=dpi)
        return target


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_SOURCES = frozenset({SOURCE_FRAMEWORK, SOURCE_DEVICE, SOURCE_STEP})
_MARK_FIELDS = ("time", "label", "allocated", "reserved")
_DEVICE_FIELDS = ("time", "device_total", "device_used", "process_used", "host_rss", "error")  # a stream's "d" record
_FRAMEWORK_FIELDS = ("time", "allocated", "reserved", "error")  # a stream's "f" record
_ARRAYS = frozenset({"samples", "marks"})
_DIGITS = re.compile(r"[0-9]{1,20}")
_MAX_STREAM_SAMPLES = 10_000_000  # a stream's max_samples beyond this is not one a monitor wrote


def _sample_from(row: object, where: str) -> Sample:
    """A sample read from a file, every field checked; else a ``ConfigError`` naming ``where``."""
    if not isinstance(row, dict):
        raise ConfigError("path", f"{where} is {shown(row)}, expected an object")
    source = row.get("source")
    if not isinstance(source, str) or source not in _SOURCES:
        raise ConfigError("path", f"{where}: source is {shown(source)}, expected one of {', '.join(sorted(_SOURCES))}")
    exact = row.get("peak_exact")
    if exact is not None and not isinstance(exact, bool):
        raise ConfigError("path", f"{where}: peak_exact is {shown(exact)}, expected true, false or null")
    return Sample(
        time=moment(row.get("time"), "time", where),
        source=source,
        peak_exact=exact,
        error=text(row.get("error"), "error", where),
        **{name: figure(row.get(name), name, where) for name in _INT_FIELDS},
    )


def _mark_from(row: object, where: str) -> Mark:
    """A mark read from a file, every field checked."""
    if not isinstance(row, dict):
        raise ConfigError("path", f"{where} is {shown(row)}, expected an object")
    label = row.get("label")
    if not isinstance(label, str):
        raise ConfigError("path", f"{where}: label is {shown(label)}, expected text")
    allocated, reserved = (figure(row.get(name), name, where) for name in _MARK_FIGURES)
    return Mark(moment(row.get("time"), "time", where), label, allocated, reserved)


def _sources_ok(column: Sequence[Any]) -> bool:
    return set(map(type, column)) <= {str} and set(column) <= _SOURCES


def _labels_ok(column: Sequence[Any]) -> bool:
    return set(map(type, column)) <= {str}


# What each field of a sample or mark read from a file may hold, checked a whole column at once.
_Check = Callable[[Sequence[Any]], bool]
_SAMPLE_CHECKS: dict[str, _Check] = {
    "time": moments_ok,
    "source": _sources_ok,
    "peak_exact": flags_ok,
    "error": texts_ok,
    **dict.fromkeys(_INT_FIELDS, figures_ok),
}
_MARK_CHECKS: dict[str, _Check] = {
    "time": moments_ok,
    "label": _labels_ok,
    "allocated": figures_ok,
    "reserved": figures_ok,
}
_T = TypeVar("_T", Sample, Mark)
_SLICE = 1 << 16  # rows checked together


def _made(kind: type[_T], fields: dict[str, Any]) -> _T:
    """A ``Sample`` or ``Mark`` whose attributes are ``fields`` (every field of it, checked).

    The dict becomes the object's attributes as it is: the frozen dataclass's ``__init__`` sets each
    field through ``object.__setattr__``, six times the cost over a million samples.
    """
    item = object.__new__(kind)
    object.__setattr__(item, "__dict__", fields)
    return item


def _columns_ok(rows: list[dict[str, Any]], checks: dict[str, _Check]) -> bool:
    """Whether every field ``checks`` names passes its check, in every row (a ``KeyError`` if one lacks it).

    Rows are read a slice at a time, each row once (its fields taken together, then turned into
    columns): a pass per field over a million rows would fetch each row from memory again.
    """
    values = itemgetter(*checks)
    for start in range(0, len(rows), _SLICE):
        columns = zip(*map(values, rows[start : start + _SLICE]), strict=True)
        if not all(ok(column) for ok, column in zip(checks.values(), columns, strict=True)):
            return False
    return True


def _read_rows(
    rows: list[Any], kind: type[_T], checks: dict[str, _Check], one: Callable[[object, str], _T], where: str
) -> list[_T]:
    """Each JSON object of ``rows`` as a ``kind``, checked a whole column at a time; when a column
    fails, row by row with ``one``, which names the first row that is wrong (``where``, row N)."""
    if set(map(type, rows)) <= {dict}:
        fields = rows
        try:  # as many names as fields, and each field found: the very fields (the usual file, and a quick test)
            whole = set(map(len, rows)) <= {len(checks)} and _columns_ok(rows, checks)
        except KeyError:
            whole = False
        if not whole:  # a field missing (an older file) is None, a name that is none is left out
            fields = [{name: row.get(name) for name in checks} for row in rows]
            whole = _columns_ok(fields, checks)
        if whole:
            return [_made(kind, row) for row in fields]
    return [one(row, f"{where} {i + 1}") for i, row in enumerate(rows)]


# A stream's records as the fields of a sample or a mark (positions: ``unimem.observe.stream``).
_BLANK = dict.fromkeys(SAMPLE_FIELDS)


def _device_row(r: list[Any]) -> dict[str, Any]:
    return dict(
        _BLANK,
        time=r[1],
        source=SOURCE_DEVICE,
        device_total=r[2],
        device_used=r[3],
        process_used=r[4],
        host_rss=r[5],
        error=r[6],
    )


def _framework_row(r: list[Any]) -> dict[str, Any]:
    return dict(_BLANK, time=r[1], source=SOURCE_FRAMEWORK, allocated=r[2], reserved=r[3], error=r[4])


def _mark_row(r: list[Any]) -> dict[str, Any]:
    return {"time": r[1], "label": r[2], "allocated": r[3], "reserved": r[4]}


# Per record tag: its fields, and the checks of the fields it sets (the others are None).
_RECORDS: dict[str, tuple[Callable[[list[Any]], dict[str, Any]], dict[str, _Check]]] = {
    DEVICE: (_device_row, {name: _SAMPLE_CHECKS[name] for name in _DEVICE_FIELDS}),
    FRAMEWORK: (_framework_row, {name: _SAMPLE_CHECKS[name] for name in _FRAMEWORK_FIELDS}),
    MARK: (_mark_row, _MARK_CHECKS),
}


def _stream_items(records: list[list[Any]], first: int, source: Path) -> dict[str, list[Any]]:
    """A batch of a stream's records as samples and marks, by tag, in the file's order.

    Checked a whole column at a time; when a column fails, record by record, which names the
    first line that is wrong.
    """
    rows = {tag: [build(r) for r in records if r[0] == tag] for tag, (build, _) in _RECORDS.items()}
    if all(_columns_ok(rows[tag], checks) for tag, (_, checks) in _RECORDS.items()):
        made: dict[str, list[Any]] = {tag: [_made(Sample, row) for row in rows[tag]] for tag in (DEVICE, FRAMEWORK)}
        made[MARK] = [_made(Mark, row) for row in rows[MARK]]
        return made
    items: dict[str, list[Any]] = {tag: [] for tag in _RECORDS}
    for line, record in enumerate(records, first):
        row, where = _RECORDS[record[0]][0](record), f"{source}, line {line}"
        items[record[0]].append(_mark_from(row, where) if record[0] == MARK else _sample_from(row, where))
    return items


def _recovered(count: int, expected: int | None, noun: str) -> str:
    return counted(count, noun) if expected is None else f"{count} of {counted(expected, noun)}"


def load_recording(path: str | os.PathLike[str]) -> Recording:
    """Read a recording saved with ``to_json`` or ``to_csv``, or streamed by ``monitor(path=...)``.

    By suffix: ``.jsonl`` a monitor's stream, ``.csv`` CSV, anything else JSON. The file must be a
    regular file (opened without blocking: a FIFO or a device is refused, never waited on) of at
    most 256 MiB for JSON and CSV, 16 GiB for a stream, which is read a line at a time into the
    bounded series a monitor keeps (``max_samples`` per source, peaks and gaps kept).

    Args:
        path: The file ``to_json``, ``to_csv`` or a monitor's stream wrote.

    Returns:
        The recording, with unknown figures as None. A file cut short (no end record, fewer
        rows than it counts) gives what it holds, with a note in ``meta["notes"]``.

    Raises:
        ConfigError: ``path`` does not exist, is not a regular file, is empty or over the size
            limit, or is not a whole or cut unimem recording (malformed JSON or CSV, a figure
            that is not a byte count, a time that is not finite, ...); the message names the
            file and the problem.

    Warns:
        UnimemWarning: The file was cut short; the message says what was recovered.

    Example:
        ```python
        recording = unimem.load_recording("memory.json")
        recording.plot("memory.png")
        ```
    """
    suffix = Path(path).suffix.lower() if isinstance(path, (str, os.PathLike)) and os.fspath(path) else ""
    loader = {".jsonl": _load_stream, ".csv": _load_csv}.get(suffix, _load_json)
    with _collector_paused():
        recording, cut = loader(path)
    if cut is not None:
        recording.meta["notes"] = [*recording.meta.get("notes", []), cut]
        warnings.warn(cut, UnimemWarning, stacklevel=2)
    return recording


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, back as it was after.

    A load makes millions of objects, none in a cycle; each collection the allocations trigger
    would walk them all again (a third of a million-sample stream's load time).
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _load_json(path: object) -> tuple[Recording, str | None]:
    content, source = read_recording(path, MAX_SAVED_BYTES)
    data, cut = parse_document(content, str(source), _ARRAYS)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(
            "path", f"{source} is not a unimem recording (no 'format': {FORMAT!r}); save one with to_json()"
        )
    rows, kept = data.get("samples", []), data.get("marks", [])
    for name, value in (("samples", rows), ("marks", kept)):
        if not isinstance(value, list):
            raise ConfigError("path", f"{source}: {name!r} is {shown(value)}, expected an array")
    samples = _read_rows(rows, Sample, _SAMPLE_CHECKS, _sample_from, f"{source}, sample")
    marks = _read_rows(kept, Mark, _MARK_CHECKS, _mark_from, f"{source}, mark")
    meta = dict(check_meta(data.get("meta", {}), str(source)))
    count = data.get("count")
    if count is not None and not isinstance(count, dict):
        raise ConfigError("path", f"{source}: 'count' is {shown(count)}, expected an object")
    expected = [figure((count or {}).get(name), f"count {name!r}", str(source)) for name in ("samples", "marks")]
    if cut:
        recovered = (
            f"{_recovered(len(samples), expected[0], 'sample')} and {_recovered(len(marks), expected[1], 'mark')}"
        )
        return Recording(samples, marks, meta), f"{source} was cut short (it ends mid-way): recovered {recovered}"
    for name, held, said in (("samples", len(samples), expected[0]), ("marks", len(marks), expected[1])):
        if said is not None and held != said:
            raise ConfigError("path", f"{source} holds {held} {name} but counts {said}; the file was altered")
    return Recording(samples, marks, meta), None


def _csv_cell(name: str, cell: str, where: str) -> Any:
    """One CSV cell as the value its column holds (checked again as a sample's field)."""
    if cell == "":
        return None
    if name in _INT_FIELDS:
        if not _DIGITS.fullmatch(cell):
            raise ConfigError("path", f"{where}: {name} is {shown(cell)}, expected a whole number from 0 to 2**63")
        return int(cell)
    if name == "time":
        try:
            return float(cell)
        except ValueError:
            raise ConfigError("path", f"{where}: time is {shown(cell)}, expected seconds as a number") from None
    if name == "peak_exact":
        if cell not in ("true", "false"):
            raise ConfigError("path", f"{where}: peak_exact is {shown(cell)}, expected true, false or empty")
        return cell == "true"
    return cell


def _csv_header(first: str, source: Path) -> tuple[int | None, dict[str, Any]] | None:
    """``(rows counted, meta)`` from a CSV's first line; None when it is not a comment unimem wrote."""
    where = f"{source}, line 1"
    if first.startswith(CSV_HEADER):
        header = parse_json(first[len(CSV_HEADER) :], where)
        if not isinstance(header, dict):
            raise ConfigError("path", f"{where}: the header is {shown(header)}, expected an object")
        rows = header.get("rows")
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise ConfigError("path", f"{where}: the row count is {shown(rows)}, expected a whole number")
        return rows, dict(check_meta(header.get("meta", {}), where))
    if first.startswith(CSV_META_PREFIX):  # written before CSVs counted their rows
        return None, dict(check_meta(parse_json(first[len(CSV_META_PREFIX) :], where), where))
    return None


def _csv_rows(body: str, source: Path, offset: int) -> Iterable[tuple[str, dict[str, str]]]:
    """``(where, row)`` for each data row; a row of the wrong width or broken quoting is a ``ConfigError``."""
    reader = csv.reader(io.StringIO(body, newline=""))
    try:
        columns = next(reader, None)
        if columns is None or not {"time", "source"} <= set(columns):
            raise ConfigError("path", f"{source} is not a unimem CSV (no time and source columns)")
        for row in reader:
            where = f"{source}, line {reader.line_num + offset}"
            if row and len(row) != len(columns):
                raise ConfigError("path", f"{where}: {len(row)} fields where the header names {len(columns)}")
            if row:
                yield where, dict(zip(columns, row, strict=True))
    except csv.Error as exc:
        raise ConfigError("path", f"{source}, line {reader.line_num + offset}: {exc}") from None


def _load_csv(path: object) -> tuple[Recording, str | None]:
    content, source = read_recording(path, MAX_SAVED_BYTES)
    first, _, rest = content.partition("\n")
    header = _csv_header(first, source)
    expected, meta = header if header is not None else (None, {})
    body, offset = (rest, 1) if header is not None else (content, 0)
    cut = expected is not None and not content.endswith("\n")
    if cut:
        body = body[: body.rfind("\n") + 1]  # the last line was written in part: left out
    samples: list[Sample] = []
    marks: list[Mark] = []
    if body.strip() or expected is None:
        for where, row in _csv_rows(body, source, offset):
            if row["source"] == "mark":
                cells = {name: _csv_cell(name, row.get(name, ""), where) for name in _MARK_FIELDS if name != "label"}
                marks.append(_mark_from({**cells, "label": row.get("label", "")}, where))
            else:
                samples.append(_sample_from({n: _csv_cell(n, row.get(n, ""), where) for n in SAMPLE_FIELDS}, where))
    held = len(samples) + len(marks)
    if expected is not None and held > expected:
        raise ConfigError("path", f"{source} holds {held} rows but counts {expected}; the file was altered")
    if expected is not None and (cut or held < expected):
        return Recording(samples, marks, meta), f"{source} was cut short: recovered {_recovered(held, expected, 'row')}"
    return Recording(samples, marks, meta), None


def _load_stream(path: object) -> tuple[Recording, str | None]:
    handle, source = open_recording(path, MAX_STREAM_BYTES)
    try:
        with handle:
            return _read_stream(StreamReader(handle, str(source)), source)
    except OSError as exc:
        raise ConfigError("path", f"{source} cannot be read ({exc.strerror or exc})") from None


def _read_stream(reader: StreamReader, source: Path) -> tuple[Recording, str | None]:
    """Every record into bounded series (the file keeps every sample; memory stays bounded)."""
    meta = dict(check_meta(reader.meta, f"{source}, line 1"))
    capacity = meta.get("max_samples")
    if not isinstance(capacity, int) or not 100 <= capacity <= _MAX_STREAM_SAMPLES:
        capacity = DEFAULT_MAX_SAMPLES
    series = {DEVICE: BoundedSeries(capacity), FRAMEWORK: BoundedSeries(capacity)}
    marks: deque[Mark] = deque(maxlen=capacity)
    seen = {"samples": 0, "marks": 0}
    for first, records in reader.batches():
        items = _stream_items(records, first, source)
        for tag in (DEVICE, FRAMEWORK):
            series[tag].extend(items[tag])
            seen["samples"] += len(items[tag])
        marks.extend(items[MARK])
        seen["marks"] += len(items[MARK])
    samples = merge_samples(series[DEVICE].items(), series[FRAMEWORK].items())
    end = reader.end
    if end is not None and reader.dropped:
        raise ConfigError("path", f"{source}: a partial line after the end record; the file was altered")
    if end is not None:
        for name in ("samples", "marks"):
            if end[name] != seen[name]:
                raise ConfigError("path", f"{source} holds {seen[name]} {name} but its end counts {end[name]}; altered")
        meta.update(check_meta(end["meta"], f"{source}, end record"))
    meta["decimation"] = {"device_stride": series[DEVICE].stride, "framework_stride": series[FRAMEWORK].stride}
    if seen["samples"] > len(samples) or seen["marks"] > len(marks):
        notes = [
            *meta.get("notes", []),
            f"read {len(samples)} of the file's {seen['samples']} samples, peaks and "
            f"gaps kept, and its latest {len(marks)} marks (max_samples={capacity} per source)",
        ]
        meta["notes"] = notes
    if end is not None:
        return Recording(samples, list(marks), meta), None
    last = f", the last at {samples[-1].time - meta['started']:.1f} s" if samples and meta.get("started") else ""
    partial = "; a line written in part was left out" if reader.dropped else ""
    cut = (
        f"{source} has no end record (its run was killed, or is still going): recovered "
        f"{counted(seen['samples'], 'sample')}{last} and {counted(seen['marks'], 'mark')}{partial}"
    )
    return Recording(samples, list(marks), meta), cut


def merge_samples(*streams: Iterable[Sample]) -> list[Sample]:
    """Samples of several streams as one list in time order."""
    merged = [sample for stream in streams for sample in stream]
    merged.sort(key=attrgetter("time"))
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
    target = check_target(path, ".png")
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
