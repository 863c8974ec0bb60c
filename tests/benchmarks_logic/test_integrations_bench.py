"""benchmarks/bench_integrations.py: each trainer finder judged against the largest batch that runs in
its own loop, found in fresh processes from the finders' answers."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from benchmark_modules import load


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load("bench_integrations")


def _search(bench: ModuleType, truth: int, start: int) -> tuple[int | None, int]:
    """The bracket search against a loop where sizes up to ``truth`` run: its answer and rounds."""
    low, high, rounds = 0, None, 0
    sizes = bench.next_sizes(0, None, start)
    while sizes:
        rounds += 1
        low, high, odd = bench.narrow(low, high, [(n, n <= truth) for n in sizes])
        assert odd == []
        sizes = bench.next_sizes(low, high, start)
        assert all(low < n and (high is None or n < high) for n in sizes), (low, high, sizes)
    return (low if high == low + 1 else None), rounds


@pytest.mark.parametrize(("truth", "start"), [(12, 13), (13, 13), (14, 13), (20, 13), (5, 13), (24, 24), (1, 16)])
def test_the_truth_comes_out_exact_in_few_rounds_from_the_answers(bench: ModuleType, truth: int, start: int) -> None:
    found, rounds = _search(bench, truth, start)
    assert found == truth
    assert rounds <= (1 if truth == start else 5), rounds


def test_the_first_round_tries_the_answer_and_the_size_above_it(bench: ModuleType) -> None:
    assert bench.next_sizes(0, None, 13) == [13, 14]
    assert bench.next_sizes(13, 14, 13) == []  # a size that runs beside one that does not: done
    assert bench.next_sizes(0, 1, 13) == []  # not even one sample runs
    assert bench.next_sizes(14, None, 13) == [15, 18]  # all ran: one more, and a quarter up
    assert bench.next_sizes(0, 13, 13) == [6, 12]  # none ran: one less, and half
    assert bench.next_sizes(14, 18, 13) == [15, 16]  # evenly inside
    assert bench.next_sizes(10, 40, 13) == [20, 30]
    assert bench.next_sizes(14, 17, 13) == [15, 16]  # two inside: both


def test_a_size_that_fails_below_one_that_ran_is_kept_aside(bench: ModuleType) -> None:
    low, high, odd = bench.narrow(0, None, [(13, False), (14, True)])
    assert (low, high, odd) == (14, None, [13])
    assert bench.narrow(14, 16, [(15, True)]) == (15, 16, [])
    assert bench.narrow(14, 16, [(17, True)]) == (17, None, [16])  # the earlier failure no longer bounds it


def test_an_answer_above_its_loops_truth_is_flagged(bench: ModuleType) -> None:
    assert bench.exceeds(13, {"true_max": 12}) is True
    assert bench.exceeds(12, {"true_max": 12}) is False
    # A bracket not closed in the budget: above it only where that size did not run fresh.
    assert bench.exceeds(16, {"true_max": None, "low": 13, "high": 16}) is True
    assert bench.exceeds(13, {"true_max": None, "low": 13, "high": 16}) is False
    assert bench.exceeds(14, {"true_max": None, "low": 13, "high": 16}) is None


def _rows() -> dict[str, dict[str, Any]]:
    def row(found: int, calls: int) -> dict[str, Any]:
        return {"found": found, "calls": calls, "failed_calls": 1}

    return {
        "lightning-unimem": row(13, 7),
        "lightning-power": row(8, 4),
        "lightning-binsearch": row(11, 7),
        "trainer-unimem": row(13, 6),
        "trainer-auto": {"error": "timed out after 71 s"},
    }


def test_each_finder_is_judged_against_its_own_loops_truth(bench: ModuleType) -> None:
    rows = _rows()
    truths = {"lightning": {"true_max": 14}, "trainer": {"true_max": 12}}
    checks = bench.judge(rows, truths)
    assert rows["lightning-unimem"]["true_max"] == 14 and rows["lightning-unimem"]["share"] == round(13 / 14, 3)
    assert rows["trainer-unimem"]["true_max"] == 12 and rows["trainer-unimem"]["exceeds_truth"] is True
    assert rows["lightning-power"]["truth_loop"] == "lightning" and rows["lightning-power"]["exceeds_truth"] is False
    assert "true_max" not in rows["trainer-auto"]
    assert checks["exceed_their_truth"] == ["trainer-unimem"]
    # unimem's finders: 95% in at most 6 calls, and not above their truth.
    assert checks["unimem_met"]["lightning-unimem"] == {"share": False, "calls": False, "not_above_truth": True}
    assert checks["unimem_met"]["trainer-unimem"] == {"share": True, "calls": True, "not_above_truth": False}
    lines = bench.summary(rows, truths, checks)
    assert any("trainer-unimem: found 13" in line and "ABOVE ITS TRUTH" in line for line in lines)
    assert any(line.startswith("trainer-auto: timed out") for line in lines)
    assert any(
        line.startswith("lightning-unimem: found 13") and "targets not met: share, calls" in line for line in lines
    )
    assert any(
        line.startswith("trainer-unimem: found 13") and line.endswith("not met: not_above_truth") for line in lines
    )
    rows["trainer-unimem"]["found"] = 12
    checks = bench.judge(rows, truths)
    assert checks["exceed_their_truth"] == [] and all(checks["unimem_met"]["trainer-unimem"].values())
    assert any(
        line.endswith("(100.0% of 12), 6 calls, 1 failed; targets met") for line in bench.summary(rows, truths, checks)
    )


def test_a_loop_without_a_closed_bracket_gives_no_share(bench: ModuleType) -> None:
    rows = _rows()
    checks = bench.judge(rows, {"lightning": {"true_max": None, "low": 12, "high": 16}})
    assert rows["lightning-unimem"]["share"] is None and rows["lightning-unimem"]["exceeds_truth"] is None
    assert checks["unimem_met"]["lightning-unimem"]["share"] is None
    assert "true_max" in rows["trainer-unimem"] and rows["trainer-unimem"]["true_max"] is None


def test_the_truth_in_a_loop_probes_fresh_processes_within_its_time(bench: ModuleType, monkeypatch: Any) -> None:
    tried: list[dict[str, Any]] = []

    def fake_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:  # a loop where up to 14 runs
        tried.append(spec)
        return {"ran": spec["size"] <= 14, "seconds": 1.0}

    monkeypatch.setattr(bench, "_child", fake_child)
    clock = iter(range(0, 10_000, 10))  # each look at the clock: 10 s later
    monkeypatch.setattr(bench.time, "monotonic", lambda: float(next(clock)))
    truth = bench.loop_truth("trainer", 13, gpu=False, until=1_000.0)
    assert truth["true_max"] == 14 and truth["low"] == 14 and truth["high"] == 15
    assert {s["loop"] for s in tried} == {"trainer"} and all(s["finder"] == "probe" for s in tried)
    assert [p[0] for p in truth["probes"]][:2] == [13, 14]
    # Out of time after the first round: the bracket so far, no truth.
    clock = iter(range(0, 10_000, 10))
    short = bench.loop_truth("trainer", 10, gpu=False, until=25.0)
    assert short["true_max"] is None and short["low"] == 11 and short["high"] is None and len(short["probes"]) == 2
    # A probe that erred stops it where it is.
    monkeypatch.setattr(bench, "_child", lambda spec, timeout: {"error": "exit 1"})
    clock = iter(range(0, 10_000, 10))
    erred = bench.loop_truth("lightning", 13, gpu=False, until=1_000.0)
    assert erred["true_max"] is None and erred["probes"][0][3] == "exit 1" and len(erred["probes"]) == 2


def test_the_emulated_device_holds_a_sample_less_beside_state_its_own_size_made(bench: ModuleType) -> None:
    cap = bench.CPU_CAP
    assert bench.room(cap, []) == cap  # a fit's first step: no optimizer state yet
    assert bench.room(cap, [cap]) == cap - 1  # its second: the state its first step made, at its size
    assert bench.room(cap - 1, [cap]) == cap - 1  # made by a larger step
    assert bench.room(cap, [2]) == cap  # state an earlier, smaller trial made splits nothing


def test_unimem_rows_list_every_call_of_the_step_with_its_figures(bench: ModuleType) -> None:
    def trial(size: int, fits: bool, reason: str) -> Any:
        return SimpleNamespace(batch_size=size, fits=fits, peak=size * 10 if fits else None, peak_reserved=None,
                               reason=reason)  # fmt: skip

    search = SimpleNamespace(trials=(trial(8, True, "start"), trial(14, False, "close")),
                             confirmations=(trial(13, True, "confirm"),))  # fmt: skip
    assert bench._trials(search) == [
        [8, True, 80, None, "start"],
        [14, False, None, None, "close"],
        [13, True, 130, None, "confirm"],  # a re-run after the search is a call the user waits for too
    ]
