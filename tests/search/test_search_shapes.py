"""``find_batch_size`` over simulated memory shapes: it always ends within its budget, and
its answer ran, is never above the largest size that fits, and is within the margin of it.

Each case is a simulated device and step (``Device``): a need in bytes that grows with the
batch as a line, a convex curve, a line that bends (XLA rematerializing above a size), or
a line whose measured peak stays clamped under the cap while larger sizes still run; peaks
read exactly or with noise; a capacity under the limit it reports (a pool grown on demand
fits less than its limit); failures that leave bytes in use for good (XLA keeps a failed
execution's outputs) or shrink what fits (a fragmented pool); and, with ``lower=``,
predicted peaks that are exact, lag the need, leave out bytes in use beside the step, or
do not grow with the batch at all (never above the need: XLA's figure was exact on the GPU,
and on the CPU its own field leaves the temporaries out; a figure above the need makes any
search stop short). The search reads the figures as a framework gives them
(``stats()``, served by the simulation, as JAX's or torch's backend), through ``measure=``, or
not at all; a failure costs a millisecond or, as in JAX, 25 s of a simulated clock.

Every case checks, by what the simulated step itself counted: the step was called at most
``max_trials`` times, counting every call (re-runs after the search included); the answer
ran; it is at most the largest size that fits in a fresh process; and, unless the budget
ran out, at least ``(1 - margin)`` of the largest size that fits in the process as the
search left it (what failures left in use and the pool's history lower it).
"""

from __future__ import annotations

import itertools
import math
import random
import warnings
from dataclasses import dataclass, field
from typing import Any

import pytest
from device_view import no_collection, show_a_device
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import unimem
from unimem import registry
from unimem.search import runner

GiB, MiB = 1 << 30, 1 << 20
SHAPES = ("linear", "convex", "bend", "clamped")
PREDICTIONS = ("none", "exact", "lagging", "beside", "constant")
READINGS = ("stats", "stats-unresettable", "stats-torch", "measure", "blind")


@dataclass
class Device:
    """A simulated step on a simulated device, and the clock the search is timed with."""

    shape: str
    held: int  # bytes in use before the search (parameters, optimizer state)
    fixed: int  # bytes a step adds whatever the batch
    per_sample: int
    room: int  # a size fits while its need (plus what failures left) is at most this, in a fresh process
    limit: int  # the cap the framework reports; at least the room, except where remat runs past it
    curve: float = 0.0  # convex: bytes per sample squared
    knee: int = 0  # bend: above this size the need grows a twentieth as fast
    kept_per_failure: int = 0  # bytes each failure leaves in use for good
    shrink_per_failure: float = 0.0  # share of the room above ``held`` each failure loses (at most 60%)
    noise: float = 0.0  # measured peaks are off by up to this share of the step's own bytes
    predictions: str = "none"
    fail_seconds: float = 0.001
    resettable: bool = True
    calls: int = 0
    failed: int = 0
    ran: set[int] = field(default_factory=set)
    kept: int = 0
    clock: float = 0.0
    peak: int = 0
    mark: int | None = None
    last: int | None = None

    # --- the shape ----------------------------------------------------------------------------------
    def natural(self, n: int) -> int:
        """The step's bytes above ``held`` at size ``n``, as it is written."""
        if self.shape == "bend" and n > self.knee:
            return self.fixed + self.per_sample * self.knee + self.per_sample * (n - self.knee) // 20
        return self.fixed + self.per_sample * n + int(self.curve * n * n)

    def need(self, n: int) -> int:
        """The bytes size ``n`` holds at its peak. Clamped: XLA rematerializes the sizes up to
        ``knee`` whose natural need passes the cap to hold them just under it; larger ones it cannot."""
        natural = self.held + self.natural(n)
        if self.shape == "clamped" and natural > 0.997 * self.limit and n <= self.knee:
            return int(0.997 * self.limit)
        return natural

    def room_now(self) -> int:
        lost = min(0.6, self.failed * self.shrink_per_failure) * (self.room - self.held)
        return self.room - int(lost) - self.kept

    def fits(self, n: int, fresh: bool = False) -> bool:
        return self.need(n) <= (self.room if fresh else self.room_now())

    def largest(self, fresh: bool, most: int) -> int:
        """The largest size that fits (0 if none), no larger than ``most``."""
        if not self.fits(1, fresh):
            return 0
        low, high = 1, 2
        while high <= most and self.fits(high, fresh):
            low, high = high, 2 * high
        high = min(high, most + 1)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self.fits(middle, fresh) else (low, middle)
        return low

    def measured(self, n: int) -> int:
        own = self.need(n) - self.held
        if self.noise:
            own = int(own * (1 + self.noise * ((n * 2654435761) % 1000 / 500 - 1)))
        return self.held + self.kept + own

    def predicted(self, n: int) -> int:
        exact = self.need(n)
        if self.predictions == "lagging":
            return self.held + int(0.8 * (exact - self.held))
        if self.predictions == "beside":  # leaves out half of what is in use beside the step
            return exact - self.held // 2
        if self.predictions == "constant":  # XLA's CPU figure: arguments and outputs, no temporaries
            return self.held + self.fixed
        return exact

    # --- the step and what a framework reports ---------------------------------------------------
    def step(self, n: int) -> None:
        self.calls += 1
        if not self.fits(n):
            self.failed += 1
            self.kept += self.kept_per_failure
            self.clock += self.fail_seconds
            raise MemoryError("RESOURCE_EXHAUSTED: out of memory while trying to allocate")
        self.clock += 1.0
        self.ran.add(n)
        self.last = self.measured(n)
        self.peak = max(self.peak, self.last)

    def measure(self) -> int | None:
        last, self.last = self.last, None
        return last

    def stats(self, device: int = 0, *, nvml: bool = True) -> unimem.MemoryStats:
        peak: int | None = self.peak
        if not self.resettable and self.mark is not None and self.peak <= self.mark:
            peak = None  # JAX: a peak below the process's peak so far reads None
        reserved, block = self.pieces()
        return unimem.MemoryStats(
            backend="jax",
            device=device,
            allocated=self.held + self.kept,
            peak_allocated=peak,
            limit=self.limit,
            reserved=reserved,
            largest_free_block=block,
        )

    def pieces(self) -> tuple[int | None, int | None]:
        """The pool's bytes and its largest free block; unknown unless a pool is simulated."""
        return None, None

    def reset_peak(self, device: int = 0) -> None:
        if self.resettable:
            self.peak = self.held + self.kept
        else:
            self.mark = self.peak

    def clear_cache(self, device: int = 0) -> int:
        return 0


class Current:
    """The device the patched adapters answer for."""

    device: Device | None = None


@pytest.fixture
def simulated(monkeypatch: pytest.MonkeyPatch) -> Current:
    """The JAX and torch adapters' ``stats``/``reset_peak``/``clear_cache`` answered by
    ``Current.device``, the search timed by its clock, and no garbage collection per failure
    (nothing real is allocated: it only costs time over thousands of searches)."""
    current = Current()

    def answer(name: str) -> Any:
        return lambda *a, **k: getattr(current.device, name)(*a, **k)

    for framework in ("jax", "torch"):
        for name in ("stats", "reset_peak", "clear_cache"):
            monkeypatch.setattr(registry.get_backend(framework), name, answer(name))
    monkeypatch.setattr(runner, "clock", lambda: current.device.clock if current.device else 0.0)
    no_collection(monkeypatch)
    show_a_device(monkeypatch)
    return current


def search(device: Device, reading: str, **kwargs: Any) -> unimem.BatchSizeSearch:
    """Run the search on ``device``, reading its figures as ``reading`` says."""
    if device.predictions != "none":
        kwargs["lower"] = device.predicted
    if reading.startswith("stats"):
        device.resettable = reading != "stats-unresettable"
        kwargs["backend"] = "torch" if reading == "stats-torch" else "jax"
    elif reading == "measure":
        # A reading over limit= fails its trial: the limit sits above the readings' noise, so
        # that the device's own room is what bounds the answer.
        kwargs.update(measure=device.measure, limit=math.ceil(device.limit * (1 + device.noise)))
    elif device.predictions != "none":
        kwargs["limit"] = device.limit  # blind: only the predictions are held against it
    kwargs.setdefault("backend", "nvml")  # no framework's figures: the step's own, or none
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", unimem.UnimemWarning)
        return unimem.find_batch_size(device.step, return_trials=True, **kwargs)


def check(device: Device, found: unimem.BatchSizeSearch, max_trials: int, margin: float, max_size: int) -> None:
    """What every case must show, by the simulated step's own count."""
    assert device.calls <= max_trials, str(found)
    assert (device.calls, device.failed) == (found.step_calls, found.failed_calls), str(found)
    assert found.batch_size in device.ran, str(found)
    fresh = device.largest(fresh=True, most=max_size)
    assert found.batch_size <= fresh, f"{found.batch_size} > {fresh}\n{found}"
    if found.converged:
        now = device.largest(fresh=False, most=max_size)
        assert found.batch_size >= (1 - margin) * now, f"{found.batch_size} < (1 - {margin}) x {now}\n{found}"
    else:
        assert device.calls >= max_trials - 1, str(found)  # only a spent budget stops it short


def build(
    shape: str,
    held: int,
    fixed: int,
    per_sample: int,
    true_max: int,
    headroom: float,
    slack: float,
    **extra: Any,
) -> Device:
    """A device on which ``true_max`` is the largest size that fits in a fresh process, reporting
    a limit ``headroom`` times its room (a pool grown on demand fits less than its limit)."""
    device = Device(shape, held, fixed, per_sample, room=0, limit=0, **extra)
    if shape == "convex":
        device.curve = extra.get("curve", 0.0) or per_sample / max(true_max, 1)
    if shape == "bend":
        device.knee = max(1, true_max // 3)
    step_up = device.natural(true_max + 1) - device.natural(true_max)
    device.room = held + device.natural(true_max) + int(slack * max(step_up - 1, 0))
    device.limit = int(device.room * headroom)
    if shape == "clamped":
        # The cap is the room; the sizes from where the natural need passes it up to true_max
        # run rematerialized just under it (their measured and predicted peaks alike).
        device.knee = true_max
        device.room = device.limit = held + max(device.natural(1) + 1, int(device.natural(true_max) / 1.15))
    return device


@settings(
    max_examples=5000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    shape=st.sampled_from(SHAPES),
    held=st.integers(0, 1 << 34),
    fixed=st.integers(0, 1 << 31),
    per_sample=st.integers(1 << 8, 1 << 24),
    true_max=st.integers(1, 300_000),
    headroom=st.sampled_from([1.0, 1.0, 1.1, 1.35]),
    slack=st.floats(0, 1),
    kept=st.sampled_from([0, 0, 100, 2150]),
    shrink=st.sampled_from([0.0, 0.0, 0.005, 0.05, 0.5]),
    noise=st.sampled_from([0.0, 0.0, 0.01, 0.03]),
    predictions=st.sampled_from(PREDICTIONS),
    reading=st.sampled_from(READINGS),
    costly=st.booleans(),
    start=st.sampled_from([1, 8, 32, 128, 1024]),
    margin=st.sampled_from([0.01, 0.05, 0.05, 0.2]),
    max_trials=st.sampled_from([4, 8, 20, 40]),
    max_size=st.sampled_from([None, None, 5000, 1 << 20]),
)
# The shape an H200 showed (a JAX MLP with growth on, a 104.85 GiB limit it could not reach):
# each failure kept ~94 MiB, which lowered the sure bound just under the failure, so no failure
# ever refuted it and the search crept down 0.09% a trial, each costing 25 s.
@example(
    shape="linear",
    held=2 * GiB,
    fixed=0,
    per_sample=45_842,
    true_max=1_700_000,
    headroom=1.35,
    slack=0.5,
    kept=2150,
    shrink=0.0,
    noise=0.0,
    predictions="none",
    reading="stats-unresettable",
    costly=True,
    start=8,
    margin=0.05,
    max_trials=20,
    max_size=None,
)
# Lagging predictions and one measured run: the bytes two failures kept, held against the
# predicted scale, ruled out the largest size that still fit (1035), one under the margin.
@example(
    shape="bend",
    held=0,
    fixed=0,
    per_sample=256,
    true_max=1715,
    headroom=1.1,
    slack=0.0,
    kept=100,
    shrink=0.0,
    noise=0.0,
    predictions="lagging",
    reading="stats",
    costly=False,
    start=1024,
    margin=0.01,
    max_trials=8,
    max_size=None,
)
@pytest.mark.slow
def test_every_shape_ends_within_its_budget_with_a_size_that_ran(
    simulated: Current,
    shape: str,
    held: int,
    fixed: int,
    per_sample: int,
    true_max: int,
    headroom: float,
    slack: float,
    kept: int,
    shrink: float,
    noise: float,
    predictions: str,
    reading: str,
    costly: bool,
    start: int,
    margin: float,
    max_trials: int,
    max_size: int | None,
) -> None:
    if reading == "stats-torch":  # torch neither rematerializes nor keeps a failed step's outputs,
        # and counts every allocation: its peaks are exact but for the pool's rounding
        shape, kept, noise = ("linear" if shape in ("bend", "clamped") else shape), 0, min(noise, 0.01)
    device = build(
        shape,
        held,
        fixed,
        per_sample,
        true_max,
        headroom,
        slack,
        kept_per_failure=per_sample * min(kept, max(true_max // 100, 0)),
        shrink_per_failure=shrink,
        noise=noise,
        predictions=predictions,
        fail_seconds=25.0 if costly else 0.001,
    )
    simulated.device = device
    bound = max_size if max_size is not None and max_size >= start else None
    try:
        found = search(device, reading, start=start, margin=margin, max_trials=max_trials, max_size=bound)
    except unimem.OutOfMemory:
        # Nothing ran: only right when nothing fits any more, or the budget went on halving.
        assert not device.ran and (device.largest(False, 1 << 40) == 0 or device.calls >= max_trials - 1)
        assert device.calls <= max_trials
        return
    check(device, found, max_trials, margin, bound if bound is not None else 1 << 40)


def test_the_h200_shape_that_crept_now_ends(simulated: Current) -> None:
    # The H200 shape above, alone: before, each failure kept 94 MiB, which lowered the sure
    # bound by ~2150 samples to just under the failure, and the search tried it again: 60
    # calls gave 59 failures 0.09% apart (25 s each) and no answer but the start.
    device = build("linear", 2 * GiB, 0, 45_842, 1_700_000, 1.35, 0.5, kept_per_failure=45_842 * 2150)
    device.fail_seconds = 25.0
    simulated.device = device
    found = search(device, "stats-unresettable", start=8, max_trials=20)
    check(device, found, 20, 0.05, 1 << 40)
    assert found.converged and found.failed_calls <= 3 and found.step_calls <= 14, str(found)


@pytest.mark.slow
def test_a_costly_failure_makes_the_search_approach_from_below(simulated: Current) -> None:
    # The same devices (their limit 2-20% over what they hold), once with failures 25 times as
    # slow as a run that fits (JAX), once with failures as cheap as torch's.
    def failures(seconds: float, predictions: str, seed: int, cases: int) -> int:
        rng, total = random.Random(seed), 0
        for _ in range(cases):
            true_max = rng.randint(1000, 300_000)
            device = build(
                rng.choice(["linear", "convex"]),
                rng.randint(0, 1 << 34),
                rng.randint(0, 1 << 31),
                rng.randint(1 << 8, 1 << 24),
                true_max,
                rng.choice([1.02, 1.05, 1.1, 1.2]),
                rng.random(),
                predictions=predictions,
                fail_seconds=seconds,
            )
            device.kept_per_failure = device.per_sample * rng.choice([0, true_max // 50])
            simulated.device = device
            found = search(device, "stats", start=8, max_trials=20)
            check(device, found, 20, 0.05, 1 << 40)
            total += found.failed_calls
        return total

    # The H200 shape alone (a failure's outputs kept, the limit 35% over what fits).
    h200 = {}
    for seconds in (25.0, 0.001):
        device = build("linear", 2 * GiB, 0, 45_842, 1_700_000, 1.35, 0.5, kept_per_failure=45_842 * 2150)
        device.fail_seconds = seconds
        simulated.device = device
        h200[seconds] = search(device, "stats-unresettable", start=8, max_trials=20).failed_calls
    assert h200[25.0] < h200[0.001], h200
    # Over many devices, fewer failures when they are costly (per 60 devices they differ by a few either
    # way; over 720, 1101 against 1118).
    costly = sum(failures(25.0, "exact", seed, 60) for seed in range(1, 13))
    cheap = sum(failures(0.001, "exact", seed, 60) for seed in range(1, 13))
    assert costly <= cheap, (costly, cheap)


def test_exact_predictions_under_a_cap_run_two_sizes_and_never_fail(simulated: Current) -> None:
    for shape in SHAPES:
        device = build(shape, 4 * GiB, 1 * GiB, 40_000, 100_000, 1.0, 0.5, predictions="exact", fail_seconds=25.0)
        simulated.device = device
        found = search(device, "stats-unresettable", start=8, max_trials=20)
        check(device, found, 20, 0.05, 1 << 40)
        assert found.failed_calls == 0, str(found)
        if shape != "clamped":  # there a flat stretch of predictions takes a second placement
            assert [t.reason for t in found.trials] == ["start", "predicted"] and found.compile_calls <= 8, str(found)


def test_an_interrupt_carries_the_best_size_so_far(simulated: Current) -> None:
    device = build("linear", 1 * GiB, 0, 1 << 20, 5000, 1.0, 0.0)
    simulated.device = device
    ran: list[int] = []

    def step(n: int) -> None:
        if len(ran) == 2:
            raise KeyboardInterrupt
        device.step(n)
        ran.append(n)

    with pytest.raises(KeyboardInterrupt) as info:
        unimem.find_batch_size(step, start=8, backend="jax")
    assert info.value.unimem_best_size == max(ran)  # type: ignore[attr-defined]
    notes = getattr(info.value, "__notes__", None)
    if notes is not None:  # Python 3.11+
        assert any(f"the largest batch size that ran: {max(ran)}" in note for note in notes), notes
    with pytest.raises(KeyboardInterrupt) as info:
        unimem.find_batch_size(
            lambda n: (_ for _ in ()).throw(KeyboardInterrupt()), backend="nvml", start=8, measure=lambda: 1
        )
    assert info.value.unimem_best_size is None  # type: ignore[attr-defined]


def test_progress_lines_go_to_stderr_only_when_asked_or_on_a_terminal(
    simulated: Current, capsys: pytest.CaptureFixture[str]
) -> None:
    device = build("linear", 1 * GiB, 0, 1 << 20, 5000, 1.0, 0.0, predictions="exact")
    simulated.device = device
    found = search(device, "stats", start=8, progress=True)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("find_batch_size  call")]
    assert out == "" and len(lines) == found.step_calls, err
    assert "fits" in lines[0] and f"/{20}" in lines[0] and "(start)" in lines[0]
    assert sum("compiled" in line for line in err.splitlines()) == found.compile_calls
    simulated.device = build("linear", 1 * GiB, 0, 1 << 20, 5000, 1.0, 0.0)
    search(simulated.device, "stats", start=8)  # progress=None: stderr is no terminal here
    assert capsys.readouterr().err == ""
    with pytest.raises(unimem.ConfigError) as info:
        unimem.find_batch_size(device.step, start=8, progress="yes")  # type: ignore[call-overload]
    assert info.value.parameter == "progress"


class H200TorchMLP(Device):
    """benchmarks/bench_search_rows.py's torch MLP (8 x Linear(4096), AdamW, 16 GiB cap) as the
    H200 measured its peaks (benchmarks/results/search-gpu-h200.json): AdamW's temporaries set
    the peak up to ~5000 samples, then 213 kB a sample. Held before: parameters, gradients and
    AdamW's two moments, 16 bytes for each of its 134M parameters."""

    PEAKS = ((0, 2_754_216_448), (64, 2_754_216_448), (1733, 2_781_561_344), (44_244, 11_112_154_112))
    PEAKS += ((72_546, 17_137_271_808), (1 << 24, 17_137_271_808 + 213_000 * ((1 << 24) - 72_546)))

    def need(self, n: int) -> int:
        (n0, p0), (n1, p1) = next((a, b) for a, b in itertools.pairwise(self.PEAKS) if n <= b[0])
        return int(p0 + (p1 - p0) * (n - n0) / (n1 - n0))


def test_the_h200_torch_mlp_takes_six_calls(simulated: Current) -> None:
    # On the H200 the search called its step 9 times: 2 failures while the peaks were flat, a
    # third as the closing step, then the answer re-run and a settling call. Torch rematerializes
    # nothing, so once the peaks rise steadily up to the cap the line through them bounds the
    # answer: no closing failure, no re-run.
    device = H200TorchMLP("linear", 134_000_000 * 16, 0, 213_000, room=17_160_000_000, limit=16 * GiB)
    simulated.device = device
    found = search(device, "stats-torch", start=64, max_trials=20)
    check(device, found, 20, 0.05, 1 << 40)
    assert found.converged and found.step_calls <= 6 and found.confirmations == (), str(found)
    assert found.batch_size >= 0.95 * device.largest(fresh=True, most=1 << 40)


@dataclass
class GrowthPool(Device):
    """JAX with growth on under a cap, as its allocator works: the pool takes regions from the
    device on demand and keeps them; each request is cut from one region, and a step's new
    bytes come as one buffer (XLA's temporaries), so a free region smaller than a step is of no
    use to it. Compiling a size allocates ``autotune`` of that step's bytes from the pool (XLA
    autotunes its kernels on real buffers), so every compilation can leave a region behind."""

    autotune: float = 0.25
    regions: list[int] = field(default_factory=list)  # the pool's free regions, in bytes

    @property
    def pool(self) -> int:
        return self.held + self.kept + sum(self.regions)

    def extra(self, n: int) -> int:
        return self.need(n) - self.held

    def _take(self, size: int) -> bool:
        """Cut ``size`` bytes from a free region, else from a new one under the cap."""
        if size <= max(self.regions, default=0):
            return True
        if size <= self.limit - self.pool:
            self.regions.append(size)
            return True
        return False

    def fits(self, n: int, fresh: bool = False) -> bool:
        if fresh:  # a fresh process compiles the size (its autotuning region stays), then runs it
            return self.extra(n) <= self.limit - self.held - int(self.autotune * self.extra(n))
        return self.extra(n) <= max(self.limit - self.pool, max(self.regions, default=0))

    def predicted(self, n: int) -> int:
        self._take(int(self.autotune * self.extra(n)))
        return super().predicted(n)

    def step(self, n: int) -> None:
        if self.fits(n):
            self._take(self.extra(n))
        super().step(n)

    def pieces(self) -> tuple[int | None, int | None]:
        return self.pool, max(self.regions, default=0)


@pytest.mark.parametrize("autotune", [0.0, 0.1, 0.25, 0.5])
def test_a_pool_grown_on_demand_is_read_again_before_each_run(simulated: Current, autotune: float) -> None:
    # Where compilations leave the pool regions too small for a step's temporaries and too much
    # for a new one, the capacity read once at the start is too high: it is read from the pool
    # again before each run, so no run fails and the answer runs again where the search left it.
    device = GrowthPool("linear", 700 * MiB, 64 * MiB, 131_072, room=8 * GiB, limit=8 * GiB,
                        predictions="exact", fail_seconds=25.0, autotune=autotune)  # fmt: skip
    simulated.device = device
    found = search(device, "stats-unresettable", start=64, max_trials=6)
    check(device, found, 6, 0.05, 1 << 40)
    assert found.failed_calls == 0, str(found)
    assert device.fits(found.batch_size), str(found)
    assert found.batch_size >= 0.95 * device.largest(fresh=False, most=1 << 40), str(found)


@dataclass
class RegionPool(Device):
    """JAX with growth on under a cap, as its allocator was seen to work on an H200: the pool
    takes regions on demand, each twice the last (at most what is left under the cap), and keeps
    them. A step's temporaries come as one buffer, cut from the largest free block or from a new
    region; its inputs and outputs, smaller buffers, fit in what the pool has free. Compiling a
    size autotunes its kernels on real buffers (half the step's temporaries) and leaves the
    region that took in the pool. ``lower(n)`` gives the peak and the largest buffer."""

    outputs: int = 0  # the step's outputs (new parameters and optimizer state), kept by a failure
    inputs_per_sample: int = 0
    regions: list[int] = field(default_factory=list)  # the regions beside ``held``'s
    block: int = 0  # the largest free block
    last_region: int = 0

    def temp(self, n: int) -> int:
        return self.need(n) - self.held - self.outputs - self.inputs_per_sample * n

    @property
    def pool(self) -> int:
        return self.held + sum(self.regions)

    def room_now(self) -> int:
        return self.room - self.kept

    def _piece(self) -> int:
        return max(self.block, self.limit - self.pool)

    def _grow(self, want: int) -> None:
        """A region for ``want`` bytes where no free block holds them (none when none fits)."""
        if want <= self.block:
            return
        size = min(max(want, 2 * self.last_region), self.limit - self.pool)
        if size >= want:
            self.regions.append(size)
            self.last_region, self.block = size, max(self.block, size)  # free again after use

    def fits(self, n: int, fresh: bool = False) -> bool:
        if fresh:
            start = RegionPool(**{**self.__dict__, "regions": list(self.regions[:3]), "kept": 0, "failed": 0})
            start.block, start.last_region = self.regions[2], self.regions[2]
            start._grow(self.temp(n) // 2)  # the fresh process compiles the size first
            return start.fits(n)
        return self.need(n) + self.kept <= self.limit and self.temp(n) <= self._piece()

    def predicted(self, n: int) -> tuple[int, int]:  # type: ignore[override]
        self._grow(self.temp(n) // 2)
        return self.need(n), self.temp(n)

    def step(self, n: int) -> None:
        if self.fits(n):
            self._grow(self.temp(n))
        super().step(n)

    def pieces(self) -> tuple[int | None, int | None]:
        return self.pool, self.block


@pytest.mark.parametrize("per_sample", [96 * 1024, 160 * 1024, 1 << 20])
def test_a_pool_of_regions_holds_the_largest_buffer_against_its_largest_piece(
    simulated: Current, per_sample: int
) -> None:
    # The peak alone says nothing of the pieces: a pool whose free bytes lie in regions too small
    # for the step's temporaries fails a size predicted well under the cap. Held against the
    # largest piece the allocator can hand out, the first size placed runs and is the answer.
    held, outputs = 700 * MiB, 700 * MiB
    device = RegionPool("linear", held, outputs + 64 * MiB, per_sample, room=8 * GiB, limit=8 * GiB,
                        predictions="exact", fail_seconds=10.0, kept_per_failure=outputs, outputs=outputs,
                        inputs_per_sample=8 * 1024, regions=[256 * MiB, 512 * MiB, 770 * MiB],
                        block=770 * MiB, last_region=770 * MiB)  # fmt: skip
    simulated.device = device
    found = search(device, "stats-unresettable", start=64, max_trials=6)
    assert (device.calls, device.failed) == (found.step_calls, found.failed_calls), str(found)
    assert found.failed_calls == 0, str(found)
    assert found.step_calls <= 3, str(found)
    assert device.fits(found.batch_size), str(found)
    assert found.batch_size >= 0.95 * device.largest(fresh=False, most=1 << 40), str(found)
    assert found.batch_size <= device.largest(fresh=True, most=1 << 40), str(found)
    # Held against the peak alone, the cap would have placed a size whose temporaries do not fit.
    over_cap = max(n for n in range(found.batch_size, 4 * found.batch_size, 64) if device.need(n) <= device.limit)
    assert not device.fits(over_cap), str(found)


@pytest.mark.parametrize("bad", [-1, (-1, 0), (100, -1), (100, 101)])
def test_a_prediction_no_pool_can_hold_is_refused_before_any_call(simulated: Current, bad: object) -> None:
    device = Device("linear", 700 * MiB, 64 * MiB, 131_072, room=8 * GiB, limit=8 * GiB)
    simulated.device = device
    with pytest.raises(unimem.ConfigError) as raised:
        unimem.find_batch_size(device.step, start=64, backend="jax", lower=lambda n: bad)
    assert raised.value.parameter == "lower" and repr(bad) in str(raised.value)
    assert device.calls == 0
