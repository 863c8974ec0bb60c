"""Latency of ``unimem.stats()`` beside the native calls it stands for, in one process.

    python benchmarks/bench_stats.py [--rounds 30] [--per-round 200] [--out FILE] [--machine LABEL]

Side by side, each after a warm-up, the cases interleaved round by round, the garbage
collector off while timing (as ``timeit`` does); each figure is the median over rounds
of the mean call time in a round, in µs:

- torch: ``unimem.stats("torch")`` vs ``torch.cuda.memory_stats()`` and
  ``torch.cuda.memory_allocated()`` (and ``mem_get_info()``, ``torch._C._cuda_memoryStats``);
- JAX: ``unimem.stats("jax")`` vs ``jax.devices()[0].memory_stats()``;
- NVML: ``unimem.stats("nvml")`` vs pynvml's memory info (v2) + process list, raw.

``unimem.stats(b)`` for a framework also reads NVML's device and per-process figures;
the raw NVML pair is timed so that part can be told apart from unimem's own work.
Where something does not exist (no GPU, no NVML, a framework not installed) it says
so under ``unavailable``/``notes`` and measures the rest. Targets are reported, not asserted.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import sys
import time
from collections.abc import Callable
from typing import Any

import benchlib

Case = Callable[[], object]
_KEEP: list[object] = []  # device buffers that must live while the stats are timed


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def build_cases() -> tuple[dict[str, Case], dict[str, str], dict[str, str], dict[str, bool]]:
    """The calls to time; what could not be timed and why; notes; which comparisons are real."""
    import unimem

    cases: dict[str, Case] = {}
    unavailable: dict[str, str] = {}
    notes: dict[str, str] = {}
    live = {"torch": False, "jax": False, "nvml": False}

    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        v2 = pynvml.nvmlMemory_v2

        def raw_pair() -> None:
            pynvml.nvmlDeviceGetMemoryInfo(handle, version=v2)
            pynvml.nvmlDeviceGetComputeRunningProcesses(handle)

        cases["pynvml memory_info(v2)"] = lambda: pynvml.nvmlDeviceGetMemoryInfo(handle, version=v2)
        cases["pynvml compute_running_processes"] = lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        cases["pynvml memory_info(v2) + compute_running_processes"] = raw_pair
        cases["unimem.stats('nvml')"] = lambda: unimem.stats("nvml")
        live["nvml"] = True
    except Exception as exc:
        unavailable["nvml"] = _error(exc)

    if _installed("jax"):
        # Before the import: no 75% preallocation on a GPU, so torch has room beside it.
        unimem.configure("jax", growth=True)
    if _installed("torch"):
        import torch

        if torch.cuda.is_available():
            _KEEP.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
            cases["torch.cuda.mem_get_info()"] = torch.cuda.mem_get_info
            cases["torch._C._cuda_memoryStats(0)"] = lambda: torch._C._cuda_memoryStats(0)
            live["torch"] = True
        else:
            notes["torch"] = (
                "no CUDA device: torch.cuda.memory_stats() answers {} and unimem.stats('torch') Nones "
                "without starting anything; these figures time that path, not a GPU query"
            )
        cases["torch.cuda.memory_stats()"] = torch.cuda.memory_stats
        cases["torch.cuda.memory_allocated()"] = torch.cuda.memory_allocated
        cases["unimem.stats('torch')"] = lambda: unimem.stats("torch")
        cases["unimem.stats('torch', nvml=False)"] = lambda: unimem.stats("torch", nvml=False)
    else:
        unavailable["torch"] = "torch is not installed"

    if _installed("jax"):
        import jax
        import jax.numpy as jnp

        device = jax.devices()[0]
        array = jnp.zeros(1 << 20)
        array.block_until_ready()
        _KEEP.append(array)
        cases["jax Device.memory_stats()"] = device.memory_stats
        cases["unimem.stats('jax')"] = lambda: unimem.stats("jax")
        cases["unimem.stats('jax', nvml=False)"] = lambda: unimem.stats("jax", nvml=False)
        live["jax"] = device.platform == "gpu"
        if not live["jax"]:
            notes["jax"] = f"JAX runs on {device.platform}: memory_stats() answers None; timed anyway"
    else:
        unavailable["jax"] = "jax is not installed"

    return cases, unavailable, notes, live


def measure(cases: dict[str, Case], warmup: int, rounds: int, per_round: int) -> tuple[dict[str, Any], dict[str, str]]:
    failed: dict[str, str] = {}
    timed: dict[str, Case] = {}
    for name, case in cases.items():
        try:
            for _ in range(warmup):
                case()
            timed[name] = case
        except Exception as exc:
            failed[name] = _error(exc)
    samples: dict[str, list[float]] = {name: [] for name in timed}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            for name, case in timed.items():
                start = time.perf_counter_ns()
                for _ in range(per_round):
                    case()
                samples[name].append((time.perf_counter_ns() - start) / per_round / 1000.0)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: benchlib.summary(values) for name, values in samples.items()}, failed


def targets(us: dict[str, float], live: dict[str, bool]) -> dict[str, Any]:
    def get(name: str) -> float | None:
        return us.get(name)

    def against_torch(call: str) -> dict[str, Any]:
        ours, native = get(call), get("torch.cuda.memory_stats()")
        entry: dict[str, Any] = {"text": f"{call} <= 0.5 x torch.cuda.memory_stats()"}
        if ours is not None and native and live["torch"]:
            entry.update(ratio=round(ours / native, 3), met=ours <= 0.5 * native)
        else:
            entry.update(met=None, why="no CUDA device here: not comparable")
        return entry

    out: dict[str, Any] = {"stats_torch": against_torch("unimem.stats('torch')")}
    # The same fields torch.cuda.memory_stats() gives (the allocator's own counters),
    # without NVML's device and per-process queries.
    out["stats_torch_allocator_only"] = against_torch("unimem.stats('torch', nvml=False)")

    ours, native = get("unimem.stats('jax')"), get("jax Device.memory_stats()")
    entry = {"text": "unimem.stats('jax') within 3 us of Device.memory_stats()"}
    if ours is not None and native is not None and live["jax"]:
        entry.update(difference_us=round(ours - native, 3), met=ours - native <= 3.0)
        pair = get("pynvml memory_info(v2) + compute_running_processes")
        if pair is not None:
            entry["difference_without_nvml_pair_us"] = round(ours - native - pair, 3)
            entry["note"] = (
                "unimem.stats('jax') also reads NVML's device and process figures; "
                "difference_without_nvml_pair_us subtracts the raw pynvml pair"
            )
    else:
        entry.update(met=None, why="JAX has no GPU here: not comparable")
    out["stats_jax"] = entry

    ours, native = get("unimem.stats('jax', nvml=False)"), get("jax Device.memory_stats()")
    entry = {"text": "unimem.stats('jax', nvml=False) within 3 us of Device.memory_stats()"}
    if ours is not None and native is not None and live["jax"]:
        entry.update(difference_us=round(ours - native, 3), met=ours - native <= 3.0)
    else:
        entry.update(met=None, why="JAX has no GPU here: not comparable")
    out["stats_jax_allocator_only"] = entry

    ours, raw = get("unimem.stats('nvml')"), get("pynvml memory_info(v2) + compute_running_processes")
    entry = {"text": "unimem.stats('nvml') <= 1.2 x raw pynvml memory info + process list"}
    if ours is not None and raw and live["nvml"]:
        entry.update(ratio=round(ours / raw, 3), met=ours <= 1.2 * raw)
    else:
        entry.update(met=None, why="NVML is not available here")
    out["stats_nvml"] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--per-round", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--out", default=None, help="JSON file to write (default: stdout)")
    parser.add_argument("--machine", default=None, help="how to name this machine in the output")
    args = parser.parse_args(argv)

    result: dict[str, Any] = benchlib.header("stats", args.machine, [sys.argv[0], *(argv or sys.argv[1:])])
    cases, unavailable, notes, live = build_cases()
    timings, failed = measure(cases, args.warmup, args.rounds, args.per_round)
    medians = {name: summary["median"] for name, summary in timings.items()}
    result.update(
        {
            "unit": "us per call",
            "method": f"median over {args.rounds} rounds of the mean of {args.per_round} calls; "
            f"{args.warmup} warm-up calls; cases interleaved; gc off while timing",
            "live": live,
            "median_us": {name: round(value, 3) for name, value in medians.items()},
            "detail_us": timings,
            "unavailable": unavailable | {name: f"raised: {why}" for name, why in failed.items()},
            "notes": notes,
            "targets": targets(medians, live),
        }
    )
    benchlib.write(result, args.out)
    for name, value in medians.items():
        print(f"{value:10.2f} us  {name}", file=sys.stderr)
    for name, entry in result["targets"].items():
        print(f"target {name}: {entry}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
