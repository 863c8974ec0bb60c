"""Gradient accumulation to a global batch: how many micro-batches of which size each rank runs.

``plan_accumulation(target_global_batch, micro_batch, world_size)`` splits a global batch of exactly
``target_global_batch`` samples into optimizer steps of ``steps`` micro-batches on each of
``world_size`` ranks, no micro-batch larger than ``micro_batch`` (the largest that fits, say
``find_batch_size``'s answer). A target that does not divide evenly is met exactly, not
rounded: the micro-batches differ by at most one sample, the larger ones first, so every
micro-batch still fits. The loss of each micro-batch is then weighted by its share of the
global batch (``AccumulationPlan.weight``), never divided by the step count, which is wrong
when micro-batches differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import ConfigError

__all__ = ["AccumulationPlan", "plan_accumulation"]


@dataclass(frozen=True)
class AccumulationPlan:
    """The micro-batches that make one global batch.

    Attributes:
        global_batch (int): Samples per optimizer step, over all ranks: the target, exactly.
        world_size (int): Ranks that share it.
        steps (int): Micro-batches each rank runs per optimizer step (forward and backward
            each; gradients synchronised on the last only).
        micro_batch (int): The largest micro-batch in the plan: at most the one given.
    """

    global_batch: int
    world_size: int
    steps: int
    micro_batch: int

    def sizes(self, rank: int = 0) -> tuple[int, ...]:
        """The micro-batch sizes ``rank`` runs in one optimizer step, in order: ``steps`` of
        them, differing by at most one, summing with every other rank's to ``global_batch``.
        A size is 0 only where the target is under ``steps x world_size`` (micro-batches of 1):
        that rank still takes part in the step's gradient synchronisation.

        Raises:
            ConfigError: ``rank`` is not in ``range(world_size)`` (``exc.parameter == "rank"``).
        """
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ConfigError("rank", f"expected a rank in 0..{self.world_size - 1}, got {rank!r}")
        slots = self.steps * self.world_size
        base, extra = divmod(self.global_batch, slots)
        # Slot k (step-major: step s of rank r is slot s * world_size + r) gets one more sample
        # while k < extra, so every rank's steps line up with the same sizes give or take one.
        return tuple(base + (s * self.world_size + rank < extra) for s in range(self.steps))

    def weight(self, size: int) -> float:
        """The factor a micro-batch's mean loss takes so that the accumulated gradient is the
        mean over the global batch: ``size / global_batch`` (under DDP's gradient averaging over
        ``world_size`` ranks, multiply by ``world_size`` too: ``accumulate`` does)."""
        return size / self.global_batch


def plan_accumulation(target_global_batch: int, micro_batch: int, world_size: int = 1) -> AccumulationPlan:
    """The fewest micro-batches per rank that reach ``target_global_batch`` exactly without
    any being larger than ``micro_batch``.

    Args:
        target_global_batch: Samples per optimizer step over all ranks (1 or more).
        micro_batch: The largest micro-batch that fits on a rank (1 or more).
        world_size: Ranks sharing the global batch (1 or more); at most the target, so that
            every rank gets a sample.

    Returns:
        The plan; ``plan.sizes(rank)`` lists each rank's micro-batches.

    Raises:
        ConfigError: an argument is not a positive int, or ``world_size`` exceeds the target
            (``exc.parameter`` names which).

    Example:
        ```python
        p = unimem.plan_accumulation(1000, micro_batch=96, world_size=4)
        p.steps, p.sizes(0)   # (3, (84, 83, 83)): 4 ranks x 3 steps, 1000 samples exactly
        ```
    """
    for name, value in (
        ("target_global_batch", target_global_batch),
        ("micro_batch", micro_batch),
        ("world_size", world_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(name, f"expected an int of 1 or more, got {value!r}")
    if world_size > target_global_batch:
        raise ConfigError(
            "world_size",
            f"{world_size} ranks cannot share a global batch of {target_global_batch}: "
            "raise target_global_batch to at least the world size",
        )
    steps = math.ceil(target_global_batch / (micro_batch * world_size))
    largest = math.ceil(target_global_batch / (steps * world_size))
    return AccumulationPlan(target_global_batch, world_size, steps, largest)
