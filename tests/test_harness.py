"""The suite's own guard: a framework named in UNIMEM_TEST_BACKENDS that cannot be imported
stops the session with an error; it never turns into skipped tests."""

from __future__ import annotations

import pytest

TINY = ["tests/test_stats.py", "-q", "-p", "no:cacheprovider", "-k", "fields_are_exactly"]


def _pytest(py, env):
    code = f"import sys, pytest; sys.exit(pytest.main({TINY!r}))"
    return py(code, env=env)


def test_a_required_framework_that_cannot_import_fails_the_session(py, tmp_path):
    broken = tmp_path / "jax"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('jax is broken here')\n")
    proc = _pytest(py, {"UNIMEM_TEST_BACKENDS": "jax", "PYTHONPATH": str(tmp_path)})
    output = proc.stdout + proc.stderr
    assert proc.returncode not in (0, 5), output[-3000:]
    assert "cannot be imported" in output and "jax" in output
    assert "passed" not in output and "skipped" not in output


def test_an_unknown_required_framework_fails_the_session(py):
    proc = _pytest(py, {"UNIMEM_TEST_BACKENDS": "torch,mxnet"})
    assert proc.returncode != 0
    assert "mxnet" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_the_session_runs_when_the_required_frameworks_import(py):
    proc = _pytest(py, {"UNIMEM_TEST_BACKENDS": "jax"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "1 passed" in proc.stdout
