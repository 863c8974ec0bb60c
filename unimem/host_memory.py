"""This process's host memory: its resident set size now, its high-water mark, and the mark's reset.

Host memory is a figure of its own, never ``allocated`` (bytes in live tensors). On Linux
every read is one ``pread`` of a file in ``/proc/self`` kept open, cheap enough for ``stats()``
to carry it (docs/measurements.md, "Host memory"); elsewhere psutil answers, and without it the
figures are None.

``available()`` is what the host can still give the process: the batch-size search holds a step
to it where no device figure is known, so that it stops before the kernel kills the process.

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
from pathlib import Path
from typing import Any

__all__ = ["available", "can_reset_peak", "peak", "reset_peak", "rss"]

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


# A cgroup limit at or above this is "no limit" (cgroup v1 writes one as the largest page-aligned int64).
_NO_LIMIT = 1 << 60
_CGROUPS = Path("/sys/fs/cgroup")


def available() -> int | None:
    """Bytes the host can still give this process before the kernel has to kill one.

    The host's available memory (free pages, and caches the kernel can drop: ``MemAvailable``),
    and no more than the memory cgroup the process runs in (a container's limit) leaves under
    its limit, where one is set: there the kernel kills at the cgroup's limit, whatever the host
    has free.

    Returns:
        Bytes: psutil's ``virtual_memory().available`` (``/proc/meminfo`` without psutil), less
        where the cgroup leaves less; None where neither can be read.
    """
    host = _host_available()
    room = _cgroup_room(_CGROUPS, _own_cgroups()) if _LINUX else None
    known = [x for x in (host, room) if x is not None]
    return min(known) if known else None


def _host_available() -> int | None:
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.virtual_memory().available)
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup paths from ``/proc/self/cgroup``: ``""`` for the unified (v2)
    hierarchy, ``"memory"`` for the v1 memory controller's."""
    paths: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as handle:
            for line in handle:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) == 3 and (parts[1] == "" or "memory" in parts[1].split(",")):
                    paths["" if parts[1] == "" else "memory"] = parts[2]
    except OSError:
        pass
    return paths


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _stat(path: Path, key: str) -> int | None:
    """A field of a cgroup's ``memory.stat``; None where it cannot be read."""
    try:
        for line in path.read_text(encoding="ascii").splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return None


# Per hierarchy: its folder under the mount, its limit and usage files, the ``memory.stat`` field
# of page cache the kernel drops before it kills, and the one of a limit an ancestor sets (v1).
_LAYOUTS = (
    ("", "", "memory.max", "memory.current", "inactive_file", None),
    (
        "memory",
        "memory",
        "memory.limit_in_bytes",
        "memory.usage_in_bytes",
        "total_inactive_file",
        "hierarchical_memory_limit",
    ),
)


def _cgroup_room(root: Path, own: dict[str, str]) -> int | None:
    """What the process's memory cgroup leaves under its limit (less the page cache it can drop),
    or None without a limit. Its folder is looked up where ``/proc/self/cgroup`` names it, else
    at the mount's top (a container sees its own cgroup there)."""
    for version, sub, limit_name, usage_name, cache_key, inherited_key in _LAYOUTS:
        if version not in own:
            continue
        for folder in (root / sub / own[version].lstrip("/"), root / sub):
            limit, usage = _read_int(folder / limit_name), _read_int(folder / usage_name)
            if limit is None or usage is None:
                continue
            stat = folder / "memory.stat"
            inherited = _stat(stat, inherited_key) if inherited_key else None
            limit = min(limit, inherited) if inherited is not None else limit
            if limit >= _NO_LIMIT:
                break
            return max(0, limit - max(0, usage - (_stat(stat, cache_key) or 0)))
    return None
