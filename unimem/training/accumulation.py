"""Gradient accumulation to a global batch: how many micro-batches of which size each rank runs.

Each micro-batch's loss is weighted by its share of the global batch, never divided by the step
count, which is wrong when sizes differ. The plan, the weights and the loops: docs/guides/gradient-accumulation.md.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from unimem import registry
from unimem.errors import ConfigError

__all__ = ["REDUCTIONS", "AccumulationPlan", "MicroBatch", "accumulate", "accumulate_grads", "plan_accumulation"]

# How the data-parallel runtime combines the ranks' gradients, and the factor that makes the
# accumulated gradient the global batch's mean under it.
REDUCTIONS = ("mean", "sum")


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
        """The ``steps`` micro-batch sizes ``rank`` runs in one optimizer step, larger first, differing by one at most.

        Args:
            rank: The rank, from 0 (default 0).

        Returns:
            The sizes; with every other rank's they sum to ``global_batch``.

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
        """``size / global_batch``: a micro-batch's share of the global batch, the factor its mean loss takes.

        Under gradient averaging over ranks ``accumulate`` multiplies it by ``world_size``.

        Args:
            size: The micro-batch's samples.

        Returns:
            The factor.
        """
        return size / self.global_batch

    def share(self, rank: int = 0) -> slice:
        """Where ``rank``'s samples sit in one global batch, ranks in order; the shares cover it exactly.

        Args:
            rank: The rank, from 0 (default 0).

        Returns:
            The slice of the global batch that is ``rank``'s.

        Raises:
            ConfigError: ``rank`` is not in ``range(world_size)`` (``exc.parameter == "rank"``).
        """
        own = sum(self.sizes(rank))  # checks rank first
        start = sum(sum(self.sizes(r)) for r in range(rank))
        return slice(start, start + own)


def plan_accumulation(target_global_batch: int, micro_batch: int, world_size: int = 1) -> AccumulationPlan:
    """The fewest micro-batches per rank that reach ``target_global_batch`` exactly, none above ``micro_batch``.

    How uneven targets split: [Gradient accumulation](../guides/gradient-accumulation.md#plan-the-micro-batches).

    Args:
        target_global_batch: Samples per optimizer step over all ranks (1 or more).
        micro_batch: The largest micro-batch that fits on a rank (1 or more), say ``find_batch_size``'s answer.
        world_size: Ranks sharing the global batch (1 or more, at most the target).

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


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of an optimizer step, as ``accumulate`` yields it.

    Attributes:
        index (int): Its place in the step, from 0.
        size (int): Its samples (0 only where the target is under ``steps x world_size``).
        start (int): Where it starts in this rank's share of the step (``plan.share(rank)``).
        weight (float): The factor its mean loss takes, so that the accumulated gradient is the
            mean over the global batch.
        last (bool): The step's last micro-batch: gradients synchronise on it, and the
            optimizer (and a loss scaler's ``step``/``update``) runs after it.
    """

    index: int
    size: int
    start: int
    weight: float
    last: bool

    @property
    def slice(self) -> slice:
        """Its samples in this rank's share: ``share[mb.slice]``."""
        return slice(self.start, self.start + self.size)


def _rank(plan: AccumulationPlan, rank: int | None) -> int:
    """``rank``, or this process's rank from the launcher's variables when None."""
    if rank is not None or plan.world_size == 1:
        return 0 if rank is None else rank
    from unimem.ranks import rank_info

    info = rank_info(runtime=True)
    if info.rank is None:
        raise ConfigError(
            "rank", f"the plan is for {plan.world_size} ranks and no launcher says which this is; pass rank="
        )
    if info.world_size is not None and info.world_size != plan.world_size:
        raise ConfigError(
            "plan",
            f"the plan is for {plan.world_size} ranks but the launcher started {info.world_size}; "
            "pass world_size= the launcher's to plan_accumulation",
        )
    return info.rank


def accumulate(
    plan: AccumulationPlan,
    rank: int | None = None,
    *,
    model: Any = None,
    reduction: str = "mean",
    backend: str | None = None,
) -> Iterator[MicroBatch]:
    """This rank's micro-batches of one optimizer step, each with the weight of its loss.

    Backward ``loss * mb.weight`` in the loop body; step the optimizer once, after the loop. The weights,
    ranks and a loss scaler: [Gradient accumulation](../guides/gradient-accumulation.md).

    Args:
        plan: What ``plan_accumulation`` returned.
        rank: This process's rank; None (default): 0 for a one-rank plan, else the launcher's.
        model: A module wrapped for data parallelism: all but the last micro-batch run under its ``no_sync()``.
        reduction: ``"mean"`` (default) or ``"sum"``: how the runtime combines the ranks' gradients.
        backend: The framework ``model`` belongs to, or None (default): the one configured, else the one imported.

    Yields:
        One ``MicroBatch`` per micro-batch, in order.

    Raises:
        ConfigError: ``plan``, ``rank``, ``reduction`` or ``backend`` is invalid or cannot be told (the error names it).
        UnsupportedFeature: ``model`` is given and its framework cannot skip the synchronisation.

    Example:
        ```python
        plan = unimem.plan_accumulation(1000, micro_batch=96, world_size=4)
        share = batch[plan.share(rank)]          # this rank's samples of the global batch
        for mb in unimem.accumulate(plan, rank, model=ddp_model):
            loss = loss_fn(ddp_model(share[mb.slice])) * mb.weight
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        ```
    """
    if not isinstance(plan, AccumulationPlan):
        raise ConfigError("plan", f"expected what plan_accumulation() returned, got {plan!r}")
    if reduction not in REDUCTIONS:
        raise ConfigError("reduction", f"expected 'mean' (ranks average gradients) or 'sum', got {reduction!r}")
    sizes = plan.sizes(_rank(plan, rank))
    factor = plan.world_size if reduction == "mean" else 1
    skip = None
    if model is not None:
        name = registry.resolve(backend, "action")
        if name is None:  # an action always names one or raises; kept for the type checker
            raise ConfigError("backend", "pass backend= the framework the model runs in")
        adapter = registry.get_backend(name)
        skip = adapter.accumulation.no_sync
    start = 0
    for index, size in enumerate(sizes):
        last = index == len(sizes) - 1
        micro = MicroBatch(index, size, start, plan.weight(size) * factor, last)
        # The caller's forward and backward run while the generator waits here, inside the context.
        with contextlib.nullcontext() if skip is None or last else skip(model):
            yield micro
        start += size


def accumulate_grads(total: Any, grads: Any, weight: float = 1.0, *, backend: str | None = None) -> Any:
    """``total + weight * grads``, leaf by leaf: the running sum of a step's weighted gradients.

    For a ``GradientTape`` or ``jax.grad``, also traced; torch adds into ``.grad`` itself.
    See [Frameworks that return gradients](../guides/gradient-accumulation.md#frameworks-that-return-gradients).

    Args:
        total: The sum so far, or None for the first micro-batch.
        grads: This micro-batch's gradients, in ``total``'s structure (lists, tuples, dicts; JAX: any pytree).
        weight: The factor ``grads`` take (``mb.weight`` when the loss was not weighted).
        backend: The framework, or None (default): the one configured, else the one imported.

    Returns:
        The new sum, in ``grads``' structure.

    Raises:
        ConfigError: ``weight`` is not a finite number, or ``backend`` cannot be told.
        UnsupportedFeature: The framework has no gradients to add.

    Example:
        ```python
        total = None
        for mb in unimem.accumulate(plan):
            with tf.GradientTape() as tape:
                loss = loss_fn(model(x[mb.slice]), y[mb.slice])
            grads = tape.gradient(loss, model.trainable_variables)
            total = unimem.accumulate_grads(total, grads, mb.weight, backend="tensorflow")
        optimizer.apply_gradients(zip(total, model.trainable_variables))
        ```
    """
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ConfigError("weight", f"expected a finite number (mb.weight), got {weight!r}")
    name = registry.resolve(backend, "action")
    if name is None:  # an action always names one or raises; kept for the type checker
        raise ConfigError("backend", "pass backend= the framework the gradients come from")
    return registry.get_backend(name).accumulation.add_gradients(total, grads, float(weight))
