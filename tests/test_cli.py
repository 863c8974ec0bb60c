"""The `unimem` command on a machine without a GPU: info, stats, matrix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import subprocess_env
from unimem import registry


def _unimem(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unimem", *args], capture_output=True, text=True, env=subprocess_env(), timeout=300
    )


def test_info_json_lists_frameworks_with_versions_and_says_why_no_gpu() -> None:
    proc = _unimem("info", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    by_name = {row["backend"]: row for row in data["frameworks"]}
    assert set(by_name) == set(registry.BACKENDS)
    for name in ("torch", "tensorflow", "jax"):
        assert by_name[name]["installed"] is True and by_name[name]["version"]
    assert data["devices"] == []
    assert "nvmlInit failed" in data["nvml"] or "not installed" in data["nvml"]


def test_stats_without_nvml_reports_host_memory_not_invented_gpu_figures() -> None:
    proc = _unimem("stats")
    assert proc.returncode == 0, proc.stderr
    assert "Host memory" in proc.stdout
    data = json.loads(_unimem("stats", "--json").stdout)
    assert data["devices"] == [] and data["processes"] == []


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_stats_of_one_backend_in_a_fresh_process_is_none_not_zero(backend: str) -> None:
    proc = _unimem("stats", "--backend", backend, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["backend"] == backend
    for key in ("allocated", "reserved", "peak_allocated", "device_total", "process_used"):
        assert data[key] is None, key


def test_matrix_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "matrix.md"
    stale.write_text("# hand-edited\n")
    proc = _unimem("matrix", "--check", "--output", str(stale))
    assert proc.returncode == 1
    assert "stale" in proc.stderr
    assert _unimem("matrix", "--output", str(stale)).returncode == 0
    assert _unimem("matrix", "--check", "--output", str(stale)).returncode == 0


def test_compare_with_a_bad_workload_is_a_usage_error_before_any_run(tmp_path: Path) -> None:
    proc = _unimem("compare", "--workload", "resnet", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "unknown workload 'resnet'" in proc.stderr
    assert not (tmp_path / "out").exists()
