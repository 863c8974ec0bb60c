"""The GPU suite's plugin: skip without a GPU, run scenarios in fresh processes, record evidence.

- No NVIDIA GPU (neither NVML nor ``nvidia-smi`` finds one): every test here is skipped,
  and nothing here imports torch or JAX. ``UNIMEM_REQUIRE_GPU=1`` (set by ``run_suite.py``)
  turns the skip into a failure, so a GPU run cannot pass by skipping.
- Every test is marked ``gpu``; its ``covers`` cells are checked against the backends and
  ``unimem.support.FEATURES`` at collection (also on the CPU, so a typo fails CI's lint of
  this folder early) and kept in ``user_properties``.
- ``record(key=value, ...)`` stores figures in ``user_properties``; ``scenario(name, ...)``
  runs ``gpu_scenarios.py`` in a fresh interpreter and records everything it reported.
- ``--evidence-tests PATH`` writes ``{"tests": [...]}`` (nodeid, outcome, covers, figures,
  message) for ``run_suite.py`` to wrap with the machine's details.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
SCENARIOS = HERE / "gpu_scenarios.py"
MARK = "UNIMEM_SCENARIO_RESULT "
BACKEND_NAMES = ("torch", "tensorflow", "jax", "cupy", "nvml")
# Variables that steer a framework's memory: a scenario starts without any of them
# unless it sets them itself, so the shell that ran pytest cannot change the result.
_STEERING_PREFIXES = ("UNIMEM_", "XLA_PYTHON_CLIENT_", "XLA_CLIENT_", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
_STEERING_NAMES = (
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "CUDA_VISIBLE_DEVICES",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "CUPY_GPU_MEMORY_LIMIT",
)


def _find_gpu() -> tuple[bool, str]:
    """Whether an NVIDIA GPU is here, asked of NVML then nvidia-smi; never of a framework."""
    reasons = []
    try:
        import pynvml

        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
        if count > 0:
            return True, f"NVML sees {count} GPU(s)"
        reasons.append("NVML sees no GPU")
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        reasons.append(f"NVML: {type(exc).__name__}: {exc}")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        reasons.append("nvidia-smi is not on PATH")
    else:
        try:
            listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
            if listing.returncode == 0 and "GPU" in listing.stdout:
                return True, "nvidia-smi -L lists a GPU"
            reasons.append(f"nvidia-smi -L exited {listing.returncode}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            reasons.append(f"nvidia-smi: {exc}")
    return False, "no NVIDIA GPU here (" + "; ".join(reasons) + ")"


_gpu: tuple[bool, str] | None = None


def gpu_status() -> tuple[bool, str]:
    global _gpu
    if _gpu is None:
        _gpu = _find_gpu()
    return _gpu


def _in_this_folder(item: pytest.Item) -> bool:
    return HERE in Path(str(item.path)).resolve().parents


def _check_cells(item: pytest.Item, cells: list[str]) -> None:
    from unimem.support import FEATURES

    for cell in cells:
        backend, sep, feature = cell.partition(":") if isinstance(cell, str) else ("", "", "")
        if not sep or backend not in BACKEND_NAMES or feature not in FEATURES:
            raise pytest.UsageError(
                f"{item.nodeid}: covers({cell!r}) is not 'backend:feature' with a backend in "
                f"{', '.join(BACKEND_NAMES)} and a feature in unimem.support.FEATURES"
            )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--evidence-tests",
        default=None,
        metavar="PATH",
        help="write each GPU test's outcome, covers and figures as JSON (run_suite.py reads it)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if _in_this_folder(item)]
    if not mine:
        return
    present, reason = gpu_status()
    require = os.environ.get("UNIMEM_REQUIRE_GPU", "") not in ("", "0")
    for item in mine:
        item.add_marker(pytest.mark.gpu)
        cells = [cell for marker in item.iter_markers("covers") for cell in marker.args]
        _check_cells(item, cells)
        item.user_properties.append(("covers", sorted(set(cells))))
        if not present and not require:
            item.add_marker(pytest.mark.skip(reason=reason))
    if not present and require:
        raise pytest.UsageError(f"UNIMEM_REQUIRE_GPU is set but {reason}")


# --- evidence: figures and outcomes -------------------------------------------------------------


def _figure_value(value: Any) -> int | float | str:
    """The evidence schema holds numbers and strings: say what anything else was."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return value
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``record(key=value, ...)``: figures for the evidence file (numbers or strings)."""

    def _record(**figures: Any) -> None:
        for key, value in figures.items():
            request.node.user_properties.append(("figure", (key, _figure_value(value))))

    return _record


def _scenario_env(overrides: dict[str, str] | None) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(_STEERING_PREFIXES) and key not in _STEERING_NAMES
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(overrides or {})
    return env


def run_scenario(name: str, env: dict[str, str] | None = None, timeout: float = 240, **kwargs: Any) -> dict[str, Any]:
    """Run one scenario in a fresh interpreter; return what it reported."""
    command = [sys.executable, str(SCENARIOS), name, json.dumps(kwargs)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=_scenario_env(env))
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARK):
            result: dict[str, Any] = json.loads(line[len(MARK) :])
            result["exit_code"] = done.returncode
            if "error" in result:
                result["stderr_tail"] = done.stderr[-1500:]
            return result
    raise AssertionError(
        f"scenario {name} reported nothing (exit {done.returncode});\nstdout: {done.stdout[-1500:]}\n"
        f"stderr: {done.stderr[-3000:]}"
    )


@pytest.fixture(scope="session")
def run_code() -> Callable[..., dict[str, Any]]:
    """``run_code(code, mark, *argv, timeout=240)``: run ``code`` in a fresh interpreter with no
    setting steered from the environment; return the JSON it printed after ``mark``."""

    def _run(code: str, mark: str, *argv: str, timeout: float = 240) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", code, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_scenario_env(None),
        )
        for line in reversed(done.stdout.splitlines()):
            if line.startswith(mark):
                result: dict[str, Any] = json.loads(line[len(mark) :])
                return result
        raise AssertionError(f"reported nothing (exit {done.returncode}), {argv};\n{done.stderr[-3000:]}")

    return _run


@pytest.fixture
def scenario(record: Callable[..., None]) -> Callable[..., dict[str, Any]]:
    """``scenario(name, env=None, prefix="", **kwargs)``: run it, record its figures, return them.

    A scenario that raised fails the test here, after its figures were recorded.
    """

    def _run(name: str, env: dict[str, str] | None = None, prefix: str = "", **kwargs: Any) -> dict[str, Any]:
        result = run_scenario(name, env=env, **kwargs)
        record(**{f"{prefix}{key}": value for key, value in result.items() if key != "stderr_tail"})
        if "error" in result:
            raise AssertionError(f"scenario {name} raised {result['error']}\n{result.get('stderr_tail', '')}")
        return result

    return _run


@pytest.fixture(scope="session")
def context() -> dict[str, dict[str, Any]]:
    """What a process holds on the device with (almost) nothing allocated, measured in
    this run: a bare driver context, torch with one tiny tensor, JAX (growth) after one op."""
    measured = {}
    for name in ("driver", "torch", "jax"):
        result = run_scenario(f"baseline_{name}")
        if "error" in result or result.get("process_used") is None:
            raise AssertionError(f"baseline_{name} failed: {result}")
        measured[name] = result
    return measured


class _EvidenceCollector:
    """Per test: the outcome over setup/call/teardown, its covers and figures, a message."""

    def __init__(self) -> None:
        self.tests: dict[str, dict[str, Any]] = {}

    def entry(self, nodeid: str) -> dict[str, Any]:
        return self.tests.setdefault(
            nodeid, {"nodeid": nodeid, "outcome": "passed", "covers": [], "figures": {}, "message": "", "seconds": 0.0}
        )

    def add(self, report: pytest.TestReport) -> None:
        entry = self.entry(report.nodeid)
        entry["seconds"] = round(entry["seconds"] + report.duration, 2)
        for name, value in report.user_properties:
            if name == "covers":
                entry["covers"] = list(value)
            elif name == "figure":
                key, figure = value
                entry["figures"][key] = figure
        if report.failed and entry["outcome"] != "failed":
            entry["outcome"] = "failed"
            crash = getattr(report.longrepr, "reprcrash", None)
            text = crash.message if crash is not None else str(report.longrepr)
            entry["message"] = f"{report.when}: {text}"[:2000]
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
            entry["message"] = str(reason).removeprefix("Skipped: ")[:2000]


_collector = _EvidenceCollector()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # A conftest's runtest hooks see only the tests below it: these are all GPU tests.
    _collector.add(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = session.config.getoption("evidence_tests", default=None)
    if path:
        Path(path).write_text(json.dumps({"tests": list(_collector.tests.values())}, indent=2) + "\n")


@pytest.fixture(autouse=True)
def _no_framework_here() -> Iterator[None]:
    """A GPU test never imports a framework into the pytest process: scenarios run in their own."""
    frameworks = ("torch", "jax", "tensorflow", "cupy")
    before = {name for name in frameworks if name in sys.modules}
    yield
    leaked = [name for name in frameworks if name in sys.modules and name not in before]
    assert not leaked, f"this test imported {leaked} into the pytest process; run it in a scenario"
