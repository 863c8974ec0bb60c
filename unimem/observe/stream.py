"""A recording streamed to a file as the monitor runs: JSON Lines, append-only, one writer.

``monitor(path="memory.jsonl")`` hands the path to its sampler process, which alone writes the
file: its own NVML/host samples, and the allocator samples and marks the training process sends
down its pipe. Lines are buffered and written at least every ``FLUSH_EVERY`` seconds, so a
``kill -9`` of everything loses at most that much. When the training process dies first, the
sampler (which watches it) writes what it holds and the end record itself.

The file, one JSON value a line:

- first ``{"format": "unimem.recording-stream/1", "meta": {...}}`` (the recording's meta at start);
- ``["d", time, device_total, device_used, process_used, host_rss, error]``: a device sample
  (NVML and host RSS, from the sampler process);
- ``["f", time, allocated, reserved, error]``: the framework's allocator counters;
- ``["m", time, label, allocated, reserved]``: a mark;
- last ``{"end": {"samples": n, "marks": k, "meta": {...}}}``: the counts written and the meta
  that changed by the end (``stopped``, notes). A file without it was cut short.

Unknown figures are ``null``; ``error`` is the failed reading's message or ``null``. The file
keeps every sample; ``load_recording`` reads it into the same bounded series the monitor keeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from unimem.errors import ConfigError
from unimem.observe.files import MAX_LINE_BYTES, create_atomically, parse_json, parse_line

__all__ = [
    "DEVICE",
    "FLUSH_EVERY",
    "FRAMEWORK",
    "MARK",
    "BATCH",
    "STREAM_FORMAT",
    "StreamReader",
    "StreamWriter",
    "encode",
]

STREAM_FORMAT = "unimem.recording-stream/1"
FLUSH_EVERY = 0.5  # seconds: a kill -9 of every process loses at most this much (plus one interval)
DEVICE, FRAMEWORK, MARK = "d", "f", "m"
ARITY = {DEVICE: 7, FRAMEWORK: 5, MARK: 5}  # elements of each record, its tag included
BATCH = 10_000  # lines the loader checks at once: whole columns in C, and a bounded list in memory
_BUFFER_BYTES = 1 << 16  # written sooner when this much is waiting


def encode(value: Any) -> bytes:
    """One line of the file: compact JSON and a newline (``NaN`` refused: no figure is one)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode() + b"\n"


class StreamWriter:
    """The sampler's side: lines buffered and appended at least every ``FLUSH_EVERY`` seconds.

    A write that fails (disk full, the folder gone) ends the stream: ``error`` says why, the
    monitor's in-memory recording goes on, and the file keeps what was written (a cut file).
    """

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        fd = create_atomically(path, encode({"format": STREAM_FORMAT, "meta": meta}), keep_open=True)
        assert fd is not None
        self.fd = fd
        self.path = path
        self.samples = 0
        self.marks = 0
        self.error: str | None = None
        self._lines: list[bytes] = []
        self._size = 0
        self._since: float | None = None  # monotonic time of the oldest line waiting

    def add(self, line: bytes, tag: str) -> None:
        """Queue one record line (its tag counted); written within ``FLUSH_EVERY`` seconds."""
        if self.error is not None:
            return
        if tag == MARK:
            self.marks += 1
        else:
            self.samples += 1
        self._lines.append(line)
        self._size += len(line)
        if self._since is None:
            self._since = time.monotonic()
        if self._size >= _BUFFER_BYTES:
            self.flush()

    def due(self) -> float | None:
        """The monotonic time by which the waiting lines must be written; None when none wait."""
        return None if self._since is None else self._since + FLUSH_EVERY

    def flush(self) -> None:
        """Append every waiting line now."""
        data, self._lines, self._size, self._since = b"".join(self._lines), [], 0, None
        if not data or self.error is not None:
            return
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            self.error = f"writing {self.path} failed ({exc.strerror or exc}); the file ends there"

    def finish(self, meta: dict[str, Any]) -> None:
        """Write the waiting lines and the end record, sync, close."""
        if self.error is None:
            end = {"end": {"samples": self.samples, "marks": self.marks, "meta": meta}}
            self._lines.append(encode(end))
            self.flush()
        with contextlib.suppress(OSError):
            os.fsync(self.fd)
        with contextlib.suppress(OSError):
            os.close(self.fd)


class StreamReader:
    """The loader's side: the header's meta, then the records in batches (``batches``).

    Every line must be whole JSON of a known shape; after iterating, ``end`` holds the end record
    (None when the file was cut short) and ``dropped`` says whether a partial last line was left
    out. Anything else malformed is a ``ConfigError`` naming the file and the line.
    """

    def __init__(self, handle: BinaryIO, where: str) -> None:
        self._handle = handle
        self.where = where
        self.end: dict[str, Any] | None = None
        self.dropped = False
        self.lines = 0
        first = self._line()
        if first is None:
            raise ConfigError("path", f"{where}: cut before its first line ended; it holds no recording")
        header = parse_json(first, f"{where}, line 1")
        if not isinstance(header, dict) or header.get("format") != STREAM_FORMAT:
            raise ConfigError(
                "path", f"{where} is not a unimem stream (its first line lacks 'format': {STREAM_FORMAT!r})"
            )
        meta = header.get("meta")
        if not isinstance(meta, dict):
            raise ConfigError("path", f"{where}, line 1: 'meta' is not an object")
        self.meta: dict[str, Any] = meta

    def _line(self) -> str | None:
        """The next whole line's text; None at the end of the file or for a partial last line."""
        raw = self._handle.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return None
        self.lines += 1
        if len(raw) > MAX_LINE_BYTES:
            raise ConfigError("path", f"{self.where}, line {self.lines}: over {MAX_LINE_BYTES} bytes; not a recording")
        if not raw.endswith(b"\n"):
            self.dropped = True  # the writer was stopped mid-line: the cut
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError("path", f"{self.where}, line {self.lines}: not UTF-8 text") from None

    def batches(self) -> Iterator[tuple[int, list[list[Any]]]]:
        """Records in batches of up to ``BATCH`` lines: ``(line number of the first, records)``, one a line.

        The loader checks each batch column by column. A line that is not a record ends the
        reading with a ``ConfigError``, after the records before it were handed out (so a bad
        value on an earlier line is still the one named).
        """
        while True:
            first, records = self.lines + 1, list[list[Any]]()
            try:
                while len(records) < BATCH and (text := self._line()) is not None:
                    record = self._record(text)
                    if record is not None:
                        records.append(record)
            except ConfigError as exc:
                if records:
                    yield first, records
                raise exc from None
            if records:
                yield first, records
            if len(records) < BATCH:
                return

    def _record(self, text: str) -> list[Any] | None:
        """One line's record; None for the end record (kept in ``end``)."""
        line = self.lines
        if self.end is not None:
            raise ConfigError("path", f"{self.where}, line {line}: a line after the end record; the file was altered")
        value = parse_line(text, lambda: f"{self.where}, line {line}")
        if type(value) is list and value and type(value[0]) is str and len(value) == ARITY.get(value[0]):
            return value
        if isinstance(value, dict) and set(value) == {"end"}:
            self.end = _end_record(value["end"], f"{self.where}, line {line}")
            return None
        raise ConfigError("path", f"{self.where}, line {line}: not a sample or a mark of a unimem stream")


def _end_record(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("meta"), dict):
        raise ConfigError("path", f"{where}: a malformed end record")
    for name in ("samples", "marks"):
        count = value.get(name)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError("path", f"{where}: the end record's {name!r} is not a count")
    return value
