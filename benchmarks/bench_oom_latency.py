"""How long one out-of-memory error takes to reach Python, per framework.

Every failing trial of a batch-size search pays this. In JAX it is long: XLA's BFC
allocator, asked for memory it cannot give with ``retry_on_failure`` set (as XLA's GPU
executables ask for their buffers), waits up to 10 s for other work to free some before it
gives up (``kMaxMillisToWait`` in tsl/framework/bfc_allocator.cc). This measures it
directly: in a fresh process per framework, capped with ``unimem.configure(fraction=...)``,
the time from the call to the exception for

- ``too_large``: one allocation of twice the cap (no wait can help);
- ``over_free``: one allocation that fits the cap but not beside what is already held;
- ``fits``: the same allocation with the pool empty (what a passing call costs),

each ``--repeats`` times. Without a GPU, torch and TensorFlow allocate on the CPU (an
allocation far beyond the machine's memory fails at once) and the figures are recorded as
CPU figures only.

    python benchmarks/bench_oom_latency.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchlib  # noqa: E402

FRAMEWORKS = ("torch", "jax", "tensorflow")


def _allocator(framework: str, gpu: bool) -> Any:
    """alloc(nbytes) -> an object holding nbytes of the framework's memory, materialised."""
    if framework == "torch":
        import torch

        device = "cuda" if gpu else "cpu"

        def alloc(nbytes: int) -> Any:
            x = torch.empty(nbytes, dtype=torch.uint8, device=device)
            if gpu:
                torch.cuda.synchronize()
            return x

        return alloc
    if framework == "jax":
        import jax.numpy as jnp

        def alloc(nbytes: int) -> Any:
            return jnp.zeros(nbytes, dtype=jnp.uint8).block_until_ready()

        return alloc
    import tensorflow as tf

    def alloc(nbytes: int) -> Any:
        x = tf.zeros([nbytes], dtype=tf.uint8)
        _ = x.numpy()[:1] if not gpu else x.shape  # eager ops run at once; this waits for it
        return x

    return alloc


def child(framework: str, fraction: float, repeats: int, gpu: bool) -> dict[str, Any]:
    import unimem

    if gpu:
        unimem.configure(backend=framework, fraction=fraction)
    alloc = _allocator(framework, gpu)
    alloc(1 << 20)  # warm-up: context, handles, kernels (the cap is known from here on)
    if gpu:
        figures = unimem.stats(framework)
        cap = int(figures.limit or fraction * (figures.device_total or 0))
        if cap <= 0:
            raise SystemExit(f"{framework}: no cap known after configure(fraction={fraction})")
    else:
        cap = 1 << 50  # 1 PiB: far beyond any machine's memory

    def timed(nbytes: int) -> tuple[float, bool]:
        started = time.perf_counter()
        try:
            held = alloc(nbytes)
        except Exception as exc:
            if not unimem.is_oom(exc):
                raise
            return time.perf_counter() - started, False
        del held
        return time.perf_counter() - started, True

    runs: dict[str, list[list[Any]]] = {"too_large": [], "over_free": [], "fits": []}
    for _ in range(repeats):
        runs["too_large"].append(list(timed(2 * cap)))
        if gpu:
            runs["fits"].append(list(timed(int(cap * 0.6))))
            held = alloc(int(cap * 0.6))
            runs["over_free"].append(list(timed(int(cap * 0.6))))
            del held
        unimem.clear_cache(framework)
    return {"cap": cap, "runs": runs}


def _run(framework: str, args: argparse.Namespace, gpu: bool) -> dict[str, Any]:
    spec = {"framework": framework, "fraction": args.fraction, "repeats": args.repeats, "gpu": gpu}
    result = benchlib.run_child(str(Path(__file__).resolve()), spec, args.timeout, cpu_only=not gpu)
    result.pop("stdout", None)
    for name, pairs in result.get("runs", {}).items():
        if pairs:
            result[name] = {**benchlib.summary([s for s, _ in pairs]), "failed": [not ok for _, ok in pairs]}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "results"), help="folder (or .json file) for the results")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--fraction", type=float, default=0.02, help="the GPU cap (share of the device)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per framework's process")
    parser.add_argument("--machine", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        spec = json.loads(args.child)
        result = child(spec["framework"], spec["fraction"], spec["repeats"], spec["gpu"])
        print(benchlib.RESULT_MARK + json.dumps(result), flush=True)
        return 0
    gpu = benchlib.gpu_description() is not None
    result = benchlib.header("oom_latency", args.machine, sys.argv)
    result["mode"] = "gpu" if gpu else "cpu"
    frameworks: dict[str, Any] = {}
    for framework in [f.strip() for f in args.frameworks.split(",") if f.strip()]:
        if importlib.util.find_spec(framework) is None:
            frameworks[framework] = {"skipped": f"{framework} is not installed"}
            continue
        frameworks[framework] = _run(framework, args, gpu)
        row = frameworks[framework]
        shown = {k: round(row[k]["median"], 3) for k in ("too_large", "over_free", "fits") if k in row}
        print(f"{framework:<11} median seconds {shown or row.get('error')}", file=sys.stderr)
    result["frameworks"] = frameworks
    out = Path(args.out)
    benchlib.write(result, str(out if out.suffix == ".json" else out / f"oom_latency-{result['mode']}.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
