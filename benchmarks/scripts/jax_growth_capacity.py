"""What a JAX step can reach under a cap with growth on, and what compiling it takes from the pool.

The batch search predicts each size's peak exactly (XLA's compiled peak), yet on an H200 a
size predicted at 7.23 GiB under an 8 GiB cap with growth on failed: a pool grown on demand
fits less than its cap. XLA autotunes its kernels on real buffers while it compiles, so a
compilation may leave regions in the pool that a step's one large temporary buffer cannot use.
For the two JAX models of ``bench_search_rows.py`` (optax AdamW, ``growth=True``,
``limit=8GiB``), each process warmed up at a small size first, this records:

1. ``compiles``: per size, XLA's predicted peak and temporaries, the seconds to compile and the
   pool after it, compiled with autotuning off (``xla_gpu_autotune_level=0``) and then as JAX
   compiles by default: whether autotuning grows the pool, whether it moves the prediction,
   and what it costs in time;
2. ``fresh_probes``: the largest MLP size whose step runs in a fresh process (compiled as JAX
   does by default, then run), bisected to 1% with one fresh process a probe; every figure of
   the pool after the compilation, after the step's inputs were made and after the run, and
   XLA's whole message when it ran out (it names the request that failed);
3. ``off_then_run``: a fresh process that predicts with autotuning off and then runs the step at
   the largest size found in 2 (does it still fit; what the run's own compilation costs).

    python benchmarks/scripts/jax_growth_capacity.py --out capacity.json [--budget 420]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import benchlib  # noqa: E402

LIMIT = "8GiB"
WARM = {"jax-mlp": 64, "jax-transformer": 2}
SIZES = {"jax-mlp": [2048, 16384, 32768, 49152, 57484, 65536], "jax-transformer": [16, 64]}
OFF = {"xla_gpu_autotune_level": 0}


def _work(model: str) -> Any:
    import unimem

    unimem.configure(backend="jax", growth=True, limit=LIMIT)
    import bench_search_rows

    work = bench_search_rows.jax_model(model, True, 0)
    work.step(WARM[model])
    return work


def _pool() -> dict[str, Any]:
    import jax

    return dict(jax.devices()[0].memory_stats() or {})  # every figure XLA's allocator keeps


def _compile(work: Any, size: int, options: dict[str, Any] | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    lowered = work.lower(size)
    compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
    analysis = compiled.memory_analysis()
    return {
        "peak": int(analysis.peak_memory_in_bytes),
        "temp": int(analysis.temp_size_in_bytes),
        "argument": int(analysis.argument_size_in_bytes),
        "output": int(analysis.output_size_in_bytes),
        "seconds": round(time.perf_counter() - t0, 2),
        "pool_after": _pool(),
    }


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import unimem

    work = _work(spec["model"])
    out: dict[str, Any] = {"pool_after_warmup": _pool()}
    if spec["kind"] == "compiles":
        out["off"] = {size: _compile(work, size, OFF) for size in spec["sizes"]}
        out["default"] = {size: _compile(work, size, None) for size in spec["sizes"]}
        return out
    size = spec["size"]
    out["compiled"] = _compile(work, size, OFF if spec["kind"] == "off-then-run" else None)
    inputs, run = work.parts
    t0 = time.perf_counter()
    try:
        x, y = inputs(size)
        out["pool_after_inputs"] = _pool()  # the step's first buffers: where did they go?
        run(x, y)
        out["fits"] = True
    except Exception as exc:
        if not unimem.is_oom(exc):
            raise
        out["fits"] = False
        out["error"] = str(exc)[:3000]  # XLA names the request that failed and the pool's state
    out.update(run_seconds=round(time.perf_counter() - t0, 2), pool_after_run=_pool())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="the JSON to write (required unless --child)")
    parser.add_argument("--budget", type=float, default=420.0)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(benchlib.RESULT_MARK + json.dumps(child(json.loads(args.child)), default=str), flush=True)
        return 0
    if args.out is None:
        parser.error("--out is required")
    deadline = time.perf_counter() + args.budget
    result = benchlib.header("jax_growth_capacity", None, sys.argv)
    result["limit"] = LIMIT

    def compiles(model: str) -> dict[str, Any]:
        spec = {"kind": "compiles", "model": model, "sizes": SIZES[model]}
        return benchlib.run_child(__file__, spec, 300, cpu_only=False)

    # The transformer's compilations alongside the MLP's (separate processes, 8 GiB each).
    with ThreadPoolExecutor(max_workers=2) as pool:
        result["compiles"] = dict(zip(SIZES, pool.map(compiles, SIZES), strict=True))
    benchlib.write(result, args.out)
    low, high, probes = 2048, 65536, []
    while high - low > max(256, low // 100) and deadline - time.perf_counter() > 45:
        middle = (low + high) // 2
        probe = benchlib.run_child(__file__, {"kind": "run", "model": "jax-mlp", "size": middle}, 120, cpu_only=False)
        probes.append({"size": middle, **probe})
        if probe.get("fits"):
            low = middle
        elif "fits" in probe:
            high = middle
        else:
            break
        result.update(fresh_probes=probes, fresh_bracket=[low, high])
        benchlib.write(result, args.out)
    if deadline - time.perf_counter() > 30:
        spec = {"kind": "off-then-run", "model": "jax-mlp", "size": low}
        result["off_then_run"] = {"size": low, **benchlib.run_child(__file__, spec, 120, cpu_only=False)}
    benchlib.write(result, args.out)
    print(json.dumps({"bracket": [low, high]}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
