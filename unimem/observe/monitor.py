"""``monitor()``: a background memory timeline that does not slow the training loop.

A thread in the training process that polls memory fights the training thread for
the GIL, and slows the loop the more often it polls (the cost measured on a GPU is in
docs/measurements.md, "Monitor overhead"). So the work is split:

- NVML (device used/total, this process's usage) and this process's host RSS are
  read at ``interval`` by a separate *sampler process* (``unimem.observe.sampler``; the
  process and the pipes to it: ``unimem.observe.sampler_link``).
  It holds its own GIL; this process does nothing for those samples until they are
  collected (at ``stop()``, or when ``samples`` is read).
- The framework's allocator counters exist only inside this process. A thread reads
  them with the cheapest accessor each framework has (torch's raw C++ stats dict, not
  the flattened ``memory_stats()``; JAX's ``Device.memory_stats()``), at
  ``framework_interval``: 10 Hz by default and never faster than 100 Hz
  (``MIN_FRAMEWORK_INTERVAL``); ``framework_interval=None`` turns that thread off.
  ``mark()`` also reads them, in the caller's thread.

Intervals: ``interval`` ≥ ``MIN_INTERVAL`` (1 ms). Memory stays bounded: each stream
keeps at most ``max_samples`` samples; when full, neighbouring pairs merge (the gap,
else the higher reading, survives) and the stream's resolution halves (see
``BoundedSeries``). Marks keep the latest ``max_samples``.

``path=`` streams the recording to a JSON Lines file as it runs (``unimem.observe.stream``):
the sampler process is its one writer, this process sends it the allocator samples and marks
down its pipe, and the file keeps every sample (the memory above may be thinned). A kill of
this process loses nothing the sampler has; a kill of both loses at most the last
``FLUSH_EVERY`` seconds.

Forks: no lock is held across a fork (each is made anew in the child, where a thread of the
parent may have held it), and a forked child closes its copy of the pipe to the sampler and
never touches it; the child's monitor is a stopped copy. The sampler watches this process
itself, so it ends when this process dies even while forked children (DataLoader workers)
live on.

NVML errors during the run are gaps (samples with ``error`` set), counted in the
notes; the sampler keeps going. Without NVML or a GPU the timeline has the
framework's figures (None on the CPU) and host RSS, and the notes say why.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

from unimem import ranks, registry
from unimem.config import check_device
from unimem.errors import BackendUnavailable, ConfigError, NoFigures, UnimemError, UnimemWarning
from unimem.memory_stats import MemoryStats
from unimem.observe.files import check_target, keep_aside
from unimem.observe.recording import Recorder, Recording
from unimem.observe.sampler_link import SamplerLink
from unimem.observe.samples import (
    DEFAULT_MAX_SAMPLES,
    SOURCE_DEVICE,
    SOURCE_FRAMEWORK,
    BoundedSeries,
    Mark,
    Sample,
    failed_readings_note,
    merge_samples,
)
from unimem.observe.stream import FRAMEWORK, MARK, encode
from unimem.observe.track import resolve_query
from unimem.sizes import counted
from unimem.snapshots import read_snapshot

__all__ = ["MIN_FRAMEWORK_INTERVAL", "MIN_INTERVAL", "Monitor", "check_interval", "counter_reader", "monitor"]

MIN_INTERVAL = 0.001  # faster, each tick is mostly the cost of reading NVML and /proc itself
MIN_FRAMEWORK_INTERVAL = 0.01  # each in-process read wakes a thread that must take the GIL
DEFAULT_FRAMEWORK_INTERVAL = 0.1

Counters = tuple[int | None, int | None]  # (allocated, reserved)


def check_interval(value: object, parameter: str, floor: float) -> float:
    """``value`` as seconds: a positive, finite number no smaller than ``floor``; else a ``ConfigError``
    naming ``parameter``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(parameter, f"expected seconds as a number, got {value!r}")
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds) or seconds <= 0:
        raise ConfigError(parameter, f"expected a positive, finite number of seconds, got {value!r}")
    if seconds < floor:
        raise ConfigError(parameter, f"{seconds:g} s is under the floor of {floor:g} s; sample less often")
    return seconds


def counter_reader(name: str | None, device: int) -> tuple[Callable[[], Counters] | None, str]:
    """A cheap ``() -> (allocated, reserved)`` for ``name``'s allocator, and a note.

    Reads ``(None, None)`` until the framework's device runtime has started; never starts it.
    A reader raises ``NoFigures`` once it knows it never will have figures here.
    """
    if name is None or not registry.is_framework(name):
        return None, "no framework in use: allocator figures are not sampled"
    return registry.get_backend(name).observe.counter_reader(device)


# Every monitor made in this process, so a forked child can make its locks anew and let go of
# its parent's sampler (see Monitor._forked).
_MONITORS: weakref.WeakSet[Monitor] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for made in list(_MONITORS):
        made._forked()


def _sample_framework(monitor: weakref.ReferenceType[Monitor], stop: threading.Event, interval: float) -> None:
    """The allocator thread: a sample every ``interval`` until ``stop`` is set or the monitor is gone.

    It holds the monitor weakly, between samples: a monitor dropped without ``stop()`` is collected,
    and its finalizer sets ``stop``, so nothing of it keeps running.
    """
    while not stop.wait(interval):
        alive = monitor()
        if alive is None or not alive._sample_framework_once():
            return
        del alive


class Monitor(Recorder):
    """A background memory timeline. ``with unimem.monitor(0.01) as m: ...`` or ``m.start()`` / ``m.stop()``.

    After (or during) the run: ``samples``, ``marks``, ``recording``, ``to_csv()``,
    ``to_json()``, ``plot()``. Sample sources: ``"device"`` (NVML and host RSS, from the
    sampler process) and ``"framework"`` (allocator counters, from this process).
    Made by ``unimem.monitor()``, which takes the same arguments and documents them.
    A monitor runs once.

    Args:
        interval: Seconds between NVML/host samples (≥ 0.001).
        backend: A backend name or alias, or None for the query rule of ``stats()``.
        device: The device index.
        framework_interval: Seconds between allocator-counter samples (``"auto"``, a
            number ≥ 0.01, or None: only at ``mark()``).
        max_samples: Samples kept per stream (at least 100).
        probe: ``"module:factory"`` run in the sampler process instead of NVML, or None.
        path: A ``.jsonl`` file the recording is streamed to as it runs, or None.

    Attributes:
        interval (float): Seconds between NVML/host samples.
        framework_interval (float | None): Seconds between allocator-counter samples;
            None: only at ``mark()``.
        backend (str | None): The backend whose counters are read, set at ``start()``;
            None when no framework is in use.
        device (int): The device index.
        max_samples (int): Samples kept per stream.
        path (Path | None): The file the recording is streamed to; None: kept in memory only.
        start_stats (MemoryStats | None): ``stats()`` at ``start()``.
        end_stats (MemoryStats | None): ``stats()`` at ``stop()``.

    Raises:
        ConfigError: An argument is invalid (see ``unimem.monitor()``).
    """

    def __init__(
        self,
        interval: float = 0.1,
        backend: str | None = None,
        device: int = 0,
        *,
        framework_interval: float | None | str = "auto",
        max_samples: int = DEFAULT_MAX_SAMPLES,
        probe: str | None = None,
        path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.interval = check_interval(interval, "interval", MIN_INTERVAL)
        if framework_interval == "auto":
            self.framework_interval: float | None = max(self.interval, DEFAULT_FRAMEWORK_INTERVAL)
        elif framework_interval is None:
            self.framework_interval = None
        else:
            self.framework_interval = check_interval(framework_interval, "framework_interval", MIN_FRAMEWORK_INTERVAL)
        if backend is not None:
            registry.canonical_name(backend)
        self.device = check_device(device)
        if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 100:
            raise ConfigError("max_samples", f"expected an int of at least 100, got {max_samples!r}")
        if probe is not None and (not isinstance(probe, str) or ":" not in probe):
            raise ConfigError("probe", f"expected 'module:factory', got {probe!r}")
        self.path = None if path is None else check_target(path, ".jsonl")
        self.max_samples = max_samples
        self._requested = backend
        self._probe = probe
        self.backend: str | None = None
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._notes: list[str] = []
        self._link = SamplerLink(self._notes.append)  # the sampler process and the pipes to it
        self._stream_error: str | None = None
        self._reader: Callable[[], Counters] | None = None
        self._framework = BoundedSeries(max_samples)
        self._marks: deque[Mark] = deque(maxlen=max_samples)
        self._marks_seen = 0
        self._device_rows: list[list[Any]] = []
        self._device_errors: list[str] = []
        self._device_error_count = 0
        self._device_stride = 1
        self._started: float | None = None
        self._stopped: float | None = None
        self.start_stats: MemoryStats | None = None
        self.end_stats: MemoryStats | None = None
        self._prometheus: Any = None
        _MONITORS.add(self)

    def __repr__(self) -> str:
        """``Monitor(backend='torch', device=0, interval=0.1 s, 57 samples, running)``."""
        state = "not started" if self._started is None else ("running" if self._stopped is None else "stopped")
        backend = self.backend if self._started is not None else self._requested
        return (
            f"Monitor(backend={backend!r}, device={self.device}, interval={self.interval:g} s, "
            f"{counted(self._sample_count(), 'sample')}, {state})"
        )

    def _sample_count(self) -> int:
        """Samples kept so far; while running, the sampler process is asked for its count only."""
        device = len(self._device_rows)
        if self.running:
            reply = self._link.ask("count")
            if reply is not None and isinstance(reply.get("count"), int):
                device = reply["count"]
        with self._lock:
            return device + len(self._framework)

    # --- lifecycle ---------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether the monitor has started and not yet stopped."""
        return self._started is not None and self._stopped is None

    def start(self) -> Monitor:
        """Start sampling; returns self. A monitor runs once.

        Resolves the backend, reads ``start_stats``, launches the sampler process and,
        unless ``framework_interval`` is None or no framework is in use, the thread that
        reads the allocator counters. Never starts a framework's device runtime.

        Returns:
            The monitor itself.

        Raises:
            UnimemError: The monitor was already started (create a new
                ``unimem.monitor()`` for another run), or the sampler process did not
                start (the message quotes its error output).
            ConfigError: With ``backend=None``, two frameworks are candidates: pass
                ``backend=``; or the ``path`` file cannot be created, or a recording already there
                cannot be kept aside (nothing is left running).

        Warns:
            UnimemWarning: ``path`` held a recording (an earlier run's): it was moved to
                ``NAME.N.jsonl`` beside it (the first free ``N``), and the warning names it.
            BackendUnavailable: The named backend's framework (or, named explicitly,
                NVML) is not available.
        """
        if self._started is not None:
            raise UnimemError("this monitor was already started; create a new unimem.monitor() for another run")
        name = resolve_query(self._requested)  # None: no framework in use, the framework-free view
        try:
            self.start_stats = read_snapshot(name, self.device)
        except BackendUnavailable as exc:
            if self._requested is not None:
                raise
            self._notes.append(f"no backend: {exc}")  # host figures only
        self.backend = name
        self._reader, note = counter_reader(self.backend, self.device)
        if note:
            self._notes.append(note)
        if self.framework_interval is None and self._reader is not None:
            self._notes.append("framework_interval=None: allocator figures only at marks")
        self._started = time.time()
        try:
            self._spawn()
        except BaseException:
            self._stopped = time.time()
            self._link.finish(kill=False)  # interrupted while starting: the sampler ends, its file whole
            raise
        self._started = time.time()  # the timeline starts when the sampler is ready, not at its launch
        if self._reader is not None and self.framework_interval is not None:
            self._thread = threading.Thread(
                target=_sample_framework,
                args=(weakref.ref(self), self._stop_event, self.framework_interval),
                name="unimem-monitor",
                daemon=True,
            )
            weakref.finalize(self, self._stop_event.set)  # dropped unstopped: the thread ends at its next wake
            self._thread.start()
        return self

    def _spawn(self) -> None:
        if self.path is not None:
            kept = keep_aside(self.path)  # an earlier run's file (a crashed job restarted) is never replaced
            if kept is not None:
                said = f"{self.path} held an earlier recording: it is kept as {kept}; this run streams to {self.path}"
                self._notes.append(said)
                warnings.warn(f"monitor: {said}", UnimemWarning, stacklevel=3)
        args = [
            "--interval",
            repr(self.interval),
            "--device",
            str(self.device),
            "--pid",
            str(os.getpid()),
            "--capacity",
            str(self.max_samples),
        ]
        # The framework's UUID maps its device ordinal to NVML's exactly (CUDA_VISIBLE_DEVICES aside).
        uuid = None if self.backend is None else registry.get_backend(self.backend).device_uuid(self.device)
        if uuid is not None:
            args += ["--uuid", uuid]
        if self._probe is not None:
            args += ["--probe", self._probe]
        if self.path is not None:
            args += ["--stream", os.path.abspath(self.path), "--meta", json.dumps(self._meta(), default=str)]
        ready = self._link.start(args)
        if ready.get("stream", "ok") != "ok":
            self._link.finish(kill=True)
            raise ConfigError("path", str(ready["stream"]))
        if ready.get("probe") != "ok":
            self._notes.append(f"device figures unavailable: {ready.get('probe')}")
        if ready.get("host") != "ok":
            self._notes.append(str(ready.get("host")))

    def _take(self, reply: dict[str, Any] | None) -> None:
        if reply is None:
            return
        self._stream_error = reply.get("stream") or self._stream_error
        self._device_rows = reply.get("samples", [])
        self._device_errors = reply.get("errors", [])
        self._device_error_count = int(reply.get("error_count", 0))
        self._device_stride = int(reply.get("stride", 1))

    def stop(self) -> Recording:
        """Stop sampling (within one interval), collect the samples; returns the recording.

        Leaves no thread and no process behind. Calling it again is harmless. With ``path``,
        the file gets its end record (the final meta) before this returns.

        Returns:
            The run's samples, marks and meta (cap, interval, notes).

        Raises:
            UnimemError: The monitor was never started.

        Warns:
            UnimemWarning: Writing the ``path`` file failed during the run (the disk filled, the
                folder went away); the file ends there, this recording is whole.
        """
        if self._started is None:
            raise UnimemError("this monitor was never started")
        if self._stopped is not None:
            return self.recording
        self._stop_event.set()
        if self._prometheus is not None:  # first: a scrape must not ask a sampler that is stopping
            self._prometheus.close()
            self._prometheus = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        failure: Exception | None = None
        try:
            if self.backend is not None:
                self.end_stats = read_snapshot(self.backend, self.device)
        except Exception as exc:  # raised once the sampler is stopped: nothing may be left running
            failure = exc
        self._stopped = time.time()
        if self.path is not None:
            self._link.send(encode({"end": json.loads(json.dumps(self._meta(), default=str))}))
        self._take(self._link.ask("stop"))
        self._link.finish(kill=False)
        if self._device_error_count:
            first = self._device_errors[0] if self._device_errors else "?"
            self._notes.append(failed_readings_note(self._device_error_count, first))
        if self._link.dropped:
            self._notes.append(f"{counted(self._link.dropped, 'record')} not streamed: the sampler fell behind")
        if self._stream_error is not None:
            self._notes.append(self._stream_error)
            warnings.warn(f"monitor: {self._stream_error}", UnimemWarning, stacklevel=2)
        if failure is not None:
            raise failure
        return self.recording

    def _forked(self) -> None:
        """In a forked child: locks made anew (a thread of the parent may have held one at the fork),
        the pipe to the parent's sampler closed and the sampler never touched; a running monitor
        becomes a stopped copy."""
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._stop_event.set()
        self._link.forked()
        self._thread = None
        self._prometheus = None  # its server thread stayed in the parent
        if self.running:
            self._stopped = time.time()
            self._notes.append(f"a forked copy (pid {os.getpid()}); the recording is the parent's")

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- in-process sampling ---------------------------------------------------------
    def _sample_framework_once(self) -> bool:
        """One allocator sample (a failed read is a gap); False once the reader says it never will have figures."""
        read = self._reader
        assert read is not None
        now = time.time()
        try:
            allocated, reserved = read()
            sample = Sample(now, SOURCE_FRAMEWORK, allocated, reserved)
        except NoFigures as exc:
            self._notes.append(str(exc))
            return False
        except Exception as exc:  # a failed read is a gap, not the end of the timeline
            sample = Sample(now, SOURCE_FRAMEWORK, error=f"{type(exc).__name__}: {exc}")
        with self._lock:
            self._framework.add(sample)
        if self.path is not None:
            self._link.send(encode([FRAMEWORK, now, sample.allocated, sample.reserved, sample.error]))
        return True

    def mark(self, label: str) -> Mark:
        """Record an event (an epoch, a phase) with the allocator's figures now.

        Reads the counters in the caller's thread; figures unknown here are None.

        Args:
            label: The event's name, drawn on the plot.

        Returns:
            The mark recorded.

        Raises:
            ConfigError: ``label`` is not a string.
        """
        if not isinstance(label, str):
            raise ConfigError("label", f"expected a string, got {label!r}")
        allocated = reserved = None
        if self._reader is not None:
            try:
                allocated, reserved = self._reader()
            except Exception:  # NoFigures on the CPU, or a transient failure: figures unknown
                allocated = reserved = None
        mark = Mark(time.time(), label, allocated, reserved)
        with self._lock:
            self._marks.append(mark)
            self._marks_seen += 1
        if self.path is not None and self.running:
            self._link.send(encode([MARK, mark.time, label, allocated, reserved]))
        return mark

    # --- results -----------------------------------------------------------------
    def _device_samples(self) -> list[Sample]:
        errors = self._device_errors
        return [
            Sample(
                time=row[0],
                source=SOURCE_DEVICE,
                device_total=row[1],
                device_used=row[2],
                process_used=row[3],
                host_rss=row[4],
                error=errors[row[5]] if 0 <= row[5] < len(errors) else None,
            )
            for row in self._device_rows
        ]

    @property
    def samples(self) -> list[Sample]:
        """Every sample so far, in time order (while running, asks the sampler process)."""
        if self.running:
            self._take(self._link.ask("dump"))
        with self._lock:
            framework = self._framework.items()
        return merge_samples(framework, self._device_samples())

    @property
    def marks(self) -> list[Mark]:
        """Every mark kept so far (the latest ``max_samples``), in order."""
        with self._lock:
            return list(self._marks)

    @property
    def recording(self) -> Recording:
        """The run so far as a ``Recording``: samples, marks, and meta (backend, device,
        intervals, cap, device total, decimation, notes)."""
        samples = self.samples
        meta = self._meta()
        if meta["device_total"] is None:
            meta["device_total"] = next((s.device_total for s in samples if s.device_total is not None), None)
        meta["decimation"] = {"device_stride": self._device_stride, "framework_stride": self._framework.stride}
        meta["device_errors"] = self._device_error_count
        return Recording(samples, self.marks, meta)

    def _meta(self) -> dict[str, Any]:
        """The recording's meta as this process knows it (a stream's header and end record carry it)."""
        limit = None
        device_total = None
        for snapshot in (self.end_stats, self.start_stats):
            if snapshot is not None:
                limit = limit if limit is not None else snapshot.limit
                device_total = device_total if device_total is not None else snapshot.device_total
        notes = list(self._notes)
        if self._marks_seen > len(self._marks):
            notes.append(f"{self._marks_seen - len(self._marks)} oldest marks dropped (max_samples={self.max_samples})")
        return {
            "backend": self.backend,
            "device": self.device,
            "pid": os.getpid(),
            **ranks.metadata(),  # rank, local rank, world size, node and host when one of several
            "interval": self.interval,
            "framework_interval": self.framework_interval,
            "started": self._started,
            "stopped": self._stopped,
            "limit": limit,
            "device_total": device_total,
            "max_samples": self.max_samples,
            "notes": notes,
        }

    @property
    def gaps(self) -> list[tuple[float, str]]:
        """``(time, error)`` of every failed reading (a gap in the data)."""
        return self.recording.gaps

    # --- Prometheus ------------------------------------------------------------------
    def serve_prometheus(self, port: int = 9400, host: str = "127.0.0.1") -> int:
        """Expose the latest figures at ``http://host:port/metrics``; returns the bound port.

        Loopback only unless ``host`` says otherwise. Figures are read when scraped
        (allocator counters in this process, the newest sampler reading). Needs
        ``prometheus-client``; stops with the monitor.

        Args:
            port: The TCP port to listen on, 0-65535 (default 9400; 0: any free port).
            host: The address to bind (default ``"127.0.0.1"``, loopback only).

        Returns:
            The port bound.

        Raises:
            UnimemError: The monitor is not running: start it first.
            ConfigError: ``port`` or ``host`` is invalid, or the port cannot be listened
                on: pick another port.
            BackendUnavailable: ``prometheus-client`` is not installed.
        """
        if not self.running:
            raise UnimemError("start the monitor before serving its metrics")
        from unimem.observe.prometheus import Gauge, serve

        labels = {"device": str(self.device), "backend": self.backend or "none"}
        # What a scrape reads, not the monitor: the server's thread must not keep a dropped monitor alive.
        reader, link = self._reader, self._link

        def collect() -> list[Gauge]:
            gauges: list[Gauge] = []
            if reader is not None:
                try:
                    allocated, reserved = reader()
                except Exception:
                    allocated = reserved = None
                gauges.append(Gauge("unimem_allocated_bytes", "Bytes in live tensors", labels, allocated))
                gauges.append(Gauge("unimem_reserved_bytes", "Bytes the framework's pool holds", labels, reserved))
            reply = link.ask("last")
            row = reply["samples"][-1] if reply and reply.get("samples") else [None] * 6
            gauges.append(Gauge("unimem_device_total_bytes", "Device memory (NVML)", labels, row[1]))
            gauges.append(Gauge("unimem_device_used_bytes", "Device memory in use (NVML)", labels, row[2]))
            gauges.append(Gauge("unimem_process_used_bytes", "This process on the device (NVML)", labels, row[3]))
            gauges.append(Gauge("unimem_host_rss_bytes", "This process's resident host memory", labels, row[4]))
            return gauges

        self._prometheus = serve(collect, port, host)
        weakref.finalize(self, self._prometheus.close)  # dropped unstopped: the port is let go
        return int(self._prometheus.port)


def monitor(
    interval: float = 0.1,
    backend: str | None = None,
    device: int = 0,
    *,
    framework_interval: float | None | str = "auto",
    max_samples: int = DEFAULT_MAX_SAMPLES,
    probe: str | None = None,
    path: str | os.PathLike[str] | None = None,
) -> Monitor:
    """A background memory timeline; use as ``with unimem.monitor(0.01) as m:`` or ``.start()``/``.stop()``.

    NVML (device used/total, this process's usage) and this process's host RSS are read
    by a separate sampler process, so polling does not fight the training thread for the
    GIL; the framework's allocator counters are read by a thread in this process, with
    the cheapest accessor each framework has. NVML errors during the run are gaps
    (samples with ``error`` set), counted in the notes; without NVML or a GPU the
    timeline has the framework's figures (None on the CPU) and host RSS, and the notes
    say why.

    Everything is validated here; nothing starts until ``start()`` or ``with``.

    Args:
        interval: Seconds between NVML/host samples (≥ 0.001, default 0.1), read in a
            separate process.
        backend: A backend name or alias, or None (default) for the query rule of
            ``stats()``, resolved at ``start()`` (no framework in use: host and NVML
            figures only).
        device: The device index (default 0).
        framework_interval: Seconds between allocator-counter samples in this process;
            ``"auto"`` (default) = ``max(interval, 0.1)``; at least 0.01; ``None`` = only
            at ``mark()``.
        max_samples: Samples kept per stream (at least 100, default 20000); longer runs
            are decimated (neighbouring pairs merge, peaks and gaps kept) and marks keep
            the latest ``max_samples``.
        probe: ``"module:factory"`` run in the sampler process instead of NVML (see
            ``unimem.observe.sampler``); None (default): NVML.
        path: A ``.jsonl`` file to stream the recording to as it runs (None, the default:
            memory only, saved with ``to_json``/``to_csv``). The sampler process writes every
            sample and mark at least twice a second and an end record at the end, even when
            this process is killed first; a kill of both loses at most the last half second.
            ``load_recording`` reads it. A recording already there (an earlier run's: a crashed
            job restarted with the same path) is kept, never replaced: ``start()`` moves it to
            ``NAME.N.jsonl`` beside it (``memory.1.jsonl``, the first free number; before a
            ``.rankN``) and says where in a ``UnimemWarning`` and in the notes.

    Returns:
        The monitor, not yet started.

    Raises:
        ConfigError: An interval is not a positive number or under its floor,
            ``backend`` is unknown, ``device`` is not an index of 0 or more,
            ``max_samples`` is under 100, ``probe`` is not ``"module:factory"``, or
            ``path`` is not a ``.jsonl`` file in a folder that exists.

    A per-epoch peak needs no monitor per epoch: mark each epoch and ask the recording,
    ``m.recording.peak_between("epoch 1", "epoch 2", field="host_rss")``.

    Example:
        ```python
        with unimem.monitor(0.01) as m:
            for epoch in range(3):
                m.mark(f"epoch {epoch}")
                train_one_epoch()
            m.mark("done")
        m.to_json("memory.json")
        m.plot("memory.png")
        print(m.recording.peak_between("epoch 1", "epoch 2", field="host_rss"))  # bytes
        ```
    """
    return Monitor(
        interval,
        backend,
        device,
        framework_interval=framework_interval,
        max_samples=max_samples,
        probe=probe,
        path=path,
    )


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
