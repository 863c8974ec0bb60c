"""``find_batch_size`` on a CuPy workload, against the largest size a fresh process runs.

    python benchmarks/bench_cupy_search.py [--limit 4GiB] [--start 256] [--out FILE] [--machine LABEL]

The workload is a two-layer MLP's forward and backward pass written in CuPy (1024 -> 4096
-> 1024, float32): its peak grows linearly with the batch. Each process caps CuPy's pool
with ``unimem.configure(backend="cupy", limit=...)``.

- the search: one fresh process runs ``find_batch_size(step, start=..., backend="cupy")``
  and reports the answer, every call of the step, the failures and the seconds;
- the reference: the largest size that runs in a fresh process, by bisection over fresh
  processes between the answer and twice it (each probe one process, one call).

Needs a GPU with CuPy; the JSON says so and stops otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import benchlib

WIDTH, HIDDEN = 1024, 4096


def _step(cp: Any) -> Any:
    rng = cp.random.default_rng(0)
    w1 = rng.standard_normal((WIDTH, HIDDEN), dtype=cp.float32) * 0.01
    w2 = rng.standard_normal((HIDDEN, WIDTH), dtype=cp.float32) * 0.01
    calls: list[int] = []

    def step(n: int) -> None:
        calls.append(n)
        x = cp.ones((n, WIDTH), dtype=cp.float32)
        h = cp.maximum(x @ w1, 0)
        y = h @ w2
        dy = 2 * (y - x) / n
        dw2 = h.T @ dy
        dh = (dy @ w2.T) * (h > 0)
        dw1 = x.T @ dh
        w1[...] -= 1e-4 * dw1
        w2[...] -= 1e-4 * dw2
        cp.cuda.Device().synchronize()

    step.calls = calls  # type: ignore[attr-defined]
    return step


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import unimem

    unimem.configure(backend="cupy", limit=spec["limit"])
    import cupy as cp

    step = _step(cp)
    if spec["mode"] == "probe":
        try:
            step(spec["size"])
            return {"fits": True}
        except Exception as exc:
            if not unimem.is_oom(exc):
                raise
            return {"fits": False}
    t0 = time.perf_counter()
    found = unimem.find_batch_size(step, start=spec["start"], backend="cupy", return_trials=True)
    seconds = time.perf_counter() - t0
    trials = [{"size": t.batch_size, "fits": t.fits, "peak": t.peak, "reason": t.reason} for t in found.trials]
    return {
        "found": int(found),
        "step_calls": len(step.calls),
        "reported_step_calls": found.step_calls,
        "failed_calls": found.failed_calls,
        "trials": trials,
        "seconds": seconds,
        "notes": list(found.notes),
    }


def _probe(limit: str, size: int) -> bool:
    out = benchlib.run_child(__file__, {"mode": "probe", "limit": limit, "size": size}, 120, cpu_only=False)
    if "fits" not in out:
        raise RuntimeError(f"probe at {size} failed: {out}")
    return bool(out["fits"])


def reference(limit: str, found: int) -> dict[str, Any]:
    """The largest size a fresh process runs, bisected between ``found`` and twice it."""
    low, high, probes = found, 2 * found, 0
    if not _probe(limit, low):
        low, high = 1, found
    probes += 1
    while _probe(limit, high):
        low, high, probes = high, 2 * high, probes + 1
    while high - low > max(1, low // 500):  # 0.2% of the size
        middle = (low + high) // 2
        probes += 1
        if _probe(limit, middle):
            low = middle
        else:
            high = middle
    return {"true_max": low, "first_failure": high, "probes": probes}


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(benchlib.RESULT_MARK + json.dumps(child(json.loads(sys.argv[2]))), flush=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", default="4GiB")
    parser.add_argument("--start", type=int, default=256)
    parser.add_argument("--out", default=None)
    parser.add_argument("--machine", default=None)
    args = parser.parse_args()
    result = benchlib.header("cupy_search", args.machine, sys.argv)
    search = benchlib.run_child(
        __file__, {"mode": "search", "limit": args.limit, "start": args.start}, 300, cpu_only=False
    )
    result.update(
        limit=args.limit, workload=f"MLP {WIDTH}-{HIDDEN}-{WIDTH} float32, forward and backward", search=search
    )
    if "found" in search:
        ref = reference(args.limit, search["found"])
        result["reference"] = ref
        result["found_share"] = search["found"] / ref["true_max"]
        print(
            f"cupy: found {search['found']} in {search['step_calls']} calls ({search['failed_calls']} failed), "
            f"{search['seconds']:.1f} s; largest in a fresh process {ref['true_max']} "
            f"({result['found_share']:.1%}); target >= 95%",
            file=sys.stderr,
        )
    benchlib.write(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
