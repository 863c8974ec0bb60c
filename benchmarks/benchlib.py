"""What every benchmark here writes beside its numbers: the machine, versions, date."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

DISTRIBUTIONS = ("unimem", "torch", "jax", "jaxlib", "tensorflow", "nvidia-ml-py")


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
