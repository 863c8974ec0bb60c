"""benchmarks/bench_estimate.py's search rows: the truth bracketed around the search's answer, the row's
share and verdict, the file's rows of other kinds kept, and the CPU smoke of the whole path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from benchmark_modules import BENCHMARKS, load
from conftest import need_framework, subprocess_env


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load("bench_estimate")


class Probes:
    """A fresh process's outcome per size: sizes up to ``largest`` run."""

    def __init__(self, largest: int) -> None:
        self.largest = largest
        self.asked: list[int] = []

    def __call__(self, n: int) -> dict[str, Any]:
        self.asked.append(n)
        return {"runs": n <= self.largest}


@pytest.mark.parametrize(
    ("answer", "largest", "asked", "true_max"),
    [
        (15, 15, [15, 16], 15),  # the answer is the largest: it and the size above it
        (13, 15, [13, 14, 15, 16], 15),  # below it: up until one does not run
        (16, 14, [16, 15, 14], 14),  # above it: down until one runs, the size above it known already
    ],
)
def test_the_truth_is_the_largest_size_that_runs_beside_one_that_does_not(
    bench: ModuleType, answer: int, largest: int, asked: list[int], true_max: int
) -> None:
    probes = Probes(largest)
    truth = bench.bracket(probes, answer)
    assert truth["true_max"] == true_max
    assert probes.asked == asked
    assert [p["batch"] for p in truth["probes"]] == sorted(asked)


def test_probes_that_run_out_leave_no_truth(bench: ModuleType) -> None:
    probes = Probes(100)
    truth = bench.bracket(probes, 10, most=4)
    assert truth["true_max"] is None and probes.asked == [10, 11, 12, 13]
    assert bench.bracket(Probes(0), 3)["true_max"] is None  # nothing runs down to 1


def _found(found: int, calls: int = 2, failed: int = 0) -> dict[str, Any]:
    return {"found": found, "step_calls": calls, "failed_calls": failed}


def test_a_row_meets_the_target_only_with_two_calls_no_failure_and_97_percent(bench: ModuleType) -> None:
    spec = bench.MODELS["gpt2-bf16"]
    row = bench.search_row("gpt2-bf16", spec, _found(15), {"probes": [], "true_max": 15}, "24GiB")
    assert row["kind"] == "search" and row["share"] == 1.0 and row["meets"] is True
    assert row["precision"] == "bf16" and row["cap"] == "24GiB"
    assert bench.search_row("m", spec, _found(14), {"true_max": 15}, "24GiB")["meets"] is False  # 93%
    assert bench.search_row("m", spec, _found(15, calls=3), {"true_max": 15}, "24GiB")["meets"] is False
    assert bench.search_row("m", spec, _found(15, failed=1), {"true_max": 15}, "24GiB")["meets"] is False
    unknown = bench.search_row("m", spec, _found(15), {"true_max": None}, "24GiB")
    assert unknown["share"] is None and unknown["meets"] is False


def test_a_run_of_some_kinds_keeps_the_file_s_rows_of_the_others(bench: ModuleType) -> None:
    before = {
        "command": "python benchmarks/bench_estimate.py", "date": "earlier",
        "rows": [{"kind": "estimate", "model": "gpt2-bf16"}, {"kind": "search", "model": "gpt2-bf16", "found": 1}],
        "largest": {"gpt2-bf16": {"largest": 15}}, "skipped": [{"model": "flax-mlp", "why": "..."}],
    }  # fmt: skip
    result: dict[str, Any] = {"command": "now", "rows": [{"kind": "search", "found": 15}], "largest": {}, "skipped": []}
    bench.keep_other_kinds(result, before, ["search"])
    assert result["rows"] == [{"kind": "estimate", "model": "gpt2-bf16"}, {"kind": "search", "found": 15}]
    assert result["largest"] == before["largest"] and result["skipped"] == before["skipped"]
    assert [s["rows"] for s in result["sources"]] == ["the rows kept from before", "kinds search"]
    fresh: dict[str, Any] = {"rows": [], "largest": {}, "skipped": []}
    bench.keep_other_kinds(fresh, None, ["search"])
    assert fresh == {"rows": [], "largest": {}, "skipped": []}


def test_an_unknown_kind_is_refused_before_anything_runs(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_estimate.py"), "--kinds", "serach", "--out", str(out)],
        capture_output=True, text=True, env=subprocess_env(), timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "--kinds: serach unknown" in done.stderr and not out.exists()


@pytest.mark.slow
def test_the_cpu_smoke_sizes_the_search_from_the_estimate_in_two_calls(tmp_path: Path) -> None:
    need_framework("torch")
    out = tmp_path / "smoke.json"
    command = [sys.executable, str(BENCHMARKS / "bench_estimate.py"), "--smoke", "--kinds", "search"]
    done = subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, env=subprocess_env(), timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["skipped"] == [], result["skipped"]
    (row,) = result["rows"]
    assert row["kind"] == "search" and row["model"] == "tiny-torch-mlp", row
    # The tracker counts what the estimate predicts, in exact bytes: right predictions, two calls.
    assert row["found"] == row["estimate_largest"] == row["true_max"], row
    assert [t["reason"] for t in row["trials"]] == ["predicted", "steady"], row["trials"]
    assert row["step_calls"] == 2 and row["failed_calls"] == 0 and row["share"] == 1.0 and row["meets"], row
    assert [p["batch"] for p in row["probes"]] == [row["found"], row["found"] + 1], row["probes"]
