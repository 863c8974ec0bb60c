"""CuPy's GPU scenarios, each run in a fresh interpreter by ``test_cupy.py``:

    python cupy_scenarios.py NAME '{"kwarg": value}'

Same protocol as ``gpu_scenarios.py`` (whose NVML helpers and result dict ``R`` are
reused): a scenario measures and reports, the test asserts; ``R`` is printed as one JSON
line after ``MARK``, also when the scenario raises. cupy is imported inside each
scenario, because when it is imported is part of what is under test.
"""

from __future__ import annotations

import gc
import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from gpu_scenarios import MARK, GiB, MiB, R, applied_text, raw_handle, raw_memory, raw_process_used, stats_into

ALIGN = 512  # CuPy's pool rounds every request up to this


def _round(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


def _adapter() -> Any:
    from unimem import registry

    return registry.get_backend("cupy")


def cupy_baseline() -> None:
    """CuPy after one tiny array: its context, kernels and the smallest pool block."""
    import cupy

    (cupy.zeros(1) + 1).sum().get()
    handle = raw_handle()
    R["process_used"] = raw_process_used(handle)
    pool = cupy.get_default_memory_pool()
    R["pool_total"] = int(pool.total_bytes())
    R["context"] = (R["process_used"] or 0) - R["pool_total"]
    R["cupy"] = cupy.__version__
    R["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()


def cupy_cap(fraction: float | None = None, limit: str | None = None, after_import: bool = False) -> None:
    """Configure a cap (before ``import cupy``, or after it but before its first allocation),
    then allocate 1 GiB arrays until CuPy's pool raises."""
    import unimem

    if after_import:
        import cupy  # noqa: F401
    kwargs: dict[str, Any] = {"fraction": fraction} if fraction is not None else {"limit": limit}
    R["imported_at_configure"] = "cupy" in sys.modules
    R["applied"] = applied_text(unimem.configure("cupy", **kwargs))
    R["phase_after_configure"] = int(_adapter().phase())
    import cupy

    R["phase_after_import"] = int(_adapter().phase())
    handle = raw_handle()
    total = int(cupy.cuda.runtime.getDeviceProperties(0)["totalGlobalMem"])
    cap = int(total * fraction) if fraction is not None else unimem.parse_size(limit)
    R.update(total_memory=total, cap=cap)
    blocks, max_raw, max_total = [], 0, 0
    R["oom"] = False
    for _ in range(cap // GiB + 8):
        try:
            blocks.append(cupy.empty(GiB, dtype=cupy.uint8))
        except Exception as exc:
            R["oom"] = True
            R["oom_type"] = f"{type(exc).__module__}.{type(exc).__qualname__}"
            R["oom_message"] = str(exc)[:400]
            R["is_oom"] = unimem.is_oom(exc)
            R["requested"] = _adapter().diagnose.requested_bytes(str(exc))
            break
        max_raw = max(max_raw, raw_process_used(handle) or 0)
        max_total = max(max_total, int(cupy.get_default_memory_pool().total_bytes()))
    R["phase_after_use"] = int(_adapter().phase())
    R["blocks_allocated"] = len(blocks)
    R["pool_limit"] = int(cupy.get_default_memory_pool().get_limit())
    R["max_pool_total"] = max_total
    R["max_process_used_raw"] = max(max_raw, raw_process_used(handle) or 0)
    stats_into("stats", unimem.stats("cupy"))


def cupy_stats(sizes: tuple[int, ...] = (1, 1000, 513, 3 * MiB + 7, GiB, 2 * GiB + 100)) -> None:
    """Arrays of odd sizes: the pool's figures against their sizes, NVML, and clear_cache."""
    import cupy

    import unimem

    handle = raw_handle()
    keep = [cupy.empty(size, dtype=cupy.uint8) for size in sizes]
    cupy.cuda.Device(0).synchronize()
    R["expected_allocated"] = sum(_round(size) for size in sizes)
    stats_into("stats", unimem.stats("cupy"))
    R["process_used"] = raw_process_used(handle)
    R["phase"] = int(_adapter().phase())
    R["uuid"] = _adapter().device_uuid(0)
    R["nvml_total"] = raw_memory(handle)[0]
    # Peaks: none until reset_peak() installs the hook, then the most reached since.
    unimem.reset_peak("cupy")
    burst = cupy.empty(4 * GiB, dtype=cupy.uint8)
    del burst
    stats_into("after_burst", unimem.stats("cupy"))
    R["expected_peak"] = R["expected_allocated"] + 4 * GiB
    fragmentation = unimem.fragmentation("cupy")
    R["free_in_pool"], R["free_blocks"] = fragmentation.free_in_pool, fragmentation.free_blocks
    # clear_cache: what it returns against what NVML shows going back.
    del keep
    gc.collect()
    R["process_used_before_clear"] = raw_process_used(handle)
    R["returned"] = unimem.clear_cache("cupy")
    time.sleep(0.2)
    R["process_used_after_clear"] = raw_process_used(handle)
    R["nvml_delta"] = (R["process_used_before_clear"] or 0) - (R["process_used_after_clear"] or 0)
    stats_into("after_clear", unimem.stats("cupy"))
    R["returned_second_call"] = unimem.clear_cache("cupy")


def cupy_prealloc(fraction: float = 0.25, use: int = 10 * GiB) -> None:
    """``growth=False`` with a cap, before import: the pool takes the cap at the first allocation."""
    import unimem

    R["applied"] = applied_text(unimem.configure("cupy", fraction=fraction, growth=False))
    import cupy

    handle = raw_handle()
    R["process_used_before"] = raw_process_used(handle)
    pool = cupy.get_default_memory_pool()
    first = cupy.zeros(1)
    R["pool_total_after_first"] = int(pool.total_bytes())
    R["pool_limit"] = int(pool.get_limit())
    R["process_used_after_first"] = raw_process_used(handle)
    big = cupy.empty(use, dtype=cupy.uint8)  # out of the preallocation: no new device memory
    R["pool_total_after_use"] = int(pool.total_bytes())
    R["process_used_after_use"] = raw_process_used(handle)
    del big, first


def cupy_allocator(allocator: str, size: int = GiB) -> None:
    """An allocator configured before import: what CuPy uses, what stats() reads, what NVML shows."""
    import unimem

    R["applied"] = applied_text(unimem.configure("cupy", allocator=allocator))
    import cupy

    handle = raw_handle()
    array = cupy.empty(size, dtype=cupy.uint8)
    R["allocator"] = repr(cupy.cuda.get_allocator())[:120]
    stats_into("stats", unimem.stats("cupy"))
    R["process_used_with_array"] = raw_process_used(handle)
    del array
    R["process_used_after_del"] = raw_process_used(handle)
    R["returned"] = unimem.clear_cache("cupy")
    R["process_used_after_clear"] = raw_process_used(handle)
    R["size"] = size


def cupy_late() -> None:
    """CuPy started: the visible devices are too late; a cap is set on the running pool."""
    import cupy

    import unimem

    cupy.zeros(1)
    R["phase"] = int(_adapter().phase())
    try:
        unimem.configure("cupy", devices=[0])
    except unimem.TooLateError as exc:
        R["devices_error"] = type(exc).__name__
    R["applied"] = applied_text(unimem.configure("cupy", fraction=0.5))
    total = int(cupy.cuda.runtime.getDeviceProperties(0)["totalGlobalMem"])
    R["pool_limit"] = int(cupy.get_default_memory_pool().get_limit())
    R["expected_limit"] = int(0.5 * total)
    R["again"] = applied_text(unimem.configure("cupy", fraction=0.5))
    stats_into("stats", unimem.stats("cupy"))


SCENARIOS: dict[str, Callable[..., None]] = {
    f.__name__: f for f in (cupy_baseline, cupy_cap, cupy_stats, cupy_prealloc, cupy_allocator, cupy_late)
}


def main() -> int:
    name = sys.argv[1]
    kwargs = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    started = time.perf_counter()
    code = 0
    try:
        SCENARIOS[name](**kwargs)
    except BaseException as exc:  # report, with the figures gathered so far
        R["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        traceback.print_exc()
        code = 1
    R["seconds"] = round(time.perf_counter() - started, 3)
    sys.stdout.write(MARK + json.dumps(R, default=str) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
