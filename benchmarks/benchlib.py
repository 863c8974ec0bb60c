"""What every benchmark here writes beside its numbers: the machine, versions, date."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

DISTRIBUTIONS = ("unimem", "torch", "jax", "jaxlib", "tensorflow", "nvidia-ml-py")
RESULT_MARK = "UNIMEM_BENCH_RESULT "  # a child's one line of JSON: ``print(RESULT_MARK + json.dumps(...))``


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_description() -> dict[str, Any] | None:
    """GPU name and driver from NVML (pynvml only, no framework), or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {
            "name": name.decode() if isinstance(name, bytes) else str(name),
            "driver": driver.decode() if isinstance(driver, bytes) else str(driver),
            "count": int(pynvml.nvmlDeviceGetCount()),
        }
    except Exception:
        return None


def gpu_total_bytes() -> int | None:
    """The first GPU's memory in bytes from NVML, or None without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total)
    except Exception:
        return None


def machine(label: str | None) -> dict[str, Any]:
    return {
        "label": label or platform.node(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "gpu": gpu_description(),
        # other work on the machine skews every timing here: the 1/5/15-minute load averages
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "n": len(ordered),
    }


def header(benchmark: str, label: str | None, command: list[str]) -> dict[str, Any]:
    return {
        "benchmark": benchmark,
        "machine": machine(label),
        "versions": versions(),
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["python", *command]),
    }


def write(result: dict[str, Any], out: str | None) -> None:
    text = json.dumps(result, indent=2, default=str) + "\n"
    if out is None or out == "-":
        sys.stdout.write(text)
    else:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
        print(f"wrote {out}", file=sys.stderr)


def run_child(
    script: str, spec: dict[str, Any], timeout: float, *, cpu_only: bool, keep_stderr: bool = False
) -> dict[str, Any]:
    """Run ``script --child <spec as JSON>`` in a fresh interpreter, with none of the settings
    unimem or the frameworks read from the environment, and return the JSON it printed after
    ``RESULT_MARK``; else ``{"error": ...}`` with the output's tail (all of it on a timeout,
    for whatever the child printed as it went)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PYTORCH_", "UNIMEM_", "TF_FORCE_GPU"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    if cpu_only:
        env["JAX_PLATFORMS"] = "cpu"
    try:
        done = subprocess.run(
            [sys.executable, script, "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return {"error": f"timed out after {timeout:.0f} s", "stdout": out, "stderr": err[-4000:]}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            result: dict[str, Any] = json.loads(line[len(RESULT_MARK) :])
            if keep_stderr:  # what the child said as it went (progress lines), kept beside its figures
                result["stderr_tail"] = done.stderr[-4000:]
            return result
    return {"error": f"exit {done.returncode}", "stderr": done.stderr[-2000:]}


def earlier(out: str | None) -> dict[str, Any] | None:
    """The result a benchmark wrote to ``out`` before (to merge this run's rows into), or None."""
    if out is None or out == "-" or not Path(out).is_file():
        return None
    found: dict[str, Any] = json.loads(Path(out).read_text())
    return found


def _source(result: dict[str, Any], rows: str) -> dict[str, Any]:
    keys = ("command", "date", "versions", "machine")
    return {"rows": rows, **{k: result[k] for k in keys if k in result}}


def add_source(result: dict[str, Any], before: dict[str, Any] | None, rows: str) -> None:
    """Where ``result``'s rows join those of ``before`` (an earlier result in the same file): its
    ``sources``, each run's rows, command, date, versions and machine -- ``before``'s own (or one
    entry for it), then this run's. Nothing where there is no earlier result."""
    if before is None:
        return
    kept = before.get("sources") or [_source(before, "the rows kept from before")]
    result["sources"] = [*kept, _source(result, rows)]
