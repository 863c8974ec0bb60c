"""The monitor's sampler process: NVML and host RSS of another process, off its GIL.

``monitor()`` starts ``python -m unimem.observe.sampler`` so that polling NVML at up
to 1 kHz never takes the training process's GIL (a thread doing it there slows the
training loop: docs/measurements.md). The protocol is lines on stdin/stdout:

- at start the sampler writes ``{"ready": true, "probe": "ok" | reason, "host": "ok" | reason}``;
- ``dump`` asks for everything so far, ``last`` for the newest sample only, ``count`` for
  ``{"count": n}``, how many samples are kept (one short line, for a monitor's repr);
- ``stop`` (or stdin closing, e.g. the parent died) makes it write everything and exit.

Every reply is one JSON line. A sample is ``[time, device_total, device_used,
process_used, host_rss, error]`` with ``error`` an index into ``errors`` or -1.

A probe is a factory ``make(device, pid, uuid) -> read`` where ``read()`` returns
``(device_total, device_used, process_used)`` and raises when a reading fails (the
sample becomes a gap). The default reads NVML; ``--probe module:factory`` swaps it
(tests inject failures this way; another vendor's tool could go here).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import sys
import time
from collections.abc import Callable
from typing import Any

from unimem import device_view
from unimem.observe.recording import BoundedSeries

__all__ = ["host_rss_reader", "main", "nvml_probe"]

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


def _commands(buffer: bytes) -> tuple[list[str], bytes]:
    """The whole command lines in ``buffer``, and what is left of it."""
    lines = buffer.split(b"\n")
    return [line.strip().decode() for line in lines[:-1]], lines[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unimem.observe.sampler")
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--uuid", default=None)
    parser.add_argument("--capacity", type=int, default=20_000)
    parser.add_argument("--probe", default="unimem.observe.sampler:nvml_probe")
    args = parser.parse_args(argv)
    probe, probe_status, host, host_status = _readers(args)
    series = BoundedSeries(args.capacity, _keep)
    errors = _Errors()
    stdin = sys.stdin.fileno()
    out = sys.stdout

    def reply(kind: str) -> None:
        """``count``, ``last``, else (``dump`` or an unknown word) everything so far."""
        payload: dict[str, Any]
        if kind == "count":
            payload = {"count": len(series)}
        else:
            rows = series.items()[-1:] if kind == "last" else series.items()
            payload = {"samples": rows, "errors": errors.messages, "error_count": errors.count, "stride": series.stride}
        out.write(json.dumps(payload, separators=(",", ":")) + "\n")
        out.flush()

    out.write(json.dumps({"ready": True, "probe": probe_status, "host": host_status}) + "\n")
    out.flush()
    buffer = b""
    next_time = time.monotonic()
    while True:
        readable, _, _ = select.select([stdin], [], [], max(0.0, next_time - time.monotonic()))
        if readable:
            chunk = os.read(stdin, 4096)
            commands, buffer = _commands(buffer + chunk)
            if not chunk or "stop" in commands:  # stdin closed (the parent stopped or died), or asked
                for command in commands[: commands.index("stop")] if "stop" in commands else commands:
                    reply(command)
                reply("dump")
                return 0
            for command in commands:
                reply(command)
            continue
        series.add(_sample(probe, host, errors))
        next_time += args.interval
        late = time.monotonic()
        if next_time < late:
            next_time = late + args.interval  # fell behind (machine busy): skip, never burst


if __name__ == "__main__":
    sys.exit(main())
