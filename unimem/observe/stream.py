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
from unimem.observe.files import MAX_LINE_BYTES, create_atomically, parse_json, scan_json

__all__ = [
    "DEVICE",
    "FLUSH_EVERY",
    "FRAMEWORK",
    "MARK",
    "STREAM_FORMAT",
    "StreamReader",
    "StreamWriter",
    "encode",
]

STREAM_FORMAT = "unimem.recording-stream/1"
FLUSH_EVERY = 0.5  # seconds: a kill -9 of every process loses at most this much (plus one interval)
DEVICE, FRAMEWORK, MARK = "d", "f", "m"
ARITY = {DEVICE: 7, FRAMEWORK: 5, MARK: 5}  # elements of each record, its tag included
_BLOCK_BYTES = 1 << 20  # read at once, its lines checked as one batch: whole columns in C, memory bounded
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
        self._carry = b""  # the start of a line the last block read cut
        block = self._block()
        if block is None or not block[0]:
            if block is not None and block[1] is not None:
                raise block[1]
            raise ConfigError("path", f"{where}: cut before its first line ended; it holds no recording")
        texts, self._after = block
        self.lines = 1
        header = parse_json(texts[0], f"{where}, line 1")
        self._texts = texts[1:]  # the lines read with the first, not yet handed out
        if not isinstance(header, dict) or header.get("format") != STREAM_FORMAT:
            raise ConfigError(
                "path", f"{where} is not a unimem stream (its first line lacks 'format': {STREAM_FORMAT!r})"
            )
        meta = header.get("meta")
        if not isinstance(meta, dict):
            raise ConfigError("path", f"{where}, line 1: 'meta' is not an object")
        self.meta: dict[str, Any] = meta

    def _block(self) -> tuple[list[str], ConfigError | None] | None:
        """The next whole lines (their text, newline left off) and the error of the line after them,
        if it is over ``MAX_LINE_BYTES`` or not UTF-8; None at the end of the file."""
        while True:
            data = self._handle.read(_BLOCK_BYTES)
            if not data:
                self.dropped = bool(self._carry)  # the writer was stopped mid-line: the cut
                return None
            data = self._carry + data
            cut = data.rfind(b"\n") + 1
            self._carry = data[cut:]
            if cut:
                break
            if len(self._carry) > MAX_LINE_BYTES:
                return [], self._error(self.lines + 1, f"over {MAX_LINE_BYTES} bytes; not a recording")
        raws = data[: cut - 1].split(b"\n")
        error = None
        if max(map(len, raws)) >= MAX_LINE_BYTES or len(self._carry) > MAX_LINE_BYTES:  # a newline counts
            bad = next((i for i, raw in enumerate(raws) if len(raw) >= MAX_LINE_BYTES), len(raws))
            raws, error = raws[:bad], self._error(self.lines + bad + 1, f"over {MAX_LINE_BYTES} bytes; not a recording")
        try:
            return b"\n".join(raws).decode("utf-8").split("\n") if raws else [], error
        except UnicodeDecodeError:
            texts = []
            for raw in raws:
                try:
                    texts.append(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    return texts, self._error(self.lines + len(texts) + 1, "not UTF-8 text")
            return texts, None  # not reached: lines that each decode, joined by newlines, decode

    def _error(self, line: int, problem: str) -> ConfigError:
        return ConfigError("path", f"{self.where}, line {line}: {problem}")

    def batches(self) -> Iterator[tuple[int, list[list[Any]]]]:
        """The records, a block of lines at a time: ``(line number of the first, records)``, one a line.

        The loader checks each batch column by column. A line that is not a record ends the
        reading with a ``ConfigError``, after the records before it were handed out (so a bad
        value on an earlier line is still the one named).
        """
        texts, after = self._texts, self._after
        while True:
            first, records = self.lines + 1, list[list[Any]]()
            error: ConfigError | None = None
            try:
                for text in texts:
                    self.lines += 1
                    try:  # the usual line: one record, scanned without json.loads' set-up
                        value, end = scan_json(text, 0)
                    except (StopIteration, ValueError, RecursionError):
                        value, end = None, -1
                    if (
                        end == len(text)
                        and type(value) is list
                        and value
                        and type(value[0]) is str
                        and len(value) == ARITY.get(value[0])
                        and self.end is None
                    ):
                        records.append(value)
                    elif (record := self._record(text)) is not None:
                        records.append(record)
                if after is not None:
                    raise after
            except ConfigError as exc:
                error = exc
            if records:
                yield first, records
            if error is not None:
                raise error
            block = self._block()
            if block is None:
                return
            texts, after = block

    def _record(self, text: str) -> list[Any] | None:
        """One line's record, every problem named; None for the end record (kept in ``end``)."""
        where = f"{self.where}, line {self.lines}"
        if self.end is not None:
            raise ConfigError("path", f"{where}: a line after the end record; the file was altered")
        value = parse_json(text, where)
        if type(value) is list and value and type(value[0]) is str and len(value) == ARITY.get(value[0]):
            return value
        if isinstance(value, dict) and set(value) == {"end"}:
            self.end = _end_record(value["end"], where)
            return None
        raise ConfigError("path", f"{where}: not a sample or a mark of a unimem stream")


def _end_record(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("meta"), dict):
        raise ConfigError("path", f"{where}: a malformed end record")
    for name in ("samples", "marks"):
        count = value.get(name)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError("path", f"{where}: the end record's {name!r} is not a count")
    return value
