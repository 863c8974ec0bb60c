"""The `unimem` command on a machine without a GPU: info, stats, matrix."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from tests.cli.cli_process import run_cli
from tests.conftest import run_py, subprocess_env
from unimem import registry


def test_info_json_lists_frameworks_with_versions_and_says_why_no_gpu() -> None:
    proc = run_cli("info", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    by_name = {row["backend"]: row for row in data["frameworks"]}
    assert set(by_name) == set(registry.BACKENDS)
    for name in ("torch", "tensorflow", "jax"):
        assert by_name[name]["installed"] is True and by_name[name]["version"]
    assert data["devices"] == []
    assert "nvmlInit failed" in data["nvml"] or "not installed" in data["nvml"]


def test_stats_without_nvml_reports_host_memory_not_invented_gpu_figures() -> None:
    proc = run_cli("stats")
    assert proc.returncode == 0, proc.stderr
    assert "Host memory" in proc.stdout
    data = json.loads(run_cli("stats", "--json").stdout)
    assert data["devices"] == [] and data["processes"] == []


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_stats_of_one_backend_in_a_fresh_process_is_none_not_zero(backend: str) -> None:
    proc = run_cli("stats", "--backend", backend, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["backend"] == backend
    for key in ("allocated", "reserved", "peak_allocated", "device_total", "process_used"):
        assert data[key] is None, key


@pytest.mark.slow
def test_matrix_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "matrix.md"
    stale.write_text("# hand-edited\n")
    proc = run_cli("matrix", "--check", "--output", str(stale))
    assert proc.returncode == 1
    assert "stale" in proc.stderr
    assert run_cli("matrix", "--output", str(stale)).returncode == 0
    assert run_cli("matrix", "--check", "--output", str(stale)).returncode == 0


def test_compare_with_a_bad_workload_is_a_usage_error_before_any_run(tmp_path: Path) -> None:
    proc = run_cli("compare", "--workload", "resnet", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "unknown workload 'resnet'" in proc.stderr
    assert not (tmp_path / "out").exists()


# --- output fit for pipes and logs ---------------------------------------------------------

# A stand-in ``pynvml`` (first on PYTHONPATH) with two GPUs: process 4242 holds memory on both,
# 777 on the second only. NVML's other calls are not needed by `unimem stats`.
FAKE_PYNVML = """
import types

class NVMLError(Exception):
    pass

class NVMLError_FunctionNotFound(NVMLError):
    pass

class NVMLError_NotSupported(NVMLError):
    pass

nvmlMemory_v2 = 0x02000028
GIB = 1 << 30
PROCS = {0: [(4242, 3 * GIB)], 1: [(4242, 5 * GIB), (777, 1 * GIB)]}

def nvmlInit():
    pass

def nvmlSystemGetDriverVersion():
    return "550.00"

def nvmlDeviceGetCount():
    return 2

def nvmlDeviceGetHandleByIndex(index):
    if index >= 2:
        raise NVMLError("Invalid Argument")
    return ("handle", index)

def nvmlDeviceGetName(handle):
    return "Fake GPU"

def nvmlDeviceGetUUID(handle):
    return f"GPU-{handle[1]}0000000-1111-2222-3333-444455556666"

def nvmlDeviceGetMemoryInfo(handle, version=None):
    return types.SimpleNamespace(total=80 * GIB, free=70 * GIB, used=10 * GIB, reserved=0)

def nvmlDeviceGetComputeRunningProcesses(handle):
    return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in PROCS[handle[1]]]
"""


def _with_fake_nvml(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pynvml.py").write_text(FAKE_PYNVML)
    previous = os.environ.get("PYTHONPATH")
    env = subprocess_env({"PYTHONPATH": os.pathsep.join([str(tmp_path), *([previous] if previous else [])])})
    return subprocess.run([sys.executable, "-m", "unimem", *args], capture_output=True, text=True, env=env, timeout=120)


def _comparison_rows(figures: Mapping[str, int | None]) -> list[dict[str, object]]:
    base = {"ok": True, "parameters": 1_234_567, "step_ms": 12.34, **figures}
    return [
        {"framework": "tensorflow", "workload": "transformer", "config": "default", **base},
        {"framework": "jax", "workload": "transformer", "config": "bf16", **base},
        {
            "framework": "torch",
            "workload": "mlp",
            "config": "cap",
            "ok": False,
            "error": "worker exited 1: " + "e" * 150,
        },
    ]


def test_compare_table_in_an_80_column_pipe_keeps_every_row_on_one_line() -> None:
    # Every column a GPU machine fills: the table is far wider than 80 columns.
    gib = 1 << 30
    figures = {
        "start_process_used": 252_257_976,
        "start_host_rss": 252_257_976,
        "peak_allocated": 3 * gib,
        "peak_reserved": 4 * gib,
        "process_peak": 5 * gib,
        "host_peak_rss": 1_105_954_816,
    }
    code = f"""
        from unimem.cli.main import print_comparison
        from unimem.cli.observe import output_console
        from unimem.compare.harness import Comparison

        print_comparison(output_console(), Comparison({_comparison_rows(figures)!r}, {{"device": "NVIDIA H200"}}))
    """
    proc = run_py(code, env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    from unimem.compare.harness import Comparison, table_rows

    _, rows = table_rows(Comparison(_comparison_rows(figures), {}))
    lines = proc.stdout.splitlines()
    for row in rows:
        # The row's cells, in order, on one line: "240.57 MiB" and "transformer" are never split.
        found = [line for line in lines if line.startswith("│") and all(cell in line for cell in row if cell)]
        assert len(found) == 1, (row, proc.stdout)
        positions = [found[0].index(cell) for cell in row if cell]
        assert positions == sorted(positions), found[0]
    assert "240.57 MiB" in proc.stdout
    failed = [line for line in lines if line.startswith("failed: torch · mlp · cap: worker exited 1: eee")]
    assert len(failed) == 1 and failed[0].endswith("e" * 150)


@pytest.mark.slow
def test_compare_run_in_an_80_column_pipe_prints_whole_rows(need: Callable[[str], None]) -> None:
    need("torch")
    args = ["compare", "--size", "small", "--steps", "1", "-f", "torch", "-w", "mlp", "-c", "default"]
    proc = subprocess.run(
        [sys.executable, "-m", "unimem", *args],
        capture_output=True,
        text=True,
        env=subprocess_env({"COLUMNS": "80"}),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if "torch" in line and "mlp" in line]
    assert len(rows) == 1, proc.stdout
    assert "default" in rows[0] and len(re.findall(r"\d+\.\d\d [KMG]iB", rows[0])) == 2, rows[0]
    assert "unimem compare: run 1 of 1: torch · mlp · default" in proc.stderr  # progress as log lines


def _stopped_watch(signum: int, *extra: str) -> subprocess.CompletedProcess[str]:
    """``unimem watch`` in a pipe, sent ``signum`` about 2 s after its second frame is out."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "unimem", "watch", "--interval", "0.2", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        # As from a shell in the foreground: SIGINT is not ignored (a background job's would be).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    stdout, stderr = proc.stdout, proc.stderr
    assert stdout is not None and stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(stdout.readline, "")), daemon=True)
    reader.start()
    # Started and printing (a loaded machine may take seconds to import): then a while longer.
    deadline = time.monotonic() + 120
    while sum("unimem watch" in line or line.startswith("{") for line in lines) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, (proc.poll(), lines)
        time.sleep(0.05)
    time.sleep(2)
    proc.send_signal(signum)
    err = stderr.read()
    reader.join(timeout=60)
    proc.wait(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines), err)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_watch_in_a_pipe_stopped_by_a_signal_has_printed_its_frames_and_exits_0(signum: int) -> None:
    proc = _stopped_watch(signum)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    frames = proc.stdout.split("unimem watch · ")[1:]
    assert len(frames) >= 2, proc.stdout  # one per refresh, printed as it came
    last = frames[-1].rstrip("\n").splitlines()
    assert any("Host memory" in line for line in last), frames[-1]
    assert last[-1].startswith("└"), frames[-1]  # the last frame is whole: its last table is closed


def test_watch_json_in_a_pipe_is_one_json_line_per_frame_until_sigterm() -> None:
    proc = _stopped_watch(signal.SIGTERM, "--json")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) >= 2, proc.stdout
    for line in lines:
        assert json.loads(line)["host"]["total"] > 0


def _recording(tmp_path: Path) -> Path:
    from unimem.observe.recording import Recording
    from unimem.observe.samples import Sample

    return Recording([Sample(1.0, "device", host_rss=1 << 20), Sample(2.0, "device", host_rss=2 << 20)]).to_json(
        tmp_path / "memory.json"
    )


@pytest.mark.parametrize(
    "output, message",
    [
        ("missing/deeper/out.png", "does not exist"),
        ("out.json", "does not end in .png"),
    ],
)
def test_plot_refuses_a_bad_output_and_creates_nothing(tmp_path: Path, output: str, message: str) -> None:
    saved = _recording(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    proc = run_cli("plot", str(saved), "-o", str(tmp_path / output))
    assert proc.returncode == 2
    assert "'--output'" in proc.stderr and message in proc.stderr, proc.stderr
    assert sorted(tmp_path.rglob("*")) == before  # no folder, no file


def test_plot_of_a_csv_recording_writes_the_png(tmp_path: Path) -> None:
    from unimem.observe.recording import load_recording

    csv = load_recording(_recording(tmp_path)).to_csv(tmp_path / "memory.csv")
    proc = run_cli("plot", str(csv))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "memory.png").stat().st_size > 0


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_stats_of_a_framework_says_why_its_figures_are_na(backend: str) -> None:
    proc = run_cli("stats", "--backend", backend)
    assert proc.returncode == 0, proc.stderr
    assert f"this is a fresh process: {backend} has not started here" in proc.stdout
    assert "`unimem stats` lists every process on every GPU" in proc.stdout
    data = json.loads(run_cli("stats", "--backend", backend, "--json").stdout)
    assert data["allocated"] is None and "fresh process" in data["note"]


def test_stats_with_an_unknown_backend_is_a_usage_error_naming_the_option() -> None:
    proc = run_cli("stats", "--backend", "mxnet")
    assert proc.returncode == 2
    assert "--backend" in proc.stderr and "unknown backend 'mxnet'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_stats_pid_without_nvml_gives_the_host_memory_of_that_process() -> None:
    data = json.loads(run_cli("stats", "--pid", str(os.getpid()), "--json").stdout)
    assert data["pid"] == os.getpid() and data["exists"] is True
    assert data["processes"] == [] and data["host_rss"] > 0


# Above every Linux pid_max (at most 2**22): no process has it.
MISSING_PID = "99999999"


@pytest.mark.parametrize("extra", [(), ("--json",)])
def test_stats_pid_of_a_missing_process_exits_1_with_one_line_saying_so(extra: tuple[str, ...]) -> None:
    proc = run_cli("stats", "--pid", MISSING_PID, *extra)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and f"no process {MISSING_PID}" in lines[0], proc.stderr


def test_stats_pid_missing_everywhere_with_nvml_exits_1_and_one_nvml_lists_is_shown(tmp_path: Path) -> None:
    gone = _with_fake_nvml(tmp_path, "stats", "--pid", MISSING_PID)
    assert gone.returncode == 1 and "on any GPU NVML lists" in gone.stderr, gone.stderr
    # NVML lists processes of other PID namespaces (a container) this host cannot see: still shown.
    listed = _with_fake_nvml(tmp_path, "stats", "--pid", "4242", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["processes"], listed.stderr


def test_stats_json_carries_the_host_figures_the_table_shows() -> None:
    data = json.loads(run_cli("stats", "--json").stdout)
    host = data["host"]
    assert set(host) == {"total", "used", "available"}
    assert all(isinstance(host[key], int) and host[key] > 0 for key in host), host
    from unimem.sizes import format_bytes

    table = run_cli("stats").stdout
    assert format_bytes(host["total"]) in table  # the same figure, read the same way


def test_stats_pid_lists_the_bytes_that_process_holds_on_each_gpu(tmp_path: Path) -> None:
    proc = _with_fake_nvml(tmp_path, "stats", "--pid", "4242", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["nvml"] == "ok"
    assert data["processes"] == [
        {"device": 0, "pid": 4242, "used": 3 << 30},
        {"device": 1, "pid": 4242, "used": 5 << 30},
    ]
    table = _with_fake_nvml(tmp_path, "stats", "--pid", "777")
    assert table.returncode == 0, table.stderr
    assert "Process 777 on the GPUs (NVML)" in table.stdout and "1.00 GiB" in table.stdout
    assert "3.00 GiB" not in table.stdout  # 4242's bytes are not 777's
    every = json.loads(_with_fake_nvml(tmp_path, "stats", "--json").stdout)
    assert {(row["device"], row["pid"]) for row in every["processes"]} == {(0, 4242), (1, 4242), (1, 777)}


def test_stats_pid_with_backend_is_refused() -> None:
    proc = run_cli("stats", "--pid", "1", "--backend", "torch")
    assert proc.returncode == 2 and "--pid" in proc.stderr
