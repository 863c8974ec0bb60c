"""``limit=`` holds whatever measured the peak: a trial whose peak passed it did not fit, even
though nothing enforced the limit and the step ran; ``measure=`` must return bytes."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
from device_view import no_collection, show_a_device
from hypothesis import given, settings
from hypothesis import strategies as st

import unimem
from unimem import registry

GiB, MiB = 1 << 30, 1 << 20


@pytest.fixture(autouse=True)
def simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device the framework-free view shows (so no host limit), and no collection per failure."""
    show_a_device(monkeypatch)
    no_collection(monkeypatch)


class Unenforced:
    """A step that always runs, its peak ``fixed + per_sample × n`` (off by up to ``noise``), read
    through ``measure=`` or as the torch adapter's ``stats()``: nothing holds it to any limit."""

    def __init__(self, fixed: int, per_sample: int, noise: float = 0.0) -> None:
        self.fixed, self.per_sample, self.noise = fixed, per_sample, noise
        self.last: int | None = None
        self.peak = 0

    def reading(self, n: int) -> int:
        return int((self.fixed + self.per_sample * n) * (1 + self.noise * math.sin(n * 1.7)))

    def __call__(self, n: int) -> None:
        self.last = self.reading(n)
        self.peak = max(self.peak, self.last)

    def measure(self) -> int | None:
        last, self.last = self.last, None
        return last

    def stats(self, device: int = 0, *, nvml: bool = True) -> unimem.MemoryStats:
        return unimem.MemoryStats("torch", device, allocated=0, peak_allocated=self.peak)

    def reset_peak(self, device: int = 0) -> None:
        self.peak = 0

    def clear_cache(self, device: int = 0) -> int:
        return 0


def _search(step: Unenforced, source: str, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> unimem.BatchSizeSearch:
    if source == "measure":
        kwargs.update(measure=step.measure, backend="nvml")  # no framework: the step's own figures
    else:
        adapter = registry.get_backend("torch")
        for name in ("stats", "reset_peak", "clear_cache"):
            monkeypatch.setattr(adapter, name, getattr(step, name))
        kwargs["backend"] = "torch"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", unimem.UnimemWarning)
        found = unimem.find_batch_size(step, return_trials=True, **kwargs)
    assert isinstance(found, unimem.BatchSizeSearch)
    return found


@pytest.mark.parametrize("source", ["measure", "framework"])
@pytest.mark.parametrize(("per_sample", "largest"), [(1000 * MiB, 8), (100 * MiB, 81)])
def test_no_size_whose_peak_passed_the_limit_is_the_answer(
    source: str, per_sample: int, largest: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, 1,000 MiB a sample under an 8 GiB limit answered 21 (21,000 MiB measured), every trial fitting.
    step = Unenforced(0, per_sample)
    found = _search(step, source, monkeypatch, start=1, limit="8GiB")
    assert 0.95 * largest <= found.batch_size <= largest, str(found)
    over = [t for t in found.trials if t.peak is not None and t.peak > 8 * GiB]
    assert over and not any(t.fits for t in over), str(found)
    assert "passed limit=8.00 GiB" in (over[0].error or "")


def test_batch_size_one_past_the_limit_is_out_of_memory() -> None:
    step = Unenforced(0, 2 * GiB)
    with pytest.raises(
        unimem.OutOfMemory,
        match=r"even batch size 1 does not fit: its peak 2.00 GiB \(measure=\) passed limit=1.00 GiB",
    ):
        unimem.find_batch_size(step, backend="nvml", start=4, measure=step.measure, limit="1GiB")


@settings(max_examples=60, deadline=None)
@given(
    fixed=st.integers(0, 4 * GiB),
    per_sample=st.integers(1, 64 * MiB),
    limit=st.integers(1 * MiB, 64 * GiB),
    noise=st.sampled_from([0.0, 0.01, 0.05]),
    start=st.integers(1, 4096),
    source=st.sampled_from(["measure", "framework"]),
    confirm=st.booleans(),
)
def test_the_answer_s_recorded_peak_never_passes_the_limit(
    fixed: int, per_sample: int, limit: int, noise: float, start: int, source: str, confirm: bool
) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        step = Unenforced(fixed, per_sample, noise)
        try:
            found = _search(step, source, monkeypatch, start=start, limit=limit, confirm=confirm, max_size=1 << 20)
        except unimem.OutOfMemory:
            assert step.reading(1) > limit  # only when batch size 1 passed it
            return
    ran = [t for t in (*found.trials, *found.confirmations) if t.batch_size == found.batch_size]
    assert any(t.fits for t in ran), str(found)
    assert all(t.peak is None or t.peak <= limit for t in ran if t.fits), str(found)
    assert not any(t.fits and t.peak is not None and t.peak > limit for t in found.trials), str(found)


@pytest.mark.parametrize("value", [math.nan, math.inf, -1, -0.5, "123", b"1", True, [1], object()])
def test_a_measure_that_does_not_return_bytes_is_a_config_error(value: object) -> None:
    with pytest.raises(unimem.ConfigError) as info:
        unimem.find_batch_size(lambda n: None, backend="nvml", start=4, measure=lambda: value, limit="1GiB")
    assert info.value.parameter == "measure" and repr(value) in str(info.value)


@pytest.mark.parametrize("value", [0, 1024, 1024.0, 1.5e9])
def test_a_measure_may_return_any_finite_number_of_bytes(value: float) -> None:
    found = unimem.find_batch_size(
        lambda n: None, backend="nvml", start=4, max_size=4, measure=lambda: value, limit="8GiB"
    )
    assert found == 4
