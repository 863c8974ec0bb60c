"""``unimem watch`` (live memory per device and per process) and ``unimem plot`` (a saved recording to PNG).

Registered on the ``unimem`` command group by cli.py. Imports no framework.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from . import device_view, registry
from .sizes import format_bytes

__all__ = ["collect_watch", "plot", "watch"]

STATUS = registry.FRAMEWORK_FREE  # the key a snapshot gives the device view's status under


def _host_memory() -> dict[str, int | None]:
    try:
        import psutil

        memory = psutil.virtual_memory()
        return {"total": int(memory.total), "available": int(memory.available), "used": int(memory.used)}
    except ImportError:
        pass
    fields: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {"total": None, "available": None, "used": None}
    total, available = fields.get("MemTotal"), fields.get("MemAvailable")
    used = None if total is None or available is None else total - available
    return {"total": total, "available": available, "used": used}


def _process_name(pid: int) -> str:
    try:
        import psutil

        return str(psutil.Process(pid).name())
    except Exception:  # psutil missing, the process gone, or in another PID namespace
        return "?"


def _top_host_processes(limit: int = 10) -> list[dict[str, Any]]:
    try:
        import psutil
    except ImportError:
        return []
    rows = []
    for proc in psutil.process_iter(["pid", "name", "memory_info"]):
        info = proc.info
        if info.get("memory_info") is not None:
            rows.append({"pid": info["pid"], "name": info.get("name") or "?", "rss": int(info["memory_info"].rss)})
    rows.sort(key=lambda row: row["rss"], reverse=True)
    return rows[:limit]


def collect_watch() -> dict[str, Any]:
    """One snapshot: NVML devices and their processes, or host memory where NVML is absent."""
    view, status = device_view.usable()
    data: dict[str, Any] = {"time": time.time(), STATUS: status, "devices": [], "processes": []}
    data["host"] = _host_memory()
    if view is None:
        data["host_processes"] = _top_host_processes()
        return data
    for index in range(view.device_count() or 0):
        row, listed = view.device_usage(index)  # an NVML error on one device is its row's error
        data["devices"].append(row)
        data["processes"] += [
            {"device": index, "pid": pid, "name": _process_name(pid), "used": used} for pid, used in listed
        ]
    return data


def _render(data: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [Text(f"unimem watch · {time.strftime('%H:%M:%S', time.localtime(data['time']))}", style="bold")]
    if data[STATUS] != "ok":
        parts.append(Text(f"NVML: {data[STATUS]}", style="yellow"))
        parts.append(Text("No GPU figures here: showing host memory."))
    else:
        devices = Table(title="GPU memory (NVML)")
        for column in ("device", "name", "used", "total", "free", "use"):
            devices.add_column(column, justify="right" if column != "name" else "left")
        for row in data["devices"]:
            if row["error"]:
                devices.add_row(str(row["index"]), row["name"], f"[red]{row['error']}[/red]", "", "", "")
                continue
            share = "n/a" if not row["total"] else f"{row['used'] / row['total']:.0%}"
            devices.add_row(
                str(row["index"]),
                row["name"],
                format_bytes(row["used"]),
                format_bytes(row["total"]),
                format_bytes(row["free"]),
                share,
            )
        parts.append(devices)
        if data["processes"]:
            procs = Table(title="Processes (NVML)")
            for column in ("device", "pid", "name", "used"):
                procs.add_column(column, justify="right" if column != "name" else "left")
            for proc in data["processes"]:
                procs.add_row(str(proc["device"]), str(proc["pid"]), proc["name"], format_bytes(proc["used"]))
            parts.append(procs)
        else:
            parts.append(Text("No compute processes on any GPU."))
    host = data["host"]
    hosts = Table(title="Host memory")
    for column in ("total", "used", "available"):
        hosts.add_column(column, justify="right")
    hosts.add_row(format_bytes(host["total"]), format_bytes(host["used"]), format_bytes(host["available"]))
    parts.append(hosts)
    if data.get("host_processes"):
        top = Table(title="Largest host processes (RSS)")
        for column in ("pid", "name", "rss"):
            top.add_column(column, justify="right" if column != "name" else "left")
        for proc in data["host_processes"]:
            top.add_row(str(proc["pid"]), proc["name"], format_bytes(proc["rss"]))
        parts.append(top)
    return Group(*parts)


def _gauges(data: dict[str, Any]) -> list[Any]:
    from .prometheus_export import Gauge

    gauges = []
    for row in data["devices"]:
        labels = {"device": str(row["index"]), "name": row["name"]}
        gauges.append(Gauge("unimem_device_total_bytes", "Device memory (NVML)", labels, row["total"]))
        gauges.append(Gauge("unimem_device_used_bytes", "Device memory in use (NVML)", labels, row["used"]))
    for proc in data["processes"]:
        labels = {"device": str(proc["device"]), "pid": str(proc["pid"]), "name": proc["name"]}
        gauges.append(Gauge("unimem_process_used_bytes", "A process's memory on a device (NVML)", labels, proc["used"]))
    host = data["host"]
    gauges.append(Gauge("unimem_host_total_bytes", "Host memory", {}, host["total"]))
    gauges.append(Gauge("unimem_host_available_bytes", "Host memory available", {}, host["available"]))
    return gauges


@click.command()
@click.option("--interval", "-n", default=1.0, show_default=True, type=float, help="Seconds between refreshes.")
@click.option("--once", is_flag=True, help="Print one snapshot and exit.")
@click.option("--count", type=int, default=None, help="Exit after this many refreshes.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line per refresh instead of tables.")
@click.option(
    "--prometheus",
    "prometheus_port",
    type=int,
    default=None,
    help="Also serve the figures at http://BIND:PORT/metrics (needs prometheus-client).",
)
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address for --prometheus (loopback by default).")
def watch(
    interval: float, once: bool, count: int | None, as_json: bool, prometheus_port: int | None, bind: str
) -> None:
    """Live memory per GPU and per process (NVML); host memory where NVML is absent."""
    from .errors import ConfigError
    from .monitoring import _check_interval

    try:
        interval = _check_interval(interval, "interval", 0.05)
        if count is not None and count < 1:
            raise ConfigError("count", f"expected 1 or more, got {count}")
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None
    if once:
        count = 1
    server = None
    if prometheus_port is not None:
        from .prometheus_export import serve

        server = serve(lambda: _gauges(collect_watch()), prometheus_port, bind)
        click.echo(f"serving metrics at http://{server.host}:{server.port}/metrics", err=True)
    try:
        if as_json:
            shown = 0
            while count is None or shown < count:
                if shown:
                    time.sleep(interval)
                click.echo(json.dumps(collect_watch()))
                shown += 1
            return
        from rich.console import Console

        console = Console()
        if count == 1:
            console.print(_render(collect_watch()))
            return
        from rich.live import Live

        shown = 0
        with Live(_render(collect_watch()), console=console, auto_refresh=False) as live:
            shown = 1
            while count is None or shown < count:
                time.sleep(interval)
                live.update(_render(collect_watch()), refresh=True)
                shown += 1
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server.close()


@click.command("plot")
@click.argument("recording", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="PNG to write (default: the recording's name with .png).",
)
@click.option("--title", default=None, help="Title of the plot.")
@click.option("--width", default=1000, show_default=True, type=int, help="Width in pixels.")
@click.option("--height", default=500, show_default=True, type=int, help="Height in pixels.")
def plot(recording: Path, output: Path | None, title: str | None, width: int, height: int) -> None:
    """Turn a saved monitor recording (JSON or CSV) into a PNG timeline."""
    from .errors import UnimemError
    from .recording import load_recording

    if width < 100 or height < 100:
        raise click.BadParameter("width and height must be at least 100 pixels")
    target = output or recording.with_suffix(".png")
    try:
        data = load_recording(recording)
        data.plot(target, title=title, figsize=(width / 100, height / 100), dpi=100)
    except UnimemError as exc:
        click.echo(f"unimem plot: {exc}", err=True)
        sys.exit(1)
    click.echo(f"wrote {target} ({len(data.samples)} samples, {len(data.marks)} marks)")
