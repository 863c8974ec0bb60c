"""The benchmarks' own logic, loaded from benchmarks/ (no framework at their top: each imports its
frameworks inside the functions that run on a device)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str) -> ModuleType:
    """``load("bench_savers")``: that benchmark's module, as its script sees itself."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    path = list(sys.path)
    try:
        spec.loader.exec_module(module)  # it puts benchmarks/ first on the path, for benchlib
    finally:
        sys.path[:] = path
    return module
