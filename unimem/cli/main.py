"""The ``unimem`` command (also ``python -m unimem``): info, stats, run, compare, watch, plot, matrix.

What each command reads and prints, and its exit statuses: docs/guides/command-line.md.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from unimem import __version__, device_view, registry
from unimem.cli.exits import UnimemGroup, option_error
from unimem.cli.observe import host_figures, output_console, plot, titled_table, watch
from unimem.cli.view import view
from unimem.errors import BackendUnavailable, ConfigError
from unimem.sizes import format_bytes

if TYPE_CHECKING:
    from unimem.compare.harness import Comparison


def _console() -> Any:
    return output_console()


def _nvml_devices() -> tuple[list[dict[str, Any]], str]:
    view, status = device_view.usable()
    return ([], status) if view is None else (view.devices(), "ok")


@click.group(cls=UnimemGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="unimem")
def main() -> None:
    """One GPU-memory API for PyTorch, TensorFlow, JAX and CuPy, with NVML as ground truth."""
    from unimem.cli.run import one_line_warnings

    one_line_warnings()  # unimem's warnings as "unimem: <message>", not Python's file-and-line format


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def info(as_json: bool) -> None:
    """Frameworks and versions, GPUs and driver (NVML). Imports no framework."""
    frameworks: list[dict[str, Any]] = []
    for name in registry.BACKENDS:
        installed = name in registry.available_backends()
        version = registry.get_backend(name).version() if installed else None
        frameworks.append({"backend": name, "installed": installed, "version": version})
    devices, nvml = _nvml_devices()
    data = {
        "unimem": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "frameworks": frameworks,
        registry.FRAMEWORK_FREE: nvml,  # the device view's status, under its backend's name
        "devices": devices,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    console = _console()
    console.print(f"[bold]unimem {__version__}[/bold] · Python {data['python']} · {data['platform']}")
    table = titled_table("Frameworks")
    for column in ("backend", "installed", "version"):
        table.add_column(column)
    for row in frameworks:
        table.add_row(row["backend"], "yes" if row["installed"] else "no", row["version"] or "—")
    console.print(table)
    if nvml != "ok":
        console.print(f"NVML: [yellow]{nvml}[/yellow]")
        console.print("No GPU figures on this machine: frameworks run on the CPU here.")
        return
    gpus = titled_table(f"GPUs (driver {devices[0]['driver'] if devices else '?'})")
    for column in ("NVML index", "name", "UUID", "total", "free"):
        gpus.add_column(column)
    for d in devices:
        gpus.add_row(str(d["index"]), d["name"], d["uuid"], format_bytes(d["total"]), format_bytes(d["free"]))
    console.print(gpus)
    if data["cuda_visible_devices"] is not None:
        console.print(f"CUDA_VISIBLE_DEVICES={data['cuda_visible_devices']}")


def _process_rows() -> list[dict[str, Any]]:
    """Every compute process on every GPU, from NVML."""
    view = device_view.adapter()
    return [
        {"device": index, "pid": pid, "used": used}
        for index in range(view.device_count() or 0)
        for pid, used in view.processes(index)
    ]


FRESH_PROCESS_NOTE = (
    "this is a fresh process: {name} has not started here; figures of a running process come from NVML — "
    "`unimem stats` lists every process on every GPU, `unimem stats --pid PID` one process"
)


def _backend_stats(backend: str, device: int, as_json: bool) -> None:
    """One backend's MemoryStats read in this process, with why a framework's are n/a here."""
    import unimem

    try:  # NVML asked for by name on a machine without it is a failure (1), for the command's rule
        name = registry.canonical_name(backend)
        snapshot = unimem.stats(name, device)
    except ConfigError as exc:
        raise option_error(exc, "--device" if exc.parameter == "device" else "--backend") from None
    # A framework's counters live in the process that runs it; this command starts none.
    note = None if name == registry.FRAMEWORK_FREE else FRESH_PROCESS_NOTE.format(name=name)
    if as_json:
        data = snapshot.as_dict()
        if note is not None:
            data["note"] = note
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(unimem.summary(name, device))
    if note is not None:
        click.echo(f"\nnote: {note}")


def _host_rss(pid: int) -> tuple[int | None, bool | None]:
    """``(resident bytes, whether the process exists here)``; None for what psutil cannot tell."""
    try:
        import psutil
    except ImportError:
        return None, None
    try:
        return int(psutil.Process(pid).memory_info().rss), True
    except psutil.ZombieProcess:  # exited, not yet reaped: it still has a PID and no memory
        return None, True
    except psutil.NoSuchProcess:
        return None, False
    except psutil.Error:  # exists, but its memory is not ours to read
        return None, True


def _pid_stats(pid: int, as_json: bool) -> None:
    """The bytes process ``pid`` holds on each GPU (NVML), and its host RSS; exit 1 if it exists nowhere."""
    _, nvml = _nvml_devices()
    rows = [row for row in _process_rows() if row["pid"] == pid] if nvml == "ok" else []
    host_rss, exists = _host_rss(pid)
    if exists is False and not rows:  # NVML may list a process this PID namespace cannot see: shown below
        where = "on this host or on any GPU NVML lists" if nvml == "ok" else "on this host"
        click.echo(f"unimem stats: no process {pid} {where}; check the PID (ps, or `unimem stats`)", err=True)
        sys.exit(1)
    data = {registry.FRAMEWORK_FREE: nvml, "pid": pid, "processes": rows, "host_rss": host_rss, "exists": exists}
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    console = _console()
    if nvml != "ok":
        console.print(f"NVML: [yellow]{nvml}[/yellow]")
        console.print("No GPU figures on this machine.")
    elif rows:
        table = titled_table(f"Process {pid} on the GPUs (NVML)")
        for column in ("device", "used"):
            table.add_column(column, justify="right")
        for row in rows:
            table.add_row(str(row["device"]), format_bytes(row["used"]))
        console.print(table)
    else:
        # NVML lists the processes of its own PID namespace: one in a container may be missing.
        console.print(f"NVML lists no memory of process {pid} on any GPU.")
    if host_rss is not None:
        console.print(f"host RSS of process {pid}: {format_bytes(host_rss)}")


@main.command()
@click.option(
    "--backend",
    "-b",
    default=None,
    help=f"Framework whose figures to read in this process ({', '.join(registry.FRAMEWORKS)}); "
    "default: NVML for every GPU. A framework has not started in this fresh process: its figures are n/a.",
)
@click.option("--device", "-d", default=0, show_default=True, help="Device index (with --backend).")
@click.option(
    "--pid", "-p", type=click.IntRange(min=0), default=None, help="Only this process: its bytes on each GPU (NVML)."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def stats(backend: str | None, device: int, pid: int | None, as_json: bool) -> None:
    """Memory figures: per GPU and per process from NVML, one process's, or one backend's MemoryStats."""
    import unimem

    if backend is not None and pid is not None:
        raise click.UsageError(
            "--pid reads NVML's per-process figures, --backend a framework's counters in this process; "
            "drop --backend to see what process PID holds"
        )
    if backend is not None:
        _backend_stats(backend, device, as_json)
        return
    if pid is not None:
        _pid_stats(pid, as_json)
        return
    devices, nvml = _nvml_devices()
    snapshots = [unimem.stats(registry.FRAMEWORK_FREE, d["index"]).as_dict() for d in devices] if nvml == "ok" else []
    processes = _process_rows() if nvml == "ok" else []
    host = host_figures()
    if as_json:
        data = {registry.FRAMEWORK_FREE: nvml, "devices": snapshots, "processes": processes, "host": host}
        click.echo(json.dumps(data, indent=2))
        return
    console = _console()
    if nvml != "ok":
        # No GPU figures exist here; the host's memory is what a CPU run draws on.
        console.print(f"NVML: [yellow]{nvml}[/yellow]")
        table = titled_table("Host memory (no GPU figures on this machine)")
        for column in ("total", "used", "available"):
            table.add_column(column, justify="right")
        table.add_row(format_bytes(host["total"]), format_bytes(host["used"]), format_bytes(host["available"]))
        console.print(table)
        return
    table = titled_table("GPU memory (NVML)")
    for column in ("device", "total", "used", "free"):
        table.add_column(column, justify="right")
    for snap in snapshots:
        total, free = snap["device_total"], snap["device_free"]
        used = None if total is None or free is None else total - free
        table.add_row(str(snap["device"]), format_bytes(total), format_bytes(used), format_bytes(free))
    console.print(table)
    procs = titled_table("Processes (NVML)")
    for column in ("device", "pid", "used"):
        procs.add_column(column, justify="right")
    for row in processes:
        procs.add_row(str(row["device"]), str(row["pid"]), format_bytes(row["used"]))
    console.print(procs if processes else "No compute processes on any GPU.")


@main.command()
@click.option("--check", is_flag=True, help="Exit 1 if compat_matrix.md is not what the tables and evidence give.")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False),
    default=None,
    help="Where to write (default: the repo's compat_matrix.md).",
)
def matrix(check: bool, output: str | None) -> None:
    """Render compat_matrix.md from the capability tables and the recorded evidence."""
    from pathlib import Path

    from unimem.cli import matrix as matrix_module

    root = matrix_module.repo_root()
    target = Path(output) if output else root / matrix_module.MATRIX_FILE
    text = matrix_module.render(root)
    if check:
        current = target.read_text(encoding="utf-8") if target.is_file() else None
        if current != text:
            click.echo(f"{target} is stale: run `unimem matrix` and commit the result", err=True)
            sys.exit(1)
        click.echo(f"{target} is up to date")
        return
    target.write_text(text, encoding="utf-8")
    click.echo(f"wrote {target}")


# compare()'s parameters as the command's options name them, for its errors.
_COMPARE_OPTIONS = {
    "frameworks": "--framework",
    "workloads": "--workload",
    "configs": "--config",
    "size": "--size",
    "steps": "--steps",
}


@main.command()
@click.option(
    "--framework", "-f", "frameworks", multiple=True, help="Framework to include (repeatable); default: all installed."
)
@click.option("--workload", "-w", "workloads", multiple=True, help="mlp, transformer (repeatable); default: both.")
@click.option(
    "--config",
    "-c",
    "configs",
    multiple=True,
    help="default, growth, cap, bf16, remat, offload (repeatable); default: default, cap.",
)
@click.option("--full", is_flag=True, help="Every configuration (adds growth, bf16, remat, offload): the whole grid.")
@click.option("--size", default="small", show_default=True, type=click.Choice(["small", "large"]))
@click.option(
    "--steps",
    default=5,
    show_default=True,
    help="Timed steps per run (after 2 untimed ones); the table gives their median (min–max).",
)
@click.option(
    "--out", "-o", type=click.Path(file_okay=False), default=None, help="Folder for compare.json and compare.png."
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON instead of the table.")
def compare(
    frameworks: tuple[str, ...],
    workloads: tuple[str, ...],
    configs: tuple[str, ...],
    full: bool,
    size: str,
    steps: int,
    out: str | None,
    as_json: bool,
) -> None:
    """The same workloads in each installed framework and configuration, each in a fresh process.

    By default each framework's own behaviour and the cap configure() makes (default, cap); --full
    adds growth, bf16 and the savers. Every run first takes one tiny step of each configuration compared, so that what a
    framework imports on first use weighs on every row alike. A note under the table says when the
    step times are not comparable: a load average above the machine's cores, or a run whose timed
    steps spread over 20% of their median.
    """
    from rich.progress import MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from unimem.compare import harness as compare_module

    if full and configs:
        raise click.UsageError("--full runs every configuration: pass it or --config, not both")
    chosen = configs or (tuple(compare_module.CONFIGS) if full else compare_module.QUICK_CONFIGS)
    names, workloads = frameworks or None, workloads or compare_module.WORKLOADS
    try:  # every argument checked before anything runs
        runs = compare_module.plan_runs(names, workloads, chosen, size=size, steps=steps)
    except ConfigError as exc:
        raise option_error(exc, _COMPARE_OPTIONS.get(exc.parameter, exc.parameter)) from None
    folder = None if out is None else _writable_folder(out)
    console = _console()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), MofNCompleteColumn(), TimeElapsedColumn())
    # Off a terminal a redrawn bar is noise in the log: each run's start is one line on stderr instead.
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("comparing", total=len(runs))

        def show_progress(label: str) -> None:
            if console.is_terminal:
                bar.update(task, description=label.partition(": ")[2])
            else:
                click.echo(f"unimem compare: {label}", err=True)

        def on_result(partial: compare_module.Comparison) -> None:
            bar.advance(task)
            if folder is not None:  # saved as it goes: a run stopped early keeps its rows
                partial.to_json(folder / "compare.json")

        result = compare_module.compare(
            names, workloads, chosen, size=size, steps=steps, progress=show_progress, on_result=on_result
        )
    written: list[Path] = []
    if folder is not None:
        result.to_json(folder / "compare.json")
        written.append(folder / "compare.json")
        try:
            from unimem.observe.plotting import plot_comparison

            plot_comparison(result, folder / "compare.png")
            written.append(folder / "compare.png")
        except BackendUnavailable as exc:  # the figures are in the JSON; the picture needs the plot extra
            click.echo(f"unimem compare: no compare.png: {str(exc).removeprefix('compare plot: ')}", err=True)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    print_comparison(console, result)
    if written:
        console.print(f"wrote {' and '.join(str(path) for path in written)}")


def _writable_folder(out: str) -> Path:
    """``--out`` made and shown writable before anything runs: a comparison takes minutes, and its
    results must not be lost at the end to a folder it cannot write.

    Raises:
        click.BadParameter: The folder cannot be made, or a file cannot be written in it (exit 2).
    """
    import tempfile

    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".unimem-compare-"):
            pass
    except OSError as exc:
        unwritable = ConfigError("out", f"cannot write to {out}: {exc.strerror or exc}; pass a folder you can write to")
        raise option_error(unwritable, "--out") from None
    return folder


def print_comparison(console: Any, result: Comparison) -> None:
    """The comparison as a table, then why runs failed and what n/a means on this machine.

    Args:
        console: A rich console (``output_console()``: off a terminal, lines are not broken).
        result: A ``unimem.compare.harness.Comparison``.
    """
    from unimem.compare import harness as compare_module

    header, rows = compare_module.table_rows(result)
    machine = result.machine
    table = titled_table(f"unimem compare · {machine.get('device', '?')} · size {machine.get('size', '?')}")
    for column in header:
        table.add_column(column, justify="left" if column in ("framework", "workload", "config") else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for line in compare_module.failures(result):
        console.print(f"failed: {line}", markup=False)
    for line in compare_module.unsupported(result):
        console.print(f"unsupported: {line}", markup=False)
    for line in compare_module.timing_notes(result):
        console.print(f"note: {line}", markup=False)
    if not result.has_gpu:
        console.print(
            "No GPU here: device figures (held at start, peaks, NVML process peak) are n/a; "
            "host peak RSS is the process's memory on the CPU."
        )


class _RunCommand(click.Command):
    """Remembers whether ``--`` separated unimem's options from the command."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["unimem_dashdash"] = "--" in args
        return super().parse_args(ctx, args)


def _split_option(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """``0.5`` stays a number/size; ``torch=0.5,jax=0.3`` becomes a per-backend split."""
    if value is None or "=" not in value:
        if value is not None and param.name == "fraction":
            try:
                return float(value)
            except ValueError:
                raise click.BadParameter(f"expected a number in (0, 1], got {value!r}") from None
        return value
    split: dict[str, Any] = {}
    for part in value.split(","):
        name, sep, item = part.partition("=")
        if not sep:
            raise click.BadParameter(f"cannot read {part!r}; write 0.5 or torch=0.5,jax=0.3")
        if param.name == "fraction":
            try:
                split[name.strip()] = float(item)
            except ValueError:
                raise click.BadParameter(f"expected a number for {name.strip()}, got {item!r}") from None
        else:
            split[name.strip()] = item.strip()
    return split


@main.command(
    cls=_RunCommand,
    context_settings={"allow_interspersed_args": False},
    short_help="Run a command with a memory configuration applied.",
)
@click.option("--backend", "-b", default="auto", show_default=True, help="Backend(s), comma-separated.")
@click.option("--fraction", callback=_split_option, help="Cap as a share of the device: 0.25 or torch=0.5,jax=0.3.")
@click.option("--limit", callback=_split_option, help="Cap in bytes or a size: 8GiB, or torch=8GiB,jax=4GiB.")
@click.option("--growth/--no-growth", default=None, help="Allocate on demand / preallocate the allowance.")
@click.option("--allocator", type=click.Choice(["default", "async", "expandable", "uncached"]))
@click.option(
    "--devices",
    help="Visible device indices, comma-separated (CUDA_VISIBLE_DEVICES semantics); per-rank: each rank's own GPU.",
)
@click.option("--verbose", "-v", is_flag=True, help="Print what was applied, here and in each Python started.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run(
    ctx: click.Context,
    backend: str,
    fraction: Any,
    limit: Any,
    growth: bool | None,
    allocator: str | None,
    devices: str | None,
    verbose: bool,
    command: tuple[str, ...],
) -> None:
    """Apply a configuration to an unmodified script: unimem run --fraction 0.25 -- python train.py

    Settings the framework reads from the environment go into the command's environment;
    API-only settings (torch's fraction cap) are made by a startup hook when the script
    imports the framework. The command gets its arguments verbatim (no shell) and its exit
    status is unimem's.
    """
    import unimem

    if not ctx.meta.get("unimem_dashdash") or not command:
        raise click.UsageError("put the command after --, e.g. unimem run --fraction 0.25 -- python train.py")
    device_list: list[int] | str | None = None
    if devices is not None and devices.strip().lower() == "per-rank":
        device_list = "per-rank"
    elif devices is not None:
        try:
            device_list = [int(part) for part in devices.split(",")]
        except ValueError:
            raise click.BadParameter(f"expected indices such as 0,1, got {devices!r}", param_hint="--devices") from None
    names = [part.strip() for part in backend.split(",") if part.strip()]
    settings: dict[str, Any] = {
        "backend": names[0] if len(names) == 1 else names,
        "fraction": fraction,
        "limit": limit,
        "growth": growth,
        "allocator": allocator,
        "devices": device_list,
    }
    from unimem.cli.run import exec_command

    try:
        exec_command(command, settings, verbose=verbose)
    except unimem.UnimemError as exc:  # a bad setting or command: before anything started
        click.echo(f"unimem run: error: {exc}", err=True)
        sys.exit(2)
    except FileNotFoundError:
        click.echo(f"unimem run: command not found: {command[0]}", err=True)
        sys.exit(127)
    except OSError as exc:  # found, but not executable (no permission, not a program, ...)
        click.echo(f"unimem run: cannot run {command[0]}: {exc.strerror or exc}", err=True)
        sys.exit(126)


main.add_command(watch)  # the observability commands live in cli_observe.py
main.add_command(plot)
main.add_command(view)

if __name__ == "__main__":
    main()
