"""The monitor's sampler process: NVML and host RSS of another process, off its GIL.

``monitor()`` starts ``python -m unimem.monitor_sampler`` so that polling NVML at up
to 1 kHz never takes the training process's GIL (a thread doing it there slows the
training loop: docs/measurements.md). The protocol is lines on stdin/stdout:

- at start the sampler writes ``{"ready": true, "probe": "ok" | reason, "host": "ok" | reason}``;
- ``dump`` asks for everything so far, ``last`` for the newest sample only;
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

from . import device_view
from .recording import BoundedSeries

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unimem.monitor_sampler")
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--uuid", default=None)
    parser.add_argument("--capacity", type=int, default=20_000)
    parser.add_argument("--probe", default="unimem.monitor_sampler:nvml_probe")
    args = parser.parse_args(argv)

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

    series = BoundedSeries(args.capacity, _keep)
    errors: list[str] = []
    error_index: dict[str, int] = {}
    error_count = 0
    stdin = sys.stdin.fileno()
    out = sys.stdout

    def reply(kind: str) -> None:
        rows = series.items()
        if kind == "last":
            rows = rows[-1:]
        payload = {"samples": rows, "errors": errors, "error_count": error_count, "stride": series.stride}
        out.write(json.dumps(payload, separators=(",", ":")) + "\n")
        out.flush()

    out.write(json.dumps({"ready": True, "probe": probe_status, "host": host_status}) + "\n")
    out.flush()

    interval = args.interval
    buffer = b""
    next_time = time.monotonic()
    while True:
        timeout = max(0.0, next_time - time.monotonic())
        readable, _, _ = select.select([stdin], [], [], timeout)
        if readable:
            chunk = os.read(stdin, 4096)
            if not chunk:  # stdin closed: the parent stopped us or died
                reply("dump")
                return 0
            buffer += chunk
            stop = False
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                command = line.strip().decode()
                if command == "stop":
                    stop = True
                    break
                reply("last" if command == "last" else "dump")
            if stop:
                reply("dump")
                return 0
            continue
        now = time.time()
        total = used = process = rss = None
        error = -1
        if probe is not None:
            try:
                total, used, process = probe()
            except Exception as exc:  # a failed reading is a gap; the next one is tried as usual
                message = f"{type(exc).__name__}: {exc}"
                if message not in error_index:
                    error_index[message] = len(errors)
                    errors.append(message)
                error = error_index[message]
                error_count += 1
        if host is not None:
            try:
                rss = host()
            except (OSError, ValueError, IndexError):
                rss = None  # the parent is gone; stdin closes next
        series.add([now, total, used, process, rss, error])
        next_time += interval
        late = time.monotonic()
        if next_time < late:
            next_time = late + interval  # fell behind (machine busy): skip, never burst


if __name__ == "__main__":
    sys.exit(main())
