"""A memory timeline: the ``Recording``, its CSV/JSON saves and PNG, and ``load_recording``.

``monitor()``, ``MemoryHook`` and the Keras callback all produce a ``Recording`` of
``Sample`` and ``Mark`` objects (``unimem.observe.samples``); ``load_recording(path)`` reads one
back from the JSON or CSV it was saved to, or from the JSON Lines a monitor streamed
(``unimem.observe.stream``), through ``unimem.observe.loading``.
Figures unimem could not know are ``None`` in memory, empty cells in CSV and
``null`` in JSON, never 0. The plots are drawn by ``unimem.observe.plotting``.

Every file says whether it is whole: JSON counts its samples and marks, CSV its rows (on its
first line), a stream ends with an end record. A file cut short loads what it holds with a
``UnimemWarning`` saying what was recovered; any other malformed file is a ``ConfigError``
naming the file and the problem.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

from unimem.errors import ConfigError, UnimemWarning
from unimem.observe.files import check_target, write_atomically
from unimem.observe.loading import load_file
from unimem.observe.plotting import RanksPlot, plot_ranks, plot_recording
from unimem.observe.samples import (
    BLOCK_ROWS,
    CSV_HEADER,
    FORMAT,
    MARK_FIELDS,
    MARK_FIGURES,
    SAMPLE_FIELDS,
    Mark,
    Sample,
)
from unimem.sizes import counted, format_bytes

__all__ = ["Recorder", "Recording", "load_recording", "plot_recordings"]


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
        if field in MARK_FIGURES:
            values += [getattr(m, field) for m in marks if opening.time <= m.time <= last]
        known = [v for v in values if v is not None]
        return max(known) if known else None

    # --- saving -----------------------------------------------------------------
    def to_json(self, path: str | os.PathLike[str]) -> Path:
        """Everything (samples, marks, meta) as JSON; ``load_recording`` reads it back.

        Column by column (``"unimem.recording/3"``): the marks, then the samples, in blocks of at
        most 1,000, one block a line, each block an object holding one array per field (a field
        no row of the block knows is left out: null throughout). The counts come first, so a
        copy cut short is told from a whole one and still gives every whole block. Written to a
        temporary file in the same folder, then renamed over ``path``: a process killed while
        saving leaves the previous file whole.

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
        """The JSON document: the counts and meta, then the marks' and the samples' blocks, one a line."""

        def dump(value: Any) -> str:
            return json.dumps(value, allow_nan=False)

        count = {"samples": len(self.samples), "marks": len(self.marks)}
        marks = ",\n".join(map(dump, _blocks(self.marks, MARK_FIELDS, ("time", "label"))))
        samples = ",\n".join(map(dump, _blocks(self.samples, SAMPLE_FIELDS, ("time", "source"))))
        return (
            f'{{"format": {dump(FORMAT)},\n"count": {dump(count)},\n"meta": {dump(self.meta)},\n'
            f'"marks": [\n{marks}\n],\n"samples": [\n{samples}\n]}}\n'
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


def _blocks(
    items: Sequence[Sample] | Sequence[Mark], names: Sequence[str], kept: Sequence[str]
) -> Iterator[dict[str, Any]]:
    """``items`` as blocks of at most ``BLOCK_ROWS``: one array per field, a field with no value in
    the block left out unless it is one of ``kept`` (the fields every row has)."""
    values = attrgetter(*names)
    for start in range(0, len(items), BLOCK_ROWS):
        rows = items[start : start + BLOCK_ROWS]
        columns = zip(*map(values, rows), strict=True)
        yield {
            name: column
            for name, column in zip(names, columns, strict=True)
            if name in kept or column.count(None) < len(rows)
        }


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def load_recording(path: str | os.PathLike[str], *, max_bytes: int | str | None = None) -> Recording:
    """Read a recording saved with ``to_json`` or ``to_csv``, or streamed by ``monitor(path=...)``.

    By suffix: ``.jsonl`` a monitor's stream, ``.csv`` CSV, anything else JSON. The file must be a
    regular file (opened without blocking: a FIFO or a device is refused, never waited on). JSON
    and CSV are read whole: without ``max_bytes``, a file that would take more memory than the
    host has available (up to 20 times its size, once its samples are objects) is refused, and
    the message says so. A stream is read a line at a time into the bounded series a monitor
    keeps (``max_samples`` per source, peaks and gaps kept), so it may be any size. Every format
    unimem has written loads.

    Args:
        path: The file ``to_json``, ``to_csv`` or a monitor's stream wrote.
        max_bytes: A cap of your own on the file's size, in bytes or as a size such as ``"2GiB"``
            (a file over it is refused, whatever the memory); None (default): the memory rule above.

    Returns:
        The recording, with unknown figures as None. A file cut short (no end record, fewer
        rows than it counts) gives what it holds, with a note in ``meta["notes"]``.

    Raises:
        ConfigError: ``path`` does not exist (or is a link that loops), is not a regular file, is
            empty, over ``max_bytes`` or too large for the memory available, or is not a whole or cut
            unimem recording (malformed JSON or CSV, a figure that is not a byte count, a time that
            is not finite, ...); ``max_bytes`` is not a size. The message names the file and the
            problem.

    Warns:
        UnimemWarning: The file was cut short; the message says what was recovered.

    Example:
        ```python
        recording = unimem.load_recording("memory.json")
        recording.plot("memory.png")
        ```
    """
    loaded = load_file(path, max_bytes)
    recording = Recording(loaded.samples, loaded.marks, loaded.meta)
    if loaded.cut is not None:
        recording.meta["notes"] = [*recording.meta.get("notes", []), loaded.cut]
        warnings.warn(loaded.cut, UnimemWarning, stacklevel=2)
    return recording


def _loaded(recordings: Sequence[Any], max_bytes: int | str | None) -> list[tuple[Recording, str | None]]:
    """Each recording with the name of the file it was read from (None for one passed in)."""
    if isinstance(recordings, (str, os.PathLike, Recording)) or not recordings:
        raise ConfigError("recordings", "expected a list of recordings or their files, e.g. [r0, r1]")
    out: list[tuple[Recording, str | None]] = []
    for item in recordings:
        if isinstance(item, Recording):
            out.append((item, None))
        elif isinstance(item, (str, os.PathLike)):
            out.append((load_recording(item, max_bytes=max_bytes), Path(item).name))
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
    max_bytes: int | str | None = None,
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
        max_bytes: A cap on the size of each file read (see ``load_recording``); None (default):
            the memory rule ``load_recording`` keeps.

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
    loaded = _loaded(recordings, max_bytes)
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
