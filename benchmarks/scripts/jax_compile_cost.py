"""What one compilation of a JAX training step costs, and whether compiling several sizes at
once costs less than one after another.

The batch search predicts each size's peak from its compiled program, so a JAX search spends
most of its time compiling. For the transformer of ``bench_search_rows.py`` (4 pre-LN blocks,
optax AdamW, ``growth=True``, ``limit=8GiB``), in one fresh process warmed up at batch 2, this
records per compilation the seconds to lower and to compile, XLA's predicted peak and
temporaries and the pool after it:

1. ``sequential``: one size after another, as JAX compiles by default, then with autotuning
   off (``xla_gpu_autotune_level=0``) and with Triton's GEMMs off (``xla_gpu_enable_triton_gemm``);
2. ``threads-N``: N sizes lowered one after another, then compiled in N threads at once (JAX
   releases the interpreter while XLA compiles): the wall time against the sum of the parts.

    python benchmarks/scripts/jax_compile_cost.py --out compile_cost.json [--model jax-transformer]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import benchlib  # noqa: E402

WARM = {"jax-transformer": 2, "jax-mlp": 64}
# Sizes no step compiled before (a size compiles once per process): each figure is a fresh compilation.
SEQUENTIAL = {
    "jax-transformer": [("default", 24, None), ("autotune-off", 28, {"xla_gpu_autotune_level": 0}),
                        ("triton-gemm-off", 32, {"xla_gpu_enable_triton_gemm": False})],
    "jax-mlp": [("default", 24576, None), ("autotune-off", 28672, {"xla_gpu_autotune_level": 0}),
                ("triton-gemm-off", 32768, {"xla_gpu_enable_triton_gemm": False})],
}  # fmt: skip
THREADS = {"jax-transformer": [[40, 44, 48, 52], [56, 60]], "jax-mlp": [[36864, 40960, 45056, 49152], [53248, 57344]]}


def _pool() -> dict[str, Any]:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    keys = ("bytes_in_use", "pool_bytes", "largest_free_block_bytes", "bytes_limit")
    return {k: stats.get(k) for k in keys}


def _lower(work: Any, size: int) -> tuple[Any, float]:
    t0 = time.perf_counter()
    lowered = work.lower(size)
    return lowered, round(time.perf_counter() - t0, 2)


def _compile(lowered: Any, options: dict[str, Any] | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
    except Exception as exc:  # an option this XLA does not know: said, not fatal
        return {"error": str(exc)[:400], "seconds": round(time.perf_counter() - t0, 2)}
    seconds = round(time.perf_counter() - t0, 2)
    analysis = compiled.memory_analysis()
    return {
        "seconds": seconds,
        "peak": int(analysis.peak_memory_in_bytes),
        "temp": int(analysis.temp_size_in_bytes),
        "ended": round(time.perf_counter(), 2),
    }


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import unimem

    model = spec["model"]
    out: dict[str, Any] = {"sequential": [], "threads": []}
    try:
        unimem.configure(backend="jax", growth=True, limit="8GiB")
        import bench_search_rows

        work = bench_search_rows.jax_model(model, True, 0)
        t0 = time.perf_counter()
        work.step(WARM[model])
        out["warmup_seconds"] = round(time.perf_counter() - t0, 2)
        out["pool_after_warmup"] = _pool()
        for label, size, options in SEQUENTIAL[model]:
            lowered, lower_seconds = _lower(work, size)
            row = {"way": label, "size": size, "lower_seconds": lower_seconds, **_compile(lowered, options)}
            out["sequential"].append({**row, "pool_after": _pool()})
        for sizes in THREADS[model]:
            lowered = [_lower(work, n) for n in sizes]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=len(sizes)) as pool:
                parts = list(pool.map(lambda pair: _compile(pair[0], None), lowered))
            wall = time.perf_counter() - t0
            for part in parts:
                part["ended"] = round(part.pop("ended") - t0, 2) if "ended" in part else None
            out["threads"].append(
                {
                    "sizes": sizes,
                    "lower_seconds": [s for _, s in lowered],
                    "wall_seconds": round(wall, 2),
                    "sum_seconds": round(sum(p["seconds"] for p in parts), 2),
                    "parts": parts,
                    "pool_after": _pool(),
                }
            )
        for row in out["sequential"]:
            row.pop("ended", None)
    except Exception:
        out["failure"] = traceback.format_exc()[-3000:]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="the JSON to write (required unless --child)")
    parser.add_argument("--model", default="jax-transformer", choices=sorted(WARM))
    parser.add_argument("--timeout", type=float, default=420.0)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(benchlib.RESULT_MARK + json.dumps(child(json.loads(args.child)), default=str), flush=True)
        return 0
    if args.out is None:
        parser.error("--out is required")
    result = benchlib.header("jax_compile_cost", None, sys.argv)
    result["model"] = args.model
    result.update(benchlib.run_child(__file__, {"model": args.model}, args.timeout, cpu_only=False))
    benchlib.write(result, args.out)
    print(json.dumps(result, indent=1, default=str)[-4000:], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
