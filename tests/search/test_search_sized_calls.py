"""A measured JAX call sized as it runs refuses, before it runs, only a program that cannot fit.

Without ``lower=``, on a pool grown on demand, every program a call of the step compiles is compiled in
a fresh process and its figures read here before it runs (``_fresh_compile.compiled_during_call``). A
program that cannot fit is refused with JAX's own out-of-memory error rather than run: a failed execution
takes seconds and keeps its outputs for the life of the process. Only a certain failure is refused.
"""

from __future__ import annotations

from typing import Any

from unimem.backends.jax._fresh_compile import cannot_run

GiB = 1 << 30
# A step's program: its peak counts its arguments (1 GiB) and its one buffer of temporaries (4 GiB).
PROGRAM = {"peak": 6 * GiB, "argument": 1 * GiB, "temp": 4 * GiB}


class FakeDevice:
    """A device as JAX shows its pool (``memory_stats()``), or one that cannot say."""

    def __init__(self, stats: dict[str, int] | None, fails: bool = False) -> None:
        self.stats, self.fails = stats, fails

    def memory_stats(self) -> dict[str, int] | None:
        if self.fails:
            raise RuntimeError("no memory stats on this platform")
        return self.stats


def pool(in_use: float, block: float, reserved: float, limit: float = 8) -> FakeDevice:
    return FakeDevice(
        {
            "bytes_limit": int(limit * GiB),
            "bytes_in_use": int(in_use * GiB),
            "largest_free_block_bytes": int(block * GiB),
            "pool_bytes": int(reserved * GiB),
        }
    )


def test_a_program_that_fits_runs() -> None:
    assert cannot_run(PROGRAM, pool(in_use=1, block=5, reserved=8)) is None  # its temporaries in a free block
    assert cannot_run(PROGRAM, pool(in_use=1, block=1, reserved=3)) is None  # in a new region under the limit
    assert cannot_run(PROGRAM, pool(in_use=3, block=5, reserved=8)) is None  # 6 + 2 beside it: exactly the limit


def test_a_program_whose_peak_passes_the_limit_is_refused() -> None:
    why = cannot_run(PROGRAM, pool(in_use=3.5, block=5, reserved=8))  # 6 GiB + 2.5 GiB beside it > 8 GiB
    assert why is not None and why.startswith("RESOURCE_EXHAUSTED: Out of memory") and "not run" in why[:300]
    assert str(int(8.5 * GiB)) in why and str(8 * GiB) in why


def test_temporaries_no_piece_of_the_pool_holds_are_refused() -> None:
    # A 3 GiB free block, 2 GiB left under the limit for a region: the 4 GiB buffer fits in neither.
    why = cannot_run(PROGRAM, pool(in_use=1, block=3, reserved=6))
    assert why is not None and str(3 * GiB) in why


def test_without_the_pool_s_figures_nothing_is_refused() -> None:
    for device in (FakeDevice(None), FakeDevice({}), FakeDevice(None, fails=True)):
        assert cannot_run(PROGRAM, device) is None
    partial: Any = FakeDevice({"bytes_limit": 8 * GiB, "bytes_in_use": 1 * GiB})  # no block, no pool: peak only
    assert cannot_run(PROGRAM, partial) is None
    assert cannot_run({**PROGRAM, "peak": 9 * GiB}, partial) is not None
