"""What a JAX step can reach under a cap with growth on: the pool's figures against the largest
step that runs in a fresh process, and against the largest single buffer the pool hands out.

The batch search predicts each size's peak exactly (XLA's compiled peak), yet on an H200 a
size predicted at 7.23 GiB under an 8 GiB cap with growth on failed: a pool grown on demand
fits less than its cap. This collects what is needed to place that capacity without a failed
step, for the MLP of ``bench_search_rows.py`` (optax AdamW, ``growth=True``, ``limit=8GiB``),
each process warmed up at 64:

1. the pool's figures after the warm-up (``bytes_in_use``, ``pool_bytes``,
   ``largest_free_block_bytes``, ``bytes_limit``);
2. the largest single buffer that can be allocated then (bisected to 32 MiB in one process: a
   failed allocation keeps nothing), with how long a failed allocation takes;
3. XLA's predicted peak of sizes from 2048 up, and the largest size whose step runs in a fresh
   process (bisected on the predicted scale, one fresh process per probe).

    python benchmarks/scripts/jax_growth_capacity.py --out capacity.json [--budget 400]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import benchlib  # noqa: E402

MiB = 1 << 20
LIMIT = "8GiB"


def _work() -> Any:
    import unimem

    unimem.configure(backend="jax", growth=True, limit=LIMIT)
    import bench_search_rows

    work = bench_search_rows.jax_model("jax-mlp", True, 0)
    work.step(64)
    return work


def _pool() -> dict[str, Any]:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    keys = ("bytes_in_use", "peak_bytes_in_use", "pool_bytes", "largest_free_block_bytes", "bytes_limit")
    return {key: stats.get(key) for key in keys}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    import unimem

    work = _work()
    out: dict[str, Any] = {"pool_after_warmup": _pool()}
    if spec["kind"] == "buffer":
        low, high, failures = 0, int(out["pool_after_warmup"]["bytes_limit"] or 8 << 30), []
        while high - low > 32 * MiB:
            size = (low + high) // 2 // MiB * MiB
            t0 = time.perf_counter()
            try:
                buffer = jnp.zeros((size,), jnp.uint8)
                buffer.block_until_ready()
                del buffer
                low = size
            except Exception as exc:
                if not unimem.is_oom(exc):
                    raise
                failures.append([size, round(time.perf_counter() - t0, 3)])
                high = size
        out.update(largest_buffer=low, first_failing_buffer=high, failed_allocations=failures, pool_after=_pool())
        out["predicted"] = {}
        assert work.lower is not None
        for size in spec["sizes"]:
            t0 = time.perf_counter()
            compiled = work.lower(size).compile()
            analysis = compiled.memory_analysis()
            out["predicted"][size] = {
                "peak": int(analysis.peak_memory_in_bytes),
                "temp": int(analysis.temp_size_in_bytes),
                "output": int(analysis.output_size_in_bytes),
                "argument": int(analysis.argument_size_in_bytes),
                "seconds": round(time.perf_counter() - t0, 2),
            }
        return out
    size = spec["size"]
    t0 = time.perf_counter()
    try:
        work.step(size)
        out["fits"] = True
    except Exception as exc:
        if not unimem.is_oom(exc):
            raise
        out["fits"] = False
        out["error"] = str(exc).splitlines()[0][:300]
    out.update(seconds=round(time.perf_counter() - t0, 2), pool_after=_pool(), devices=str(jax.devices()))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget", type=float, default=400.0)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(benchlib.RESULT_MARK + json.dumps(child(json.loads(args.child)), default=str), flush=True)
        return 0
    deadline = time.perf_counter() + args.budget
    result = benchlib.header("jax_growth_capacity", None, sys.argv)
    sizes = [2048, 16384, 32768, 49152, 57484, 65536]
    first = benchlib.run_child(__file__, {"kind": "buffer", "sizes": sizes}, 240, cpu_only=False)
    result["buffer"] = first
    benchlib.write(result, args.out)
    predicted = {int(k): v["peak"] for k, v in first.get("predicted", {}).items()}
    # The fresh-process boundary, bisected in size between a size that runs and one that fails.
    low, high, probes = 2048, 65536, []
    while high - low > max(256, low // 100) and deadline - time.perf_counter() > 60:
        middle = (low + high) // 2
        probe = benchlib.run_child(__file__, {"kind": "step", "size": middle}, 120, cpu_only=False)
        probes.append({"size": middle, **probe})
        if probe.get("fits"):
            low = middle
        elif "fits" in probe:
            high = middle
        else:
            break
        result.update(fresh_probes=probes, fresh_bracket=[low, high], predicted_at=predicted)
        benchlib.write(result, args.out)
    print(json.dumps({"bracket": [low, high], "buffer": first.get("largest_buffer")}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
