"""Shared helpers for the CPU suite.

Process-global settings (caps, growth, allocators, env vars a framework reads once)
are tested in fresh subprocesses: ``run_py`` runs a script in a new interpreter.
The test process itself never imports torch, tensorflow or jax; an autouse fixture
fails any test that does, and restores the process state unimem keeps (environment,
registry, post-import hooks, NVML state) after every test.

``UNIMEM_TEST_BACKENDS`` (default ``torch,tensorflow,jax``) names the frameworks that
MUST import here: if one cannot, the session stops with an error instead of skipping
its tests, so CI cannot pass by testing nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parent.parent

# scripts/test.sh (what CI runs) picks this profile: the same examples on every run, so that a red
# run means the change broke something; a bare ``pytest`` draws new ones, and finds new cases.
settings.register_profile("repeatable", derandomize=True, print_blob=True)
FRAMEWORKS = ("torch", "tensorflow", "jax", "cupy")
FRAMEWORK_MODULES = ("torch", "tensorflow", "jax", "jaxlib", "cupy")
RESULT_MARK = "@@UNIMEM-RESULT@@"

# Variables that change what unimem or a framework does: a developer's shell must not
# leak them into a subprocess test (a test that needs one sets it explicitly).
_SCRUBBED_PREFIXES = ("UNIMEM_", "XLA_", "PYTORCH_", "TF_", "JAX_")
_SCRUBBED = {"CUDA_VISIBLE_DEVICES"}


# Launcher environments of one rank (the second local rank of a two-node job), as each launcher sets them.
TORCHRUN = {
    "LOCAL_RANK": "1",
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "TORCHELASTIC_RUN_ID": "job",
}
# srun --ntasks-per-node=2 --gpus-per-task=1: each task sees the one GPU SLURM bound to it.
SLURM_ONE_GPU_PER_TASK = {
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_NODEID": "1",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_GPUS": "4,5",
    "CUDA_VISIBLE_DEVICES": "5",
}
# srun --ntasks-per-node=2 --gpus-per-node=2: every task sees both GPUs of its node.
SLURM_ALL_GPUS = {**SLURM_ONE_GPU_PER_TASK, "CUDA_VISIBLE_DEVICES": "4,5"}
OPEN_MPI = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
}


# The prelude of the savers' framework scripts: R collects what they find, error_of(fn) what fn raised.
SAVERS_PRELUDE = r"""
import unimem
R = {}

def error_of(fn):
    try:
        fn()
    except Exception as exc:
        return {"type": type(exc).__name__, "feature": getattr(exc, "feature", None), "message": str(exc)}
    return None
"""


def subprocess_env(env: dict[str, str | None] | None = None) -> dict[str, str]:
    """The environment a test subprocess starts with: quiet TF, no leaked settings.

    A ``None`` value in ``env`` removes that variable.
    """
    base = {
        key: value
        for key, value in os.environ.items()
        if key not in _SCRUBBED and not key.startswith(_SCRUBBED_PREFIXES)
    }
    base["TF_CPP_MIN_LOG_LEVEL"] = "3"
    base["TF_ENABLE_ONEDNN_OPTS"] = "0"
    base["PYTHONDONTWRITEBYTECODE"] = "1"
    for key, value in (env or {}).items():
        if value is None:
            base.pop(key, None)
        else:
            base[key] = value
    return base


def run_py(
    code: str, env: dict[str, str | None] | None = None, timeout: float = 180, cwd: str | Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh ``sys.executable`` and return the completed process (text)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=subprocess_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(cwd) if cwd is not None else str(REPO),
    )


# Prepended to scripts run with run_json: ``emit(obj)`` prints the result line.
_EMIT = f"""
import json as _json
def emit(obj):
    print({RESULT_MARK!r} + _json.dumps(obj, default=repr), flush=True)
"""


def run_json(code: str, env: dict[str, str | None] | None = None, timeout: float = 180) -> Any:
    """Run ``code`` (which calls ``emit(obj)`` once) in a fresh interpreter; return ``obj``.

    Fails the test with the subprocess's output if it exits non-zero or emits nothing.
    """
    proc = run_py(_EMIT + textwrap.dedent(code), env=env, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if proc.returncode != 0 or len(lines) != 1:
        pytest.fail(
            f"subprocess exited {proc.returncode} with {len(lines)} result line(s)\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-6000:]}",
            pytrace=False,
        )
    return json.loads(lines[0][len(RESULT_MARK) :])


_FRAMEWORK_RUNS: dict[tuple[str, str], Any] = {}


def gather_ranks(world: int, target: str, args: str, deadline: float = 90) -> str:
    """Script lines that fork ``world`` processes running ``target(*args)`` (each puts one
    result on ``queue``), collect the results within ``deadline`` seconds (a rank that dies
    ends the wait early; one that hangs is killed) and ``emit`` them sorted by rank. Forked, so
    the framework is imported once for all ranks."""
    return textwrap.dedent(
        f"""
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        ranks = [context.Process(target={target}, args=({args})) for rank in range({world})]
        for process in ranks:
            process.start()
        results = []
        try:
            deadline = time.monotonic() + {deadline!r}
            while len(results) < len(ranks) and time.monotonic() < deadline:
                try:
                    results.append(queue.get(timeout=0.5))
                except Exception:  # queue.Empty: stop early once a rank has died without answering
                    if any(p.exitcode not in (None, 0) for p in ranks):
                        break
        finally:
            for process in ranks:
                process.join(5)
                if process.is_alive():
                    process.kill()
        emit(sorted(results, key=lambda r: r["rank"]))
        """
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(code: str, envs: list[dict[str, str]], timeout: float = 120) -> list[dict]:
    """Start one interpreter per environment at once; each ``emit``s one result; return them by rank."""
    script = _EMIT + textwrap.dedent(code)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            env=subprocess_env(env),
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for env in envs
    ]
    deadline = time.monotonic() + timeout
    results, failures = [], []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            lines = [line for line in out.splitlines() if line.startswith(RESULT_MARK)]
            if proc.returncode != 0 or len(lines) != 1:
                failures.append(f"exit {proc.returncode}\n--- stdout ---\n{out[-3000:]}\n--- stderr ---\n{err[-5000:]}")
            else:
                results.append(json.loads(lines[0][len(RESULT_MARK) :]))
    except subprocess.TimeoutExpired:
        failures.append(f"the ranks did not finish within {timeout} s (a hang)")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)
    return results


def run_framework_script(framework: str, prelude: dict[str, str], script: str, timeout: float = 240) -> Any:
    """``prelude[framework] + script`` (with ``FRAMEWORK`` replaced by the framework's name) run
    once per test session in a fresh interpreter, as ``run_json``; later calls reuse its result,
    so several tests can assert on one expensive run."""
    code = prelude[framework] + script.replace("FRAMEWORK", repr(framework))
    key = (framework, code)
    if key not in _FRAMEWORK_RUNS:
        _FRAMEWORK_RUNS[key] = run_json(code, timeout=timeout)
    return _FRAMEWORK_RUNS[key]


def required_frameworks() -> list[str]:
    raw = os.environ.get("UNIMEM_TEST_BACKENDS", ",".join(FRAMEWORKS))
    names = [part.strip().lower() for part in raw.split(",") if part.strip()]
    names = ["tensorflow" if n == "tf" else n for n in names]
    unknown = [n for n in names if n not in FRAMEWORKS]
    if unknown:
        pytest.exit(f"UNIMEM_TEST_BACKENDS names unknown frameworks: {unknown}", returncode=4)
    return names


def installed(framework: str) -> bool:
    return importlib.util.find_spec(framework) is not None


def need_framework(framework: str) -> None:
    """Skip only when ``framework`` is neither required (UNIMEM_TEST_BACKENDS) nor installed."""
    if framework not in required_frameworks() and not installed(framework):
        pytest.skip(f"{framework} is not installed and UNIMEM_TEST_BACKENDS does not require it")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Every framework in UNIMEM_TEST_BACKENDS must import (checked in a subprocess)."""
    _scrub_test_process_env()
    required = required_frameworks()
    # Checked once, by the process that starts the run: xdist's workers would repeat the imports.
    if not required or hasattr(session.config, "workerinput"):
        return
    code = f"""
        import importlib, json, traceback
        failed = {{}}
        for name in {required!r}:
            try:
                importlib.import_module(name)
            except BaseException:
                failed[name] = traceback.format_exc(limit=3)
        print(json.dumps(failed))
    """
    proc = run_py(code, timeout=300)
    try:
        failed = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        failed = {"(check)": f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"}
    if failed:
        details = "\n".join(f"--- {name} ---\n{trace}" for name, trace in failed.items())
        pytest.exit(
            f"UNIMEM_TEST_BACKENDS={','.join(required)} but these cannot be imported: "
            f"{', '.join(failed)}. Install them (bash scripts/setup.sh test) or set "
            f"UNIMEM_TEST_BACKENDS to the frameworks this machine has.\n{details}",
            returncode=3,
        )


@pytest.fixture(scope="session")
def py():
    """``py(code, env=None)`` runs code in a fresh interpreter (see ``run_py``)."""
    return run_py


@pytest.fixture(scope="session")
def need():
    """``need(framework)``: skip only if it is neither required nor installed."""
    return need_framework


@pytest.fixture(scope="session")
def pyjson():
    """``pyjson(code, env=None)`` runs code that calls ``emit(obj)``; returns ``obj``."""
    return run_json


def _unimem_state() -> dict[str, Any]:
    from unimem.backends import nvml_gate as nvml_backend
    from unimem.backends import steps

    from unimem import import_hooks, registry

    return {
        "environ": dict(os.environ),
        "configured": list(registry._configured),
        "instances": dict(registry._instances),
        "post_import": {key: list(value) for key, value in import_hooks._post_import.items()},
        "visible": dict(steps._visible),
        "written": dict(steps._written),
        "meta_path": list(sys.meta_path),
        "nvml": (nvml_backend._pynvml, nvml_backend._init_error, dict(nvml_backend._handles), nvml_backend._use_v2),
        "pynvml_loaded": "pynvml" in sys.modules,
    }


def _restore(state: dict[str, Any]) -> None:
    from unimem.backends import nvml_gate as nvml_backend
    from unimem.backends import steps

    from unimem import import_hooks, registry

    os.environ.clear()
    os.environ.update(state["environ"])
    registry._configured[:] = state["configured"]
    registry._instances.clear()
    registry._instances.update(state["instances"])
    import_hooks._post_import.clear()
    import_hooks._post_import.update(state["post_import"])
    steps._visible.clear()
    steps._visible.update(state["visible"])
    steps._written.clear()
    steps._written.update(state["written"])
    sys.meta_path[:] = state["meta_path"]
    nvml_backend._pynvml, nvml_backend._init_error, handles, nvml_backend._use_v2 = state["nvml"]
    nvml_backend._handles.clear()
    nvml_backend._handles.update(handles)
    if not state["pynvml_loaded"]:
        sys.modules.pop("pynvml", None)


def _scrub_test_process_env() -> None:
    """Drop the developer's memory settings from the test process, once: in-process tests
    read ``os.environ`` and must start from a known state."""
    for key in list(os.environ):
        if key.startswith("UNIMEM_TEST_"):
            continue
        if key in _SCRUBBED or key.startswith(_SCRUBBED_PREFIXES):
            del os.environ[key]
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"


@pytest.fixture(autouse=True)
def _isolated_unimem_state():
    """Each in-process test starts from, and leaves, the same unimem process state;
    and none may import a framework into the test process."""
    state = _unimem_state()
    from unimem import registry

    registry._instances.clear()  # a fresh adapter per test: pending settings must not leak
    yield
    leaked = [name for name in FRAMEWORK_MODULES if name in sys.modules]
    _restore(state)
    assert not leaked, f"this test imported {leaked} into the test process; use a subprocess (run_py)"
