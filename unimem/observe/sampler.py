"""The monitor's sampler process: NVML and host RSS of another process, off its GIL.

``monitor()`` starts ``python -m unimem.observe.sampler`` so that polling NVML at up
to 1 kHz never takes the training process's GIL (a thread doing it there slows the
training loop: docs/measurements.md). The protocol is lines on stdin/stdout:

- at start the sampler writes ``{"ready": true, "probe": "ok" | reason, "host": "ok" | reason,
  "stream": "ok" | reason}``;
- ``dump`` asks for everything so far, ``last`` for the newest sample only, ``count`` for
  ``{"count": n}``, how many samples are kept (one short line, for a monitor's repr);
- ``stop`` makes it write everything and exit;
- with ``--stream PATH`` it writes the recording to PATH as it runs (``unimem.observe.stream``):
  a line that is a JSON array is a record of the training process (an allocator sample, a
  mark) to append, ``{"end": meta}`` the meta the end record carries.

Every reply is one JSON line. A sample is ``[time, device_total, device_used,
process_used, host_rss, error]`` with ``error`` an index into ``errors`` or -1.

The sampler ends when its parent does, whatever children the parent forked: it watches the
parent itself (a pidfd in its ``select`` set on Linux >= 5.3, else ``os.getppid()`` at least
every ``PARENT_CHECK`` seconds), and its stdin closing ends it too. It then writes what it
holds and the stream's end record. Ctrl+C in a terminal reaches it with the training process:
it ignores SIGINT (the training process decides); SIGTERM and SIGHUP end it with the stream whole.

A probe is a factory ``make(device, pid, uuid) -> read`` where ``read()`` returns
``(device_total, device_used, process_used)`` and raises when a reading fails (the
sample becomes a gap). The default reads NVML; ``--probe module:factory`` swaps it
(tests inject failures this way; another vendor's tool could go here).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from unimem import device_view
from unimem.errors import ConfigError
from unimem.observe.files import MAX_LINE_BYTES
from unimem.observe.samples import BoundedSeries, failed_readings_note
from unimem.observe.stream import ARITY, DEVICE, FRAMEWORK, MARK, StreamWriter, encode

__all__ = ["PARENT_CHECK", "ParentWatch", "host_rss_reader", "main", "nvml_probe"]

PARENT_CHECK = 0.5  # seconds between checks that the parent lives, where no pidfd says so at once

Reading = tuple[int | None, int | None, int | None]
Row = list[Any]  # [time, device_total, device_used, process_used, host_rss, error index]


def nvml_probe(device: int, pid: int, uuid: str | None = None) -> Callable[[], Reading]:
    """NVML figures of CUDA device ``device`` and of process ``pid`` on it.

    Raises ``BackendUnavailable`` when NVML cannot be used here (no driver, not installed).
    """
    return device_view.adapter().probe(device, pid, uuid)


def host_rss_reader(pid: int) -> Callable[[], int | None]:
    """Resident set size of ``pid``: /proc on Linux (one small read), psutil elsewhere."""
    statm = f"/proc/{pid}/statm"
    if os.path.exists(statm):
        page = os.sysconf("SC_PAGE_SIZE")

        def from_proc() -> int | None:
            with open(statm, "rb") as handle:
                return int(handle.read().split()[1]) * page

        return from_proc
    import psutil  # raises ImportError: reported as "host figures unavailable"

    process = psutil.Process(pid)

    def from_psutil() -> int | None:
        return int(process.memory_info().rss)

    return from_psutil


def _load_probe(spec: str) -> Callable[..., Callable[[], Reading]]:
    module_name, _, attr = spec.partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    if not callable(factory):
        raise TypeError(f"{spec} is not callable")
    return factory


def _keep(a: Row, b: Row) -> Row:
    """Decimation: keep a gap, else the higher process (then device, then host) figure."""
    if (a[5] < 0) != (b[5] < 0):
        return a if a[5] >= 0 else b

    def key(row: Row) -> int:
        for index in (3, 2, 4):
            if row[index] is not None:
                return int(row[index])
        return -1

    return a if key(a) >= key(b) else b


class _Errors:
    """Each distinct failed reading's message once, and how many readings failed."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.index: dict[str, int] = {}
        self.count = 0

    def add(self, exc: Exception) -> int:
        message = f"{type(exc).__name__}: {exc}"
        if message not in self.index:
            self.index[message] = len(self.messages)
            self.messages.append(message)
        self.count += 1
        return self.index[message]


def _readers(
    args: argparse.Namespace,
) -> tuple[Callable[[], Reading] | None, str, Callable[[], int | None] | None, str]:
    """The device probe and the host reader, each with "ok" or why it is missing."""
    probe: Callable[[], Reading] | None = None
    try:
        probe = _load_probe(args.probe)(args.device, args.pid, args.uuid)
        probe_status = "ok"
    except Exception as exc:  # no NVML, no driver, a bad probe: host figures only, and say why
        probe_status = str(exc) or type(exc).__name__
    host: Callable[[], int | None] | None = None
    try:
        host = host_rss_reader(args.pid)
        host()
        host_status = "ok"
    except Exception as exc:
        host, host_status = None, f"host RSS unavailable: {exc or type(exc).__name__}"
    return probe, probe_status, host, host_status


def _sample(probe: Callable[[], Reading] | None, host: Callable[[], int | None] | None, errors: _Errors) -> Row:
    """One row now: a failed device reading is a gap (its error's index), the next is tried as usual."""
    now = time.time()  # the reading's time is when it started
    total = used = process = rss = None
    error = -1
    if probe is not None:
        try:
            total, used, process = probe()
        except Exception as exc:
            error = errors.add(exc)
    if host is not None:
        try:
            rss = host()
        except (OSError, ValueError, IndexError):
            rss = None  # the parent is gone; stdin closes next
    return [now, total, used, process, rss, error]


def _commands(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The whole lines in ``buffer``, and what is left of it."""
    lines = buffer.split(b"\n")
    return lines[:-1], lines[-1]


class ParentWatch:
    """Whether the process that started the sampler still lives, whatever children it forked.

    A forked child (a DataLoader worker) can keep the sampler's stdin open after its parent
    died, so the end of stdin is not enough. On Linux >= 5.3 a pidfd of the parent is readable
    the moment it exits (``fd``, for a ``select`` set); elsewhere ``alive()`` compares
    ``os.getppid()`` with the parent (an orphan is handed to another), every ``PARENT_CHECK`` s.
    """

    def __init__(self, pid: int, use_pidfd: bool = True) -> None:
        self.pid = pid
        self.fd: int | None = None
        self._parent = os.getppid()
        self._gone = self._parent != pid  # the parent died before the sampler looked
        if use_pidfd and not self._gone and hasattr(os, "pidfd_open"):
            try:
                self.fd = os.pidfd_open(pid)
            except ProcessLookupError:
                self._gone = True
            except OSError:
                self.fd = None  # a kernel without pidfds: getppid() it is
        self.next_check = time.monotonic() + PARENT_CHECK

    def deadline(self) -> float | None:
        """The monotonic time of the next ``alive()`` check; None when the pidfd says at once."""
        return None if self.fd is not None else self.next_check

    def alive(self) -> bool:
        """Whether the parent still runs (checked now)."""
        if not self._gone:
            if self.fd is not None:
                self._gone = bool(select.select([self.fd], [], [], 0)[0])
            else:
                self._gone = os.getppid() != self._parent
                self.next_check = time.monotonic() + PARENT_CHECK
        return not self._gone


class _Sampler:
    """One run: the readers, the kept series, the stream, and the loop that serves them."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.probe, self.probe_status, self.host, self.host_status = _readers(args)
        self.series = BoundedSeries(args.capacity, _keep)
        self.errors = _Errors()
        self.stdin = sys.stdin.fileno()
        self.buffer = b""
        self.end_meta: dict[str, Any] = {}
        self.signalled = False
        self.watch = ParentWatch(args.pid)
        self.start_meta: dict[str, Any] = json.loads(args.meta) if args.meta else {}
        self.stream: StreamWriter | None = None
        self.stream_status = "ok"
        if args.stream is not None:
            try:
                self.stream = StreamWriter(Path(args.stream), {**self.start_meta, "started": time.time()})
            except (ConfigError, OSError, ValueError) as exc:
                self.stream_status = str(exc)
        self.wake, wake_in = os.pipe()
        os.set_blocking(self.wake, False)
        os.set_blocking(wake_in, False)
        signal.set_wakeup_fd(wake_in, warn_on_full_buffer=False)
        for number in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if number is not None and signal.getsignal(number) is not signal.SIG_IGN:  # nohup's ignore is kept
                signal.signal(number, self._on_signal)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the training process's to handle

    def _on_signal(self, number: int, frame: object) -> None:
        self.signalled = True  # the loop sees it: the wakeup fd makes select return

    def send(self, payload: dict[str, Any]) -> bool:
        """One reply line to the parent; False when nobody reads any more."""
        try:
            sys.stdout.write(json.dumps(payload, separators=(",", ":")) + "\n")
            sys.stdout.flush()
        except (OSError, ValueError):
            return False
        return True

    def reply(self, kind: str) -> None:
        """``count``, ``last``, else (``dump`` or an unknown word) everything so far."""
        if kind == "count":
            self.send({"count": len(self.series)})
            return
        rows = self.series.items()[-1:] if kind == "last" else self.series.items()
        error = None if self.stream is None else self.stream.error
        errors = self.errors
        self.send(
            {"samples": rows, "errors": errors.messages, "error_count": errors.count, "stride": self.series.stride}
            | ({"stream": error} if error else {})
        )

    def take(self, line: bytes) -> str | None:
        """One input line: a record to stream, the end's meta, or a command; returns ``"stop"`` to stop."""
        if line.startswith(b"["):
            self._record(line)
        elif line.startswith(b"{"):
            with contextlib.suppress(ValueError, TypeError, KeyError):
                self.end_meta = dict(json.loads(line)["end"])
        elif (command := line.strip().decode(errors="replace")) == "stop":
            return "stop"
        elif command:
            self.reply(command)
        return None

    def _record(self, line: bytes) -> None:
        if self.stream is None or len(line) >= MAX_LINE_BYTES:  # one the loader would refuse: memory only
            return
        try:
            value = json.loads(line)
        except ValueError:
            return  # a line cut by an interrupted write in the training process: dropped, the file stays whole
        if isinstance(value, list) and value and value[0] in (FRAMEWORK, MARK) and len(value) == ARITY[value[0]]:
            self.stream.add(line.rstrip() + b"\n", value[0])

    def read_input(self, drain: bool = False) -> str | None:
        """Read what the parent wrote; ``"stop"`` when asked, ``"eof"`` when its end closed.

        ``drain``: read without blocking until nothing is left (the parent died; a forked
        child may still hold the pipe open, so an end of file need not come).
        """
        if drain:
            os.set_blocking(self.stdin, False)
        while True:
            try:
                chunk = os.read(self.stdin, 1 << 16)
            except BlockingIOError:
                return None
            lines, self.buffer = _commands(self.buffer + chunk)
            for line in lines:
                if self.take(line) == "stop" and not drain:
                    return "stop"
            if not chunk:
                return "eof"
            if not drain:
                return None

    def sample(self) -> None:
        row = _sample(self.probe, self.host, self.errors)
        self.series.add(row)
        if self.stream is not None:
            error = self.errors.messages[row[5]] if row[5] >= 0 else None
            self.stream.add(encode([DEVICE, *row[:5], error]), DEVICE)

    def finish(self, why: str | None) -> int:
        """Write the stream's end record (the parent's end meta, and ``why`` when it did not stop us)."""
        if self.stream is not None:
            meta = dict(self.end_meta)
            notes = list(meta.get("notes", self.start_meta.get("notes", [])))
            notes += [why] if why else []
            if self.errors.count:
                notes.append(failed_readings_note(self.errors.count, self.errors.messages[0]))
            meta.setdefault("stopped", time.time())
            self.stream.finish(meta | {"notes": notes, "device_errors": self.errors.count})
        return 0

    def _ended(self) -> str:
        return f"the monitored process (pid {self.args.pid}) ended without stopping the monitor (exited or killed)"

    def run(self) -> int:
        self.send({"ready": True, "probe": self.probe_status, "host": self.host_status, "stream": self.stream_status})
        interval = self.args.interval
        next_time = time.monotonic()
        while True:
            deadlines = [next_time, self.watch.deadline(), None if self.stream is None else self.stream.due()]
            timeout = max(0.0, min(d for d in deadlines if d is not None) - time.monotonic())
            waits = [self.stdin, self.wake] + ([self.watch.fd] if self.watch.fd is not None else [])
            readable = select.select(waits, [], [], timeout)[0]
            if self.wake in readable:
                with contextlib.suppress(OSError):
                    os.read(self.wake, 512)
                if self.signalled:
                    self.read_input(drain=True)
                    return self.finish("the sampler was ended by a signal (SIGTERM or SIGHUP)")
            if self.stdin in readable:
                got = self.read_input()
                if got == "stop":
                    self.finish(None)
                    self.reply("dump")
                    return 0
                if got == "eof":
                    return self.finish(self._ended())
            now = time.monotonic()
            if (self.watch.fd in readable or (self.watch.fd is None and now >= self.watch.next_check)) and (
                not self.watch.alive()
            ):
                self.read_input(drain=True)  # what it wrote before it died
                return self.finish(self._ended())
            if self.stream is not None and (due := self.stream.due()) is not None and now >= due:
                self.stream.flush()
            if now >= next_time:
                self.sample()
                next_time += interval
                late = time.monotonic()
                if next_time < late:
                    next_time = late + interval  # fell behind (machine busy): skip, never burst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unimem.observe.sampler")
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--uuid", default=None)
    parser.add_argument("--capacity", type=int, default=20_000)
    parser.add_argument("--probe", default="unimem.observe.sampler:nvml_probe")
    parser.add_argument("--stream", default=None, help="stream the recording to this .jsonl file as it runs")
    parser.add_argument("--meta", default=None, help="the recording's meta at start, as JSON (for the stream)")
    return _Sampler(parser.parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
