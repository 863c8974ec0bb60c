"""track() and MemoryHook: peak, delta and duration of a block, nesting, honesty.

A fake allocator stands in for a framework's (a GPU is not here): it keeps
``allocated`` and a peak that ``reset_peak`` resets (torch-like) or never resets
(JAX-like). The real frameworks are run too, in fresh processes, where on the CPU
every figure must be None, never 0.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import unimem
from unimem import registry
from unimem.memory_stats import MemoryStats
from unimem.support import Level, Support


class FakeAllocator:
    """A framework allocator: live bytes, a pool, and a peak counter."""

    peak_reset_exact = False  # an emulated reset here is JAX's: the peak cannot restart

    @property
    def observe(self) -> FakeAllocator:  # its observe topic, whose flag track() reads, is itself
        return self

    def __init__(self, name: str, reset: Level) -> None:
        self.name = name
        self.CAPABILITIES = {"reset_peak": Support(reset)}
        self.allocated = 0
        self.reserved = 0
        self.peak = 0
        self.peak_reserved = 0
        self.resets = 0

    def alloc(self, size: int) -> None:
        self.allocated += size
        self.reserved = max(self.reserved, self.allocated)
        self.peak = max(self.peak, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, size: int) -> None:
        self.allocated -= size

    def stats(self, device: int = 0, *, nvml: bool = True) -> MemoryStats:
        return MemoryStats(
            self.name,
            device,
            allocated=self.allocated,
            reserved=self.reserved,
            peak_allocated=self.peak,
            peak_reserved=self.peak_reserved,
        )

    def reset_peak(self, device: int = 0) -> None:
        if self.CAPABILITIES["reset_peak"].level is not Level.NATIVE:
            raise AssertionError("track() must not reset a peak the framework cannot reset")
        self.resets += 1
        self.peak = self.allocated
        self.peak_reserved = self.reserved


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``fake(level)`` installs a fake allocator as the 'torch' backend and returns it."""

    def install(level: Level = Level.NATIVE) -> FakeAllocator:
        allocator = FakeAllocator("torch", level)
        real = registry.get_backend
        monkeypatch.setattr(registry, "get_backend", lambda name: allocator if name == "torch" else real(name))
        return allocator

    return install


def test_a_block_reports_peak_delta_and_duration(fake: Any) -> None:
    alloc = fake()
    alloc.alloc(1000)
    with unimem.track("torch") as t:
        assert t.peak is None and t.duration is None  # nothing is known before the block ends
        alloc.alloc(5000)
        alloc.free(5000)
        alloc.alloc(300)
        time.sleep(0.01)
    assert t.peak == 6000  # the high point inside the block, not the 1000 held before it
    assert t.peak_exact is True
    assert t.delta == 300
    assert t.duration is not None and 0.01 <= t.duration < 5
    assert t.start is not None and t.start.allocated == 1000
    assert t.end is not None and t.end.allocated == 1300


def test_nested_blocks_keep_the_outer_peak(fake: Any) -> None:
    alloc = fake()
    with unimem.track("torch") as outer:
        alloc.alloc(800)
        alloc.free(800)  # the outer block's peak happens before the inner block resets the counter
        with unimem.track("torch") as inner:
            alloc.alloc(200)
            alloc.free(200)
        with unimem.track("torch") as second:
            alloc.alloc(100)
            with unimem.track("torch") as innermost:
                alloc.alloc(50)
            alloc.free(150)
        alloc.alloc(10)
    assert inner.peak == 200
    assert innermost.peak == 150  # 100 held by the enclosing block + 50
    assert second.peak == 150
    assert outer.peak == 800  # would be 150 if the inner resets were not folded back
    assert outer.delta == 10
    assert alloc.resets == 4


def test_inner_peak_higher_than_outer_reaches_the_outer(fake: Any) -> None:
    alloc = fake()
    with unimem.track("torch") as outer:
        alloc.alloc(100)
        with unimem.track("torch") as inner:
            alloc.alloc(900)
            alloc.free(900)
        alloc.free(100)
    assert inner.peak == 1000
    assert outer.peak == 1000


def test_overlapping_blocks_closed_out_of_order_stay_exact(fake: Any) -> None:
    """Blocks that are not strictly nested (an epoch block and per-step blocks) still get exact peaks."""
    alloc = fake()
    first = unimem.track("torch").__enter__()
    alloc.alloc(400)
    alloc.free(400)
    second = unimem.track("torch").__enter__()
    alloc.alloc(100)
    first.close()  # closes before the block it contains
    alloc.alloc(250)
    second.close()
    assert first.peak == 400
    assert second.peak == 350


def test_jax_like_backend_gives_a_flagged_lower_bound_not_a_guess(fake: Any) -> None:
    alloc = fake(Level.EMULATED)
    alloc.alloc(10_000)
    alloc.free(10_000)  # an old process peak the block will never pass
    alloc.alloc(100)
    with unimem.track("torch") as t:
        alloc.alloc(2_000)
        alloc.free(2_000)
        alloc.alloc(50)
    assert alloc.resets == 0
    assert t.peak_exact is False
    assert t.peak == 150  # what is known: at least the bytes held at the end
    assert "lower bound" in t.note and "lower bound" in repr(t)
    with unimem.track("torch") as rising:
        alloc.alloc(20_000)
        alloc.free(20_000)
    assert rising.peak_exact is True
    assert rising.peak == 20_150  # the process peak rose inside the block: it is the block's


def test_step_hook_records_each_steps_peak(fake: Any, tmp_path: Any) -> None:
    alloc = fake()
    hook = unimem.MemoryHook("torch")
    assert hook.step() is None  # the first call opens the first step
    sizes = [300, 700, 100]
    for size in sizes:
        alloc.alloc(size)
        alloc.free(size)
        hook.step()
    hook.mark("done")
    hook.close()
    peaks = [s.peak for s in hook.samples]
    assert peaks == sizes
    assert [s.step for s in hook.samples] == [2, 3, 4]  # step() calls, the opening one included
    assert all(s.peak_exact for s in hook.samples)
    png = hook.plot(tmp_path / "hook.png")
    assert png.stat().st_size > 0


def test_step_hook_every_n_steps_covers_the_steps_between(fake: Any) -> None:
    alloc = fake()
    hook = unimem.MemoryHook("torch", every=2)
    hook.step()
    for size in (500, 10, 20, 30):
        alloc.alloc(size)
        alloc.free(size)
        hook.step()
    assert [s.peak for s in hook.samples] == [500, 30]


def test_without_a_device_every_figure_is_none_and_said_so() -> None:
    """Nothing imported, no NVML driver on this machine (or NVML with no framework): no peak, no delta."""
    with unimem.track() as t:
        pass
    assert t.peak is None and t.delta is None and t.peak_exact is None
    assert t.duration is not None and t.duration >= 0
    assert t.note  # says why


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [({"device": -1}, "device"), ({"device": True}, "device"), ({"backend": "numpy"}, "backend")],
)
def test_bad_arguments_are_config_errors(kwargs: dict[str, Any], parameter: str) -> None:
    with pytest.raises(unimem.ConfigError) as info:
        unimem.track(**kwargs)
    assert info.value.parameter == parameter


def test_a_block_cannot_be_opened_twice(fake: Any) -> None:
    fake()
    t = unimem.track("torch")
    with t, pytest.raises(unimem.UnimemError, match="already open"):
        t.__enter__()


@pytest.mark.parametrize("framework", ["torch", "jax", "tensorflow"])
@pytest.mark.slow
def test_real_frameworks_on_the_cpu_report_none_never_zero(framework: str, pyjson: Any, need: Any) -> None:
    need(framework)
    work = {
        "torch": "import torch; x = torch.ones(1000, 1000); y = x @ x",
        "jax": "import jax.numpy as jnp; x = jnp.ones((1000, 1000)); y = (x @ x).block_until_ready()",
        "tensorflow": "import tensorflow as tf; x = tf.ones((1000, 1000)); y = tf.matmul(x, x)",
    }[framework]
    result = pyjson(
        f"""
        import unimem
        {work}
        with unimem.track({framework!r}) as outer:
            with unimem.track({framework!r}) as inner:
                {work}
        hook = unimem.MemoryHook({framework!r})
        for _ in range(3):
            {work}
            hook.step()
        emit({{
            "outer": [outer.peak, outer.delta, outer.peak_exact, outer.duration, outer.note],
            "inner": [inner.peak, inner.delta, inner.duration],
            "steps": [[s.allocated, s.peak, s.host_rss] for s in hook.samples],
        }})
        """
    )
    peak, delta, exact, duration, note = result["outer"]
    assert (peak, delta, exact) == (None, None, None)
    assert duration > 0
    assert "None, not 0" in note
    assert result["inner"][:2] == [None, None]
    assert len(result["steps"]) == 2
    for allocated, step_peak, host_rss in result["steps"]:
        assert allocated is None and step_peak is None
        assert host_rss > 0  # the host figure is known on Linux
