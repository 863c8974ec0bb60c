"""One ``unimem compare`` measurement, in a fresh process: configure, start, warm up, train, report JSON.

Run as ``python -m unimem.compare.worker FRAMEWORK WORKLOAD CONFIG SIZE STEPS [WARM]``; prints
one JSON object on the last line of stdout. The framework's adapter starts the device and builds
the step (``start_device``, ``workload_step``); nothing here names a framework.

Before anything is measured, one tiny step of the path of every configuration in the comparison
(WARM: each saver, each dtype) runs, whichever configuration is measured: a framework imports
some modules on first use (torch's first checkpointed call imports ``torch._dynamo`` and sympy,
tens of MiB), and that cost must land in every row alike, not only in the row that first needs them.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import statistics
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from unimem.workload_specs import Shapes

CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "growth": {"growth": True},
    "cap": {"fraction": 0.25},
    "bf16": {},
    "remat": {},
    "offload": {},
}
# Configurations that run every block of the workload under a memory saver (``unimem.remat``
# policy); a framework that cannot do the policy reports the row unsupported.
SAVERS: dict[str, str] = {"remat": "full", "offload": "offload"}
# The warm-up's model: every code path of the workload, at a size that costs no memory to speak of.
WARM_UP_SHAPES = Shapes(batch=2, width=8, hidden=8, depth=1, seq=4, heads=2)


def dtype_of(config: str) -> str:
    """The dtype a configuration trains in."""
    return "bfloat16" if config == "bf16" else "float32"


def warm_up_paths(configs: Sequence[str]) -> list[tuple[str | None, str]]:
    """``(saver, dtype)`` of every distinct code path ``configs`` take, in their order."""
    return list(dict.fromkeys((SAVERS.get(config), dtype_of(config)) for config in configs))


def warm_up(framework: str, workload: str, configs: Sequence[str]) -> list[str]:
    """One tiny step of the path of every configuration in ``configs`` (those of the comparison);
    what could not run, one line each.

    A saver the framework cannot do is skipped (its own row says unsupported); any other
    failure is reported, and the measurement goes on.
    """
    from unimem.compare.workloads import build_step
    from unimem.errors import UnsupportedFeature

    skipped = []
    for saver, dtype in warm_up_paths(configs):
        try:
            step, _ = build_step(framework, workload, replace(WARM_UP_SHAPES, saver=saver), dtype)
            step()
        except UnsupportedFeature:
            continue
        except Exception as exc:  # the measured configuration may not need this path: keep measuring
            skipped.append(f"{saver or 'no saver'}, {dtype}: {type(exc).__name__}: {exc}".splitlines()[0][:300])
    return skipped


def step_times(seconds: list[float]) -> dict[str, Any]:
    """The timed steps' median, min, max and quartiles in ms, and their spread.

    ``step_spread`` is the interquartile range over the median (one slow step, say a garbage
    collection, does not make it large); None with fewer than two timed steps.
    """
    ms = [t * 1e3 for t in seconds]
    median = statistics.median(ms)
    figures: dict[str, Any] = {
        "step_ms": median,
        "step_ms_min": min(ms),
        "step_ms_max": max(ms),
        "step_times_ms": ms,
        "step_ms_q1": None,
        "step_ms_q3": None,
        "step_spread": None,
    }
    if len(ms) > 1:
        q1, _, q3 = statistics.quantiles(ms, n=4, method="inclusive")
        figures.update(step_ms_q1=q1, step_ms_q3=q3, step_spread=(q3 - q1) / median if median > 0 else None)
    return figures


def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def _peak_rss() -> int:
    # ru_maxrss is KiB on Linux, bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _settle(framework: str) -> None:
    """After the warm-up: its pool blocks back and the framework's peaks restarted, where the
    framework can; the host's high-water mark stays (the warm-up's tensors are tiny)."""
    import warnings

    from unimem.api import clear_cache, reset_peak
    from unimem.errors import UnimemError, UnimemWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnimemWarning)  # "nothing to clear" on a CPU
        for action in (clear_cache, reset_peak):
            # A framework that cannot: its figures include the warm-up's few bytes.
            with contextlib.suppress(UnimemError):
                action(framework)


def measure(
    framework: str, workload: str, config: str, size: str, steps: int, warm: Sequence[str] = tuple(CONFIGS)
) -> dict[str, Any]:
    """Configure, start the device, warm up the paths of ``warm``'s configurations, then time
    ``steps`` steps (after two untimed ones) of ``config``; the row of figures."""
    from unimem import registry
    from unimem.api import configure, stats
    from unimem.compare.workloads import SIZES, build_step

    result: dict[str, Any] = {"framework": framework, "workload": workload, "config": config, "size": size}
    shapes: Shapes = SIZES[size]
    if config in SAVERS:
        shapes = replace(shapes, saver=SAVERS[config])
        result["saver"] = SAVERS[config]
    applied = configure(backend=framework, strict=False, **CONFIGS[config])
    result["applied"] = [f"{a.setting}={a.value}: {a.status}" + (f" ({a.note})" if a.note else "") for a in applied]
    t0 = time.perf_counter()
    result["device"] = registry.get_backend(framework).workloads.start_device()
    result["start_seconds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    result["warm_up"] = list(dict.fromkeys([*warm, config]))
    result["warm_up_skipped"] = warm_up(framework, workload, result["warm_up"])
    result["warm_up_seconds"] = time.perf_counter() - t0
    _settle(framework)
    start = stats(framework)  # its first call may load NVML's binding: before the count below
    modules = set(sys.modules)
    result["start_process_used"] = start.process_used
    result["start_reserved"] = start.reserved
    result["start_host_rss"] = _rss()
    result["device_total"] = start.device_total

    step, result["parameters"] = build_step(framework, workload, shapes, dtype_of(config))
    process_peak = start.process_used
    times = []
    for i in range(steps + 2):
        t = time.perf_counter()
        step()
        if i >= 2:  # the first steps compile and warm the allocator
            times.append(time.perf_counter() - t)
        used = stats(framework).process_used
        if used is not None:
            process_peak = used if process_peak is None else max(process_peak, used)
    end = stats(framework)
    # Empty when the warm-up did its work: nothing was imported while memory and time were measured.
    result["imported_while_measuring"] = sorted(set(sys.modules) - modules)
    result.update(step_times(times))
    result.update(
        peak_allocated=end.peak_allocated,
        peak_reserved=end.peak_reserved,
        reserved=end.reserved,
        limit=end.limit,
        process_peak=process_peak,
        host_peak_rss=_peak_rss(),
        ok=True,
    )
    return result


def main(argv: list[str]) -> int:
    """``FRAMEWORK WORKLOAD CONFIG SIZE STEPS [WARM]``, WARM the comparison's configurations,
    comma-separated (default: every configuration)."""
    framework, workload, config, size, steps = argv[0], argv[1], argv[2], argv[3], int(argv[4])
    warm = argv[5].split(",") if len(argv) > 5 and argv[5] else list(CONFIGS)
    from unimem.errors import UnsupportedFeature

    row = {"framework": framework, "workload": workload, "config": config, "size": size, "ok": False}
    try:
        result = measure(framework, workload, config, size, steps, warm)
    except UnsupportedFeature as exc:  # the framework cannot run this configuration: a row that says so
        result = {**row, "unsupported": True, "error": str(exc).splitlines()[0][:300]}
    except Exception as exc:  # a failed run is a row in the table, not a crash of the comparison
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        result = {**row, "error": error, "traceback": traceback.format_exc()[-2000:]}
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
