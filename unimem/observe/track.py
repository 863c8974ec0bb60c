"""``track()``: the peak, the change and the duration of a block of code.

How the peak is known depends on the framework's ``reset_peak`` capability:

- native (torch, TensorFlow): the framework's peak counter is reset when a block
  opens. Blocks nest: before an inner block resets the counter, the peak reached so
  far is folded into every block still open, so an outer block still learns the
  maximum over its whole span.
- emulated (JAX): XLA's peak cannot be reset. If the process peak rose during the
  block, the block reached it: exact. If not, the block's peak is only known to be
  at least what was allocated at its start and end: that lower bound is reported
  with ``peak_exact=False``.
- unsupported (NVML): no peak; ``peak`` is None.

On the CPU (no device allocator to read) every device figure is None, never 0; ``note`` says why.

Host memory is measured beside, in its own figures (``host_peak``, ``host_delta``): the
process's resident set size. Its high-water mark is process-wide and is reset when a block
opens (Linux, ``/proc/self/clear_refs``); as for a framework's counter, the mark reached so
far is first folded into every block still open, in any thread, so nested, overlapping and
threaded blocks all keep exact peaks. Where the mark cannot be reset, a block's host peak
is exact if the mark rose during it, else a lower bound (``host_peak_exact=False``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from unimem import host_memory, registry
from unimem.config import check_device
from unimem.errors import ConfigError, UnimemError
from unimem.memory_stats import MemoryStats
from unimem.sizes import format_bytes
from unimem.snapshots import read_snapshot
from unimem.support import Level

__all__ = ["Tracked", "resolve_query", "track"]

MODE_RESET = "reset"  # the framework resets its peak: exact, nestable
MODE_COMPARE = "compare"  # peak cannot be reset: exact if it rose, else a lower bound
MODE_NONE = "none"  # no peak at all


def resolve_query(backend: str | None) -> str | None:
    """The backend a query on ``backend`` reads (the registry's query rule); None for the
    framework-free view."""
    if backend is not None and not isinstance(backend, str):
        raise ConfigError("backend", f"expected a backend name or None, got {backend!r}")
    return registry.resolve(backend, "query")


def resolve_backend(backend: str | None) -> tuple[str, bool]:
    """``(name, fallback)``: the name a block reports, and whether it is the framework-free view."""
    name = resolve_query(backend)
    return (registry.FRAMEWORK_FREE, True) if name is None else (name, False)


def _read(name: str, device: int, fallback: bool) -> MemoryStats:
    return read_snapshot(None if fallback else name, device)


def _peak_mode(name: str, fallback: bool) -> str:
    if fallback:
        return MODE_NONE
    backend = registry.get_backend(name)
    level = backend.CAPABILITIES["reset_peak"].level
    if level is Level.NATIVE or (level is Level.EMULATED and backend.observe.peak_reset_exact):
        return MODE_RESET
    if level is Level.EMULATED:
        return MODE_COMPARE
    return MODE_NONE


def _max(*values: int | None) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


class _Frame:
    """An open block of a resetting backend: the peak reached before a later reset."""

    __slots__ = ("allocated", "reserved")

    def __init__(self) -> None:
        self.allocated: int | None = None
        self.reserved: int | None = None

    def fold(self, snapshot: MemoryStats) -> None:
        self.allocated = _max(self.allocated, snapshot.peak_allocated)
        self.reserved = _max(self.reserved, snapshot.peak_reserved)


class _HostFrame:
    """An open block's host high-water mark reached before a later reset."""

    __slots__ = ("peak",)

    def __init__(self) -> None:
        self.peak: int | None = None


# Open blocks per (backend, device), and every open block's host frame. The peak counters
# (the framework's, the process's resident mark) are process-wide, so these are too; the
# lock makes "read, fold into every open block, reset" one step.
_frames: dict[tuple[str, int], list[_Frame]] = {}
_host_frames: list[_HostFrame] = []
_frames_lock = threading.Lock()

_HOST_LOWER_BOUND = (
    "the host's resident high-water mark cannot be reset here (/proc/self/clear_refs is not writable, "
    "or this is not Linux) and it did not rise in this block: host_peak is a lower bound (the larger "
    "resident size at the block's start or end)"
)
_HOST_UNKNOWN = "this host's resident memory cannot be read here: the host figures are None"


def _host_begin() -> tuple[_HostFrame | None, int | None]:
    """Open a block's host figures (under the lock): its frame where the mark was reset,
    else the mark at its start (to see whether it rises)."""
    if host_memory.can_reset_peak():
        mark = host_memory.peak() if _host_frames else None
        for frame in _host_frames:
            frame.peak = _max(frame.peak, mark)
        if host_memory.reset_peak():
            frame = _HostFrame()
            _host_frames.append(frame)
            return frame, None
    return None, host_memory.peak()


def _host_finish(frame: _HostFrame | None, start_mark: int | None, start: MemoryStats, end: MemoryStats) -> _Peak:
    """A block's host peak (under the lock): exact where the mark was reset at its start."""
    mark = host_memory.peak()
    if frame is not None:
        if frame in _host_frames:
            _host_frames.remove(frame)
        if mark is not None:
            return _Peak(_max(frame.peak, mark, start.host_rss, end.host_rss), True)
    elif mark is not None and start_mark is not None and mark > start_mark:
        return _Peak(_max(mark, end.host_rss), True)  # the mark rose: the block reached it
    bound = _max(start.host_rss, end.host_rss)
    if bound is None:
        return _Peak(None, None, _HOST_UNKNOWN)
    return _Peak(bound, False, _HOST_LOWER_BOUND)


@dataclass(frozen=True)
class _Peak:
    value: int | None
    exact: bool | None
    note: str = ""


def _compare_peak(start: MemoryStats, end: MemoryStats, field: str, current: str) -> _Peak:
    """Peak of a block on a backend whose peak counter cannot be reset (JAX)."""
    start_peak, end_peak = getattr(start, field), getattr(end, field)
    start_now, end_now = getattr(start, current), getattr(end, current)
    if end_peak is not None:
        if start_now is None:
            # The allocator was not running when the block opened: its whole peak is inside.
            return _Peak(end_peak, True)
        if start_peak is None or end_peak > start_peak:
            # The process peak rose during the block (start_peak None means it was under the
            # reset_peak() baseline then and is above it now): the block reached it.
            return _Peak(end_peak, True)
    bound = _max(start_now, end_now)
    if bound is None:
        return _Peak(None, None)
    return _Peak(
        bound,
        False,
        f"{end.backend} cannot reset its peak and the process peak did not rise in this block: "
        "the peak is a lower bound (the most allocated at the block's start or end)",
    )


class Tracked:
    """What ``with unimem.track() as t:`` measured. Figures are None until the block ends.

    How the peak is known depends on the backend's ``reset_peak`` capability: where the
    framework resets its peak counter (torch, TensorFlow) the peak is exact and blocks
    nest; where it cannot (JAX) the peak is exact if the process peak rose during the
    block, else a lower bound (``peak_exact=False``); NVML keeps no peak (None). On the
    CPU every device figure is None, never 0; ``note`` says why. ``str()`` reads as one line.

    Host memory (this process's resident set size) is measured beside, in its own figures,
    on every host: on one without a GPU they are the figures known. Its high-water mark is
    process-wide, so ``host_peak`` counts every thread's memory; blocks nest, overlap and run
    in threads, each with an exact peak, where the mark can be reset (Linux).

    Args:
        backend: A backend name or alias, or None (default) for the query rule of
            ``stats()``, resolved when the block opens.
        device: The device index (default 0).

    Attributes:
        backend (str | None): The backend whose figures were read (set when the block opens).
        device (int): The device index.
        peak (int | None): Highest ``allocated`` during the block (bytes in live tensors).
        peak_reserved (int | None): Highest pool size during the block in bytes, where the
            framework counts it.
        peak_exact (bool | None): False when ``peak`` is a lower bound (JAX), None when unknown.
        delta (int | None): ``allocated`` at the end minus at the start, in bytes.
        host_peak (int | None): Highest resident set size of this process during the block, in
            bytes (host memory, never part of ``peak``). None where it cannot be read.
        host_peak_exact (bool | None): False when ``host_peak`` is a lower bound (the host's
            high-water mark cannot be reset here and did not rise); None when unknown.
        host_delta (int | None): Resident set size at the end minus at the start, in bytes.
        duration (float | None): Seconds.
        start (MemoryStats | None): The full ``MemoryStats`` at the block's start.
        end (MemoryStats | None): The full ``MemoryStats`` at the block's end.
        note (str): Why a figure is None or a lower bound; empty if nothing.

    Raises:
        ConfigError: ``backend`` is unknown or ``device`` is not an index of 0 or more.
    """

    def __init__(self, backend: str | None = None, device: int = 0) -> None:
        if backend is not None:
            registry.canonical_name(backend)
        self.device = check_device(device)
        self._requested = backend
        self.backend: str | None = None
        self.start: MemoryStats | None = None
        self.end: MemoryStats | None = None
        self.peak: int | None = None
        self.peak_reserved: int | None = None
        self.peak_exact: bool | None = None
        self.delta: int | None = None
        self.host_peak: int | None = None
        self.host_peak_exact: bool | None = None
        self.host_delta: int | None = None
        self.duration: float | None = None
        self.note = ""
        self._mode = MODE_NONE
        self._fallback = False
        self._frame: _Frame | None = None
        self._host: _HostFrame | None = None
        self._host_mark: int | None = None
        self._t0: float | None = None

    # --- the block ---------------------------------------------------------------
    def __enter__(self) -> Tracked:
        if self._t0 is not None:
            raise UnimemError("this track() block is already open; open a new unimem.track() to nest blocks")
        name, fallback = resolve_backend(self._requested)
        self.backend, self._fallback = name, fallback
        self._mode = _peak_mode(name, fallback)
        self.end = None
        self.peak = self.peak_reserved = self.peak_exact = self.delta = self.duration = None
        self.host_peak = self.host_peak_exact = self.host_delta = None
        self.note = ""
        with _frames_lock:
            self._begin(_read(name, self.device, fallback))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """End the block (what leaving ``with`` does).

        Raises:
            UnimemError: The block is not open.
        """
        if self._t0 is None:
            raise UnimemError("this track() block is not open")
        assert self.backend is not None
        with _frames_lock:
            self._finish(_read(self.backend, self.device, self._fallback))

    def roll(self) -> Tracked:
        """End the block and open the next one at the same instant, reading the stats once.

        Returns the finished block's figures (a closed copy). A training loop's
        per-step figures (``MemoryHook``) are consecutive blocks.

        Returns:
            The finished block's figures, a closed copy; this ``Tracked`` stays open on
            the next block.

        Raises:
            UnimemError: The block is not open.
        """
        if self._t0 is None:
            raise UnimemError("this track() block is not open")
        assert self.backend is not None
        with _frames_lock:
            snapshot = _read(self.backend, self.device, self._fallback)
            self._finish(snapshot)
            finished = Tracked.__new__(Tracked)
            finished.__dict__.update(self.__dict__)
            self._begin(snapshot)
        return finished

    # --- internals (called under _frames_lock) ---------------------------------------
    def _begin(self, start: MemoryStats) -> None:
        assert self.backend is not None
        self.start = start
        if self._mode == MODE_RESET:
            key = (self.backend, self.device)
            # The peak so far belongs to every block still open: keep it before the reset.
            for frame in _frames.get(key, []):
                frame.fold(start)
            registry.get_backend(self.backend).reset_peak(self.device)
            self._frame = _Frame()
            _frames.setdefault(key, []).append(self._frame)
        self._host, self._host_mark = _host_begin()
        self._t0 = time.perf_counter()

    def _finish(self, end: MemoryStats) -> None:
        assert self.backend is not None and self.start is not None and self._t0 is not None
        self.duration = time.perf_counter() - self._t0
        self._t0 = None
        self.end = end
        start = self.start
        if start.allocated is not None and end.allocated is not None:
            self.delta = end.allocated - start.allocated
        if start.host_rss is not None and end.host_rss is not None:
            self.host_delta = end.host_rss - start.host_rss
        host = _host_finish(self._host, self._host_mark, start, end)
        self._host = None
        self.host_peak, self.host_peak_exact = host.value, host.exact
        notes = []
        if self._mode == MODE_RESET:
            frame = self._frame
            assert frame is not None
            frames = _frames.get((self.backend, self.device), [])
            if frame in frames:
                frames.remove(frame)
            self._frame = None
            if end.peak_allocated is not None:
                self.peak = _max(end.peak_allocated, frame.allocated)
                self.peak_exact = True
            if end.peak_reserved is not None:
                self.peak_reserved = _max(end.peak_reserved, frame.reserved)
        elif self._mode == MODE_COMPARE:
            allocated = _compare_peak(start, end, "peak_allocated", "allocated")
            reserved = _compare_peak(start, end, "peak_reserved", "reserved")
            self.peak, self.peak_exact = allocated.value, allocated.exact
            self.peak_reserved = reserved.value
            if allocated.note:
                notes.append(allocated.note)
        else:
            notes.append(f"{self.backend} keeps no peak")
        if end.allocated is None and end.peak_allocated is None:
            notes.append(
                f"{end.backend} reports no allocator figures on device {self.device} here "
                "(no GPU, or its device runtime has not started): they are None, not 0"
            )
        if host.note:
            notes.append(host.note)
        self.note = "; ".join(notes)

    # --- display -----------------------------------------------------------------
    def __repr__(self) -> str:
        if self.duration is None:
            return f"<unimem.track {self.backend or self._requested or 'auto'}:{self.device} open>"
        peak = format_bytes(self.peak)
        if self.peak_exact is False:
            peak = f">= {peak} (lower bound)"
        host_peak = format_bytes(self.host_peak)
        if self.host_peak_exact is False:
            host_peak = f">= {host_peak}"
        text = (
            f"track({self.backend}:{self.device}): peak {peak}, delta {_signed(self.delta)}, "
            f"host peak {host_peak}, host delta {_signed(self.host_delta)}, {self.duration:.3f} s"
        )
        return f"{text} [{self.note}]" if self.note else text

    __str__ = __repr__

    def as_dict(self) -> dict[str, Any]:
        """The block's figures as plain data, JSON-ready.

        Returns:
            ``backend``, ``device``, ``peak``, ``peak_reserved``, ``peak_exact``, ``delta``,
            ``host_peak``, ``host_peak_exact``, ``host_delta`` (bytes, or None where unknown),
            ``duration`` (seconds), ``note``, and ``start``/``end`` as ``MemoryStats.as_dict()``.
        """
        data: dict[str, Any] = {
            name: getattr(self, name)
            for name in (
                "backend",
                "device",
                "peak",
                "peak_reserved",
                "peak_exact",
                "delta",
                "host_peak",
                "host_peak_exact",
                "host_delta",
                "duration",
                "note",
            )
        }
        data["start"] = None if self.start is None else self.start.as_dict()
        data["end"] = None if self.end is None else self.end.as_dict()
        return data


def _signed(value: int | None) -> str:
    return "n/a" if value is None else ("+" if value >= 0 else "-") + format_bytes(abs(value))


def track(backend: str | None = None, device: int = 0) -> Tracked:
    """Measure a block: ``with unimem.track() as t: ...`` then ``t.peak``, ``t.delta``, ``t.duration``.

    Blocks nest. Opening a block resets the framework's peak counter where the
    framework can (torch, TensorFlow), so ``stats().peak_allocated`` afterwards counts
    from the innermost block's start; see ``Tracked`` for JAX (lower bounds) and the CPU (None).
    Host memory is measured too (``host_peak``, ``host_delta``: this process's resident set
    size), on every host; on Linux opening a block likewise restarts the process's resident
    high-water mark (``VmHWM`` and ``ru_maxrss``), after folding it into every open block.

    Args:
        backend: A backend name or alias, or None (default) for the query rule of
            ``stats()``, resolved when the block opens.
        device: The device index (default 0).

    Returns:
        The block's measurement, a context manager; its figures are None until the
        block ends.

    Raises:
        ConfigError: ``backend`` is unknown or ``device`` is not an index of 0 or more
            (raised here); with ``backend=None``, two frameworks are candidates when the
            block opens: pass ``backend=``.
        BackendUnavailable: When the block opens, the named framework is not installed.
        UnimemError: The same ``Tracked`` is opened again while open: open a new
            ``unimem.track()`` to nest blocks.

    Example:
        ```python
        with unimem.track("torch") as t:
            loss = model(batch).sum()
            loss.backward()
        print(t.peak, t.delta, t.duration)  # bytes, bytes, seconds
        print(t.host_peak, t.host_delta)  # host memory, bytes: known without a GPU too
        print(t)  # "track(torch:0): peak ..., delta ..., host peak ..., host delta ..., ... s"
        ```
    """
    return Tracked(backend, device)
