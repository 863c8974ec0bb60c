"""What reading host memory costs: ``host_rss`` in ``stats()`` and a ``track()`` block's host peak.

    python benchmarks/bench_host_memory.py [--rounds 30] [--per-round 200] [--out FILE] [--machine LABEL]

In one process, each case after a warm-up, the cases interleaved round by round, the garbage
collector off while timing (as ``timeit`` does); each figure is the median over rounds of the
mean call time in a round, in µs. ``stats('jax')`` reads ``host_rss`` (JAX is not imported, so
its adapter answers without a device); the adapter's own ``stats()`` is timed beside it, as what
the call read before ``host_rss`` existed. ``nvml=False`` reads no host figure. A ``track()``
block reads the host high-water mark at both ends and restarts it when it opens (Linux).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable

import benchlib


def build_cases() -> dict[str, Callable[[], object]]:
    import unimem
    from unimem import host_memory, registry

    def block() -> None:
        with unimem.track():
            pass

    return {
        "host_memory.rss()": host_memory.rss,
        "host_memory.peak()": host_memory.peak,
        "jax adapter stats(0) (no host figure)": lambda: registry.get_backend("jax").stats(0),
        "unimem.stats('jax') (with host_rss)": lambda: unimem.stats("jax"),
        "unimem.stats('jax', nvml=False)": lambda: unimem.stats("jax", nvml=False),
        "unimem.stats() (framework-free view)": unimem.stats,
        "with unimem.track(): pass": block,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--per-round", type=int, default=200)
    parser.add_argument("--out", default=None, help="JSON file to write (default: stdout)")
    parser.add_argument("--machine", default=None, help="a label for the machine")
    args = parser.parse_args(argv)
    cases = build_cases()
    for case in cases.values():
        for _ in range(args.per_round):
            case()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    gc.disable()
    try:
        for _ in range(args.rounds):
            for name, case in cases.items():
                start = time.perf_counter()
                for _ in range(args.per_round):
                    case()
                samples[name].append((time.perf_counter() - start) / args.per_round * 1e6)
    finally:
        gc.enable()
    result = benchlib.header("host_memory", args.machine, sys.argv)
    result["us_per_call"] = {name: benchlib.summary(values) for name, values in samples.items()}
    benchlib.write(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
