"""Recording files read back: a saved JSON or CSV, or a monitor's JSON Lines stream, as samples, marks and meta.

``load_file(path)`` picks the reader by suffix and answers the parts of the recording the file
holds (``Loaded``); ``unimem.observe.recording.load_recording`` makes the ``Recording`` of them.
Every value read is checked: a whole column at once (in C, fast over a million rows), and, when
a column fails, row by row to name the first row that is wrong. A file cut short gives what it
holds and a note saying what was recovered; any other malformed file is a ``ConfigError``
naming the file and the problem (the checks on single values: ``unimem.observe.files``).
"""

from __future__ import annotations

import contextlib
import csv
import gc
import io
import os
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from itertools import compress, repeat
from operator import eq, itemgetter, methodcaller, not_
from pathlib import Path
from typing import Any, TypeVar

from unimem.errors import ConfigError
from unimem.observe.files import (
    check_max_bytes,
    check_meta,
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
)
from unimem.observe.samples import (
    CSV_HEADER,
    CSV_META_PREFIXES,
    DEFAULT_MAX_SAMPLES,
    FORMAT,
    INT_FIELDS,
    MARK_FIELDS,
    MARK_FIGURES,
    ROWS_FORMAT,
    SAMPLE_FIELDS,
    SOURCE_DEVICE,
    SOURCE_FRAMEWORK,
    SOURCES,
    BoundedSeries,
    Mark,
    Sample,
    merge_samples,
)
from unimem.observe.stream import DEVICE, FRAMEWORK, MARK, StreamReader
from unimem.sizes import counted

__all__ = ["JSON_MEMORY", "Loaded", "load_file"]

# Bytes of memory a file read whole takes per byte of it, at most, while it loads and once it is
# samples: a short sample's Python objects outweigh its text by an order of magnitude, and a CSV's
# cells are strings before they are numbers (docs/measurements.md, "Recordings of any size and any label").
JSON_MEMORY = 12
_CSV_MEMORY = 20


@dataclass(frozen=True)
class Loaded:
    """What a recording file holds.

    Attributes:
        samples (list[Sample]): The samples read, every field checked.
        marks (list[Mark]): The marks read.
        meta (dict[str, Any]): The recording's meta, its known fields checked.
        cut (str | None): What was recovered from a file cut short; None for a whole file.
    """

    samples: list[Sample]
    marks: list[Mark]
    meta: dict[str, Any]
    cut: str | None = None


def load_file(path: object, max_bytes: object = None) -> Loaded:
    """The recording in ``path``, by suffix: ``.jsonl`` a monitor's stream, ``.csv`` CSV, anything else JSON.

    ``max_bytes``: the caller's cap on the file's size (bytes, or a size such as ``"2GiB"``); None:
    a JSON or CSV file, read whole, must fit in the memory the host has available, and a stream,
    read into bounded series, may be any size.

    Raises:
        ConfigError: ``max_bytes`` is not a size, or ``path`` is not a readable regular file within
            the size rule, or is not a whole or cut unimem recording; the message names the file
            and the problem.
    """
    cap = check_max_bytes(max_bytes)
    suffix = Path(path).suffix.lower() if isinstance(path, (str, os.PathLike)) and os.fspath(path) else ""
    loader = {".jsonl": _load_stream, ".csv": _load_csv}.get(suffix, _load_json)
    with _collector_paused():
        return loader(path, cap)


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
    if not isinstance(source, str) or source not in SOURCES:
        raise ConfigError("path", f"{where}: source is {shown(source)}, expected one of {', '.join(sorted(SOURCES))}")
    exact = row.get("peak_exact")
    if exact is not None and not isinstance(exact, bool):
        raise ConfigError("path", f"{where}: peak_exact is {shown(exact)}, expected true, false or null")
    return Sample(
        time=moment(row.get("time"), "time", where),
        source=source,
        peak_exact=exact,
        error=text(row.get("error"), "error", where),
        **{name: figure(row.get(name), name, where) for name in INT_FIELDS},
    )


def _mark_from(row: object, where: str) -> Mark:
    """A mark read from a file, every field checked."""
    if not isinstance(row, dict):
        raise ConfigError("path", f"{where} is {shown(row)}, expected an object")
    label = row.get("label")
    if not isinstance(label, str):
        raise ConfigError("path", f"{where}: label is {shown(label)}, expected text")
    allocated, reserved = (figure(row.get(name), name, where) for name in MARK_FIGURES)
    return Mark(moment(row.get("time"), "time", where), label, allocated, reserved)


def _sources_ok(column: Sequence[Any]) -> bool:
    return set(map(type, column)) <= {str} and set(column) <= SOURCES


def _labels_ok(column: Sequence[Any]) -> bool:
    return set(map(type, column)) <= {str}


# What each field of a sample or mark read from a file may hold, checked a whole column at once.
_Check = Callable[[Sequence[Any]], bool]
_SAMPLE_CHECKS: dict[str, _Check] = {  # in the fields' order, so messages name columns in it
    name: {"time": moments_ok, "source": _sources_ok, "peak_exact": flags_ok, "error": texts_ok}.get(name, figures_ok)
    for name in SAMPLE_FIELDS
}
_MARK_CHECKS: dict[str, _Check] = {
    "time": moments_ok,
    "label": _labels_ok,
    "allocated": figures_ok,
    "reserved": figures_ok,
}
_T = TypeVar("_T", Sample, Mark)
_SLICE = 1 << 16  # rows checked together


def _made(kind: type[_T], rows: Iterable[dict[str, Any]]) -> list[_T]:
    """A ``Sample`` or ``Mark`` of each of ``rows``, whose attributes are the row's dict (every field, checked).

    The dict becomes the object's attributes as it is, and every object is made and given its dict
    by ``map`` in C: the frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, six times the cost over a million samples.
    """
    rows = rows if isinstance(rows, list) else list(rows)
    made = list(map(object.__new__, repeat(kind, len(rows))))
    deque(map(object.__setattr__, made, repeat("__dict__"), rows), maxlen=0)
    return made


# Fields whose default is None. A row made from columns leaves one out when no row knows it: the
# dataclass's class attribute, its default, answers for it, and a dict of fewer keys is made sooner.
_NULL_DEFAULTS = {kind: frozenset(f.name for f in fields(kind) if f.default is None) for kind in (Sample, Mark)}


def _from_columns(kind: type[_T], columns: dict[str, list[Any]], keep: Iterable[bool] | None = None) -> list[_T]:
    """A ``kind`` of each row of ``columns`` (checked, of one length) where ``keep`` is true (None: every row)."""
    kept = {
        name: column
        for name, column in columns.items()
        if name not in _NULL_DEFAULTS[kind] or column.count(None) < len(column)
    }
    rows = map(dict, map(zip, repeat(tuple(kept)), zip(*kept.values(), strict=True)))
    return _made(kind, rows if keep is None else compress(rows, keep))


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
        given = rows
        try:  # as many names as fields, and each field found: the very fields (the usual file, and a quick test)
            whole = set(map(len, rows)) <= {len(checks)} and _columns_ok(rows, checks)
        except KeyError:
            whole = False
        if not whole:  # a field missing (an older file) is None, a name that is none is left out
            given = [{name: row.get(name) for name in checks} for row in rows]
            whole = _columns_ok(given, checks)
        if whole:
            return _made(kind, given)
    return [one(row, f"{where} {i + 1}") for i, row in enumerate(rows)]


def _joined(blocks: list[Any], names: Sequence[str], where: str) -> list[list[Any]]:
    """The columns of ``blocks`` joined in order, one list per name of ``names``.

    A block is an object of arrays of one length, one per field; a field it leaves out is null in
    all its rows (the writer leaves out a column with no value known), a name that is no field is
    ignored. Anything else is a ``ConfigError`` naming the block.
    """
    columns: list[list[Any]] = [[] for _ in names]
    for number, block in enumerate(blocks, 1):
        if not isinstance(block, dict):
            raise ConfigError("path", f"{where}s' block {number} is {shown(block)}, expected an object of columns")
        given = [(name, block[name]) for name in names if name in block]
        for name, column in given:
            if not isinstance(column, list):
                raise ConfigError("path", f"{where}s' block {number}: {name} is {shown(column)}, expected an array")
        lengths = {len(column) for _, column in given}
        if len(lengths) > 1:
            held = ", ".join(f"{name} {len(column)}" for name, column in given)
            raise ConfigError(
                "path", f"{where}s' block {number}: its columns differ in length ({held}); the file was altered"
            )
        rows = lengths.pop() if lengths else 0
        for joined, name in zip(columns, names, strict=True):
            joined.extend(block[name] if name in block else [None] * rows)
    return columns


def _read_blocks(
    blocks: list[Any], kind: type[_T], checks: dict[str, _Check], one: Callable[[object, str], _T], where: str
) -> list[_T]:
    """The rows of a columnar file's blocks as ``kind``, each column checked whole; when a column
    fails, row by row with ``one``, which names the first row that is wrong (``where`` N)."""
    names = list(checks)
    columns = _joined(blocks, names, where)
    if all(ok(column) for ok, column in zip(checks.values(), columns, strict=True)):
        return _from_columns(kind, dict(zip(names, columns, strict=True)))
    rows = map(dict, map(zip, repeat(names), zip(*columns, strict=True)))
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
        made: dict[str, list[Any]] = {tag: _made(Sample, rows[tag]) for tag in (DEVICE, FRAMEWORK)}
        made[MARK] = _made(Mark, rows[MARK])
        return made
    items: dict[str, list[Any]] = {tag: [] for tag in _RECORDS}
    for line, record in enumerate(records, first):
        row, where = _RECORDS[record[0]][0](record), f"{source}, line {line}"
        items[record[0]].append(_mark_from(row, where) if record[0] == MARK else _sample_from(row, where))
    return items


def _recovered(count: int, expected: int | None, noun: str) -> str:
    return counted(count, noun) if expected is None else f"{count} of {counted(expected, noun)}"


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


def _load_json(path: object, max_bytes: int | None) -> Loaded:
    content, source = read_recording(path, max_bytes, JSON_MEMORY)
    data, cut = parse_document(content, str(source), _ARRAYS)
    if not isinstance(data, dict) or data.get("format") not in (FORMAT, ROWS_FORMAT):
        raise ConfigError(
            "path", f"{source} is not a unimem recording (no 'format': {FORMAT!r}); save one with to_json()"
        )
    rows, kept = data.get("samples", []), data.get("marks", [])
    for name, value in (("samples", rows), ("marks", kept)):
        if not isinstance(value, list):
            raise ConfigError("path", f"{source}: {name!r} is {shown(value)}, expected an array")
    if data["format"] == FORMAT:
        samples = _read_blocks(rows, Sample, _SAMPLE_CHECKS, _sample_from, f"{source}, sample")
        marks = _read_blocks(kept, Mark, _MARK_CHECKS, _mark_from, f"{source}, mark")
    else:
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
        return Loaded(samples, marks, meta, f"{source} was cut short (it ends mid-way): recovered {recovered}")
    for name, held, said in (("samples", len(samples), expected[0]), ("marks", len(marks), expected[1])):
        if said is not None and held != said:
            raise ConfigError("path", f"{source} holds {held} {name} but counts {said}; the file was altered")
    return Loaded(samples, marks, meta, None)


def _csv_cell(name: str, cell: str, where: str) -> Any:
    """One CSV cell as the value its column holds (checked again as a sample's field)."""
    if cell == "":
        return None
    if name in INT_FIELDS:
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
    for prefix in CSV_META_PREFIXES:  # written before CSVs counted their rows
        if first.startswith(prefix):
            return None, dict(check_meta(parse_json(first[len(prefix) :], where), where))
    return None


_FIELD_LIMIT = threading.Lock()


@contextlib.contextmanager
def _fields_up_to(size: int) -> Iterator[None]:
    """The CSV reader's limit on one cell raised to ``size`` for the block, back as it was after.

    A mark's label may be megabytes long, and the reader's default refuses a cell over 128 KiB: a
    file unimem wrote must load. The limit is the ``csv`` module's own, so loads take turns here.
    """
    with _FIELD_LIMIT:
        was = csv.field_size_limit()
        csv.field_size_limit(max(was, size))
        try:
            yield
        finally:
            csv.field_size_limit(was)


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


_FLAGS = {"true": True, "false": False, "": None}


def _csv_column(name: str, cells: Sequence[str]) -> list[Any] | None:
    """A CSV column as the values ``_csv_cell`` makes of its cells; None where a cell is not one."""
    if name in ("source", "label"):
        return list(cells)
    if cells.count("") == len(cells):
        return [None] * len(cells)
    joined = "".join(cells) if name in INT_FIELDS else ""
    if joined and not (joined.isascii() and joined.isdigit()):  # ``isdigit`` alone takes other scripts' digits
        return None
    try:
        if name in INT_FIELDS:
            return [int(cell) if cell else None for cell in cells]  # a figure past 2**63: the column's check
        if name == "time":
            return list(map(float, cells))
    except ValueError:  # a time that is no number; digits too many for int()
        return None
    if name == "peak_exact":
        return list(map(_FLAGS.__getitem__, cells)) if set(cells) <= _FLAGS.keys() else None
    return [cell or None for cell in cells]  # error: an empty cell is a good reading


def _csv_table(body: str) -> tuple[list[str], list[Sequence[str]]] | None:
    """A CSV body's header and its columns of cells; None when a row's width is not the header's,
    or the CSV reader refuses the text (``_csv_rows`` then names the line).

    Cells without quotes, NUL or a lone carriage return (what unimem writes, unless a label or an
    error holds a comma or a quote) are split on commas over the whole text at once, and each
    column is a slice of that list: a CSV reader's lists per row cost more than the rest together.
    """
    text = body.replace("\r\n", "\n")
    if '"' not in text and "\x00" not in text and "\r" not in text:
        first, _, rest = text.partition("\n")
        header, lines = first.split(","), list(filter(None, rest.split("\n")))
        if max(map(len, lines), default=0) > csv.field_size_limit():
            return None
        if set(map(methodcaller("count", ","), lines)) - {len(header) - 1}:
            return None
        cells = ",".join(lines).split(",") if lines else []
        return header, [cells[i :: len(header)] for i in range(len(header))]
    reader = csv.reader(io.StringIO(body, newline=""))
    try:
        header = next(reader, [])
        table = list(filter(None, reader))
    except csv.Error:
        return None
    if set(map(len, table)) - {len(header)}:
        return None
    return header, list(zip(*table, strict=True)) or [()] * len(header)


def _csv_columns(body: str) -> tuple[list[Sample], list[Mark]] | None:
    """Every row of a CSV's body as samples and marks, a whole column at a time; None when any row
    or cell is not what unimem writes (``_csv_rows`` and ``_csv_cell`` then name the line).

    Every row's cells are read as a sample's fields, a mark's too (its other cells are empty), and
    the marks' rows are taken out after: one pass over the rows, not one over each column.
    """
    table = _csv_table(body)
    if table is None or not {"time", "source"} <= set(table[0]):
        return None
    header, cells = table
    at = {name: i for i, name in enumerate(header)}
    count = len(cells[0])
    read = {name: _csv_column(name, cells[at[name]]) if name in at else [None] * count for name in SAMPLE_FIELDS}
    columns = {name: column for name, column in read.items() if column is not None}
    sources = cells[at["source"]]  # checked apart: a mark's row is no sample's
    if len(columns) < len(read) or not set(sources) - {"mark"} <= SOURCES:
        return None
    if not all(_SAMPLE_CHECKS[name](column) for name, column in columns.items() if name != "source"):
        return None
    is_mark = list(map(eq, sources, repeat("mark")))
    marks_at = list(compress(range(count), is_mark))
    labels = cells[at["label"]] if "label" in at else [""] * count  # as _load_csv reads a row without one
    marks = {name: [(labels if name == "label" else columns[name])[i] for i in marks_at] for name in MARK_FIELDS}
    if not all(_MARK_CHECKS[name](column) for name, column in marks.items()):
        return None
    return _from_columns(Sample, columns, map(not_, is_mark)), _from_columns(Mark, marks)


def _load_csv(path: object, max_bytes: int | None) -> Loaded:
    content, source = read_recording(path, max_bytes, _CSV_MEMORY)
    first, _, rest = content.partition("\n")
    header = _csv_header(first, source)
    expected, meta = header if header is not None else (None, {})
    body, offset = (rest, 1) if header is not None else (content, 0)
    cut = expected is not None and not content.endswith("\n")
    if cut:
        body = body[: body.rfind("\n") + 1]  # the last line was written in part: left out
    samples: list[Sample] = []
    marks: list[Mark] = []
    written = bool(body) and not body.isspace()  # not body.strip(): no copy of a file's text
    with _fields_up_to(len(body)):
        whole = _csv_columns(body) if written else None
        if whole is not None:
            samples, marks = whole
        elif written or expected is None:
            for where, row in _csv_rows(body, source, offset):
                if row["source"] == "mark":
                    cells = {n: _csv_cell(n, row.get(n, ""), where) for n in MARK_FIELDS if n != "label"}
                    marks.append(_mark_from({**cells, "label": row.get("label", "")}, where))
                else:
                    row_cells = {n: _csv_cell(n, row.get(n, ""), where) for n in SAMPLE_FIELDS}
                    samples.append(_sample_from(row_cells, where))
    held = len(samples) + len(marks)
    if expected is not None and held > expected:
        raise ConfigError("path", f"{source} holds {held} rows but counts {expected}; the file was altered")
    if expected is not None and (cut or held < expected):
        return Loaded(samples, marks, meta, f"{source} was cut short: recovered {_recovered(held, expected, 'row')}")
    return Loaded(samples, marks, meta, None)


def _load_stream(path: object, max_bytes: int | None) -> Loaded:
    handle, source, _ = open_recording(path, max_bytes, None)
    try:
        with handle:
            return _read_stream(StreamReader(handle, str(source)), source)
    except OSError as exc:
        raise ConfigError("path", f"{source} cannot be read ({exc.strerror or exc})") from None


def _read_stream(reader: StreamReader, source: Path) -> Loaded:
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
        return Loaded(samples, list(marks), meta, None)
    last = f", the last at {samples[-1].time - meta['started']:.1f} s" if samples and meta.get("started") else ""
    partial = "; a line written in part was left out" if reader.dropped else ""
    cut = (
        f"{source} has no end record (its run was killed, or is still going): recovered "
        f"{counted(seen['samples'], 'sample')}{last} and {counted(seen['marks'], 'mark')}{partial}"
    )
    return Loaded(samples, list(marks), meta, cut)
