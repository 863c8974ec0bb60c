"""The measured search (no ``lower=``) past peaks that stopped growing near the cap: XLA
rematerializes a step whose peak would pass its limit, so sizes keep running while their peaks
read no higher, and only a failure says where they stop. The search climbs there in steps that
grow, not by its margin. Replayed from the H200's GPU test of a JAX MLP under a 2% cap
(``tests/gpu/test_diagnosis.py::test_jax_find_batch_size_under_a_cap``, evidence/gpu.json):
nothing imports a framework, and time is a simulated clock."""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, field

import pytest
from device_view import no_collection, show_a_device

import unimem
from unimem import registry
from unimem.search import runner

GiB = 1 << 30
MARGIN = 0.05


@dataclass
class CappedMlp:
    """The GPU test's JAX MLP as the H200 ran it under its 2.79 GiB cap: peaks through the sizes it
    measured (601, 9222 and 59179), then held at the 2.78 GB it read at 65290 while XLA
    rematerializes, every size up to ``runs_up_to`` running (80161 there: 76153 ran, 80162 did
    not). JAX's peak cannot be reset: a peak no higher than the process's so far reads None. A
    failure keeps the step's outputs (32 MiB) and costs more than a run."""

    runs_up_to: int = 80161
    limit: int = int(2.79 * GiB)
    held: int = 67_100_000  # parameters and the step's inputs before the search
    peak: int = 219_100_000  # the process's peak after the warm-up at the search's start
    kept: int = 0
    mark: int | None = None
    clock: float = 0.0
    calls: list[tuple[int, bool]] = field(default_factory=list)

    POINTS = ((0, 67_100_000), (601, 253_157_888), (9222, 511_955_456), (59179, 2_654_376_960))
    AT_THE_CAP = 2_783_501_568

    def natural(self, n: int) -> float:
        """The step's peak without rematerialization: through the measured points, then their last slope."""
        for (n0, p0), (n1, p1) in itertools.pairwise(self.POINTS):
            if n <= n1:
                return p0 + (p1 - p0) * (n - n0) / (n1 - n0)
        (n0, p0), (n1, p1) = self.POINTS[-2:]
        return p1 + (p1 - p0) / (n1 - n0) * (n - n1)

    def step(self, n: int) -> None:
        fits = n <= self.runs_up_to
        self.calls.append((n, fits))
        if not fits:
            self.kept += 33_579_520
            self.clock += 15.0
            raise MemoryError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
        self.clock += 4.3
        need = self.natural(n)
        self.peak = max(self.peak, self.kept + int(need if need <= 0.95 * self.limit else self.AT_THE_CAP))

    def stats(self, device: int = 0, *, nvml: bool = True) -> unimem.MemoryStats:
        peak = None if self.mark is not None and self.peak <= self.mark else self.peak
        in_use = self.held + self.kept
        return unimem.MemoryStats(
            "jax",
            device,
            allocated=in_use,
            reserved=self.limit,  # preallocated: one region, the whole cap
            peak_allocated=peak,
            limit=self.limit,
            largest_free_block=self.limit - in_use,
        )

    def reset_peak(self, device: int = 0) -> None:
        self.mark = self.peak

    def clear_cache(self, device: int = 0) -> int:
        return 0


def search(device: CappedMlp, monkeypatch: pytest.MonkeyPatch) -> unimem.BatchSizeSearch:
    adapter = registry.get_backend("jax")
    for name in ("stats", "reset_peak", "clear_cache"):
        monkeypatch.setattr(adapter, name, getattr(device, name))
    monkeypatch.setattr(runner, "clock", lambda: device.clock)
    no_collection(monkeypatch)
    show_a_device(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", unimem.UnimemWarning)
        return unimem.find_batch_size(device.step, start=32, backend="jax", return_trials=True)


def test_the_h200_capped_mlp_climbs_past_its_flat_peaks_in_eight_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    # On the H200: 32, 601, 9222, 59179 and 65290 (sure steps), then 68727, 72345 and 76153 ran
    # and 80162 failed, one margin at a time: 9 trials. Past the first size whose peak read no
    # higher, the next goes three margins past the last peak read, then to the size that ends it.
    device = CappedMlp()
    found = search(device, monkeypatch)
    assert [n for n, _ in device.calls][: len(found.trials)] == [t.batch_size for t in found.trials]
    assert found.converged and (1 - MARGIN) * device.runs_up_to <= found.batch_size <= device.runs_up_to, str(found)
    assert len(found.trials) <= 8 and found.failed_calls <= 1, str(found)
    climbed = [t for t in found.trials if t.reason == "saturated"]
    assert climbed and climbed[0].batch_size >= 65290 / (1 - MARGIN) ** 3, str(found)


@pytest.mark.parametrize("runs_up_to", [66_000, 70_000, 80_161, 90_000, 120_000, 150_000])
def test_a_longer_stretch_past_the_flat_peaks_costs_few_trials_more(
    monkeypatch: pytest.MonkeyPatch, runs_up_to: int
) -> None:
    # Rematerialization stretches as far as the step allows: the steps past the flat peaks double,
    # so a stretch twice as long costs a few trials more, not one trial a margin (one a margin,
    # 150000 was not reached within max_trials=20), and at most two fail.
    device = CappedMlp(runs_up_to=runs_up_to)
    found = search(device, monkeypatch)
    assert found.converged and (1 - MARGIN) * runs_up_to <= found.batch_size <= runs_up_to, str(found)
    assert found.failed_calls <= 2, str(found)
    most = {66_000: 6, 70_000: 8, 80_161: 8, 90_000: 11, 120_000: 13, 150_000: 17}[runs_up_to]
    assert len(found.trials) <= most, str(found)
