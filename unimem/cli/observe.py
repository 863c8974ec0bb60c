"""``unimem watch`` (live memory per device and per process) and ``unimem plot`` (a saved recording to PNG).

Registered on the ``unimem`` command group by cli.py. Imports no framework.
"""

from __future__ import annotations

import errno
import glob
import json
import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import click

from unimem import device_view, registry
from unimem.cli.exits import option_error
from unimem.errors import ConfigError
from unimem.observe.plotting import RANK_FIGURES
from unimem.sizes import format_bytes

__all__ = [
    "MAX_BYTES_HELP",
    "UNSEEN_ABOVE",
    "collect_watch",
    "default_output",
    "host_figures",
    "max_bytes_option",
    "output_console",
    "plot",
    "recording_files",
    "titled_table",
    "watch",
]

STATUS = registry.FRAMEWORK_FREE  # the key a snapshot gives the device view's status under
# Off a terminal (a pipe, a log file) no width exists to fit: a line is as long as its content,
# so no figure is split across lines and every table row stays one line for grep.
UNBOUNDED_WIDTH = 100_000


def output_console() -> Any:
    """A rich console on stdout: the terminal's width on a terminal, lines unbroken elsewhere.

    When the reader of stdout goes away (``unimem watch | head``) it raises ``BrokenPipeError``,
    which every command ends on with status 0, where rich's own console would exit with 1.
    """
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "the reader of stdout has gone")

    console = PipeConsole()
    if not console.is_terminal:
        console.width = UNBOUNDED_WIDTH
    return console


def titled_table(title: str) -> Any:
    """A rich table whose title stays one line, however narrow the table below it."""
    from rich.table import Table
    from rich.text import Text

    # rich wraps a title to its table's width ("Process 777 on the / GPUs (NVML)").
    return Table(title=Text(title, style="table.title", no_wrap=True, overflow="ignore"))


def host_figures() -> dict[str, int | None]:
    """The host's ``total``, ``available`` and ``used`` bytes (None for each that cannot be read)."""
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


# Memory in use on a GPU that no process NVML lists accounts for is "cannot see" above this many
# bytes: the driver's own reserve counts as used and belongs to no process (docs/measurements.md,
# "What `unimem watch` cannot attribute"); 1 GiB stays above it, so an idle GPU shows none.
UNSEEN_ABOVE = 1 << 30
CANNOT_SEE = "cannot see"


def _account(row: dict[str, Any], listed: list[tuple[int, int | None]], unseen_above: int) -> None:
    """Add to a device row the bytes its listed processes account for and what is left over.

    ``unattributed`` is None where it cannot be known (no figure for the device, or a listed
    process whose bytes NVML does not give); ``cannot_see`` is True when it exceeds
    ``unseen_above``: memory held by processes NVML does not list (another PID namespace).
    """
    known = [used for _, used in listed if used is not None]
    row["attributed"] = sum(known)
    complete = len(known) == len(listed) and row.get("used") is not None and not row.get("error")
    row["unattributed"] = max(0, int(row["used"]) - row["attributed"]) if complete else None
    row["cannot_see"] = row["unattributed"] is not None and row["unattributed"] > unseen_above


def collect_watch(devices: Sequence[int] | None = None, unseen_above: int = UNSEEN_ABOVE) -> dict[str, Any]:
    """One snapshot: NVML devices and their processes, or host memory where NVML is absent.

    Args:
        devices: NVML indices of the GPUs to show; None (default): every GPU of the node.
        unseen_above: Bytes in use on a GPU beyond what its listed processes hold that make
            it ``cannot_see`` (default 1 GiB, above the driver's own reserve).
    """
    view, status = device_view.usable()
    data: dict[str, Any] = {"time": time.time(), STATUS: status, "devices": [], "processes": []}
    data["host"] = host_figures()
    if view is None:
        data["host_processes"] = _top_host_processes()
        return data
    indices = range(view.device_count() or 0) if devices is None else devices
    for index in indices:
        row, listed = view.device_usage(index)  # an NVML error on one device is its row's error
        _account(row, listed, unseen_above)
        data["devices"].append(row)
        data["processes"] += [
            {"device": index, "pid": pid, "name": _process_name(pid), "used": used} for pid, used in listed
        ]
    return data


def _process_table(data: dict[str, Any]) -> Any:
    """Each GPU's processes, then a "cannot see" row for memory no listed process accounts for."""
    from rich.markup import escape

    unseen = [row for row in data["devices"] if row.get("cannot_see")]
    if not data["processes"] and not unseen:
        return None
    procs = titled_table("Processes (NVML)")
    for column in ("device", "pid", "name", "used"):
        procs.add_column(column, justify="right" if column != "name" else "left")
    for row in data["devices"]:
        index = row["index"]
        for proc in data["processes"]:
            if proc["device"] == index:
                procs.add_row(str(index), str(proc["pid"]), escape(proc["name"]), format_bytes(proc["used"]))
        if row.get("cannot_see"):
            why = "held by processes NVML does not list (another PID namespace?)"
            procs.add_row(str(index), CANNOT_SEE, why, format_bytes(row["unattributed"]))
    return procs


def _render(data: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.markup import escape
    from rich.text import Text

    # Names and errors come from NVML and the OS: escaped, a "[" in them is text, not markup.
    parts: list[Any] = [Text(f"unimem watch · {time.strftime('%H:%M:%S', time.localtime(data['time']))}", style="bold")]
    if data[STATUS] != "ok":
        parts.append(Text(f"NVML: {data[STATUS]}", style="yellow"))
        parts.append(Text("No GPU figures here: showing host memory."))
    else:
        devices = titled_table("GPU memory (NVML)")
        for column in ("device", "name", "used", "total", "free", "use"):
            devices.add_column(column, justify="right" if column != "name" else "left")
        for row in data["devices"]:
            if row["error"]:
                failed = f"[red]{escape(row['error'])}[/red]"
                devices.add_row(str(row["index"]), escape(row["name"]), failed, "", "", "")
                continue
            share = "n/a" if not row["total"] else f"{row['used'] / row['total']:.0%}"
            devices.add_row(
                str(row["index"]),
                escape(row["name"]),
                format_bytes(row["used"]),
                format_bytes(row["total"]),
                format_bytes(row["free"]),
                share,
            )
        parts.append(devices)
        parts.append(_process_table(data) or Text("No compute processes on any GPU."))
    host = data["host"]
    hosts = titled_table("Host memory")
    for column in ("total", "used", "available"):
        hosts.add_column(column, justify="right")
    hosts.add_row(format_bytes(host["total"]), format_bytes(host["used"]), format_bytes(host["available"]))
    parts.append(hosts)
    if data.get("host_processes"):
        top = titled_table("Largest host processes (RSS)")
        for column in ("pid", "name", "rss"):
            top.add_column(column, justify="right" if column != "name" else "left")
        for proc in data["host_processes"]:
            top.add_row(str(proc["pid"]), escape(proc["name"]), format_bytes(proc["rss"]))
        parts.append(top)
    return Group(*parts)


def _gauges(data: dict[str, Any]) -> list[Any]:
    from unimem.observe.prometheus import Gauge

    gauges = []
    for row in data["devices"]:
        labels = {"device": str(row["index"]), "name": row["name"]}
        gauges.append(Gauge("unimem_device_total_bytes", "Device memory (NVML)", labels, row["total"]))
        gauges.append(Gauge("unimem_device_used_bytes", "Device memory in use (NVML)", labels, row["used"]))
        gauges.append(
            Gauge(
                "unimem_device_unattributed_bytes",
                "Device memory in use that no process NVML lists accounts for",
                labels,
                row.get("unattributed"),
            )
        )
    for proc in data["processes"]:
        labels = {"device": str(proc["device"]), "pid": str(proc["pid"]), "name": proc["name"]}
        gauges.append(Gauge("unimem_process_used_bytes", "A process's memory on a device (NVML)", labels, proc["used"]))
    host = data["host"]
    gauges.append(Gauge("unimem_host_total_bytes", "Host memory", {}, host["total"]))
    gauges.append(Gauge("unimem_host_available_bytes", "Host memory available", {}, host["available"]))
    return gauges


class _Stopped(Exception):
    """Raised by the SIGINT/SIGTERM handler to cut short the wait between two frames."""


class StopSignals:
    """SIGINT and SIGTERM end ``watch`` with its last frame shown and exit status 0.

    A signal during the wait between frames ends it at once; one during a frame ends it
    once that frame is printed, so no frame is cut in half.
    """

    def __init__(self) -> None:
        self.stopped = False
        self._waiting = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.stopped = True
        if self._waiting:
            raise _Stopped

    @contextmanager
    def installed(self) -> Iterator[StopSignals]:
        """The handlers, for the ``with`` block; the previous ones come back after it."""
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():  # Python runs handlers on the main thread only
            for number in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(number) == signal.SIG_IGN:  # ignored on purpose (a background job, nohup)
                    continue
                previous[number] = signal.signal(number, self._handle)
        try:
            yield self
        except _Stopped:  # a signal that landed a moment before or after the wait's own ``try``
            pass
        finally:
            for restored, handler in previous.items():
                signal.signal(restored, signal.SIG_DFL if handler is None else handler)

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds``; False when a signal asked to stop (before or during the sleep)."""
        if self.stopped:
            return False
        self._waiting = True
        try:
            time.sleep(seconds)
        except _Stopped:
            pass
        finally:
            self._waiting = False
        return not self.stopped


def _frames(
    count: int | None, interval: float, stop: StopSignals, collect: Callable[[], dict[str, Any]] = collect_watch
) -> Iterator[dict[str, Any]]:
    """Snapshots every ``interval`` seconds until ``count`` are taken or a signal stops them."""
    shown = 0
    while count is None or shown < count:
        if shown and not stop.wait(interval):
            return
        yield collect()
        shown += 1
        if stop.stopped:
            return


def _show_frames(frames: Iterator[dict[str, Any]], as_json: bool, console: Any) -> None:
    """JSON lines, or tables: redrawn in place on a terminal, one after another elsewhere."""
    if as_json or not console.is_terminal:
        # A pipe or a log keeps every frame as it was printed: a reader (or ``tail -f``) sees
        # each one whole, and the last one is there whenever the watch is stopped.
        for index, data in enumerate(frames):
            if as_json:
                click.echo(json.dumps(data))
            else:
                if index:
                    console.print()  # a blank line between frames
                console.print(_render(data))
        return
    from rich.live import Live

    with Live(console=console, auto_refresh=False) as live:  # leaves the last frame on screen
        for data in frames:
            live.update(_render(data), refresh=True)


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
@click.option(
    "--device",
    "-d",
    "device_options",
    multiple=True,
    help="GPUs to show, as NVML numbers them: -d 0,1 or -d 0 -d 1 (default: every GPU of the node).",
)
@click.option(
    "--unseen-above",
    default="1GiB",
    show_default=True,
    help="Show memory in use on a GPU that no listed process accounts for as 'cannot see' above this size.",
)
def watch(
    interval: float,
    once: bool,
    count: int | None,
    as_json: bool,
    prometheus_port: int | None,
    bind: str,
    device_options: tuple[str, ...],
    unseen_above: str,
) -> None:
    """Live memory per GPU and per process (NVML); host memory where NVML is absent.

    Every GPU of the node (or those given with --device), each with its processes: pid,
    name where it can be read, bytes. Memory in use that no listed process accounts for
    (processes in another PID namespace, as in a container) is a "cannot see" row.
    On a terminal the view is redrawn in place; in a pipe or a log each refresh is printed
    in turn (tables, or one JSON line each with ``--json``). Ctrl+C (SIGINT) and SIGTERM
    end it with the last refresh shown and exit status 0.
    """
    from unimem.observe.monitor import check_interval
    from unimem.sizes import parse_size

    try:
        interval = check_interval(interval, "interval", 0.05)
    except ConfigError as exc:
        raise option_error(exc, "'--interval'") from None
    if count is not None and count < 1:
        raise click.BadParameter(f"expected 1 or more, got {count}", param_hint="'--count'")
    try:
        threshold = parse_size(unseen_above, "unseen_above")
    except ConfigError as exc:
        raise option_error(exc, "'--unseen-above'") from None
    devices = _chosen_devices(device_options)
    if once:
        count = 1

    def collect() -> dict[str, Any]:
        return collect_watch(devices, threshold)

    server = None
    if prometheus_port is not None:
        from unimem.observe.prometheus import serve

        try:  # prometheus-client missing is a failure (1), for the command's rule
            server = serve(lambda: _gauges(collect()), prometheus_port, bind)
        except ConfigError as exc:  # a port out of range, taken or privileged; a host not of this machine
            raise option_error(exc, "'--bind'" if exc.parameter == "host" else "'--prometheus'") from None
        click.echo(f"serving metrics at {server.url}", err=True)
    stop = StopSignals()
    try:
        with stop.installed():
            _show_frames(_frames(count, interval, stop, collect), as_json, output_console())
    finally:
        if server is not None:
            server.close()


def _chosen_devices(options: tuple[str, ...]) -> list[int] | None:
    """The GPUs ``--device`` names (``0,1`` or repeated), checked against the node's; None for all."""
    if not options:
        return None
    chosen: list[int] = []
    for part in ",".join(options).split(","):
        text = part.strip()
        if not text.isdigit():
            raise click.BadParameter(f"expected GPU numbers such as 0,1; got {text!r}", param_hint="'--device'")
        if int(text) not in chosen:
            chosen.append(int(text))
    view, _ = device_view.usable()
    count = None if view is None else view.device_count()
    # Without NVML nothing can be checked: every frame says why no GPU is shown.
    if count is not None:
        missing = [index for index in chosen if index >= count]
        if missing:
            have = f"0-{count - 1}" if count else "none"
            raise click.BadParameter(
                f"no GPU {', '.join(map(str, missing))} on this node: NVML counts {count} ({have}); "
                "pick from those or leave --device out",
                param_hint="'--device'",
            )
    return chosen


MAX_BYTES_HELP = (
    "Read files up to this size (bytes, or e.g. 2GiB) whatever the memory available; by default a JSON or "
    "CSV file that would not fit in the memory available is refused."
)


def max_bytes_option(value: str | None) -> int | None:
    """``--max-bytes`` as bytes (None when not given), or click's error naming the option."""
    from unimem.observe.files import check_max_bytes

    try:
        return check_max_bytes(value)
    except ConfigError as exc:
        raise option_error(exc, "'--max-bytes'") from None


@click.command("plot")
@click.argument("recordings", nargs=-1, required=True)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="PNG to write (default: the recording's name with .png; several: memory.rank0.json gives memory.ranks.png).",
)
@click.option("--title", default=None, help="Title of the plot.")
@click.option(
    "--figure",
    type=click.Choice(RANK_FIGURES),
    default=None,
    help="With several recordings, the figure drawn per rank (default: the first every recording has).",
)
@click.option("--width", default=1000, show_default=True, type=int, help="Width in pixels.")
@click.option("--height", default=500, show_default=True, type=int, help="Height in pixels.")
@click.option("--max-bytes", "max_bytes", default=None, help=MAX_BYTES_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print what was written as one JSON line.")
def plot(
    recordings: tuple[str, ...],
    output: Path | None,
    title: str | None,
    figure: str | None,
    width: int,
    height: int,
    max_bytes: str | None,
    as_json: bool,
) -> None:
    """Turn saved monitor recordings (JSON or CSV) into a PNG timeline.

    One recording: its figures over time. Several (one per rank: unimem plot
    memory.rank0.json memory.rank1.json, or a quoted pattern such as 'memory.rank*.json'):
    one line per rank, labelled by its rank, on one wall-clock axis.
    """
    from unimem.observe.plotting import require_matplotlib

    if width < 100 or height < 100:
        raise click.BadParameter("width and height must be at least 100 pixels")
    cap = max_bytes_option(max_bytes)
    files = recording_files(recordings)
    target = output or default_output(files)
    _check_output(target)
    require_matplotlib("plot")
    if len(files) == 1 and figure is None:
        _plot_one(files[0], target, title, (width / 100, height / 100), as_json, cap)
        return
    from unimem.observe.recording import plot_recordings

    size = (width / 100, height / 100)
    done = plot_recordings(files, target, figure=figure, title=title, figsize=size, max_bytes=cap)
    lines = [
        {"label": line.label, "rank": line.rank, "file": line.file, "samples": line.samples} for line in done.lines
    ]
    if as_json:
        click.echo(
            json.dumps({"output": str(target), "figure": done.figure, "lines": lines, "notes": list(done.notes)})
        )
        return
    drawn = ", ".join(f"{line['label']} ({line['file']}, {line['samples']} samples)" for line in lines)
    click.echo(f"wrote {target} ({done.figure or 'no figure known'}): {drawn}")
    for note in done.notes:
        click.echo(f"note: {note}")


def _plot_one(
    recording: Path, target: Path, title: str | None, figsize: tuple[float, float], as_json: bool, cap: int | None
) -> None:
    from unimem.observe.recording import load_recording

    data = load_recording(recording, max_bytes=cap)
    if title is None and not data.meta:
        # A recording without metadata (a CSV keeps none) names no framework or device:
        # the file's name titles the plot rather than a made-up "no framework, device 0".
        title = f"unimem: {recording.name}"
    data.plot(target, title=title, figsize=figsize, dpi=100)
    if as_json:
        click.echo(json.dumps({"output": str(target), "samples": len(data.samples), "marks": len(data.marks)}))
    else:
        click.echo(f"wrote {target} ({len(data.samples)} samples, {len(data.marks)} marks)")


def _rank_order(path: Path) -> tuple[float, str]:
    found = re.search(r"\.rank(\d+)$", path.stem)
    return (int(found.group(1)) if found else math.inf, path.name)


def recording_files(arguments: tuple[str, ...]) -> list[Path]:
    """Each argument a file, or a pattern (``'memory.rank*.json'``) read here, in rank order (``plot``, ``view``)."""
    files: list[Path] = []
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            raise click.BadParameter(
                f"{argument} is a folder; pass the recordings in it, e.g. '{path / 'memory.rank*.json'}'",
                param_hint="'RECORDINGS'",
            )
        # Anything else that exists (a FIFO, a link to a device, one that loops) is the loader's to
        # refuse, by what it is.
        if os.path.lexists(path):
            files.append(path)
            continue
        if glob.has_magic(argument):
            matched = sorted((Path(name) for name in glob.glob(argument) if Path(name).is_file()), key=_rank_order)
            if not matched:
                raise click.BadParameter(
                    f"no file matches {argument}; check the folder and the pattern", param_hint="'RECORDINGS'"
                )
            files += matched
            continue
        raise click.BadParameter(f"{argument} does not exist; check the path", param_hint="'RECORDINGS'")
    return list(dict.fromkeys(files))  # a file named twice (a pattern and its name) is drawn once


def default_output(files: list[Path], suffix: str = ".png") -> Path:
    """One recording: its name with ``suffix``. Several: the first's name without .rankN, with .ranks and ``suffix``."""
    first = files[0]
    if len(files) == 1:
        return first.with_suffix(suffix)
    stem = re.sub(r"\.rank\d+$", "", first.stem)
    return first.with_name(f"{stem}.ranks{suffix}")


def _check_output(target: Path) -> None:
    """The PNG goes into a folder that exists, under a name that says PNG; nothing is created otherwise."""
    if target.suffix.lower() != ".png":
        raise click.BadParameter(
            f"{target} does not end in .png; the plot is a PNG: name it e.g. {target.with_suffix('.png').name}",
            param_hint="'--output'",
        )
    folder = target.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise click.BadParameter(
            f"the folder {folder} {what}; create it first (mkdir -p {folder}) or pick another path",
            param_hint="'--output'",
        )
