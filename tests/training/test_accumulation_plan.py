"""``plan_accumulation``: a global batch met exactly by micro-batches that each fit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import unimem


@given(
    target=st.integers(1, 100_000),
    micro=st.integers(1, 4096),
    world=st.integers(1, 64),
)
def test_the_plan_meets_the_target_exactly_with_micro_batches_that_fit(target: int, micro: int, world: int) -> None:
    world = min(world, target)
    plan = unimem.plan_accumulation(target, micro, world)
    per_rank = [plan.sizes(rank) for rank in range(world)]
    assert sum(map(sum, per_rank)) == target
    assert all(len(sizes) == plan.steps for sizes in per_rank)  # every rank syncs on the same step
    largest, smallest = max(map(max, per_rank)), min(map(min, per_rank))
    assert largest == plan.micro_batch <= micro and largest - smallest <= 1
    # The fewest steps: one fewer could not carry the target at the largest micro-batch that fits.
    assert (plan.steps - 1) * micro * world < target


def test_a_target_that_does_not_divide_evenly_is_met_exactly_by_near_equal_micro_batches() -> None:
    plan = unimem.plan_accumulation(1000, micro_batch=96, world_size=4)
    assert (plan.steps, plan.micro_batch) == (3, 84)
    assert plan.sizes(0) == (84, 83, 83) and plan.sizes(3) == (84, 83, 83)
    assert sum(plan.weight(n) for r in range(4) for n in plan.sizes(r)) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("args", "parameter"),
    [
        ((0, 8, 1), "target_global_batch"),
        ((64, 0, 1), "micro_batch"),
        ((64, 8, 0), "world_size"),
        ((64, 8.0, 1), "micro_batch"),
        ((64, True, 1), "micro_batch"),
        ((3, 8, 4), "world_size"),
    ],
)
def test_bad_arguments_name_the_parameter(args: tuple[object, object, object], parameter: str) -> None:
    with pytest.raises(unimem.ConfigError) as info:
        unimem.plan_accumulation(*args)  # type: ignore[arg-type]
    assert info.value.parameter == parameter


def test_a_rank_outside_the_world_is_refused() -> None:
    plan = unimem.plan_accumulation(64, 8, 2)
    with pytest.raises(unimem.ConfigError) as info:
        plan.sizes(2)
    assert info.value.parameter == "rank"
