"""A torch batch search sized from predictions in bytes (``lower=`` an estimate, or a predictor):
the first call at the largest size predicted to fit, a second at it to confirm the step's steady
state, and nothing more where the predictions are right; where a call contradicts them, the
measured search takes over and a note says what was predicted, what was measured, and that it
switched.

The step is pure Python on a simulated torch: its first call holds no optimizer state, every later
call does (as a training step's second call), and it fails, as torch's caching allocator does,
when the least memory it runs in passes the cap. Nothing here allocates.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
from device_view import no_collection, show_a_device
from hypothesis import given, settings
from hypothesis import strategies as st

import unimem
from unimem import registry
from unimem.estimate.result import MemoryEstimate, SizeEstimate
from unimem.search.predicted import TOLERANCE

GiB, MiB = 1 << 30, 1 << 20
CAP = 24 * GiB


@pytest.fixture(autouse=True)
def simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device the framework-free view shows (so no host limit), and no collection per failure."""
    show_a_device(monkeypatch)
    no_collection(monkeypatch)


class Training:
    """A training step on a simulated torch under a cap: ``fixed + per_sample × n`` bytes in use at its
    peak, ``optimizer`` more from its second call on, ``cache`` more held by the pool at the peak, and a
    third of the cache more is the least it runs in (``required``). ``off`` scales the truth away from
    what ``predicted`` says (0: the predictions are right)."""

    def __init__(self, fixed: int, per_sample: int, optimizer: int, cache: int = GiB, off: float = 0.0) -> None:
        self.fixed, self.per_sample, self.optimizer, self.cache, self.off = fixed, per_sample, optimizer, cache, off
        self.calls: list[int] = []
        self.failed: list[int] = []
        self.peak = self.peak_reserved = 0

    def predicted(self, n: int, steady: bool = True) -> int:
        return self.fixed + (self.optimizer if steady else 0) + self.per_sample * n

    def predicted_required(self, n: int) -> int:
        return self.predicted(n) + self.cache // 3

    def need(self, n: int, steady: bool = True) -> int:
        return int(self.predicted(n, steady) * (1 + self.off))

    def runs(self, n: int, steady: bool = True) -> bool:
        return self.need(n, steady) + self.cache // 3 <= CAP

    def largest(self) -> int:
        return _largest(self.runs)

    def __call__(self, n: int) -> None:
        steady = bool(self.calls)
        self.calls.append(n)
        if not self.runs(n, steady):
            self.failed.append(n)
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        self.peak = max(self.peak, self.need(n, steady))
        self.peak_reserved = max(self.peak_reserved, self.need(n, steady) + self.cache)

    def stats(self, device: int = 0, *, nvml: bool = True) -> unimem.MemoryStats:
        return unimem.MemoryStats(
            "torch", device, allocated=self.fixed, peak_allocated=self.peak, reserved=0,
            peak_reserved=self.peak_reserved, limit=CAP,
        )  # fmt: skip

    def reset_peak(self, device: int = 0) -> None:
        self.peak = self.peak_reserved = 0

    def clear_cache(self, device: int = 0) -> int:
        return 0

    def estimate(self, asked: tuple[int, ...] = (4, 8)) -> tuple[MemoryEstimate, list[int]]:
        """What ``estimate_memory`` would say of this step (``peak``, ``reserved``, ``required``, as
        predicted), its ``largest`` under the cap found; and the sizes estimated from then on."""
        later: list[int] = []

        def measure(n: int) -> SizeEstimate:
            later.append(n)
            peak, required = self.predicted(n), self.predicted_required(n)
            return SizeEstimate(n, "cuda", peak, peak + self.cache, required, {}, required <= CAP)

        estimate = MemoryEstimate("torch", "cuda", CAP, "given", asked=list(asked), _measure=measure)
        for n in asked:
            estimate.peak_at(n)
        low = _largest(lambda n: self.predicted_required(n) <= CAP)
        estimate.peak_at(low), estimate.peak_at(low + 1)
        estimate.largest, estimate.above = low, low + 1
        later.clear()
        return estimate, later


def _largest(fits: Callable[[int], bool]) -> int:
    """The largest size that ``fits`` (0: none), for a need that grows with the size."""
    low, high = 0, 1
    while fits(high):
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def search(step: Training, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> unimem.BatchSizeSearch:
    adapter = registry.get_backend("torch")
    for name in ("stats", "reset_peak", "clear_cache"):
        monkeypatch.setattr(adapter, name, getattr(step, name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", unimem.UnimemWarning)
        found = unimem.find_batch_size(step, backend="torch", return_trials=True, **kwargs)
    assert isinstance(found, unimem.BatchSizeSearch)
    assert found.step_calls == len(step.calls) and found.failed_calls == len(step.failed), str(found)
    return found


def _gpt2_like(off: float = 0.0) -> Training:
    return Training(int(1.5 * GiB), int(1.45 * GiB), GiB, off=off)


def _switched(found: unimem.BatchSizeSearch) -> str:
    notes = [note for note in found.notes if "switched to the measured peaks" in note]
    assert len(notes) == 1, str(found)
    return notes[0]


# --- the predictions are right: two calls, at the largest size --------------------------------------------


@pytest.mark.parametrize("start", [1, 14, 64])
def test_a_predictor_s_largest_size_runs_first_and_once_more_to_confirm(
    start: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, the first call was at start (halved while predicted past the limit), the predicted
    # largest came second; from start=14 it ran once, a first step holding no optimizer state.
    step = _gpt2_like()
    found = search(step, monkeypatch, start=start, lower=step.predicted_required)
    assert found.batch_size == step.largest() == 14, str(found)
    assert step.calls == [14, 14] and not step.failed, str(found)
    assert [t.reason for t in found.trials] == ["predicted", "steady"], str(found)
    assert found.converged and not found.confirmations, str(found)
    assert not any("set aside" in note for note in found.notes), str(found)


@pytest.mark.parametrize("how", ["estimate", "peak_at"])
def test_an_estimate_sizes_the_search_under_the_cap_without_estimating_more(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pool holds 9 GiB more than the bytes in use at the peak, and the least the step runs in is
    # 3 GiB (15%) above them: as GPT-2 under bf16 with every block saved measured on an H200.
    step = Training(int(1.5 * GiB), int(1.45 * GiB), GiB, cache=9 * GiB)
    estimate, later = step.estimate()
    lower: Any = estimate if how == "estimate" else estimate.peak_at
    found = search(step, monkeypatch, start=4, lower=lower)
    assert found.batch_size == estimate.largest == step.largest(), str(found)
    assert step.calls == [found.batch_size] * 2 and not step.failed, str(found)
    # What the estimate knew placed it; its peak (not the least memory it runs in) is what the
    # measured peak was held to: 15% apart would otherwise have read as a contradiction.
    assert later == [], later
    assert not any("set aside" in note for note in found.notes), str(found)


def test_against_limit_an_estimate_holds_the_bytes_in_use_that_limit_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    # limit= bounds the peak in use (max_memory_allocated), not the pool: an estimate's peak is held to it.
    step = Training(int(1.5 * GiB), GiB, GiB, cache=3 * GiB)
    estimate, _ = step.estimate()
    limit = step.predicted(10) + MiB  # 10 fits the bytes in use; the pool at 10 would pass it
    found = search(step, monkeypatch, start=4, lower=estimate, limit=limit)
    assert found.batch_size == 10 and step.calls == [10, 10], str(found)


@pytest.mark.parametrize("given", [{"confirm": False}, {"max_trials": 1}])
def test_without_confirm_or_a_call_for_it_the_first_call_is_the_only_one(
    given: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    step = _gpt2_like()
    estimate, _ = step.estimate()  # what it knows is read whatever the calls allowed
    found = search(step, monkeypatch, start=4, lower=estimate, **given)
    # The predictions bound the answer: converged, with no note that the calls ran out.
    assert step.calls == [14] and found.batch_size == 14 and found.converged, str(found)
    assert not any("ran out" in note for note in found.notes), str(found)


@settings(max_examples=40, deadline=None)
@given(
    fixed=st.integers(100 * MiB, 8 * GiB),
    per_sample=st.integers(MiB, 2 * GiB),
    optimizer=st.integers(0, 4 * GiB),
    start=st.integers(1, 512),
)
def test_right_predictions_cost_two_calls_and_no_failure(
    fixed: int, per_sample: int, optimizer: int, start: int
) -> None:
    step = Training(fixed, per_sample, optimizer)
    if step.largest() < 1:
        return
    with pytest.MonkeyPatch.context() as monkeypatch:
        found = search(step, monkeypatch, start=start, lower=step.predicted_required)
    assert found.step_calls <= 2 and found.failed_calls == 0, str(found)
    assert (1 - found.margin) * step.largest() <= found.batch_size <= step.largest(), str(found)


# --- a call contradicts them: the measured search takes over, and says so -----------------------------------


def test_a_first_call_that_fails_hands_over_to_the_measured_search(monkeypatch: pytest.MonkeyPatch) -> None:
    step = _gpt2_like(off=0.15)  # the step needs 15% more than predicted
    estimate, _ = step.estimate()
    found = search(step, monkeypatch, start=4, lower=estimate)
    assert step.calls[0] == 14 and step.failed[0] == 14, str(found)
    assert (1 - found.margin) * step.largest() <= found.batch_size <= step.largest(), str(found)
    note = _switched(found)
    assert "batch size 14 was predicted to fit the limit 24.00 GiB at a peak of 22.80 GiB" in note
    assert "its first call did not fit (CUDA out of memory" in note


def test_a_second_call_that_fails_leaves_no_answer_it_disproved(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first call fits without the optimizer's state; the step's steady state does not. Before, a
    # search started at the predicted largest answered it after that one call.
    step = _gpt2_like(off=0.05)
    found = search(step, monkeypatch, start=14, lower=step.predicted_required)
    assert step.calls[:2] == [14, 14] and step.failed[0] == 14, str(found)
    assert found.batch_size == step.largest() == 13 and step.runs(found.batch_size), str(found)
    assert "its second call did not fit" in _switched(found)


@pytest.mark.parametrize(("off", "per_sample"), [(-0.2, 1.45), (-0.1, 1.45), (0.1, 5.0)])
def test_a_peak_past_the_tolerance_hands_over_to_the_measured_search(
    off: float, per_sample: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Predicted too high (more fits), or too low (it fits all the same, a sample taking 5 GiB of the room).
    step = Training(int(1.5 * GiB), int(per_sample * GiB), 0, off=off)
    found = search(step, monkeypatch, start=4, lower=step.predicted)
    largest = step.largest()
    assert (1 - found.margin) * largest <= found.batch_size <= largest, str(found)
    note = _switched(found)
    size = step.calls[0]
    measured = [t.peak for t in found.trials if t.batch_size == size and t.fits][-1]
    assert measured is not None
    assert f"a peak of {unimem.format_bytes(step.predicted(size))}" in note, note
    assert f"peaked at {unimem.format_bytes(measured)}" in note, note
    assert f"{'above' if off > 0 else 'below'} it, past the {TOLERANCE:.0%} tolerance" in note, note
    if off < 0:
        assert found.batch_size > size, str(found)  # the measured peaks found the room the predictions hid


def test_a_first_step_under_its_prediction_is_no_contradiction(monkeypatch: pytest.MonkeyPatch) -> None:
    # A first call holds no optimizer state: its peak reads under the steady state's prediction by that much.
    step = Training(int(1.5 * GiB), int(1.45 * GiB), 4 * GiB)
    found = search(step, monkeypatch, start=4, lower=step.predicted_required)
    first = found.trials[0]
    assert first.peak is not None and first.peak < (1 - TOLERANCE) * step.predicted(first.batch_size)
    assert step.calls == [first.batch_size] * 2 and not any("switched" in n for n in found.notes), str(found)


def test_lower_must_be_a_callable_or_an_estimate() -> None:
    with pytest.raises(unimem.ConfigError) as raised:
        unimem.find_batch_size(lambda n: None, start=4, backend="torch", lower=42)
    assert raised.value.parameter == "lower" and "an estimate" in str(raised.value)


def test_after_a_second_call_fails_the_measured_search_finds_the_answer_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first call's fit, without the optimizer's state, is no size that ran: the answer is one the
    # measured search ran in the step's steady state, not a re-run of a size below the disproved one.
    step = _gpt2_like(off=0.05)
    found = search(step, monkeypatch, start=14, lower=step.predicted_required)
    searched = [t for t in found.trials[2:] if t.fits]
    assert found.batch_size == 13 and max(t.batch_size for t in searched) == 13, str(found)
    assert step.failed == [14] and not found.confirmations, str(found)


@pytest.mark.parametrize("optimizer", [1, 4])
def test_past_the_tolerance_the_first_call_s_peak_is_no_point_of_the_measured_line(
    optimizer: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Read without the optimizer's state, the first call's peak lies under the second's at the same
    # size: as a point of the line it would make two of one size, which no line through them takes.
    step = Training(int(1.5 * GiB), int(1.45 * GiB), optimizer * GiB, off=-0.2)
    found = search(step, monkeypatch, start=4, lower=step.predicted)
    largest = step.largest()
    assert (1 - found.margin) * largest <= found.batch_size <= largest, str(found)
    assert found.model is not None, str(found)
    fixed, per_sample = found.model
    assert fixed == pytest.approx(step.need(0), rel=0.01), str(found)
    assert per_sample == pytest.approx(0.8 * step.per_sample, rel=0.01), str(found)
