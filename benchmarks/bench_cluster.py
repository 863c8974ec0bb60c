"""What ``unimem.cluster_stats()`` costs per call, for 2 and 4 ranks on torch's gloo runtime.

    python benchmarks/bench_cluster.py [--rounds 15] [--per-round 20] [--warmup 20] [--out FILE] [--machine LABEL]

Each world size is one job of forked ranks (torch imported once, before the fork, as the tests
do), each rank a gloo process group on 127.0.0.1; both jobs live for the whole run and take turns
round by round (the order alternating), so a drift of the machine's load reaches both alike.
Per call: every rank of the job passes a ``dist.barrier()``, then times one call; the call's
figure is the slowest rank's time (when the job can go on), and rank 0's is kept beside it.
Cases, interleaved within a round: ``cluster_stats()`` (a ``stats()`` snapshot, then the
gather), ``cluster_stats(snapshot=...)`` (the gather alone), and ``stats()`` alone for
reference. ``--warmup`` calls of each case are made before timing; the garbage collector is off
while timing. Figures in ms. The snapshot is whatever ``stats()`` answers in the rank (recorded as
``snapshot_backend``); on a machine without NVML that is host memory only.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import socket
import statistics
import sys
import time
from typing import Any

import benchlib

WORLDS = (2, 4)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cases() -> dict[str, Any]:
    import unimem

    known = unimem.MemoryStats("torch", 0, allocated=1000, peak_allocated=2000)
    return {
        "cluster_stats()": lambda: unimem.cluster_stats(timeout=60),
        "cluster_stats(snapshot=...)": lambda: unimem.cluster_stats(snapshot=known, timeout=60),
        "stats() alone": unimem.stats,
    }


def _rank_main(rank: int, world: int, port: int, conn: Any) -> None:
    """One rank: joins its job's group, then times ``per_round`` calls of each case per request."""
    import torch.distributed as dist

    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),
        }
    )
    dist.init_process_group("gloo")
    cases = _cases()
    while True:
        request = conn.recv()
        if request is None:
            break
        calls, timed = request
        times: dict[str, list[float]] = {name: [] for name in cases}
        gc.disable()
        try:
            for _ in range(calls):
                for name, case in cases.items():
                    dist.barrier()  # every rank arrives together: the call's own cost, not a late rank's
                    start = time.perf_counter()
                    case()
                    times[name].append((time.perf_counter() - start) * 1e3)
        finally:
            gc.enable()
        conn.send(times if timed else None)
    dist.destroy_process_group()
    conn.close()


def _spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=20)  # 5% steps
    return {
        **benchlib.summary(ordered),
        "p10": quartiles[1],
        "p25": quartiles[4],
        "p75": quartiles[14],
        "max": ordered[-1],
    }


def _start_job(context: Any, world: int) -> tuple[list[Any], list[Any]]:
    port = _free_port()
    processes, conns = [], []
    for rank in range(world):
        parent, child = context.Pipe()
        process = context.Process(target=_rank_main, args=(rank, world, port, child))
        process.start()
        processes.append(process)
        conns.append(parent)
    return processes, conns


def _ask(conns: list[Any], calls: int, timed: bool) -> list[dict[str, list[float]] | None]:
    for conn in conns:
        conn.send((calls, timed))
    return [conn.recv() for conn in conns]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--out", default=None, help="JSON file to write (default: stdout)")
    parser.add_argument("--machine", default=None, help="a label for the machine")
    args = parser.parse_args(argv)
    import torch  # noqa: F401  (before the fork: imported once for every rank)

    import unimem

    context = multiprocessing.get_context("fork")
    jobs = {world: _start_job(context, world) for world in WORLDS}
    slowest: dict[int, dict[str, list[float]]] = {world: {} for world in WORLDS}
    rank0: dict[int, dict[str, list[float]]] = {world: {} for world in WORLDS}
    started = time.monotonic()
    try:
        for world in WORLDS:
            _ask(jobs[world][1], args.warmup, timed=False)
        for round_number in range(args.rounds):
            order = WORLDS if round_number % 2 == 0 else WORLDS[::-1]
            for world in order:
                answers = [a for a in _ask(jobs[world][1], args.per_round, timed=True) if a is not None]
                for name in answers[0]:
                    per_call = zip(*(answer[name] for answer in answers), strict=True)
                    slowest[world].setdefault(name, []).extend(max(call) for call in per_call)
                    rank0[world].setdefault(name, []).extend(answers[0][name])
    finally:
        for processes, conns in jobs.values():
            for conn in conns:
                conn.send(None)
            for process in processes:
                process.join(30)
                if process.is_alive():
                    process.kill()
    result = benchlib.header("cluster", args.machine, sys.argv)
    result["config"] = {
        "runtime": "torch gloo, forked ranks on one host",
        "worlds": list(WORLDS),
        "rounds": args.rounds,
        "per_round": args.per_round,
        "warmup": args.warmup,
        "seconds": round(time.monotonic() - started, 1),
        "snapshot_backend": unimem.stats().backend,
    }
    result["ms_per_call_slowest_rank"] = {
        str(world): {name: _spread(values) for name, values in cases.items()} for world, cases in slowest.items()
    }
    result["ms_per_call_rank0"] = {
        str(world): {name: _spread(values) for name, values in cases.items()} for world, cases in rank0.items()
    }
    benchlib.write(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
