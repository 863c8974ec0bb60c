"""Fault injection, a hundred times each: kills during a streamed recording and during saves,
forks while marking, the sampler after its parent's kill -9, hostile and damaged files.

    python benchmarks/bench_faults.py [--tries 100] [--workers 3] [--out FILE] [--machine LABEL]

The trials are tests/observe/fault_trials.py's (the tests run a few of each). Kills during a
recording: kill -9, SIGTERM and SIGINT, to the training process alone and to its whole process
group, at a moment drawn uniformly from 0.05-1.2 s after the monitor started; a file's staleness
is the kill time minus its last sample's time, bound to 1 s + the interval. Kills during saves:
kill -9 0-0.6 s into a loop saving one 20,000-sample recording to one file, at that moment or at
the first moment after it when a save is writing its temporary file; the file left must be the
whole previous save, byte for byte. ``--workers`` trials run at once (they mostly wait).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import benchlib

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "observe"))
import fault_trials  # noqa: E402  (the trials the tests run, from their folder)

SIGNALS = {"kill -9": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}


def _env() -> dict[str, str]:
    """The environment of every trial's process: none of the settings unimem or a framework reads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PYTORCH_", "UNIMEM_", "TF_", "JAX_"))}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _many(
    tries: int, workers: int, trial: Callable[[random.Random], dict[str, Any]], seed: str
) -> list[dict[str, Any]]:
    rngs = [random.Random(f"{seed} {n}") for n in range(tries)]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(trial, rngs))


def recordings(folder: Path, tries: int, workers: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    bound = 1.0 + fault_trials.INTERVAL
    for name, sig in SIGNALS.items():
        for target in ("process", "group"):

            def trial(rng: random.Random, sig: int = sig, group: bool = target == "group") -> dict[str, Any]:
                return fault_trials.kill_during_recording(folder, sig, group, rng.uniform(0.05, 1.2), _env())

            seen = _many(tries, workers, trial, f"{name} {target}")
            loads = Counter(s.get("load", "no file") for s in seen)
            stale = [s["staleness"] for s in seen if s.get("staleness") is not None]
            ended = [s["sampler_ended_after"] for s in seen if s["sampler_ended_after"] is not None]
            out[f"{name} / {target}"] = {
                "tries": tries,
                "files_left": sum(s["file_left"] for s in seen),
                "loads_ok": loads["ok"] + loads["cut"],
                "loads_whole": loads["ok"],
                "loads_cut_with_warning": loads["cut"],
                "refused": loads["refused"],
                "raw_tracebacks": loads["raw"],
                "max_staleness_s": round(max(stale), 3) if stale else None,
                "staleness_over_bound": sum(value > bound for value in stale),
                "files_without_samples": sum(1 for s in seen if s.get("samples") == 0),
                "sampler_max_end_s": round(max(ended), 3) if ended else None,
                "sampler_not_ended_in_10_s": sum(1 for s in seen if s["sampler_ended_after"] is None),
            }
            print(f"recording, {name} to the {target}: {out[f'{name} / {target}']}", file=sys.stderr)
    return out


def saves(folder: Path, tries: int, workers: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for suffix in (".json", ".csv"):
        for in_write in (False, True):

            def trial(rng: random.Random, suffix: str = suffix, in_write: bool = in_write) -> dict[str, Any]:
                delay = rng.uniform(0.0, 0.6)
                return fault_trials.kill_during_save(folder, suffix, delay, _env(), in_write=in_write)

            seen = _many(tries, workers, trial, f"{suffix} {in_write}")
            name = f"{suffix} / {'while writing the new file' if in_write else 'at a random moment'}"
            out[name] = {
                "tries": tries,
                "previous_file_intact": sum(s["intact"] for s in seen),
                "loads_ok": sum(s["load"] == "ok" for s in seen),
                "killed_mid_save": sum(s["mid_save"] for s in seen),
            }
            print(f"saves, {name}: {out[name]}", file=sys.stderr)
    return out


def samplers(folder: Path, tries: int, workers: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("os", "libc"):

        def trial(rng: random.Random, kind: str = kind) -> dict[str, Any]:
            return fault_trials.sampler_after_parent_kill(folder, kind, _env())

        seen = _many(tries, workers, trial, kind)
        ended = [s["sampler_ended_after"] for s in seen if s["sampler_ended_after"] is not None]
        out[f"{kind} fork"] = {
            "tries": tries,
            "child_alive": sum(s["child_alive"] for s in seen),
            "sampler_ended_within_2_s": sum(value < 2.0 for value in ended),
            "sampler_max_end_s": round(max(ended), 3) if ended else None,
            "files_whole": sum(s["load"] == "ok" for s in seen),
        }
        print(f"sampler, {kind} fork: {out[f'{kind} fork']}", file=sys.stderr)
    return out


def files(folder: Path, tries: int) -> dict[str, Any]:
    hostile = fault_trials.hostile_paths(folder)
    seen = {name: (fault_trials.outcome(path)[0], due) for name, (path, due) in hostile.items()}
    damaged = fault_trials.mutated_outcomes(folder, tries, seed=2026)
    per_format = {
        suffix: dict(Counter(got for s, got, _ in damaged if s == suffix)) for suffix in (".json", ".csv", ".jsonl")
    }
    return {
        "hostile": {
            "files": len(seen),
            "as_due": sum(got == due for got, due in seen.values()),
            "refused": sum(got == "refused" for got, _ in seen.values()),
            "cut_with_warning": sum(got == "cut" for got, _ in seen.values()),
            "raw_tracebacks": sum(got == "raw" for got, _ in seen.values()),
        },
        "damaged_copies": {"tries_per_format": tries, "outcomes": per_format},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=100)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--out", default=None, help="JSON file to write (default: stdout)")
    parser.add_argument("--machine", default=None, help="a label for the machine")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = benchlib.header("faults", args.machine, sys.argv)
    result["tries"] = args.tries
    result["workers"] = args.workers
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "files").mkdir()
        result["hostile_files"] = files(folder / "files", args.tries)
        result["kill_during_recording"] = recordings(folder, args.tries, args.workers)
        result["kill_during_save"] = saves(folder, args.tries, args.workers)
        result["fork_while_marking"] = fault_trials.fork_while_marking(args.tries, env=_env())
        result["sampler_after_parent_kill"] = samplers(folder, args.tries, args.workers)
    result["wall_s"] = round(time.monotonic() - started, 1)
    benchlib.write(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
