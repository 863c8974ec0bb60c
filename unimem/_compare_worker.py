"""One ``unimem compare`` measurement, in a fresh process: configure, start, train, report JSON.

Run as ``python -m unimem._compare_worker FRAMEWORK WORKLOAD CONFIG SIZE STEPS``; prints one
JSON object on the last line of stdout. The framework's adapter starts the device and builds
the step (``start_device``, ``workload_step``); nothing here names a framework.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
import traceback
from dataclasses import replace
from typing import Any

from unimem.workloads import Shapes

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


def measure(framework: str, workload: str, config: str, size: str, steps: int) -> dict[str, Any]:
    import unimem
    from unimem import registry
    from unimem.workloads import SIZES, build_step

    result: dict[str, Any] = {"framework": framework, "workload": workload, "config": config, "size": size}
    shapes: Shapes = SIZES[size]
    if config in SAVERS:
        shapes = replace(shapes, saver=SAVERS[config])
        result["saver"] = SAVERS[config]
    applied = unimem.configure(backend=framework, strict=False, **CONFIGS[config])
    result["applied"] = [f"{a.setting}={a.value}: {a.status}" + (f" ({a.note})" if a.note else "") for a in applied]
    t0 = time.perf_counter()
    result["device"] = registry.get_backend(framework).start_device()
    result["start_seconds"] = time.perf_counter() - t0
    start = unimem.stats(framework)
    result["start_process_used"] = start.process_used
    result["start_reserved"] = start.reserved
    result["start_host_rss"] = _rss()
    result["device_total"] = start.device_total

    step, result["parameters"] = build_step(framework, workload, shapes, "bfloat16" if config == "bf16" else "float32")
    process_peak = start.process_used
    times = []
    for i in range(steps + 2):
        t = time.perf_counter()
        step()
        if i >= 2:  # the first steps compile and warm the allocator
            times.append(time.perf_counter() - t)
        used = unimem.stats(framework).process_used
        if used is not None:
            process_peak = used if process_peak is None else max(process_peak, used)
    end = unimem.stats(framework)
    result.update(
        step_ms=statistics.median(times) * 1e3,
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
    framework, workload, config, size, steps = argv[0], argv[1], argv[2], argv[3], int(argv[4])
    from unimem.errors import UnsupportedFeature

    row = {"framework": framework, "workload": workload, "config": config, "size": size, "ok": False}
    try:
        result = measure(framework, workload, config, size, steps)
    except UnsupportedFeature as exc:  # the framework cannot run this configuration: a row that says so
        result = {**row, "unsupported": True, "error": str(exc).splitlines()[0][:300]}
    except Exception as exc:  # a failed run is a row in the table, not a crash of the comparison
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        result = {**row, "error": error, "traceback": traceback.format_exc()[-2000:]}
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
