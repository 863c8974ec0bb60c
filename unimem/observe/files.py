"""A recording's files, read and written safely: whatever is at a path, the answer is a file or a ``ConfigError``.

Reading: a path is opened without blocking (``O_NONBLOCK``: a FIFO cannot stall the reader), and
must be a regular file, not empty. A file read whole (JSON, CSV) must fit in memory: one that
would take more than the host has available is refused, saying so, unless ``max_bytes`` (the
caller's own cap) is given; a JSON Lines stream is read line by line into bounded series and
has no size limit but the caller's. JSON is parsed with ``NaN``/``Infinity`` refused and every
parser failure (nesting too deep, a 5,000-digit number) turned into a ``ConfigError`` naming
the file.

Writing: ``write_atomically`` writes a temporary file in the target's folder and renames it
over the target, so a process killed while saving leaves the previous file whole; the
temporary files such kills leave are removed at the next save of that target.
``keep_aside`` moves an earlier file out of a new run's way instead of replacing it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import itertools
import json
import json.scanner
import math
import os
import re
import secrets
import socket
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, cast

from unimem import host_memory
from unimem.errors import ConfigError
from unimem.sizes import format_bytes, parse_size

__all__ = [
    "MAX_LINE_BYTES",
    "check_max_bytes",
    "check_meta",
    "check_target",
    "create_atomically",
    "figure",
    "keep_aside",
    "moment",
    "figures_ok",
    "flags_ok",
    "moments_ok",
    "open_recording",
    "parse_document",
    "parse_json",
    "read_recording",
    "salvage_json",
    "scan_json",
    "shown",
    "text",
    "texts_ok",
    "write_atomically",
]

MAX_LINE_BYTES = 1 << 20  # one line of a stream: a sample is under 100 bytes, a mark its label more

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_target(path: object, suffix: str) -> Path:
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


# --- reading -------------------------------------------------------------------------------------


def check_max_bytes(value: object) -> int | None:
    """A caller's cap on the size of a file to read: None (no cap of the caller's), or bytes as an int
    or a size such as ``"2GiB"``; else a ``ConfigError`` naming ``max_bytes``."""
    return None if value is None else parse_size(value, "max_bytes")


def _check_size(source: Path, size: int, max_bytes: int | None, factor: int | None) -> None:
    """Refuse a file over the caller's cap, or, without one, a file read whole (``factor``: the bytes of
    memory each byte of it takes once read) that would take more memory than the host has available."""
    if max_bytes is not None:
        if size > max_bytes:
            raise ConfigError(
                "path",
                f"{source} is {format_bytes(size)} ({size} bytes), over max_bytes={max_bytes}; "
                "pass a larger max_bytes (or None) to read it",
            )
        return
    room = host_memory.available() if factor is not None else None
    if room is not None and factor is not None and size * factor > room:
        raise ConfigError(
            "path",
            f"{source} is {format_bytes(size)}; read whole, a recording takes up to {factor} times its size in "
            f"memory ({format_bytes(size * factor)}), more than the {format_bytes(room)} this machine has "
            f"available now. Free memory and load it again, or pass max_bytes={size} to load_recording "
            f"(--max-bytes {size} to unimem plot or unimem view) to read it regardless",
        )


def _unopened(source: Path, exc: OSError) -> ConfigError:
    """Why ``source`` could not be opened, and what to do."""
    if isinstance(exc, FileNotFoundError):
        gone = " (a link to nothing)" if source.is_symlink() else ""
        return ConfigError("path", f"{source} does not exist{gone}; check the path")
    if isinstance(exc, PermissionError):
        return ConfigError("path", f"{source} cannot be read (permission denied); check its permissions")
    if exc.errno == errno.ELOOP:
        return ConfigError(
            "path", f"{source} is a symbolic link that loops (it leads back to itself); point it at a recording file"
        )
    return ConfigError("path", f"{source} cannot be opened ({exc.strerror or exc}); check the path")


def open_recording(path: object, max_bytes: int | None, factor: int | None) -> tuple[BinaryIO, Path, int]:
    """``path`` opened for reading, and its size: a regular, non-empty file within the size rule; else a
    ``ConfigError``.

    Args:
        path: The file.
        max_bytes: The caller's cap (checked by ``check_max_bytes``); None: the rule below alone.
        factor: For a file read whole, the bytes of memory each of its bytes takes once read: without
            ``max_bytes``, a file that would take more than the host has available is refused.
            None: a file read in bounded memory (no limit but ``max_bytes``).

    Opened with ``O_NONBLOCK``, so a FIFO or a device answers at once instead of stalling the reader.
    """
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ConfigError("path", f"expected the path of a recording file, got {path!r}")
    source = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(source, flags)
    except OSError as exc:
        raise _unopened(source, exc) from None
    try:
        info = os.fstat(fd)
        kind = next((name for test, name in _KINDS if test(info.st_mode)), None)
        if kind is not None or not stat.S_ISREG(info.st_mode):
            raise ConfigError("path", f"{source} is {kind or 'not a regular file'}, not a recording file")
        if info.st_size == 0:
            raise ConfigError("path", f"{source} is empty; it holds no recording")
        _check_size(source, info.st_size, max_bytes, factor)
        return os.fdopen(fd, "rb"), source, info.st_size
    except BaseException:
        os.close(fd)
        raise


def read_recording(path: object, max_bytes: int | None, factor: int) -> tuple[str, Path]:
    """The whole text of a recording file (checked as ``open_recording``), decoded as UTF-8."""
    handle, source, size = open_recording(path, max_bytes, factor)
    with handle:
        try:
            data = handle.read(size + 1)  # no more: a read of a larger count reserves that much memory first
        except OSError as exc:
            raise ConfigError("path", f"{source} cannot be read ({exc.strerror or exc})") from None
    if len(data) != size:
        raise ConfigError("path", f"{source} changed while it was read; load it again once its writer is done")
    try:
        return data.decode("utf-8"), source
    except UnicodeDecodeError as exc:
        raise ConfigError("path", f"{source} is not UTF-8 text (byte {exc.start}); it is not a recording") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a figure")


def parse_json(text: str, where: str) -> Any:
    """``text`` as JSON, or a ``ConfigError`` naming ``where`` and the problem.

    ``NaN`` and ``Infinity`` are refused (no figure is either); nesting too deep for the parser and
    numbers too long to convert are malformed files, not crashes.
    """
    return parse_document(text, where, frozenset())[0]


# One JSON value at a position of a text, as ``json.loads`` reads it (``NaN``, ``Infinity`` refused),
# without its set-up on every call: a stream's million lines are scanned so, each value checked to
# end at its line's end, and any other line goes to ``parse_json``, which says what is wrong.
scan_json = cast(
    Callable[[str, int], tuple[Any, int]],
    json.scanner.make_scanner(cast(Any, json.JSONDecoder(parse_constant=_refuse_constant))),
)


def parse_document(text: str, where: str, arrays: frozenset[str]) -> tuple[Any, bool]:
    """``(value, cut)``: ``text`` parsed as ``parse_json`` does; a JSON object cut short on its last
    line comes back as what it still holds (see ``salvage_json``) with ``cut`` True."""
    try:
        return json.loads(text, parse_constant=_refuse_constant), False
    except RecursionError:
        raise ConfigError("path", f"{where}: nested too deeply to be a recording") from None
    except json.JSONDecodeError as exc:
        salvaged = salvage_json(text, exc, arrays) if arrays else None
        if salvaged is not None:
            return salvaged, True
        raise ConfigError("path", f"{where}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError as exc:  # NaN/Infinity, or an integer longer than Python converts
        problem = "a number too long to be a figure" if "digits" in str(exc) else str(exc)
        raise ConfigError("path", f"{where}: {problem}") from None


# --- the values a recording holds -------------------------------------------------------------------

_LARGEST = 1 << 63  # no byte count, index or count reaches it: a bigger number is not a figure


def shown(value: object) -> str:
    """A short, safe rendering of a value read from a file (never huge, never recursive)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit integer"
    if isinstance(value, (list, dict)):
        return "an array" if isinstance(value, list) else "an object"
    if isinstance(value, str):
        return repr(value[:40] + "...") if len(value) > 40 else repr(value)
    return repr(value)


def figure(value: object, name: str, where: str) -> int | None:
    """A byte count, index or count read from a file: None, or a whole number from 0 to 2**63."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _LARGEST:
        raise ConfigError(
            "path", f"{where}: {name} is {shown(value)}, expected a whole number from 0 to 2**63, or null"
        )
    return value


def moment(value: object, name: str, where: str) -> float:
    """A time or a duration in seconds read from a file: a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError("path", f"{where}: {name} is {shown(value)}, expected seconds as a number")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ConfigError("path", f"{where}: {name} is {shown(value)}, expected a finite number of seconds")
    return seconds


def text(value: object, name: str, where: str) -> str | None:
    """A text read from a file: None or a string."""
    if value is not None and not isinstance(value, str):
        raise ConfigError("path", f"{where}: {name} is {shown(value)}, expected text or null")
    return value


# Whole columns at once: True when every value of ``column`` passes ``figure``, ``moment``,
# ``text`` (or is a bool or None, for ``flags_ok``). A loader checks a million values in C this
# way, and only when one fails walks the rows with the checks above to name the row.
_NONE = type(None)


def figures_ok(column: Sequence[Any]) -> bool:
    kinds = set(map(type, column))
    if not kinds <= {int, _NONE}:
        return False
    known = [value for value in column if value is not None] if _NONE in kinds else column
    return not known or (min(known) >= 0 and max(known) < _LARGEST)


def moments_ok(column: Sequence[Any]) -> bool:
    # Integers are left to ``moment``, which turns them into floats (or refuses one too long for a float).
    return set(map(type, column)) <= {float} and all(map(math.isfinite, column))


def texts_ok(column: Sequence[Any]) -> bool:
    return set(map(type, column)) <= {str, _NONE}


def flags_ok(column: Sequence[Any]) -> bool:
    return set(map(type, column)) <= {bool, _NONE}


# The meta fields a plot or a summary reads, by what they must hold; others are kept as they are.
_META_MOMENTS = ("started", "stopped", "interval", "framework_interval")
_META_FIGURES = ("limit", "device_total", "device", "rank", "local_rank", "world_size", "node", "max_samples")
_META_TEXTS = ("backend", "host")


def check_meta(meta: object, where: str) -> dict[str, Any]:
    """A recording's meta read from a file: an object whose known fields hold what they should."""
    if not isinstance(meta, dict):
        raise ConfigError("path", f"{where}: its meta is {shown(meta)}, expected an object")
    for name in _META_MOMENTS:
        if meta.get(name) is not None:
            moment(meta[name], f"meta {name!r}", where)
    for name in _META_FIGURES:
        figure(meta.get(name), f"meta {name!r}", where)
    for name in _META_TEXTS:
        text(meta.get(name), f"meta {name!r}", where)
    notes = meta.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(note, str) for note in notes):
        raise ConfigError("path", f"{where}: its meta 'notes' is not a list of texts")
    decimation = meta.get("decimation", {})
    if not isinstance(decimation, dict):
        raise ConfigError("path", f"{where}: its meta 'decimation' is {shown(decimation)}, expected an object")
    for name, stride in decimation.items():
        figure(stride, f"meta decimation {name!r}", where)
    return meta


# --- a cut JSON document ---------------------------------------------------------------------------

_SPACE = re.compile(r"[ \t\n\r]*")


def _skip(text: str, pos: int) -> int:
    found = _SPACE.match(text, pos)
    return found.end() if found else pos


def _salvage_array(decoder: json.JSONDecoder, text: str, pos: int, items: list[Any]) -> int | None:
    """Elements of the array at ``pos`` (just past ``[``) into ``items``; the position past ``]``, or None if cut."""
    while True:
        pos = _skip(text, pos)
        if pos >= len(text):
            return None
        if text[pos] == "]":
            return pos + 1
        if text[pos] == "," and items:
            pos = _skip(text, pos + 1)
        try:
            item, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            return None
        items.append(item)


def _members(text: str, arrays: frozenset[str]) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` for each member of the object ``text`` starts with, until it is cut; an array
    named in ``arrays`` comes with the elements read whole."""
    decoder = json.JSONDecoder(parse_constant=_refuse_constant)
    pos = _skip(text, 0)
    if not text.startswith("{", pos):
        return
    pos += 1
    while True:
        pos = _skip(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _skip(text, pos + 1)
        try:
            name, pos = decoder.raw_decode(text, pos)
            pos = _skip(text, pos)
            if not isinstance(name, str) or not text.startswith(":", pos):
                return
            pos = _skip(text, pos + 1)
            if name in arrays and text.startswith("[", pos):
                items: list[Any] = []
                end = _salvage_array(decoder, text, pos + 1, items)
                yield name, items
                if end is None:
                    return
                pos = end
                continue
            value, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            return
        yield name, value


def salvage_json(text: str, error: json.JSONDecodeError, arrays: frozenset[str]) -> dict[str, Any] | None:
    """What a JSON object cut short still holds, or None when ``text`` is not one cut short.

    A document is taken as cut only when it fails on its last line: the writer puts each
    sample on a line of its own, so a cut always fails there, and a file broken further up is
    malformed, not cut. The arrays named in ``arrays`` keep the elements read whole.
    """
    if error.msg.startswith("Extra data") or "\n" in text[error.pos :].strip():
        return None
    return dict(_members(text, arrays))


# --- writing ---------------------------------------------------------------------------------------


# A temporary file is named ``.NAME.HOST-PID-XXXXXXXX.tmp``: the host (a hash of its name) and the
# process that writes it, so that a later save can tell the ones a killed save left behind.
_TEMPORARY = re.compile(r"([0-9a-f]{6})-([0-9]+)-[0-9a-f]{8}")
_EARLIER_TEMPORARY = re.compile(r"[0-9a-f]{8}")  # the name before: no host, no process
_STALE_AFTER = 3600.0  # seconds untouched: no save pauses this long, whoever writes it


@functools.cache
def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (one of another user counts: it cannot be signalled)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _remove_stale_temporaries(target: Path) -> None:
    """Remove the temporary files beside ``target`` that saves killed mid-way left: those whose writer,
    of this host, no longer runs, and any untouched for ``_STALE_AFTER`` seconds (a writer of another
    host, or one named before writers were). Nothing else is touched; a failure leaves the file."""
    prefix, now = f".{target.name}.", time.time()
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return
    for entry in entries:
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        middle = name[len(prefix) : -len(".tmp")]
        ours = _TEMPORARY.fullmatch(middle)
        if ours is None and _EARLIER_TEMPORARY.fullmatch(middle) is None:
            continue  # not a name a save gives
        with contextlib.suppress(OSError):
            info = entry.stat(follow_symlinks=False)
            dead = ours is not None and ours[1] == _host() and not _alive(int(ours[2]))
            if stat.S_ISREG(info.st_mode) and (dead or now - info.st_mtime > _STALE_AFTER):
                os.unlink(entry.path)


def _temporary(target: Path) -> tuple[int, Path]:
    """A new file beside ``target`` (same folder, so a rename replaces it in one step), named after
    this host and process; the ones earlier saves of ``target`` left behind are removed first."""
    _remove_stale_temporaries(target)
    while True:
        tag = f"{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
        temporary = target.with_name(f".{target.name}.{tag}.tmp")
        try:
            return os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), temporary
        except FileExistsError:
            continue
        except OSError as exc:
            message = f"cannot write in {target.parent} ({exc.strerror or exc}); pick another folder"
            raise ConfigError("path", message) from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def create_atomically(target: Path, data: bytes, *, keep_open: bool = False) -> int | None:
    """Put a file holding ``data`` at ``target`` in one step; with ``keep_open``, return it open for appending.

    The data goes to a temporary file in the target's folder, is flushed to disk, then renamed over
    the target: a process killed at any moment leaves either the previous file or the new one
    whole (and at worst a hidden ``.NAME.HOST-PID-XXXX.tmp`` beside it, which the next save of
    ``target`` removes). An existing target's permission bits are kept.

    Raises:
        ConfigError: The folder cannot be written to, or the disk refused the data.
    """
    fd, temporary = _temporary(target)
    try:
        with contextlib.suppress(OSError):
            os.fchmod(fd, stat.S_IMODE(os.stat(target).st_mode))  # a new file keeps the old one's permissions
        _write_all(fd, data)
        os.fsync(fd)
        os.replace(temporary, target)
    except BaseException as exc:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError):
            raise ConfigError("path", f"cannot write {target} ({exc.strerror or exc}); nothing was changed") from None
        raise
    if keep_open:
        return fd
    os.close(fd)
    _sync_folder(target.parent)
    return None


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (where the platform lets a folder be synced)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomically(target: Path, data: bytes) -> Path:
    """Replace ``target`` with ``data`` in one step (see ``create_atomically``); returns ``target``."""
    create_atomically(target, data)
    return target


_RANK_SUFFIX = re.compile(r"\.rank[0-9]+$")  # unimem.rank_path's: kept last, so a kept file still names its rank


def keep_aside(target: Path) -> Path | None:
    """Move a recording at ``target`` out of a new run's way; returns where it went (None: nothing to keep).

    A non-empty regular file becomes the first free ``STEM.N.SUFFIX`` beside it (``memory.1.jsonl``;
    ``memory.1.rank0.jsonl`` for ``memory.rank0.jsonl``), never over a file already there. An empty
    file, a link or nothing at all is left to be replaced: no recording is lost with it.

    Raises:
        ConfigError: The file cannot be moved (permissions, a read-only folder); it is left as it was.
    """
    try:
        info = os.lstat(target)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
        return None
    stem = target.name[: len(target.name) - len(target.suffix)]
    rank = _RANK_SUFFIX.search(stem)
    head, tail = (stem[: rank.start()], rank.group()) if rank else (stem, "")
    for number in itertools.count(1):
        kept = target.with_name(f"{head}.{number}{tail}{target.suffix}")
        if os.path.lexists(kept):
            continue
        try:
            os.link(target, kept)  # fails rather than replace a file that appeared there meanwhile
        except FileExistsError:
            continue
        except OSError:  # a filesystem without hard links
            try:
                os.rename(target, kept)
            except OSError as exc:
                raise ConfigError(
                    "path",
                    f"{target} holds an earlier recording that cannot be kept aside ({exc.strerror or exc}); "
                    "move it, or pass another path",
                ) from None
            return kept
        with contextlib.suppress(OSError):
            os.unlink(target)
        return kept
    raise AssertionError("unreachable")  # itertools.count never ends
