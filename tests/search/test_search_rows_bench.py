"""benchmarks/bench_search_rows.py's share of the answer in the searching process: bisected there
after the search, and reported only as far as the probes show it. Loads the benchmark's pure
helpers (it imports no framework at its top)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_search_rows.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_search_rows", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    path = list(sys.path)
    try:
        spec.loader.exec_module(module)  # it puts benchmarks/ first on the path, for its benchlib
    finally:
        sys.path[:] = path
    return module


def test_probes_grow_past_the_answer_until_one_fails_then_bisect_to_one_percent(bench: ModuleType) -> None:
    assert bench.next_probe(1000, None) == 1053  # nothing known to fail: 1/0.95 up
    assert bench.next_probe(1000, 2000) == 1500
    assert bench.next_probe(1000, 1010) is None  # within 1%: done
    # Where a size runs below 1234 (as a simulated process): the probes end bracketing it.
    low, high, sizes = 1000, None, []
    while (size := bench.next_probe(low, high)) is not None:
        sizes.append(size)
        low, high = (size, high) if size < 1234 else (low, size)
    assert high is not None and low < 1234 <= high and high - low <= low // 100
    assert len(sizes) <= 10, sizes


def test_the_share_in_process_comes_from_the_probes_never_from_the_answer_alone(bench: ModuleType) -> None:
    # No probe (no time left after the search): no share, not 1.0.
    none = bench.in_process_share(1000, None, [])
    assert none["share"] is None and none["share_at_most"] is None and none["calls"] == 0 and not none["bisected"]
    # Probes that ran and never met a failure: only a bound on the share.
    rising = bench.in_process_share(1000, None, [[1053, True, False, 9.0], [1109, True, False, 9.5]])
    assert rising["share"] is None and rising["share_at_most"] == pytest.approx(1000 / 1109)
    assert rising["largest"] == 1109 and rising["above"] is None and rising["calls"] == 2
    # Bracketed within 1%: the share, against the largest size that ran.
    probes = [[1053, True, False, 9.0], [1109, False, None, 20.0], [1081, True, False, 9.0], [1095, False, True, 12.0],
              [1088, True, False, 9.0]]  # fmt: skip
    done = bench.in_process_share(1000, None, probes)
    assert done["bisected"] and done["largest"] == 1088 and done["above"] == 1095
    assert done["share"] == pytest.approx(1000 / 1088) and done["calls"] == 5
    # The search's own failure in that process bounds it from the start.
    assert bench.in_process_share(1000, 1005, [])["share"] == 1.0


def test_the_benchmark_parses_its_arguments() -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=60, check=True)
    assert "--in-process-budget" in out.stdout
