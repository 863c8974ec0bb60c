"""One exit-status rule for every command: 0 success (a reader gone early included), 2 a bad
command line, 1 a failure said in one line on stderr, never a traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import unimem
from tests.cli.cli_process import run_cli
from tests.conftest import subprocess_env
from unimem import registry
from unimem.cli.main import main


def _one_line(stderr: str, start: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_a_unimem_error_in_any_command_is_one_line_naming_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> list[str]:
        raise unimem.UnimemError("the registry is broken\nsecond line of the reason")

    monkeypatch.setattr(registry, "available_backends", broken)
    result = CliRunner().invoke(main, ["info"])
    assert result.exit_code == 1 and not isinstance(result.exception, unimem.UnimemError)
    assert _one_line(result.stderr, "unimem info: ") == "unimem info: the registry is broken second line of the reason"


def test_a_file_the_command_cannot_write_is_one_line_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    target = tmp_path / "a-file" / "matrix.md"
    result = CliRunner().invoke(main, ["matrix", "--output", str(target)])
    assert result.exit_code == 1
    assert _one_line(result.stderr, "unimem matrix: ") == f"unimem matrix: {target}: Not a directory"


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("samples.json", '{"format": "unimem.recording/1", "samples": 5}'),
        ("deep.json", "[" * 50_000 + "]" * 50_000),
        ("binary.csv", b"\xff\xfe\x00time"),
        ("cap.json", '{"format": "unimem.recording/1", "meta": {"limit": 1' + "0" * 400 + "}}"),
    ],
)
def test_a_damaged_recording_is_one_line_and_no_png(tmp_path: Path, name: str, content: str | bytes) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    result = CliRunner().invoke(main, ["plot", str(path), "-o", str(tmp_path / "out.png")])
    assert result.exit_code == 1, result.output
    assert name in _one_line(result.stderr, "unimem plot: ")
    assert not (tmp_path / "out.png").exists()


@pytest.mark.parametrize(
    "args",
    [["--no-such-option"], ["no-such-command"], ["plot", "missing.json"], ["watch", "--count", "0"]],
)
def test_a_bad_command_line_is_status_2(args: list[str]) -> None:
    assert CliRunner().invoke(main, args).exit_code == 2


@pytest.mark.parametrize("args", [["watch", "--count", "40", "--interval", "0.05"], ["info"], ["stats", "--json"]])
def test_a_reader_that_goes_away_early_ends_the_command_with_status_0(args: list[str]) -> None:
    # `unimem watch | head -1`: the pipe is closed while the command still has lines to write.
    proc = subprocess.Popen(
        [sys.executable, "-m", "unimem", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(120) == 0, stderr
    assert stderr == ""


def test_run_refuses_an_empty_program_with_status_2_before_anything_starts() -> None:
    for args in (["run", "--", ""], ["run", "--fraction", "0.5", "--", "", "x"], ["run", "--"]):
        proc = run_cli(*args)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr


def test_run_of_a_file_that_is_not_a_program_is_126_in_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x00\x01not a program")
    junk.chmod(0o755)
    proc = run_cli("run", "--", str(junk))
    assert proc.returncode == 126
    assert "Exec format error" in _one_line(proc.stderr, f"unimem run: cannot run {junk}: ")


def test_watch_blames_a_port_in_use_on_the_port_and_a_bad_host_on_the_host() -> None:
    pytest.importorskip("prometheus_client")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        in_use = CliRunner().invoke(main, ["watch", "--once", "--prometheus", port])
    assert in_use.exit_code == 2 and "'--prometheus'" in in_use.stderr and f"port {port} is in use" in in_use.stderr
    bad = CliRunner().invoke(main, ["watch", "--once", "--prometheus", "0", "--bind", "no-such-host.invalid"])
    assert bad.exit_code == 2 and "'--bind'" in bad.stderr and "no-such-host.invalid" in bad.stderr
    assert "--prometheus" not in bad.stderr.split("Error:")[-1]


@pytest.mark.parametrize(("bind", "shown"), [("::", "[::]"), ("0.0.0.0", "0.0.0.0")])
def test_watch_on_every_interface_prints_a_valid_url_and_warns(bind: str, shown: str) -> None:
    pytest.importorskip("prometheus_client")
    if bind == "::" and not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    proc = run_cli("watch", "--once", "--json", "--prometheus", "0", "--bind", bind)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["host"]["total"] > 0
    lines = proc.stderr.splitlines()
    assert any(line.startswith(f"serving metrics at http://{shown}:") and line.endswith("/metrics") for line in lines)
    assert any(line.startswith("unimem: prometheus: ") and "every interface" in line for line in lines), proc.stderr


def test_unimem_warnings_print_as_one_line_in_every_command(tmp_path: Path) -> None:
    """A recording cut short loads with a warning: one line, not Python's file-and-line format."""
    from unimem.observe.recording import Recording
    from unimem.observe.samples import Sample

    saved = Recording([Sample(1.0 + i, "device", host_rss=(i + 1) << 20) for i in range(50)]).to_json(
        tmp_path / "m.json"
    )
    text = saved.read_text()
    saved.write_text(text[: len(text) // 2])
    proc = run_cli("plot", str(saved))
    assert proc.returncode == 0 and (tmp_path / "m.png").exists(), proc.stderr
    assert "cut short" in _one_line(proc.stderr, f"unimem: {saved}")


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero"])
def test_a_recording_that_is_not_a_regular_file_is_refused_by_what_it_is(tmp_path: Path, kind: str) -> None:
    import os

    path = tmp_path / "memory.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    for command in (["plot", str(path), "-o", str(tmp_path / "out.png")], ["view", str(path)]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 1, (command, result.output)
        line = _one_line(result.stderr, f"unimem {command[0]}: ")
        assert line.endswith("not a recording file") and ("FIFO" in line or "device" in line), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.json"]
