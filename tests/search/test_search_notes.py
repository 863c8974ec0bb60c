"""What ``find_batch_size`` says besides its answer: notes that are true of the peaks it saw and
name the framework searched, a bound on its time, the batch size a step's own error came at,
and progress lines that stay one line each in a pipe or a log file.

The steps are pure Python on a simulated device (``api``'s functions answered by the test), and
the search is timed by a simulated clock: nothing here waits or allocates.
"""

from __future__ import annotations

import io
import math
import random
import sys
import warnings
from typing import Any

import pytest
from conftest import run_py
from device_view import no_collection, show_a_device
from hypothesis import given, settings
from hypothesis import strategies as st

import unimem
from unimem import registry
from unimem.search import runner
from unimem.search.progress import Progress
from unimem.search.rules import knee, saturation_note

MiB = 1 << 20


@pytest.fixture(autouse=True)
def simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device the framework-free view shows (so no host limit), and no collection per failure."""
    show_a_device(monkeypatch)
    no_collection(monkeypatch)


def _says_saturated(notes: tuple[str, ...]) -> bool:
    return any("stopped growing" in n or "reached the limit" in n or "saves memory" in n for n in notes)


# --- no saturation note while the peaks keep growing ------------------------------------------


class NoisyLine:
    """A step needing ``fixed + per_sample × n`` bytes, each reading off by up to 1% of it."""

    def __init__(self, fixed: int, per_sample: int, true_max: int, seed: int) -> None:
        self.fixed, self.per_sample = fixed, per_sample
        self.cap = fixed + per_sample * true_max
        self.random = random.Random(seed)
        self.last: int | None = None

    def __call__(self, n: int) -> None:
        need = self.fixed + self.per_sample * n
        if need > self.cap:
            raise MemoryError("out of memory")
        self.last = int(need * (1 + self.random.uniform(-0.01, 0.01)))

    def measure(self) -> int | None:
        last, self.last = self.last, None
        return last


@settings(max_examples=150, deadline=None)
@given(
    fixed=st.sampled_from([0, 100 * MiB, 600 * MiB, 2000 * MiB]),
    per_sample=st.integers(MiB // 64, 4 * MiB),
    true_max=st.integers(20, 5000),
    start=st.sampled_from([1, 4, 8, 32]),
    seed=st.integers(0, 2**32 - 1),
)
def test_noisy_linear_peaks_get_no_saturation_note(
    fixed: int, per_sample: int, true_max: int, start: int, seed: int
) -> None:
    # A torch MLP's peaks grew linearly from 681 to 1034 MiB, yet the search said "above about
    # 237 the peak stopped growing"; with 1% noise in the readings it said so at 38 and 32.
    step = NoisyLine(fixed, per_sample, true_max, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", unimem.UnimemWarning)
        found = unimem.find_batch_size(
            # A reading over limit= fails its trial: the limit sits above the readings' 1% noise.
            step,
            backend="nvml",
            start=min(start, true_max),
            measure=step.measure,
            limit=math.ceil(step.cap * 1.01),
            return_trials=True,
        )
    assert not _says_saturated(found.notes), str(found)
    assert "saturated" not in [t.reason for t in found.trials], str(found)


@settings(max_examples=300, deadline=None)
@given(
    fixed=st.integers(0, 1 << 32),
    per_sample=st.integers(1 << 10, 1 << 24),  # a reading is bytes: kibibytes a sample at least
    sizes=st.lists(st.integers(1, 100_000), min_size=3, max_size=8, unique=True),
    seed=st.integers(0, 2**32 - 1),
)
def test_no_knee_in_a_noisy_line(fixed: int, per_sample: int, sizes: list[int], seed: int) -> None:
    noise = random.Random(seed)
    points = [(n, int((fixed + per_sample * n) * (1 + noise.uniform(-0.01, 0.01)))) for n in sizes]
    top = max(p for _, p in points)
    assert knee(points, top) is None
    assert saturation_note(points, top, max(sizes)) is None


def test_a_real_knee_is_still_found() -> None:
    # Exact readings: 36.9 kB a sample up to 2.79 GB, then 1.8 kB a sample, 5% apart.
    points = [(32, 68_180_800), (64, 69_361_600), (77_576, 2_600_000_000), (81_659, 2_607_500_000)]
    assert knee(points, 2_800_000_000) is not None


# --- the explanation is the framework's own ------------------------------------------------------


class FlatPool:
    """A framework's figures as ``stats()`` gives them: peaks that grow 36.9 kB a sample, then,
    past 2.79 GB, a twentieth as fast (XLA rematerializing), until a quarter more does not fit."""

    def __init__(self, framework: str) -> None:
        self.framework = framework
        self.a, self.b, self.cap, self.target = 67_000_000, 36_900, 3_003_000_000, 2_790_000_000
        self.peak = 0

    def step(self, n: int) -> None:
        natural = self.a + self.b * n
        if natural > 1.25 * self.target:
            raise MemoryError("RESOURCE_EXHAUSTED: out of memory")
        self.peak = natural if natural <= self.target else self.target + (natural - self.target) // 20

    def stats(self, device: int = 0, *, nvml: bool = True) -> unimem.MemoryStats:
        return unimem.MemoryStats(
            backend=self.framework, device=device, allocated=0, peak_allocated=self.peak, limit=self.cap
        )

    def reset_peak(self, device: int = 0) -> None:
        self.peak = 0

    def clear_cache(self, device: int = 0) -> int:
        return 0


def _flat_search(monkeypatch: pytest.MonkeyPatch, framework: str) -> unimem.BatchSizeSearch:
    pool = FlatPool(framework)
    for name in ("stats", "reset_peak", "clear_cache"):
        monkeypatch.setattr(registry.get_backend(framework), name, getattr(pool, name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", unimem.UnimemWarning)
        return unimem.find_batch_size(pool.step, start=32, backend=framework, return_trials=True)


def test_a_jax_search_names_xla_and_a_torch_search_never_does(monkeypatch: pytest.MonkeyPatch) -> None:
    jax = _flat_search(monkeypatch, "jax")
    note = next(n for n in jax.notes if "stopped growing" in n or "reached the limit" in n)
    assert "XLA rematerializes" in note, jax.notes
    # torch saves no memory near its limit: flat readings are no sign of it, and XLA is not torch's.
    torch = _flat_search(monkeypatch, "torch")
    assert not any("XLA" in n for n in torch.notes) and not _says_saturated(torch.notes), torch.notes


# --- a bound on the search's time ----------------------------------------------------------------


class Clocked:
    """A step on a simulated clock: each call takes ``seconds``; sizes above ``largest`` fail."""

    def __init__(self, largest: int, seconds: float = 1.0) -> None:
        self.largest, self.seconds, self.now = largest, seconds, 0.0
        self.calls: list[int] = []

    def __call__(self, n: int) -> None:
        self.calls.append(n)
        self.now += self.seconds
        if n > self.largest:
            raise MemoryError("out of memory")


def _timed(monkeypatch: pytest.MonkeyPatch, step: Clocked, **kwargs: Any) -> unimem.BatchSizeSearch:
    monkeypatch.setattr(runner, "clock", lambda: step.now)
    return unimem.find_batch_size(step, return_trials=True, **{"backend": "nvml", **kwargs})


def test_time_limit_ends_the_search_with_the_best_size_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    step = Clocked(largest=100_000)
    with pytest.warns(unimem.UnimemWarning, match="time_limit=3.5 s passed"):
        found = _timed(monkeypatch, step, start=8, time_limit=3.5)
    assert step.calls == [t.batch_size for t in found.trials] and len(step.calls) == 4  # no call after the bound
    assert found.batch_size == max(step.calls) and found.converged is False and found.time_limit_passed
    assert "time_limit=3.5 s passed after 4 call(s)" in found.notes[0]
    assert "NOT converged (time_limit passed)" in str(found) and found.as_dict()["time_limit_passed"] is True


def test_time_limit_skips_the_re_run_once_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    step = Clocked(largest=100)
    with pytest.warns(unimem.UnimemWarning):
        found = _timed(monkeypatch, step, start=64, time_limit=3.5)
    # 64 fits, 128 fails, 90 fits, 106 fails: then time is up, and 90 is not re-run.
    assert len(found.trials) == len(step.calls) == 4 and not found.trials[-1].fits, str(found)
    assert found.confirmations == () and found.confirmed is None
    assert any("was not re-run" in n and "time_limit=3.5 s passed" in n for n in found.notes), found.notes


def test_a_search_within_its_time_limit_is_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    step = Clocked(largest=37)
    found = _timed(monkeypatch, step, start=4, margin=0.0, time_limit=1000)
    assert found.batch_size == 37 and found.converged and not found.time_limit_passed
    assert not any("time_limit" in n for n in found.notes)


def test_time_limit_with_nothing_fit_yet_is_out_of_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    step = Clocked(largest=10)
    with pytest.raises(unimem.OutOfMemory, match="before time_limit=1.5 s passed"):
        _timed(monkeypatch, step, start=1000, time_limit=1.5)
    assert len(step.calls) == 2


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "5"])
def test_a_bad_time_limit_is_refused_before_any_call(bad: object) -> None:
    step = Clocked(largest=10)
    with pytest.raises(unimem.ConfigError) as info:
        unimem.find_batch_size(step, start=4, time_limit=bad)  # type: ignore[call-overload]
    assert info.value.parameter == "time_limit" and step.calls == []


# --- a step's own error says at which batch size ---------------------------------------------------


def test_a_steps_own_error_says_at_which_batch_size() -> None:
    error = ValueError("shapes do not match")

    def step(n: int) -> None:
        if n > 20:
            raise error

    with pytest.raises(ValueError) as info:
        unimem.find_batch_size(step, backend="nvml", start=8, margin=0.0)
    assert info.value is error  # the step's own error, as it came
    size = info.value.unimem_batch_size  # type: ignore[attr-defined]
    assert size > 20 and f"at batch size {size}" in "\n".join(info.value.__notes__)


def test_a_lowering_error_says_at_which_batch_size() -> None:
    def lower(n: int) -> int:
        if n > 8:
            raise TypeError("cannot lower")
        return 1000 * n

    with pytest.raises(TypeError) as info:
        unimem.find_batch_size(lambda n: None, backend="nvml", start=8, lower=lower, limit=10**9)
    size = info.value.unimem_batch_size  # type: ignore[attr-defined]
    assert size > 8 and f"lower({size}) raised this" in "\n".join(info.value.__notes__)


# --- progress lines: one line each, wherever they go ------------------------------------------------


def test_progress_lines_are_not_wrapped_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()  # no terminal: a log file, a pipe
    monkeypatch.setattr(sys, "stderr", stream)
    shown = Progress(True)
    shown.call(131_072, True, 7 * 1024 * MiB, 123.45, "predicted-split", 123, 1000)
    shown.compiled(131_072, 7 * 1024 * MiB, 12.5, largest=3 * 1024 * MiB, room=5 * 1024 * MiB)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and all(len(line) > 80 for line in lines), lines
    assert lines[0].startswith("find_batch_size  call 123/1000") and lines[0].endswith("(predicted-split)")


def test_progress_lines_are_not_wrapped_in_a_pipe() -> None:
    code = """
    import unimem
    def step(n):
        if n > 50_000:
            raise MemoryError("out of memory")
    unimem.find_batch_size(step, backend="nvml", start=8, max_trials=1000, progress=True, collective=False)
    """
    done = run_py(code, env={"COLUMNS": None})
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines and all(line.startswith("find_batch_size  call ") for line in lines), done.stderr
    assert any(len(line) > 80 for line in lines), lines
