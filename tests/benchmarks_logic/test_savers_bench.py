"""benchmarks/bench_savers.py: every JAX mode's search given its time, and a row for each, saying
why there is no answer where there is none."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from benchmark_modules import load

# The progress lines of a JAX GPT-2 search (matmuls, whole H200) stopped at 100 s: 20-31 s a compilation.
STOPPED = (
    "find_batch_size  compiled          8  predicted 13.02 GiB       0.67 s  largest buffer 10.24 GiB of 80.85 GiB\n"
    "find_batch_size  call 1/20          8  fits  peak 13.30 GiB      0.08 s  (start)\n"
    "find_batch_size  compiled         15  predicted 22.02 GiB      25.33 s  largest buffer 19.24 GiB of 80.85 GiB\n"
    "find_batch_size  compiled         37  predicted 50.79 GiB      26.50 s  largest buffer 48.01 GiB of 80.85 GiB\n"
    "find_batch_size  call 2/20         15  OOM   peak ?               1.00 s  (grow)\n"
)


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load("bench_savers")


def test_the_progress_lines_say_what_a_stopped_search_saw(bench: ModuleType) -> None:
    seen = bench.progress_seen(STOPPED)
    assert seen == {"compiled_sizes": [8, 15, 37], "compile_seconds": [0.67, 25.33, 26.5], "ran": [8]}
    assert bench.progress_seen("") == {"compiled_sizes": [], "compile_seconds": [], "ran": []}


def test_a_search_that_did_not_finish_says_so_in_its_row(bench: ModuleType) -> None:
    stopped = bench.search_outcome({"error": "timed out after 100 s", "stderr": STOPPED}, 100.0)
    assert stopped["largest_batch"] is None
    assert stopped["search"].startswith("did not finish: timed out after 100 s, after 3 compilation(s) of 1-26 s")
    assert "100 s given" in stopped["search"] and stopped["search_seen"]["ran"] == [8]
    done = bench.search_outcome({"largest_batch": 14, "search_seconds": 111.7}, 420.0)
    assert done == {"largest_batch": 14, "search": "finished"}


def test_the_default_gives_a_jax_search_its_compilations(bench: ModuleType) -> None:
    # A JAX GPT-2 search compiled up to 10 sizes at 20-31 s each on an H200 (5 at least).
    assert bench.SEARCH_SECONDS["jax"] >= 10 * 31 + 60
    assert bench.SEARCH_SECONDS["jax"] <= 560  # one mode still fits one 10-minute run of the GPU machine


def test_a_search_the_budget_cannot_hold_is_not_started_and_the_row_says_so(bench: ModuleType) -> None:
    began = time.perf_counter()
    row = bench.row("jax", "matmuls", False, time.perf_counter() + 100.0, None, parts=("search",))
    assert time.perf_counter() - began < 5  # no process started
    assert row["largest_batch"] is None and row["search"].startswith("not run: 100 s of the budget")
    assert f"given {bench.SEARCH_SECONDS['jax']:.0f} s" in row["search"]
    # Given less time explicitly, the same check holds against what was given.
    assert bench.row("jax", "none", False, time.perf_counter() + 10.0, None, 60.0, ("search",))["search"].startswith(
        "not run"
    )


def _earlier() -> list[dict[str, Any]]:
    return [
        {"framework": "jax", "mode": "matmuls", "batch": 8, "limit": "40GiB", "peak_bytes": 14_284_136_448,
         "largest_batch": 12, "search": "finished", "concurrent": 4, "caveat": "four searches at once",
         "detail": {"peak_exact": True}},
        {"framework": "jax", "mode": "full", "batch": 8, "limit": "40GiB", "peak_bytes": 6_910_562_304,
         "largest_batch": 37, "search": "finished", "detail": {"search": {"largest_batch": 37}}},
        {"model": "transformers GPT-2 small", "framework": "torch", "mode": "none", "limit": "24GiB",
         "largest_batch": 14},
    ]  # fmt: skip


def test_merged_rows_keep_the_measurements_and_take_the_new_answer(bench: ModuleType) -> None:
    searched = {"framework": "jax", "mode": "matmuls", "batch": 8, "limit": "40GiB", "largest_batch": 21,
                "search": "finished", "detail": {"search": {"largest_batch": 21}}}  # fmt: skip
    not_run = {"framework": "jax", "mode": "full", "batch": 8, "limit": "40GiB", "largest_batch": None,
               "search": "not run: 10 s of the budget were left", "detail": {}}  # fmt: skip
    other_cap = {"framework": "jax", "mode": "none", "batch": 8, "limit": None, "largest_batch": 30, "detail": {}}
    merged = bench.merge_rows(_earlier(), [searched, not_run, other_cap])
    matmuls, full, gpt2, added = merged
    assert matmuls["peak_bytes"] == 14_284_136_448 and matmuls["largest_batch"] == 21
    assert matmuls["detail"] == {"peak_exact": True, "search": {"largest_batch": 21}}
    # How the earlier search ran (four at once, and the caveat that came with it) went with it.
    assert "caveat" not in matmuls and "concurrent" not in matmuls
    assert full["largest_batch"] == 37 and full["search"] == "finished"  # not searched again: it stands
    assert gpt2 == _earlier()[2] and added == other_cap


@pytest.mark.slow
def test_a_merged_cpu_run_updates_its_row_in_the_file(tmp_path: Path) -> None:
    out = tmp_path / "savers.json"
    earlier = {"benchmark": "savers", "command": "python earlier", "date": "2026-01-01", "rows": _earlier()}
    earlier["rows"].append({"framework": "torch", "mode": "none", "batch": 2, "limit": None, "peak_bytes": 1})
    out.write_text(json.dumps(earlier))
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_savers.py"
    command = [sys.executable, str(script), "--cpu", "--frameworks", "torch", "--modes", "none", "--parts", "search"]
    subprocess.run([*command, "--merge", "--out", str(out)], check=True, capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    torch_none = [r for r in result["rows"] if r.get("framework") == "torch" and "model" not in r]
    assert len(torch_none) == 1 and torch_none[0]["peak_bytes"] == 1
    assert torch_none[0]["search"] == "finished" and torch_none[0]["largest_batch"] == 12  # the simulated cap
    assert len(result["rows"]) == 4
    assert [s["rows"] for s in result["sources"]] == ["the rows kept from before", "torch: none (search)"]
    assert result["sources"][0]["command"] == "python earlier"


def test_caps_that_add_up_past_the_gpu_are_refused_before_anything_runs(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Four 40 GiB caps on a 141 GiB device: each search would read the room the others left, not its cap.
    monkeypatch.setattr(bench.benchlib, "gpu_description", lambda: {"name": "NVIDIA H200", "driver": "x", "count": 1})
    monkeypatch.setattr(bench.benchlib, "gpu_total_bytes", lambda: 141 << 30)
    monkeypatch.setattr(bench, "row", lambda *a, **k: pytest.fail("a row ran"))
    out = tmp_path / "savers.json"
    with pytest.raises(SystemExit) as exited:
        bench.main(["--jobs", "4", "--limit", "40GiB", "--out", str(out)])
    assert exited.value.code == 2 and not out.exists()
    said = capsys.readouterr().err
    assert "--jobs 4 x --limit 40GiB" in said and "at most 3 at once" in said, said


def test_a_search_not_run_says_nothing_of_how_searches_ran(bench: ModuleType, tmp_path: Path) -> None:
    # Two at once, but the budget holds neither search: the rows say "not run", with no "concurrent" that a
    # merge would lay over how the earlier search of that row ran.
    out = tmp_path / "savers.json"
    argv = ["--cpu", "--frameworks", "jax", "--modes", "matmuls,offload", "--parts", "search"]
    assert bench.main([*argv, "--jobs", "2", "--budget", "60", "--search-seconds", "500", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["search"].startswith("not run") for r in rows] == [True, True], rows
    assert all("concurrent" not in r for r in rows), rows
