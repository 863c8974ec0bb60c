"""CuPy on the GPU: its pool's cap, figures, peaks, clear_cache, preallocation and allocators,
each in a fresh process (``cupy_scenarios.py``), checked against CuPy itself and NVML."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gpu_scenarios import MARK

pytestmark = pytest.mark.gpu

MiB = 1 << 20
GiB = 1 << 30
SLACK = 64 * MiB  # see test_context.py
SCENARIOS = Path(__file__).resolve().parent / "cupy_scenarios.py"
# Variables that steer CuPy's or unimem's memory: a scenario starts without them.
_STEERING = ("UNIMEM_", "CUPY_GPU_MEMORY_LIMIT", "CUDA_VISIBLE_DEVICES")


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(_STEERING)}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(name: str, **kwargs: Any) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(SCENARIOS), name, json.dumps(kwargs)],
        capture_output=True,
        text=True,
        timeout=240,
        env=_env(),
    )
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARK):
            result: dict[str, Any] = json.loads(line[len(MARK) :])
            if "error" in result:
                result["stderr_tail"] = done.stderr[-1500:]
            return result
    raise AssertionError(f"{name} reported nothing (exit {done.returncode}):\n{done.stderr[-3000:]}")


@pytest.fixture
def cupy_scenario(record: Callable[..., None]) -> Callable[..., dict[str, Any]]:
    """``cupy_scenario(name, **kwargs)``: run it, record its figures, fail if it raised."""

    def run(name: str, **kwargs: Any) -> dict[str, Any]:
        result = _run(name, **kwargs)
        record(**{key: value for key, value in result.items() if key != "stderr_tail"})
        if "error" in result:
            raise AssertionError(f"{name} raised {result['error']}\n{result.get('stderr_tail', '')}")
        return result

    return run


@pytest.fixture(scope="module")
def cupy_context() -> int:
    """What CuPy holds on the device outside its pool after one tiny op (context, kernels)."""
    result = _run("cupy_baseline")
    if "error" in result or result.get("process_used") is None:
        raise AssertionError(f"cupy_baseline failed: {result}")
    return int(result["context"])


@pytest.mark.covers("cupy:fraction", "cupy:stats.limit", "cupy:oom", "cupy:stats.process_used")
@pytest.mark.parametrize("after_import", [False, True], ids=["before-import", "after-import"])
def test_cupy_fraction_cap(cupy_scenario: Any, cupy_context: int, record: Any, after_import: bool) -> None:
    """A 0.25 cap made through CuPy's variable: allocating past it raises CuPy's OOM, which
    is_oom recognises, and NVML never sees more than the cap and the context."""
    r = cupy_scenario("cupy_cap", fraction=0.25, after_import=after_import)
    bound = r["cap"] + cupy_context + SLACK
    record(context=cupy_context, bound=bound, margin=bound - r["max_process_used_raw"])
    assert r["imported_at_configure"] is after_import
    assert r["phase_after_configure"] <= 1 and r["phase_after_import"] == 1, "configure or import started CUDA"
    assert r["phase_after_use"] == 2
    assert r["pool_limit"] == r["cap"] == r["stats.limit"]
    assert r["oom"] is True and r["oom_type"] == "cupy.cuda.memory.OutOfMemoryError"
    assert r["is_oom"] is True
    assert r["requested"] == [GiB, f"Out of memory allocating {GiB:,} bytes"]
    assert r["blocks_allocated"] == r["cap"] // GiB
    assert r["max_pool_total"] <= r["cap"]
    assert r["max_process_used_raw"] <= bound


@pytest.mark.covers("cupy:limit", "cupy:stats.limit")
def test_cupy_limit_cap(cupy_scenario: Any) -> None:
    r = cupy_scenario("cupy_cap", limit="20GiB")
    assert r["cap"] == r["pool_limit"] == r["stats.limit"] == 20 * GiB
    assert r["oom"] is True and r["blocks_allocated"] == 20


@pytest.mark.covers(
    "cupy:stats.allocated",
    "cupy:stats.reserved",
    "cupy:stats.peak",
    "cupy:stats.device",
    "cupy:stats.process_used",
    "cupy:reset_peak",
    "cupy:clear_cache",
    "cupy:fragmentation",
)
def test_cupy_stats_peaks_and_clear_cache(cupy_scenario: Any, cupy_context: int, record: Any) -> None:
    """allocated is the live arrays' sizes rounded up to 512 bytes; NVML's process figure
    less the context is the pool's total; clear_cache returns what NVML sees going back."""
    r = cupy_scenario("cupy_stats")
    record(
        context=cupy_context,
        nvml_minus_context_minus_pool=r["process_used"] - cupy_context - r["stats.reserved"],
        returned_minus_nvml=r["returned"] - r["nvml_delta"],
    )
    assert r["phase"] == 2
    assert r["stats.allocated"] == r["expected_allocated"]
    assert r["stats.reserved"] >= r["stats.allocated"]
    assert r["stats.peak_allocated"] is None, "a peak before reset_peak() installed the hook"
    assert r["stats.limit"] is None
    assert r["stats.device_total"] == r["nvml_total"]
    assert r["stats.process_used"] is not None
    assert abs(r["process_used"] - cupy_context - r["stats.reserved"]) <= SLACK
    assert r["uuid"] is not None and r["uuid"].startswith("GPU-")
    assert r["after_burst.peak_allocated"] == r["expected_peak"]
    assert r["after_burst.allocated"] == r["expected_allocated"]
    assert r["after_burst.peak_reserved"] >= r["after_burst.peak_allocated"]
    assert r["free_in_pool"] >= 4 * GiB and r["free_blocks"] >= 1  # the burst's block, back in the pool
    assert r["returned"] >= 7 * GiB
    assert r["after_clear.reserved"] == 0
    assert abs(r["returned"] - r["nvml_delta"]) <= SLACK
    assert r["returned_second_call"] == 0


@pytest.mark.covers("cupy:preallocate", "cupy:fraction")
def test_cupy_preallocate_capped(cupy_scenario: Any, cupy_context: int, record: Any) -> None:
    r = cupy_scenario("cupy_prealloc", fraction=0.25)
    record(context=cupy_context)
    assert r["process_used_before"] is None, "configure or import started CUDA"
    assert r["pool_limit"] - 512 < r["pool_total_after_first"] <= r["pool_limit"]
    assert r["pool_total_after_use"] == r["pool_total_after_first"], "the array did not come from the preallocation"
    assert r["process_used_after_use"] - r["process_used_after_first"] <= SLACK


@pytest.mark.covers("cupy:allocator.async", "cupy:stats.allocated", "cupy:stats.reserved")
def test_cupy_allocator_async(cupy_scenario: Any) -> None:
    r = cupy_scenario("cupy_allocator", allocator="async")
    assert "MemoryAsyncPool" in r["allocator"]
    assert r["stats.allocated"] == r["size"]
    assert r["stats.reserved"] >= r["size"]
    assert r["stats.limit"] is None


@pytest.mark.covers("cupy:allocator.uncached")
def test_cupy_allocator_uncached(cupy_scenario: Any) -> None:
    """Plain cudaMalloc: memory goes back on free, and the pool's figures are None, not 0."""
    r = cupy_scenario("cupy_allocator", allocator="uncached")
    assert "_malloc" in r["allocator"]
    assert r["stats.allocated"] is None and r["stats.reserved"] is None
    assert r["process_used_with_array"] - r["process_used_after_del"] >= r["size"] - SLACK
    assert r["returned"] == 0


@pytest.mark.covers("cupy:devices", "cupy:fraction")
def test_cupy_after_start(cupy_scenario: Any) -> None:
    """Started: devices are too late; a cap goes onto the running pool, and again is unchanged."""
    r = cupy_scenario("cupy_late")
    assert r["phase"] == 2
    assert r["devices_error"] == "TooLateError"
    assert r["pool_limit"] == r["expected_limit"] == r["stats.limit"]
    assert "set_limit" in r["applied"] and "unchanged" in r["again"]
