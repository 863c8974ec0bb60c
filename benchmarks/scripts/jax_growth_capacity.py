"""What a JAX step can reach under a cap with growth on, and what compiling it takes from the pool.

The batch search predicts each size's peak exactly (XLA's compiled peak), yet on an H200 a
size predicted at 81% of an 8 GiB cap with growth on failed, and the largest step a fresh
process ran was predicted at 70% of it: a pool grown on demand fits less than its cap. For the
JAX models of ``bench_search_rows.py`` (optax AdamW, ``growth=True``, ``limit=8GiB``) and the
GPT-2 of ``bench_savers.py`` (``limit=40GiB``), each process warmed up at a small size first,
this records:

1. ``compiles``: per size, XLA's predicted peak and temporaries, the seconds to compile and the
   pool after it, compiled with autotuning off (``xla_gpu_autotune_level=0``) and then as JAX
   compiles by default: whether autotuning grows the pool, whether it moves the prediction,
   and what it costs in time;
2. ``fresh``: per way of running the MLP's step, the largest size that runs in a fresh process,
   bisected to 1% with one fresh process a probe: ``jit`` (the step as the search runs it: the
   jitted function), ``aot`` (the executable the prediction compiled, run directly),
   ``reserve`` (as ``jit``, after one buffer of the step's predicted additions, outputs and
   temporaries, was taken and given back: does making the room in one piece first make the
   prediction hold). Per probe: every figure of the pool
   after the compilation, after the inputs and after the run, the seconds a failure took, and
   the allocator's own account of its regions when a request failed (XLA's log).

    python benchmarks/scripts/jax_growth_capacity.py --out capacity.json [--budget 420]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import benchlib  # noqa: E402

LIMITS = {"jax-mlp": "8GiB", "jax-transformer": "8GiB", "gpt2-none": "40GiB", "gpt2-full": "40GiB"}
WARM = {"jax-mlp": 64, "jax-transformer": 2, "gpt2-none": 1, "gpt2-full": 1}
SIZES = {"jax-mlp": [2048, 32768, 49152], "jax-transformer": [16, 64], "gpt2-none": [8, 12], "gpt2-full": [8, 32]}
OFF = {"xla_gpu_autotune_level": 0}
WAYS = ("jit", "aot", "reserve")
BRACKET = (30000, 60000)
# What of XLA's log on a failed request says where the bytes are (its allocator's regions and totals).
_KEEP = re.compile(r"region of size|ran out of memory|Sum Total|Limit:|InUse:|MaxInUse|NumAllocs|Largest|Pool|Bin \(")


def _log_to_file() -> str:
    """XLA's log (its allocator's dump on a failed request) into a file, read back at the end."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"  # read when XLA loads: set before JAX is imported
    fd, path = tempfile.mkstemp(suffix=".log")
    os.dup2(fd, 2)
    return path


def _kept_log(path: str) -> list[str]:
    with open(path, errors="replace") as f:
        lines = [line.rstrip()[-220:] for line in f if _KEEP.search(line)]
    return lines[:240]


def _work(model: str) -> Any:
    import unimem

    unimem.configure(backend="jax", growth=True, limit=LIMITS[model])
    if model.startswith("gpt2"):
        import bench_savers

        step, lower = bench_savers.jax_model(bench_savers.GPT2, model.split("-")[1], True)
        step(WARM[model])
        return type("Work", (), {"step": step, "lower": staticmethod(lower)})
    import bench_search_rows

    work = bench_search_rows.jax_model(model, True, 0)
    work.step(WARM[model])
    return work


def _pool() -> dict[str, Any]:
    import jax

    return dict(jax.devices()[0].memory_stats() or {})  # every figure XLA's allocator keeps


def _compile(work: Any, size: int, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    t0 = time.perf_counter()
    lowered = work.lower(size)  # traced once per size: the first lowering of a size costs more
    t1 = time.perf_counter()
    compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
    analysis = compiled.memory_analysis()
    return compiled, {
        "peak": int(analysis.peak_memory_in_bytes),
        "temp": int(analysis.temp_size_in_bytes),
        "argument": int(analysis.argument_size_in_bytes),
        "output": int(analysis.output_size_in_bytes),
        "alias": int(analysis.alias_size_in_bytes),
        "lower_seconds": round(t1 - t0, 2),
        "seconds": round(time.perf_counter() - t1, 2),
        "pool_after": _pool(),
    }


def _probe(work: Any, size: int, how: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    import unimem

    compiled, out = _compile(work, size, None)
    inputs, run = work.parts
    t0 = time.perf_counter()
    try:
        x, y = inputs(size)
        out["pool_after_inputs"] = _pool()  # the step's first buffers: where did they go?
        if how == "reserve":
            room = jnp.empty((out["output"] + out["temp"],), jnp.uint8)
            room.block_until_ready()
            out["pool_after_reserve"] = _pool()
            room.delete()
        if how == "aot":
            state = work.state
            new_params, new_opt, loss = compiled(state["params"], state["opt"], x, y)
            jax.block_until_ready(loss)
        else:
            run(x, y)
        out["fits"] = True
    except Exception as exc:
        if not unimem.is_oom(exc):
            raise
        out["fits"] = False
        out["error"] = str(exc)[:3000]  # XLA names the request that failed
    out.update(run_seconds=round(time.perf_counter() - t0, 2), pool_after_run=_pool())
    return out


def child(spec: dict[str, Any]) -> dict[str, Any]:
    log = _log_to_file()
    out: dict[str, Any] = {}
    try:
        work = _work(spec["model"])
        out["pool_after_warmup"] = _pool()
        if spec["kind"] == "compiles":
            out["off"] = {size: _compile(work, size, OFF)[1] for size in spec["sizes"]}
            out["default"] = {size: _compile(work, size, None)[1] for size in spec["sizes"]}
        else:
            out.update(_probe(work, spec["size"], spec["how"]))
    except Exception:  # the error comes back with what was measured (stderr is the log file)
        out["failure"] = traceback.format_exc()[-3000:]
    out["log"] = _kept_log(log)
    return out


def _bisect(how: str, deadline: float) -> dict[str, Any]:
    low, high, probes = BRACKET[0], BRACKET[1], []
    while high - low > max(256, low // 100) and deadline - time.perf_counter() > 45:
        middle = (low + high) // 2
        spec = {"kind": "run", "model": "jax-mlp", "size": middle, "how": how}
        probe = benchlib.run_child(__file__, spec, 150, cpu_only=False)
        probes.append({"size": middle, **probe})
        if probe.get("fits"):
            low = middle
        elif "fits" in probe:
            high = middle
        else:
            break
    return {"bracket": [low, high], "probes": probes}


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
    result["limits"] = LIMITS

    def compiles(model: str) -> dict[str, Any]:
        spec = {"kind": "compiles", "model": model, "sizes": SIZES[model]}
        return benchlib.run_child(__file__, spec, 300, cpu_only=False)

    # Separate processes side by side (each under its own cap): compile times are indicative.
    with ThreadPoolExecutor(max_workers=len(SIZES)) as pool:
        result["compiles"] = dict(zip(SIZES, pool.map(compiles, SIZES), strict=True))
    benchlib.write(result, args.out)
    with ThreadPoolExecutor(max_workers=len(WAYS)) as pool:
        result["fresh"] = dict(zip(WAYS, pool.map(lambda how: _bisect(how, deadline), WAYS), strict=True))
    benchlib.write(result, args.out)
    print(json.dumps({how: r["bracket"] for how, r in result["fresh"].items()}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
