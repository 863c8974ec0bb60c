"""How many trials ``unimem.find_batch_size`` takes over many memory shapes, without a GPU.

Each case is a step whose peak above the bytes held before the search is the larger of two
lines, ``floor + floor_per_sample × n`` (gradients and an optimizer step's temporaries, with
the batch's inputs beside them) and ``fixed + per_sample × n`` (the activations): the convex
shape torch's training steps show on a GPU (docs/measurements.md). It fails past a cap set so that a random
``true_max`` is the largest that fits; the search gets the peaks through ``measure=`` and the
held bytes as ``baseline=``, as it gets them from ``stats()`` on a GPU. Recorded: the histogram
of trial counts, the share of cases within 6 and 8 trials, the failed calls and the answer's share
of the largest that fits (on average), and any case outside the margin. ``--max-size F`` passes
each case ``max_size`` at F times its largest size (at least ``start``), as a trainer passes its
data set's size: F < 1 bounds the answer, F > 1 lies above it.

    python benchmarks/bench_search_shapes.py --cases 3000 --seed 0 --out benchmarks/results
    python benchmarks/bench_search_shapes.py --cases 3000 --seed 0 --max-size 16 --out /tmp/shapes.json
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchlib  # noqa: E402


class ConvexStep:
    """``step(n)``: raises ``MemoryError`` past the cap; ``measure()``: the last peak."""

    def __init__(self, held: int, floor: int, floor_per_sample: int, fixed: int, per_sample: int, cap: int) -> None:
        self.held, self.floor, self.floor_per_sample = held, floor, floor_per_sample
        self.fixed, self.per_sample, self.cap = fixed, per_sample, cap
        self.peak: int | None = None

    def need(self, n: int) -> int:
        return self.held + max(self.floor + self.floor_per_sample * n, self.fixed + self.per_sample * n)

    def __call__(self, n: int) -> None:
        if self.need(n) > self.cap:
            raise MemoryError(f"need {self.need(n)}")
        self.peak = self.need(n)

    def measure(self) -> int | None:
        peak, self.peak = self.peak, None
        return peak

    def largest(self) -> int:
        low, high = 0, 1
        while self.need(high) <= self.cap:
            low, high = high, high * 2
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self.need(middle) <= self.cap else (low, middle)
        return low


def run(cases: int, seed: int, max_size: float | None = None) -> dict[str, Any]:
    import unimem

    rng = random.Random(seed)
    counts: collections.Counter[int] = collections.Counter()
    calls: collections.Counter[int] = collections.Counter()  # every call of the step, re-runs included
    failed, shares = 0, 0.0
    outside: list[dict[str, Any]] = []
    worst: dict[str, Any] | None = None
    done = 0
    while done < cases:
        per_sample = rng.randint(1 << 12, 1 << 24)
        held = rng.randint(1 << 28, 1 << 34)
        fixed = rng.randint(0, 1 << 30)
        floor = rng.choice([0, rng.randint(0, 1 << 32)])
        floor_per_sample = rng.choice([0, per_sample // rng.randint(3, 50)])
        true_max = rng.randint(64, 100_000)
        start = rng.choice([1, 8, 32, 128])
        cap = held + max(floor + floor_per_sample * true_max, fixed + per_sample * true_max)
        step = ConvexStep(held, floor, floor_per_sample, fixed, per_sample, cap)
        if step.need(start) > cap:
            continue
        largest = step.largest()
        bound = None if max_size is None else max(start, int(max_size * largest))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", unimem.UnimemWarning)
            search = unimem.find_batch_size(
                step,
                start=start,
                backend="nvml",  # a simulated step of no framework: its own figures
                measure=step.measure,
                limit=cap,
                baseline=held,
                max_trials=64,
                max_size=bound,
                return_trials=True,
            )
        largest = largest if bound is None else min(largest, bound)
        done += 1
        trials = len(search.trials)
        counts[trials] += 1
        calls[search.step_calls] += 1
        failed += search.failed_calls
        shares += search.batch_size / largest
        case = {
            "start": start,
            "largest": largest,
            "found": search.batch_size,
            "trials": [[t.batch_size, t.fits, t.reason] for t in search.trials],
        }
        if not 0.95 * largest <= search.batch_size <= largest:
            outside.append(case)
        if worst is None or trials > len(worst["trials"]):
            worst = case
    return {
        "cases": cases,
        "seed": seed,
        "max_size": max_size,
        "histogram": {str(k): counts[k] for k in sorted(counts)},
        "within_6_trials": sum(v for k, v in counts.items() if k <= 6) / cases,
        "within_8_trials": sum(v for k, v in counts.items() if k <= 8) / cases,
        "most_trials": max(counts),
        "calls_histogram": {str(k): calls[k] for k in sorted(calls)},
        "within_6_calls": sum(v for k, v in calls.items() if k <= 6) / cases,
        "most_calls": max(calls),
        "failed_per_search": failed / cases,
        "mean_share": shares / cases,
        "outside_the_margin": outside,
        "worst_case": worst,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(HERE / "results"), help="folder (or .json file) for the results")
    parser.add_argument("--machine", default=None)
    parser.add_argument("--max-size", type=float, default=None, help="max_size= as a multiple of each case's largest")
    args = parser.parse_args(argv)
    result = benchlib.header("search_shapes", args.machine, sys.argv)
    result["results"] = run(args.cases, args.seed, args.max_size)
    out = Path(args.out)
    benchlib.write(result, str(out if out.suffix == ".json" else out / "search_shapes-cpu.json"))
    summary = result["results"]
    print(
        f"{args.cases} cases: <= 6 trials {summary['within_6_trials']:.1%}, <= 8 trials "
        f"{summary['within_8_trials']:.1%}, most {summary['most_trials']}; every call counted: <= 6 "
        f"{summary['within_6_calls']:.1%}, most {summary['most_calls']}; failed calls a search "
        f"{summary['failed_per_search']:.3f}, mean share {summary['mean_share']:.4f}; outside the margin "
        f"{len(summary['outside_the_margin'])}; histogram {summary['histogram']}",
        file=sys.stderr,
    )
    return 1 if summary["outside_the_margin"] else 0


if __name__ == "__main__":
    sys.exit(main())
