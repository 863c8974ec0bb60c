"""Run the GPU suite and write ``evidence/gpu.json`` (run it on the GPU machine).

    python tests/gpu/run_suite.py [--out evidence/gpu.json] [--machine TEXT] [--part N] [-- PYTEST ARGS]
    python tests/gpu/run_suite.py --merge PART1.json PART2.json [--rerun FAILED.json] [--out evidence/gpu.json]

pytest runs in a subprocess with ``UNIMEM_REQUIRE_GPU=1`` (a missing GPU fails rather
than skips); the suite's conftest writes each test's outcome, covers and figures, and
this script adds the machine, driver and versions. The schema, which
``unimem/cli/matrix.py`` reads, is::

    {"machine": str, "gpu": str, "driver": str, "cuda": str | None, "python": str,
     "versions": {"torch", "jax", "jaxlib", "nvidia-ml-py", "unimem"}, "date": "YYYY-MM-DD",
     "command": str,
     "tests": [{"nodeid", "outcome": "passed" | "failed" | "skipped", "covers": [str],
                "figures": {str: number | str}, "message": str, "seconds": number}]}

The whole suite takes longer than one call on the GPU machine may run, so ``--part 1`` and
``--part 2`` each run half of its files, and ``--merge`` joins the halves into one evidence
file, refusing halves from different machines, versions or days (one run's evidence, not a
collage). ``--rerun`` puts a later run of tests that failed in their place, each entry marked
``"rerun": true``. Each test's entry also holds its ``seconds``, which is how the halves were drawn.

Without a GPU it runs nothing and exits 0 with a note, unless ``--allow-no-gpu`` (then
every test is reported skipped; the evidence file is written only when ``--out`` names it).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_OUT = ROOT / "evidence" / "gpu.json"
# Halves of about equal time (one call on the GPU machine runs at most ten minutes).
PARTS: dict[int, tuple[str, ...]] = {
    1: ("test_context.py", "test_cupy.py", "test_diagnosis.py", "test_jax.py"),
    2: ("test_mixed.py", "test_nvml_devices.py", "test_savers.py", "test_torch.py"),
}
# What must agree for two halves to be one run's evidence.
SAME_RUN = ("machine", "gpu", "driver", "cuda", "python", "versions", "date")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _versions() -> dict[str, str | None]:
    """Every distribution a backend may come from (the matrix reads which were installed), and unimem's."""
    from unimem import registry

    names = [d for name in registry.BACKENDS for d in registry.adapter_class(name).distributions]
    return {name: _version(name) for name in [*dict.fromkeys(names), "jaxlib", "unimem"]}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_and_driver() -> tuple[str | None, str | None]:
    """GPU name(s) and driver from NVML, else nvidia-smi; (None, None) without a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        names = [
            _text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
        if names:
            gpu = names[0] if len(set(names)) == 1 and len(names) == 1 else f"{len(names)}x {names[0]}"
            return gpu, _text(pynvml.nvmlSystemGetDriverVersion())
    except Exception:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        rows = [line.split(",") for line in out.stdout.strip().splitlines() if "," in line]
        if out.returncode == 0 and rows:
            return rows[0][0].strip(), rows[0][1].strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return None, None


def cuda_version() -> str | None:
    """The CUDA that torch was built with, asked in a subprocess (this one imports no framework);
    else the driver's CUDA version from NVML."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.version.cuda or '')"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        text = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
        if out.returncode == 0 and text:
            return text
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        version = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())
        return f"{version // 1000}.{version % 1000 // 10}"
    except Exception:
        return None


def part_files(part: int) -> list[Path]:
    """The test files of one half; every test file of the suite is in exactly one half."""
    if part not in PARTS:
        raise SystemExit(f"run_suite: --part must be one of {sorted(PARTS)}, not {part}")
    return [HERE / name for name in PARTS[part]]


def merge(paths: list[Path]) -> dict[str, Any]:
    """One evidence file from the halves; refuses halves of different runs or tests run twice."""
    runs = [json.loads(path.read_text()) for path in paths]
    first = runs[0]
    for path, run in zip(paths[1:], runs[1:], strict=True):
        differ = [key for key in SAME_RUN if run.get(key) != first.get(key)]
        if differ:
            raise SystemExit(f"run_suite: {path} is not of the same run as {paths[0]}: {', '.join(differ)} differ")
    tests = [test for run in runs for test in run["tests"]]
    ids = [test["nodeid"] for test in tests]
    twice = sorted({nodeid for nodeid in ids if ids.count(nodeid) > 1})
    if twice:
        raise SystemExit(f"run_suite: tests in more than one half: {', '.join(twice)}")
    merged = {key: first.get(key) for key in SAME_RUN}
    merged["command"] = " && ".join(run["command"] for run in runs)
    merged["tests"] = tests
    return merged


def rerun(merged: dict[str, Any], again: dict[str, Any]) -> None:
    """Replace tests that failed in ``merged`` by a later run of them (same machine, versions and day):
    each replaced entry says so (``rerun``) and the command names both runs. A test that passed is
    never replaced, and a test that was not in the halves is refused."""
    differ = [key for key in SAME_RUN if again.get(key) != merged.get(key)]
    if differ:
        raise SystemExit(f"run_suite: the rerun is not of the same machine and day: {', '.join(differ)} differ")
    tests = {test["nodeid"]: i for i, test in enumerate(merged["tests"])}
    for test in again["tests"]:
        at = tests.get(test["nodeid"])
        if at is None:
            raise SystemExit(f"run_suite: {test['nodeid']} was rerun but is in neither half")
        if merged["tests"][at]["outcome"] != "failed":
            raise SystemExit(f"run_suite: {test['nodeid']} did not fail: a rerun replaces failed tests only")
        merged["tests"][at] = {**test, "rerun": True}
    merged["command"] += " && (rerun) " + again["command"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help=f"evidence file (default {DEFAULT_OUT})")
    parser.add_argument("--machine", default="nvidia-h200 (device tool)", help="how the machine is named")
    parser.add_argument("--allow-no-gpu", action="store_true", help="run (and skip) without a GPU")
    parser.add_argument("--part", type=int, default=None, help=f"run one half of the suite: {sorted(PARTS)}")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, help="join halves' evidence files")
    parser.add_argument(
        "--rerun", type=Path, default=None, help="with --merge: a later run of failed tests, which replaces them"
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --")
    args = parser.parse_args(argv)

    if args.merge:
        out_path: Path = args.out or DEFAULT_OUT
        merged = merge(args.merge)
        if args.rerun is not None:
            rerun(merged, json.loads(args.rerun.read_text()))
        out_path.write_text(json.dumps(merged, indent=2) + "\n")
        outcomes = [test["outcome"] for test in merged["tests"]]
        print(f"run_suite: wrote {out_path}: {outcomes.count('passed')} of {len(outcomes)} passed")
        return 0 if outcomes and all(outcome == "passed" for outcome in outcomes) else 1

    gpu, driver = gpu_and_driver()
    if gpu is None and not args.allow_no_gpu:
        print("run_suite: no NVIDIA GPU here (NVML and nvidia-smi found none); nothing run, nothing written")
        return 0
    out: Path = args.out or (DEFAULT_OUT if gpu is not None else None)  # type: ignore[assignment]

    with tempfile.TemporaryDirectory() as tmp:
        tests_file = Path(tmp) / "tests.json"
        command = [
            sys.executable,
            "-m",
            "pytest",
            *(str(path) for path in (part_files(args.part) if args.part else [HERE])),
            # the CPU suite's tests/conftest.py (framework checks, state restore) is not ours
            f"--confcutdir={HERE}",
            "-p",
            "no:cacheprovider",
            "-v",
            "-rA",
            f"--evidence-tests={tests_file}",
            *args.pytest_args,
        ]
        env = dict(os.environ)
        if gpu is not None:
            env["UNIMEM_REQUIRE_GPU"] = "1"
        print("run_suite:", shlex.join(command), flush=True)
        code = subprocess.run(command, cwd=tmp, env=env).returncode
        tests = json.loads(tests_file.read_text())["tests"] if tests_file.is_file() else []

    evidence = {
        "machine": args.machine if gpu is not None else f"{platform.node()} (no GPU)",
        "gpu": gpu or "none",
        "driver": driver or "none",
        "cuda": cuda_version() if gpu is not None else None,
        "python": platform.python_version(),
        "versions": _versions(),
        "date": datetime.date.today().isoformat(),
        "command": shlex.join(["python", *sys.argv]) if argv is None else shlex.join(["run_suite.py", *argv]),
        "tests": tests,
    }
    counts = {o: sum(1 for t in tests if t["outcome"] == o) for o in ("passed", "failed", "skipped")}
    print(f"run_suite: pytest exit {code}; {counts}")
    if out is None:
        print("run_suite: no GPU and no --out: evidence not written")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(evidence, indent=2) + "\n")
        print(f"run_suite: wrote {out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
