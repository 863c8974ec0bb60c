"""``find_batch_size`` on a host without device figures: the sizes are held to the host's memory.

On a CPU host a size that does not fit is no exception: the kernel kills the process. The
search must stop before that. The host here is simulated (its resident memory, its high-water
mark and the memory it has available answer for ``unimem.host_memory``), never this machine
exhausted: a simulated step past what the host has raises ``Killed``, which the search cannot
catch, so a search that goes there fails the test.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import unimem
from unimem import host_memory, snapshots
from unimem.search import host_limit as search_host
from unimem.search.host_limit import HostPeaks, read_limit

MiB, GiB = 1 << 20, 1 << 30


class Killed(BaseException):
    """What the kernel's OOM killer does to the process: nothing the search catches."""


class Host:
    """A host with ``available`` bytes free beside a process holding ``resident`` bytes; a step
    needing ``fixed + per_sample × n`` bytes above it (``retained`` of which the allocator
    already holds from before, so they show in no reading until the step needs more)."""

    def __init__(self, available: int, resident: int, fixed: int, per_sample: int, retained: int = 0) -> None:
        self.free, self.resident = available, resident + retained
        self.fixed, self.per_sample, self.retained = fixed, per_sample, retained
        self.mark = self.resident
        self.sizes: list[int] = []
        self.resettable = True

    def need(self, n: int) -> int:
        return self.fixed + self.per_sample * n

    def step(self, n: int) -> None:
        self.sizes.append(n)
        grows = max(0, self.need(n) - self.retained)
        if grows > self.free:
            raise Killed(f"the kernel killed the process at batch size {n}")
        self.mark = max(self.mark, self.resident + grows)

    def largest(self, share: float) -> int:
        """The largest size whose resident peak stays within ``share`` of the available memory."""
        return int((share * self.free + self.retained - self.fixed) // self.per_sample)

    def serve(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(host_memory, "rss", lambda: self.resident)
        monkeypatch.setattr(host_memory, "available", lambda: self.free)
        monkeypatch.setattr(host_memory, "peak", lambda: self.mark)
        monkeypatch.setattr(host_memory, "can_reset_peak", lambda: self.resettable)
        monkeypatch.setattr(host_memory, "reset_peak", self.reset)
        # A host without a GPU, whatever this machine has.
        monkeypatch.setattr(snapshots, "framework_free_stats", lambda device: unimem.MemoryStats("nvml", device))

    def reset(self) -> bool:
        if self.resettable:
            self.mark = self.resident
        return self.resettable


def _search(host: Host, step: Any = None, **kwargs: Any) -> unimem.BatchSizeSearch:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", unimem.UnimemWarning)
        # A step of no framework: the host's figures are the ones read.
        return unimem.find_batch_size(step or host.step, return_trials=True, **{"backend": "nvml", **kwargs})


def test_a_search_without_device_figures_stops_within_the_hosts_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    host = Host(available=2 * GiB, resident=300 * MiB, fixed=20 * MiB, per_sample=1 * MiB)
    host.serve(monkeypatch)
    found = _search(host, start=8)  # doubling alone would pass 2 GiB at 2048 and be killed
    largest = host.largest(search_host.SHARE)
    assert (1 - found.margin) * largest <= found.batch_size <= largest, str(found)
    assert found.converged and found.limit == host.resident + int(search_host.SHARE * host.free)
    assert found.baseline == host.resident and found.measured_by.startswith("the process's resident peak")
    assert all(t.peak is not None for t in found.trials if t.fits), str(found)
    note = next(n for n in found.notes if "host's memory" in n)
    assert "80% of the 2.00 GiB available" in note and "limit=" in note
    assert len(found.trials) <= 8, str(found)


def test_a_size_past_the_host_limit_counts_as_one_that_did_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    # The margin step past the limit runs (the host still has room) but is no answer.
    host = Host(available=1 * GiB, resident=100 * MiB, fixed=0, per_sample=1 * MiB)
    host.serve(monkeypatch)
    found = _search(host, start=16, margin=0.0)
    assert found.batch_size == host.largest(search_host.SHARE), str(found)
    over = [t for t in found.trials if not t.fits]
    assert over and all("passed the host limit" in (t.error or "") for t in over), str(found)


def test_readings_a_retained_pool_hides_do_not_send_a_size_past_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # The allocator holds 64 MiB it freed before the search: small steps read no growth at all,
    # so nothing but a bound on the step up keeps the next size from being far too large (a
    # plateau of equal readings grows sizes 16-fold on a device).
    host = Host(available=1 * GiB, resident=200 * MiB, fixed=0, per_sample=1 * MiB, retained=64 * MiB)
    host.serve(monkeypatch)
    found = _search(host, start=1)
    largest = host.largest(search_host.SHARE)
    assert (1 - found.margin) * largest <= found.batch_size <= largest, str(found)
    sizes = [t.batch_size for t in found.trials]
    assert all(b <= 8 * a for a, b in zip(sizes, sizes[1:], strict=False)), sizes


def test_without_a_resettable_mark_the_mark_that_rose_is_the_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    host = Host(available=2 * GiB, resident=300 * MiB, fixed=20 * MiB, per_sample=1 * MiB)
    host.resettable = False
    host.serve(monkeypatch)
    found = _search(host, start=8)
    largest = host.largest(search_host.SHARE)
    assert (1 - found.margin) * largest <= found.batch_size <= largest, str(found)


@pytest.mark.slow
def test_limit_or_measure_or_a_device_keep_the_host_out_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    host = Host(available=64 * GiB, resident=300 * MiB, fixed=0, per_sample=1 * MiB)
    host.serve(monkeypatch)
    peaks: dict[str, int] = {}

    def step(n: int) -> None:
        host.step(n)
        peaks["last"] = n * MiB

    found = _search(host, step, start=8, measure=lambda: peaks.pop("last", None), limit=256 * MiB)
    assert found.limit == 256 * MiB and not any("host's memory" in n for n in found.notes)
    # A device the framework-free view knows: the host is not what bounds the step.
    monkeypatch.setattr(
        snapshots, "framework_free_stats", lambda device: unimem.MemoryStats("nvml", device, device_total=GiB)
    )
    blind = _search(host, _fits_up_to(300), start=8)
    assert blind.limit is None and any("doubling" in n for n in blind.notes), str(blind)


def test_a_host_whose_figures_cannot_be_read_is_searched_blind(monkeypatch: pytest.MonkeyPatch) -> None:
    host = Host(available=64 * GiB, resident=300 * MiB, fixed=0, per_sample=1 * MiB)
    host.serve(monkeypatch)
    monkeypatch.setattr(host_memory, "available", lambda: None)
    found = _search(host, _fits_up_to(300), start=8, margin=0.0)
    assert found.limit is None and found.batch_size == 300
    assert [t.reason for t in found.trials][:3] == ["start", "grow", "grow"]


def _fits_up_to(largest: int) -> Any:
    def step(n: int) -> None:
        if n > largest:
            raise MemoryError(f"out of memory at {n}")

    return step


def test_processes_of_one_host_share_its_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_memory, "rss", lambda: 100 * MiB)
    monkeypatch.setattr(host_memory, "available", lambda: 1000 * MiB)
    one, two = read_limit(), read_limit(processes=2)
    assert one is not None and two is not None
    assert one.limit == 100 * MiB + 800 * MiB and two.limit == 100 * MiB + 400 * MiB
    assert "shared by 2 processes" in two.note() and "shared" not in one.note()
    monkeypatch.setattr(host_memory, "rss", lambda: None)
    assert read_limit() is None


def test_a_peak_is_read_only_when_the_mark_could_be_restarted_or_rose(monkeypatch: pytest.MonkeyPatch) -> None:
    marks = iter([500, 500, 500, 700])  # the mark before and after each of two trials
    monkeypatch.setattr(host_memory, "reset_peak", lambda: False)
    monkeypatch.setattr(host_memory, "peak", lambda: next(marks))
    peaks = HostPeaks()
    peaks.begin()
    assert peaks.read() is None  # stayed under the process's peak so far: unknown
    peaks.begin()
    assert peaks.read() == 700  # rose during the trial: its peak
    monkeypatch.setattr(host_memory, "reset_peak", lambda: True)
    monkeypatch.setattr(host_memory, "peak", lambda: 600)
    peaks.begin()
    assert peaks.read() == 600  # restarted before the trial: whatever it reads


_JAX_ON_A_SMALL_HOST = r"""
import jax, jax.numpy as jnp
import unimem
from unimem import host_memory

BUDGET = 128 << 20  # the simulated host: this process may grow this much past its start, no more
D = 256
def loss(w, x):
    return (jnp.tanh(x @ w) @ w.T).sum()
grad = jax.jit(jax.grad(loss))
w = jnp.full((D, D), 0.01, jnp.float32)
def need(n):
    return 8 * D * D + 16 * D * n
def lower(n):
    return grad.lower(w, jax.ShapeDtypeStruct((n, D), jnp.float32))
calls = []
def step(n):
    calls.append(n)
    if need(n) > BUDGET:
        raise SystemExit(f"the kernel would have killed the process at {n}")
    grad(w, jnp.ones((n, D), jnp.float32)).block_until_ready()

grad(w, jnp.ones((8, D), jnp.float32)).block_until_ready()
lower(8).compile()
START = host_memory.rss()
host_memory.available = lambda: max(0, START + BUDGET - host_memory.rss())
found = unimem.find_batch_size(step, start=8, backend="jax", lower=lower, return_trials=True, progress=False)
emit({"search": found.as_dict(), "calls": calls, "needs": {str(n): need(n) for n in calls}, "budget": BUDGET})
"""


@pytest.mark.covers("jax:batch_size")
@pytest.mark.slow
def test_jax_predictions_are_held_against_the_hosts_memory(need: Any, pyjson: Any) -> None:
    # Without the host's limit the predictions had nothing to be held against: the search
    # doubled until the (simulated) host killed it.
    need("jax")
    r = pyjson(_JAX_ON_A_SMALL_HOST)
    search = r["search"]
    assert any("host's memory" in n for n in search["notes"]), search["notes"]
    reasons = [t["reason"] for t in search["trials"]]
    assert reasons[1] == "predicted" and "grow" not in reasons, reasons  # placed by the predictions
    # As in a measured search no size is more than 8 times the largest that ran: from 8, three calls
    # (64, 512, 4096) reach the answer's region, where one prediction used to jump.
    ran = 0  # the largest size that ran so far
    for trial in search["trials"]:
        assert not ran or trial["batch_size"] <= 8 * ran, search["trials"]
        ran = max(ran, trial["batch_size"] if trial["fits"] else 0)
    assert search["step_calls"] <= 13 and search["converged"], search
    # The answer's need is a good share of the host's memory, and no call went past it (the
    # process grows besides: compiled programs, what the allocator keeps).
    assert 0.25 * r["budget"] <= r["needs"][str(search["batch_size"])] <= search_host.SHARE * r["budget"], search


_TORCH_ON_A_SMALL_HOST = r"""
import torch
import unimem
from unimem import host_memory

BUDGET = 256 << 20  # the simulated host: this process may grow this much past its start, no more
layer = torch.nn.Linear(256, 256)
START = float("inf")
def step(n):
    layer(torch.randn(n, 256)).relu().sum().backward()
    layer.zero_grad(set_to_none=True)
    if host_memory.peak() > START + BUDGET:  # the search restarted the mark before the call
        raise SystemExit(f"the kernel would have killed the process at {n}")

step(8)
START = host_memory.rss()
host_memory.available = lambda: max(0, START + BUDGET - host_memory.rss())
found = unimem.find_batch_size(step, start=8, backend="torch", return_trials=True, progress=False)
emit({"search": found.as_dict(), "start": START, "budget": BUDGET})
"""


@pytest.mark.covers("torch:batch_size")
@pytest.mark.slow
def test_a_torch_search_on_a_small_host_stops_before_the_kernel_has_to(need: Any, pyjson: Any) -> None:
    # An MLP search on a CPU host without limit= doubled until the kernel killed it (23.7 GB).
    need("torch")
    r = pyjson(_TORCH_ON_A_SMALL_HOST)
    search = r["search"]
    assert search["converged"] and any("host's memory" in n for n in search["notes"]), search
    fitted = [t for t in search["trials"] if t["fits"]]
    assert all(t["peak"] is not None and t["peak"] <= search["limit"] for t in fitted), search["trials"]
    # The answer's resident peak is most of the host's share, and never past it.
    top = max(t["peak"] for t in fitted if t["batch_size"] == search["batch_size"])
    assert r["start"] + 0.5 * search_host.SHARE * r["budget"] <= top <= search["limit"], search


def test_the_processes_a_launcher_put_on_this_host_share_it(monkeypatch: pytest.MonkeyPatch) -> None:
    host = Host(available=2 * GiB, resident=300 * MiB, fixed=0, per_sample=1 * MiB)
    host.serve(monkeypatch)
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    found = _search(host, start=8, collective=False)  # each rank on its own: its share still halved
    assert found.limit == host.resident + int(search_host.SHARE * host.free / 2), str(found)
    assert "shared by 2 processes of this host" in next(n for n in found.notes if "host's memory" in n)
