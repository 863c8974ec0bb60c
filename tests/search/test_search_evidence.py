"""The search answers only what its trials showed: peaks that do not grow end it with a
``SearchError`` that says so (never a size nobody can allocate), memory that grows from call to
call at one size is named a leak (never an answer that failed its own re-check), ``limit=`` holds
the host's readings where those are the peaks, a step of no framework needs ``backend=``, and a
search with ``lower=`` on a host grows as a measured one does and stops at once on Ctrl-C.

The hosts and devices here are simulated (``test_search_host.Host``, adapters answered by the
test); the real frameworks run in fresh processes.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import device_view
import pytest
from conftest import REPO, subprocess_env
from device_view import show_a_device
from test_search_host import Host

import unimem
from unimem import registry
from unimem.search.host_limit import GROWTH, SHARE

MiB, GiB = 1 << 20, 1 << 30


@pytest.fixture(autouse=True)
def no_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    """No garbage collection per failure: nothing real is allocated."""
    device_view.no_collection(monkeypatch)


def _device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device the framework-free view shows: the step's figures are its own, not the host's."""
    show_a_device(monkeypatch)


def _quietly(step: Any, **kwargs: Any) -> unimem.BatchSizeSearch:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", unimem.UnimemWarning)
        return unimem.find_batch_size(step, return_trials=True, **kwargs)


# --- peaks that do not grow -------------------------------------------------------------------


def test_a_step_whose_resident_peak_does_not_grow_ends_with_a_search_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, the search answered 1152921504606846976 after 20 trials, with a warning.
    host = Host(available=2 * GiB, resident=300 * MiB, fixed=20 * MiB, per_sample=0)
    host.serve(monkeypatch)
    with pytest.raises(unimem.SearchError, match="the peaks did not grow with the batch size") as info:
        _quietly(host.step, backend="nvml", start=8)
    assert "a byte a sample" in str(info.value) and "measure=" in str(info.value)
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, unimem.UnimemError)
    # It ended before a size the host could not hold at one byte a sample, in few calls.
    assert max(host.sizes) <= SHARE * host.free and len(host.sizes) <= 12, host.sizes


def test_a_measure_that_does_not_grow_ends_with_a_search_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _device(monkeypatch)
    sizes: list[int] = []
    with pytest.raises(unimem.SearchError, match="did not grow") as info:
        _quietly(sizes.append, backend="nvml", start=4, measure=lambda: 1000, limit="1GiB")
    assert max(sizes) <= GiB and len(sizes) <= 12, sizes
    assert "(measure=)" in str(info.value)


def test_peaks_that_grow_a_byte_a_sample_still_find_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    # The smallest growth any real step has: the rule that stops flat peaks leaves it alone.
    _device(monkeypatch)
    peaks: list[int] = []

    def step(n: int) -> None:
        if 1000 + n > 1 << 20:
            raise MemoryError("out of memory")
        peaks.append(1000 + n)

    found = _quietly(step, backend="nvml", start=4, measure=lambda: peaks.pop(), limit=1 << 20, margin=0.0)
    assert found.batch_size == (1 << 20) - 1000, str(found)


# --- leaks --------------------------------------------------------------------------------------


class LeakyStep:
    """A step needing ``per_sample × n`` bytes beside all it kept so far, ``leak`` more each call
    (a list of outputs that grows); its peak read by ``measure=``, or through the torch adapter's
    ``stats()``; ``enforce``: past ``cap`` it runs out of memory (else nothing stops it)."""

    def __init__(self, per_sample: int, leak: int, cap: int, enforce: bool = True) -> None:
        self.per_sample, self.leak, self.cap, self.enforce = per_sample, leak, cap, enforce
        self.kept, self.peak, self.last = 0, 0, None
        self.calls: list[int] = []

    def __call__(self, n: int) -> None:
        self.calls.append(n)
        need = self.kept + self.per_sample * n
        if self.enforce and need > self.cap:
            raise MemoryError("out of memory")
        self.peak = max(self.peak, need)
        self.last = need
        self.kept += self.leak

    def measure(self) -> int | None:
        last, self.last = self.last, None
        return last

    def stats(self, device: int = 0, *, nvml: bool = True) -> unimem.MemoryStats:
        return unimem.MemoryStats("torch", device, allocated=self.kept, peak_allocated=self.peak, limit=self.cap)

    def reset_peak(self, device: int = 0) -> None:
        self.peak = self.kept

    def clear_cache(self, device: int = 0) -> int:
        return 0

    def serve(self, monkeypatch: pytest.MonkeyPatch) -> None:
        adapter = registry.get_backend("torch")
        for name in ("stats", "reset_peak", "clear_cache"):
            monkeypatch.setattr(adapter, name, getattr(self, name))


def test_a_leak_read_by_measure_is_named_and_no_size_that_failed_its_re_check_is_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _device(monkeypatch)
    step = LeakyStep(MiB, 96 * MiB, GiB, enforce=False)
    with pytest.raises(unimem.SearchError, match="leaks memory") as info:
        _quietly(step, backend="nvml", start=8, measure=step.measure, limit=GiB)
    assert "fragment" not in str(info.value) and "fix it in the step" in str(info.value)


def test_a_leak_the_framework_reads_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, the answer was a size that no longer ran, with a warning that blamed a fragmented pool.
    step = LeakyStep(MiB, 80 * MiB, GiB)
    step.serve(monkeypatch)
    with pytest.raises(unimem.SearchError, match="leaks memory") as info:
        _quietly(step, backend="torch", start=8)
    assert "fragment" not in str(info.value) and "stats('torch')" in str(info.value)


def test_a_leak_whose_answer_ran_one_size_lower_is_named_with_that_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    step = LeakyStep(MiB, 20 * MiB, GiB)
    step.serve(monkeypatch)
    with pytest.warns(unimem.UnimemWarning, match="leaks memory"):
        found = unimem.find_batch_size(step, backend="torch", start=8, return_trials=True)
    recheck, lower = found.confirmations[:2]
    assert not recheck.fits and lower.fits and found.confirmed is True, str(found)
    assert found.batch_size == lower.batch_size < recheck.batch_size  # never the size that failed its re-check
    assert "leaks memory" in found.notes[-1] and f"{lower.batch_size} ran again" in found.notes[-1]


def test_growth_of_the_host_s_resident_memory_is_called_no_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    # The resident figures count the process's own growth too (JAX's compiled programs, pages the
    # allocator keeps): a JAX search on a CPU host grew 24 MiB between the answer and its re-check.
    host = Host(available=2 * GiB, resident=300 * MiB, fixed=20 * MiB, per_sample=MiB)
    host.serve(monkeypatch)
    cap = 300 * MiB + 20 * MiB + 1000 * MiB  # the step's own out-of-memory error past 1000 samples, at first

    def growing(n: int) -> None:
        if host.resident + host.need(n) > cap:
            raise MemoryError("out of memory")
        host.step(n)
        host.resident += 64 * MiB
        host.free -= 64 * MiB

    with pytest.warns(unimem.UnimemWarning, match="start a fresh process") as caught:
        found = unimem.find_batch_size(growing, backend="nvml", start=8, return_trials=True)
    said = " ".join(str(w.message) for w in caught)
    assert found.confirmed is False and "leak" not in said and "fragment" not in said, said
    assert "no figure of the step's memory in use was read" in said


class Shrinking:
    """A pool that fits less after an out-of-memory error (split segments), while nothing in use grows."""

    def __init__(self, per_sample: int, cap: int) -> None:
        self.per_sample, self.cap, self.peak, self.last = per_sample, cap, 0, None

    def __call__(self, n: int) -> None:
        if self.per_sample * n > self.cap:
            self.cap //= 2
            raise MemoryError("out of memory")
        self.last = self.peak = self.per_sample * n

    def measure(self) -> int | None:
        last, self.last = self.last, None
        return last

    def stats(self, device: int = 0, *, nvml: bool = True) -> unimem.MemoryStats:
        return unimem.MemoryStats("torch", device, allocated=0, peak_allocated=self.peak, limit=1000 * self.per_sample)

    def reset_peak(self, device: int = 0) -> None:
        self.peak = 0

    def clear_cache(self, device: int = 0) -> int:
        return 0


@pytest.mark.parametrize("source", ["measure", "framework"])
def test_an_answer_that_did_not_run_again_blames_no_pool_it_did_not_read(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _device(monkeypatch)
    step = Shrinking(MiB, 1000 * MiB)
    if source == "framework":
        for name in ("stats", "reset_peak", "clear_cache"):
            monkeypatch.setattr(registry.get_backend("torch"), name, getattr(step, name))
        kwargs: dict[str, Any] = {"backend": "torch"}
    else:
        kwargs = {"backend": "nvml", "measure": step.measure, "limit": 1000 * MiB}
    with pytest.warns(unimem.UnimemWarning, match="start a fresh process") as caught:
        found = unimem.find_batch_size(step, start=8, return_trials=True, **kwargs)
    assert found.confirmed is False, str(found)
    said = " ".join(str(w.message) for w in caught) + found.notes[-1]
    assert "fragment" not in said and "leak" not in said.replace("no leak", ""), said
    if source == "framework":  # the bytes in use were read before each call, and did not grow
        assert "had not grown enough to explain that (no leak)" in found.notes[-1], found.notes[-1]


# --- limit= on a host ---------------------------------------------------------------------------


def test_a_limit_on_a_host_holds_the_resident_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, a ConfigError after the first trial asked for measure=, though the host's figures were read.
    host = Host(available=8 * GiB, resident=300 * MiB, fixed=20 * MiB, per_sample=MiB)
    host.serve(monkeypatch)
    limit = 300 * MiB + 256 * MiB
    found = _quietly(host.step, backend="nvml", start=32, limit=limit)
    largest = (limit - host.resident - host.fixed) // host.per_sample
    assert (1 - found.margin) * largest <= found.batch_size <= largest, str(found)
    assert found.limit == limit and found.measured_by.startswith("the process's resident peak")
    assert all(t.peak is not None and t.peak <= limit for t in found.trials if t.fits), str(found)
    assert any(f"limit={unimem.format_bytes(limit)} held against the process's resident peak" in n for n in found.notes)


def test_a_limit_no_higher_than_the_host_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    host = Host(available=GiB, resident=300 * MiB, fixed=0, per_sample=MiB)
    host.serve(monkeypatch)
    found = _quietly(host.step, backend="nvml", start=32, limit=64 * GiB)
    assert found.limit == host.resident + int(SHARE * host.free), str(found)


@pytest.mark.parametrize("case", ["under-resident", "no-host-figures"])
def test_a_limit_that_cannot_work_on_a_host_is_refused_before_any_trial(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = Host(available=8 * GiB, resident=300 * MiB, fixed=0, per_sample=MiB)
    host.serve(monkeypatch)
    if case == "no-host-figures":
        monkeypatch.setattr(unimem.host_memory, "available", lambda: None)
    with pytest.raises(unimem.ConfigError) as info:
        unimem.find_batch_size(host.step, backend="nvml", start=8, limit=64 * MiB)
    assert info.value.parameter == "limit" and host.sizes == []
    expected = "this process holds already" if case == "under-resident" else "measure="
    assert expected in str(info.value)


# --- the backend rule ---------------------------------------------------------------------------


def test_a_step_of_no_framework_needs_a_backend_before_any_trial() -> None:
    # docs/explanation/backend-rule.md: an action with no framework configured or imported is a ConfigError.
    calls: list[int] = []
    with pytest.raises(unimem.ConfigError) as info:
        unimem.find_batch_size(calls.append, start=4)
    assert info.value.parameter == "backend" and calls == []
    assert "backend='nvml'" in str(info.value) and "torch" in str(info.value)

    @unimem.find_batch_size(start=4)
    def decorated(n: int) -> None:
        calls.append(n)

    with pytest.raises(unimem.ConfigError) as info:
        decorated()
    assert info.value.parameter == "backend" and calls == []


# --- lower= on a host ---------------------------------------------------------------------------


def test_predicted_sizes_on_a_host_grow_as_measured_ones_do(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, the predictions placed the second size 4600 times the first: on a CPU, a step that ran
    # for minutes, and one a Ctrl-C could not stop (JAX waits for the computation under way).
    host = Host(available=16 * GiB, resident=300 * MiB, fixed=20 * MiB, per_sample=MiB // 4)
    host.serve(monkeypatch)
    found = _quietly(host.step, backend="nvml", start=64, lower=lambda n: host.need(n))
    largest = host.largest(SHARE)
    assert (1 - found.margin) * largest <= found.batch_size <= largest, str(found)
    ran = 0  # the largest size that ran so far
    for trial in found.trials:
        assert not ran or trial.batch_size <= GROWTH * ran, str(found)
        ran = max(ran, trial.batch_size if trial.fits else 0)
    assert any("host's memory" in n for n in found.notes)


# --- the real frameworks, in fresh processes ----------------------------------------------------

_FLAT_TORCH = r"""
import torch
import unimem
x = torch.randn(64, 64)
try:
    unimem.find_batch_size(lambda n: (x @ x).sum(), start=8)
    out = {"error": None}
except unimem.SearchError as exc:
    out = {"error": str(exc)}
emit(out)
"""


@pytest.mark.covers("torch:batch_size")
@pytest.mark.slow
def test_a_torch_step_whose_memory_does_not_grow_ends_with_an_error(need: Any, pyjson: Any) -> None:
    need("torch")
    out = pyjson(_FLAT_TORCH)
    assert out["error"] is not None and "the peaks did not grow" in out["error"], out


_LIMIT_TORCH = r"""
import torch
import unimem
from unimem import host_memory

calls = []
def step(n):
    calls.append(n)
    a = torch.ones(n, 1 << 18)  # 1 MiB a sample
    return a.add_(1).sum().item()

step(8)
held = host_memory.rss()
out = {"held": held, "limit": held + (128 << 20)}
found = unimem.find_batch_size(step, start=8, limit=out["limit"], return_trials=True)
out["search"] = found.as_dict()
before = len(calls)
try:
    unimem.find_batch_size(step, start=8, limit=held // 2)
except unimem.ConfigError as exc:
    out["low"] = {"parameter": exc.parameter, "calls": len(calls) - before}
emit(out)
"""


@pytest.mark.covers("torch:batch_size")
@pytest.mark.slow
def test_a_limit_on_a_cpu_answers_a_torch_step_within_it(need: Any, pyjson: Any) -> None:
    need("torch")
    out = pyjson(_LIMIT_TORCH)
    search = out["search"]
    assert search["limit"] == out["limit"] and search["converged"], search
    fitted = [t for t in search["trials"] if t["fits"]]
    assert all(t["peak"] is not None and t["peak"] <= out["limit"] for t in fitted), search["trials"]
    assert 32 <= search["batch_size"] <= 128, search  # 128 MiB at 1 MiB a sample, the process's growth beside
    assert out["low"] == {"parameter": "limit", "calls": 0}, out


_JAX_LOWER_ON_A_HOST = r"""
import sys
import jax
import jax.numpy as jnp
import unimem
from unimem import host_memory

params = {"w1": jnp.full((1024, 4096), 0.01), "w2": jnp.full((4096, 1024), 0.01)}

@jax.jit
def train(params, x):
    loss = lambda p: jnp.mean((jax.nn.relu(x @ p["w1"]) @ p["w2"]) ** 2)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, params, jax.grad(loss)(params))

def step(n):
    print(f"running {n}", file=sys.stderr, flush=True)  # the test's Ctrl-C comes while it runs
    jax.block_until_ready(train(params, jnp.ones((n, 1024))))

lower = lambda n: train.lower(params, jax.ShapeDtypeStruct((n, 1024), jnp.float32))
train(params, jnp.ones((64, 1024)))
host_memory.available = lambda: 2 << 30  # a small host: the search stays far from this machine's memory
unimem.find_batch_size(step, start=64, backend="jax", lower=lower, progress=True)
"""


@pytest.mark.covers("jax:batch_size")
@pytest.mark.slow
def test_ctrl_c_stops_a_jax_search_on_a_host_at_once(need: Any, tmp_path: Path) -> None:
    # The guide's lower= example on a CPU: the search's second size ran for minutes, and after Ctrl-C
    # the process waited for that computation (JAX finishes it before the process exits).
    need("jax")
    script = tmp_path / "search.py"
    script.write_text(_JAX_LOWER_ON_A_HOST, encoding="utf-8")
    env = subprocess_env({"PYTHONUNBUFFERED": "1", "JAX_PLATFORMS": "cpu"})
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=str(REPO), env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    sizes: list[int] = []
    for line in proc.stderr:
        sizes += [int(m.group(1)) for m in re.finditer(r"^running (\d+)", line)]
        if len(sizes) == 2:
            break
    time.sleep(1.5)  # the second call's computation is under way
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        _, rest = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"still running 120 s after Ctrl-C, at batch sizes {sizes}")
    took = time.monotonic() - sent
    assert "KeyboardInterrupt" in rest and "find_batch_size was interrupted after" in rest, rest[-2000:]
    assert proc.returncode != 0 and took < 20, f"ended {took:.1f} s after Ctrl-C, at batch sizes {sizes}"
    assert sizes == [64, 512], sizes  # at most 8 times the largest size that ran, as a measured search
