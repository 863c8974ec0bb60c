"""``unimem.estimate_memory``'s arguments, checked before anything runs, and the search for the largest
batch that fits, on made-up peaks. No framework is imported."""

from __future__ import annotations

import sys
from typing import Any

import pytest

import unimem
from unimem import registry
from unimem.estimate.largest import largest_fitting
from unimem.estimate.result import MemoryEstimate, SizeEstimate

MIB = 2**20


def _step() -> Any:
    return lambda n: None


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"batch": 0}, "batch"),
        ({"batch": [4, -1]}, "batch"),
        ({"batch": []}, "batch"),
        ({"batch": True}, "batch"),
        ({"batch": "8"}, "batch"),
        ({"precision": "fp8"}, "precision"),
        ({"precision": 16}, "precision"),
        ({"saver": "everything", "match": "Block"}, "saver"),
        ({"saver": "full"}, "match"),
        ({"match": "Block"}, "match"),
        ({"device": ""}, "device"),
        ({"max_runs": -1}, "max_runs"),
        ({"max_runs": 2.5}, "max_runs"),
        ({"target": "-1GiB"}, "target"),
        ({"target": "12 parsecs"}, "target"),
        ({"target": 0}, "target"),
        ({"backend": "nvml"}, "backend"),
        ({"backend": "no-such-framework"}, "backend"),
    ],
)
def test_a_bad_argument_is_a_config_error_naming_it_and_runs_nothing(kwargs: dict[str, Any], parameter: str) -> None:
    arguments = {"batch": 8, "backend": "torch"} | kwargs
    batch = arguments.pop("batch")
    with pytest.raises(unimem.ConfigError) as info:
        unimem.estimate_memory(_step, batch, **arguments)
    assert info.value.parameter == parameter
    assert "torch" not in sys.modules and not registry.configured()


def test_a_device_target_where_no_device_can_be_read_says_to_pass_a_size(monkeypatch: pytest.MonkeyPatch) -> None:
    from unimem import device_view

    monkeypatch.setattr(device_view, "usable", lambda: (None, "no NVIDIA driver"))
    with pytest.raises(unimem.ConfigError, match="pass its size") as info:
        unimem.estimate_memory(_step, 8, target="cuda:0", backend="torch")
    assert info.value.parameter == "target" and "no NVIDIA driver" in str(info.value)


def _sized(peak_of: Any, limit: int) -> Any:
    calls: list[int] = []

    def measure(n: int) -> SizeEstimate:
        calls.append(n)
        need = peak_of(n)
        return SizeEstimate(n, "cuda", need, need, need, {}, need <= limit)

    return measure, calls


def test_an_affine_peak_is_placed_and_checked_in_few_estimates() -> None:
    limit = 24 * 1024 * MIB
    peak_of = lambda n: 2 * 1024 * MIB + n * 37 * MIB  # noqa: E731
    measure, calls = _sized(peak_of, limit)
    known = {8: measure(8)}
    largest, above = largest_fitting(measure, known, limit, runs=6)
    truth = max(n for n in range(1, 2000) if peak_of(n) <= limit)
    assert (largest, above) == (truth, truth + 1)
    assert len(calls) <= 4  # 8, a second point, the line's size, the one past it


def test_a_peak_that_bends_is_bracketed_within_half_a_percent() -> None:
    limit = 64 * 1024 * MIB
    peak_of = lambda n: 1024 * MIB + n * 20 * MIB + (n * n * MIB) // 400 + (n % 7) * 2 * MIB  # noqa: E731
    measure, calls = _sized(peak_of, limit)
    known = {16: measure(16), 64: measure(64)}
    largest, above = largest_fitting(measure, known, limit, runs=8)
    assert largest is not None and above is not None
    assert peak_of(largest) <= limit < peak_of(above)
    assert above - largest <= max(1, largest // 200)


def test_no_size_fits_when_one_sample_does_not() -> None:
    measure, _ = _sized(lambda n: 100 * MIB * n, 50 * MIB)
    assert largest_fitting(measure, {4: measure(4)}, 50 * MIB, runs=6) == (None, 1)


def test_the_search_stops_when_its_runs_are_spent() -> None:
    measure, calls = _sized(lambda n: n * MIB, 10**6 * MIB)
    largest, above = largest_fitting(measure, {2: measure(2)}, 10**6 * MIB, runs=2)
    assert len(calls) == 3 and above is None and largest is not None


def test_the_result_predicts_other_sizes_and_reads_as_a_table() -> None:
    measure, calls = _sized(lambda n: (100 + n) * MIB, 120 * MIB)
    result = MemoryEstimate("torch", "cuda", 120 * MIB, "given", asked=[8], _measure=measure)
    result.sizes[8] = measure(8)
    result.largest, result.above = 20, 21
    assert result.peak_at(30) == 130 * MIB and result.peak_at(30) == 130 * MIB
    assert calls == [8, 30]  # each size once
    text = str(result)
    assert "largest batch that fits 120.00 MiB: 20 (21 does not)" in text and "30*" in text
    data = result.as_dict()
    assert [size["batch"] for size in data["sizes"]] == [8, 30] and data["largest"] == 20
