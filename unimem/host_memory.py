"""This process's host memory: its resident set size now, its high-water mark, and the mark's reset.

Host memory is a figure of its own, never ``allocated`` (bytes in live tensors). On Linux
every read is one ``pread`` of a file in ``/proc/self`` kept open, cheap enough for ``stats()``
to carry it (docs/measurements.md, "Host memory"); elsewhere psutil answers, and without it the
figures are None.

The high-water mark (``VmHWM``) is process-wide. Writing ``5`` to ``/proc/self/clear_refs``
restarts it at the current size (Linux 4.0 and later); where that file cannot be written
(other systems, some containers) ``can_reset_peak()`` is False and a block's peak is known
only when the mark rose during it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any

__all__ = ["can_reset_peak", "peak", "reset_peak", "rss"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_LINUX = sys.platform.startswith("linux")

# Kept-open descriptors of files in /proc/self: a read is then one pread, not open/read/close
# (docs/measurements.md, "Host memory"). Forgotten in a forked child, whose /proc/self is
# another directory.
_fds: dict[str, int] = {}
_lock = threading.Lock()
_reset: dict[str, bool | None] = {"works": None}  # None: not tried yet


def _forget() -> None:
    for fd in _fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _fds.clear()
    _reset["works"] = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)


def _fd(name: str, flags: int) -> int:
    fd = _fds.get(name)
    if fd is None:
        with _lock:
            fd = _fds.get(name)
            if fd is None:
                fd = os.open(f"/proc/self/{name}", flags)
                _fds[name] = fd
    return fd


def _psutil_process() -> Any:
    try:
        import psutil
    except ImportError:
        return None
    return psutil.Process()


def _status_bytes(key: bytes) -> int | None:
    """A field of /proc/self/status given in kB (``VmHWM``), in bytes; None where absent."""
    text = os.pread(_fd("status", os.O_RDONLY), 8192, 0)
    start = text.find(b"\n" + key)
    if start < 0:
        return None
    end = text.find(b"\n", start + 1)
    return int(text[start + len(key) + 1 : end].split()[0]) * 1024


def rss() -> int | None:
    """This process's resident set size now, in bytes; None where it cannot be read.

    Returns:
        Bytes: ``/proc/self/statm`` on Linux, psutil elsewhere; None without either.
    """
    if _LINUX:
        try:
            return int(os.pread(_fd("statm", os.O_RDONLY), 128, 0).split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return None
    process = _psutil_process()
    if process is None:
        return None
    return int(process.memory_info().rss)


def peak() -> int | None:
    """This process's resident high-water mark, in bytes: since it started or the last
    ``reset_peak()``; None where it cannot be read.

    Returns:
        Bytes: ``VmHWM`` on Linux, ``ru_maxrss`` on macOS, psutil's ``peak_wset`` on Windows.
    """
    if _LINUX:
        try:
            return _status_bytes(b"VmHWM:")
        except (OSError, ValueError, IndexError):
            return None
    if sys.platform == "darwin":
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # bytes on macOS
    process = _psutil_process()
    value = getattr(process.memory_info(), "peak_wset", None) if process is not None else None
    return None if value is None else int(value)


def reset_peak() -> bool:
    """Restart the high-water mark at the current size (process-wide, ``ru_maxrss`` included).

    Returns:
        True when it was reset; False where it cannot be (not Linux, ``/proc/self/clear_refs``
        not writable): remembered, so later calls cost nothing.
    """
    if not _LINUX or _reset["works"] is False:
        return False
    try:
        os.write(_fd("clear_refs", os.O_WRONLY), b"5")
    except OSError:
        _reset["works"] = False
        return False
    _reset["works"] = True
    return True


def can_reset_peak() -> bool:
    """Whether ``reset_peak()`` works here, without resetting anything.

    Returns:
        The answer of the last ``reset_peak()``; before one, whether this is Linux with a
        writable ``/proc/self/clear_refs``.
    """
    works = _reset["works"]
    return bool(works) if works is not None else _LINUX and os.access("/proc/self/clear_refs", os.W_OK)
