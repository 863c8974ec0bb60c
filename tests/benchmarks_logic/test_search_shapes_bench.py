"""benchmarks/bench_search_shapes.py: each case's ``max_size`` as a multiple of its largest size, and
the failed calls and the answer's share it records beside the trial counts."""

from __future__ import annotations

from benchmark_modules import load


def test_max_size_bounds_each_case_and_the_shares_are_of_what_it_allows() -> None:
    bench = load("bench_search_shapes")
    free = bench.run(20, 3)
    bounded = bench.run(20, 3, max_size=0.5)
    assert free["max_size"] is None and bounded["max_size"] == 0.5
    # Half the largest size fits, and nothing above it is tried: the answer is max_size itself.
    assert bounded["failed_per_search"] == 0 and bounded["mean_share"] == 1.0
    assert 0.95 <= free["mean_share"] <= 1.0 and free["failed_per_search"] > 0
    assert not free["outside_the_margin"] and not bounded["outside_the_margin"]
