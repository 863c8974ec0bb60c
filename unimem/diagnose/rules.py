"""The suggestions of an out-of-memory report, as a table of rules.

Each rule reads one ``Context`` (the figures of the failure and the failing backend's
traits) and answers ``(score, Suggestion)`` or None; ``suggest`` runs them all and ranks
by score (a tie keeps the order of the table). Rules name no framework: what differs
between frameworks (the code to show, whether a failed step's outputs stay in use,
whether a pool preallocates) comes from the adapters' traits.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from unimem import registry
from unimem.live_memory import LiveMemory
from unimem.memory_stats import MemoryStats
from unimem.pool_fragmentation import Fragmentation
from unimem.sizes import format_bytes
from unimem.support import When

__all__ = ["HIGH_FRAGMENTATION", "POOL_RULES", "RULES", "Context", "PoolUse", "Suggestion", "Traits", "suggest"]

# Fragmentation above this share, with enough free bytes in the pool for the request,
# means the memory was there but in pieces: an allocator setting helps more than a
# smaller batch.
HIGH_FRAGMENTATION = 0.3
# Another framework's idle pool worth mentioning when the request size is unknown.
_IDLE_POOL_WORTH = 1 << 30


@dataclass(frozen=True)
class Suggestion:
    """One thing to change, with the evidence for it from this failure.

    An entry of ``OOMReport.suggestions``, which are ranked most promising first.

    Attributes:
        kind (str): A stable id to match on: ``"too-large"``, ``"free-other-pool"``,
            ``"allocator"``, ``"raise-cap"``, ``"smaller-batch"``, ``"fresh-process"``,
            ``"mixed-precision"`` or ``"checkpointing"``.
        action (str): What to do, in one sentence.
        why (str): The evidence for it from this failure's figures.
        code (str | None): Code to do it in the failing framework; None when there is none.
    """

    kind: str  # stable id: "too-large", "free-other-pool", "allocator", "raise-cap", "smaller-batch", ...
    action: str
    why: str
    code: str | None = None


@dataclass(frozen=True)
class PoolUse:
    """Memory another framework in this process holds on the same device."""

    framework: str
    allocated: int | None
    reserved: int | None
    limit: int | None

    @property
    def idle(self) -> int | None:
        """Bytes its pool holds that none of its arrays use."""
        if self.reserved is None or self.allocated is None:
            return None
        return max(0, self.reserved - self.allocated)


@dataclass(frozen=True)
class Traits:
    """What the rules need to know of one backend, read from its adapter class."""

    name: str
    keeps_failed_outputs: bool = False  # a failed step's outputs stay in use until the process ends
    preallocates: bool = False  # its pool is taken up front (idle bytes go back only by not preallocating)
    expandable: bool = False  # it has an expandable-segments allocator
    accumulation_code: str = ""
    checkpoint_code: str = ""

    @classmethod
    def of(cls, name: str) -> Traits:
        try:
            adapter = registry.get_backend(name)
        except Exception:  # an adapter that cannot be loaded: nothing known
            return cls(name)
        expandable = adapter.CAPABILITIES.get("allocator.expandable")
        return cls(
            name,
            keeps_failed_outputs=adapter.failed_step_keeps_outputs,
            preallocates=adapter.preallocation_var is not None,
            expandable=expandable is not None and expandable.supported,
            accumulation_code=adapter.diagnose.accumulation_code,
            checkpoint_code=adapter.diagnose.checkpoint_code,
        )


@dataclass(frozen=True)
class Context:
    """Everything the rules read about one failure."""

    framework: str | None  # None: no framework raised it (a plain MemoryError)
    requested: int | None
    capacity: int | None
    snapshot: MemoryStats | None
    frag: Fragmentation | None
    live: Sequence[LiveMemory]
    pools: Sequence[PoolUse]
    batch_size: int | None
    precision: tuple[bool | None, str]
    place: str | None
    on_gpu: bool
    traits: Traits  # the failing framework's; with none, those of the framework the code examples use
    pool_traits: dict[str, Traits] = field(default_factory=dict)  # each other pool's framework's


Scored = tuple[int, Suggestion]
Rule = Callable[[Context], Scored | None]
PoolRule = Callable[[Context, PoolUse], Scored | None]


def too_large(ctx: Context) -> Scored | None:
    if ctx.requested is None or ctx.capacity is None or ctx.requested <= ctx.capacity:
        return None
    return 100, Suggestion(
        "too-large",
        "Check the shapes: one allocation is larger than all the memory there is",
        f"it asked for {format_bytes(ctx.requested)}, and {ctx.place or 'the device'} has "
        f"{format_bytes(ctx.capacity)} in all; no setting makes that fit, a wrong shape or a batch "
        "orders of magnitude too big does that",
    )


def free_other_pool(ctx: Context, pool: PoolUse) -> Scored | None:
    idle = pool.idle
    if idle is None or idle <= 0:
        return None
    enough = ctx.requested is not None and idle >= ctx.requested
    if not enough and idle < _IDLE_POOL_WORTH:
        return None
    traits = ctx.pool_traits.get(pool.framework) or Traits(pool.framework)
    if traits.preallocates:
        action = f"Stop {pool.framework} from preallocating (set before its first operation)"
        code = f'unimem.configure(backend="{pool.framework}", growth=True)'
    else:  # it allocates on demand: what it holds idle is its cache
        action, code = f"Give {pool.framework}'s cached memory back", f'unimem.clear_cache("{pool.framework}")'
    fit = f", enough for the {format_bytes(ctx.requested)} asked for" if enough else ""
    return 90 if enough else 60, Suggestion(
        "free-other-pool",
        action,
        f"{pool.framework} in this process holds {format_bytes(pool.reserved)} and uses "
        f"{format_bytes(pool.allocated)} of it: {format_bytes(idle)} idle{fit}",
        code,
    )


def allocator(ctx: Context) -> Scored | None:
    frag = ctx.frag
    share = None if frag is None else frag.share
    if frag is None or share is None or share < HIGH_FRAGMENTATION or ctx.framework is None:
        return None
    if not ctx.traits.expandable:
        return None
    had_room = ctx.requested is not None and (frag.free_in_pool or 0) >= ctx.requested
    return 85 if had_room else 40, Suggestion(
        "allocator",
        "Use expandable segments so free pieces of the pool can be joined",
        f"the pool is {share:.0%} fragmented: {format_bytes(frag.free_in_pool)} "
        f"free but the largest block is {format_bytes(frag.largest_free_block)}"
        + (f", too small for {format_bytes(ctx.requested)}" if had_room else ""),
        f'unimem.configure(backend="{ctx.framework}", allocator="expandable")',
    )


def raise_cap(ctx: Context) -> Scored | None:
    snapshot = ctx.snapshot
    if snapshot is None or snapshot.limit is None or not ctx.on_gpu:
        return None
    total, free = snapshot.device_total, snapshot.device_free
    if total is None or free is None or snapshot.limit >= 0.95 * total or free <= (ctx.requested or 0):
        return None
    return 70 if ctx.requested is not None else 30, Suggestion(
        "raise-cap",
        f"Raise {ctx.framework}'s memory cap",
        f"it may use {format_bytes(snapshot.limit)} of the device's {format_bytes(total)}, "
        f"and {format_bytes(free)} of the device is free",
        f'unimem.configure(backend="{ctx.framework}", fraction=...)  # larger; before start for {_capped_at_start()}',
    )


@functools.cache
def _capped_at_start() -> str:
    """The frameworks whose cap must be set before their device starts, as ``a/b``."""
    names = []
    for name in registry.frameworks():
        try:
            support = registry.capability_table(name).get("fraction")
        except Exception:  # an adapter not shipped in this install
            continue
        if support is not None and support.supported and support.when is not When.ANYTIME:
            names.append(name)
    return "/".join(names)


def _accumulation(batch_size: int, at_least: int) -> tuple[int, int]:
    """``(micro_batch, steps)`` with ``steps >= at_least``, preferring an exact split of
    ``batch_size`` (same global batch) unless that needs far more steps."""
    at_least = max(2, min(at_least, batch_size))
    for steps in range(at_least, min(batch_size, 2 * at_least) + 1):
        if batch_size % steps == 0:
            return batch_size // steps, steps
    return math.ceil(batch_size / at_least), at_least


def smaller_batch(ctx: Context) -> Scored | None:
    batch_size = ctx.batch_size
    if batch_size is None:
        return 50, Suggestion(
            "smaller-batch",
            "Use a smaller batch with gradient accumulation to keep the global batch",
            "the batch size is not known here: pass oom_guard(batch_size=N) for exact numbers, or let "
            "unimem.find_batch_size(step, start=...) find the largest that fits",
        )
    if batch_size <= 1:
        return None
    allocated = ctx.snapshot.allocated if ctx.snapshot is not None else None
    needed = allocated + ctx.requested if allocated is not None and ctx.requested is not None else None
    at_least = 2
    if needed is not None and ctx.capacity:
        at_least = max(2, math.ceil(needed / ctx.capacity))
    micro, steps = _accumulation(batch_size, at_least)
    total = micro * steps
    same = "the same global batch" if total == batch_size else f"a global batch of {total} (was {batch_size})"
    return 80, Suggestion(
        "smaller-batch",
        f"Use micro-batches of {micro} with {steps} gradient-accumulation steps ({same})",
        f"batch {batch_size} does not fit"
        + (
            f"; it needed at least {format_bytes(needed)} of {format_bytes(ctx.capacity)}"
            if needed is not None and ctx.capacity
            else ""
        )
        + "; unimem.find_batch_size(step, start=...) finds the largest that fits",
        ctx.traits.accumulation_code.format(micro=micro, steps=steps, total=total) or None,
    )


def fresh_process(ctx: Context) -> Scored | None:
    # A framework that keeps a failed execution's outputs in use leaves this process
    # with less than a fresh one: a retry here fits less (measured: docs/measurements.md).
    if ctx.framework is None or not ctx.traits.keeps_failed_outputs or not ctx.on_gpu:
        return None
    return 75, Suggestion(
        "fresh-process",
        "Retry with the new settings in a fresh process",
        f"{ctx.framework} does not free a failed step's output buffers: they stay in use until the process ends, "
        "so this process now fits less than a fresh one (for a training step, a copy of the "
        "parameters and optimizer state per failure)",
    )


def mixed_precision(ctx: Context) -> Scored | None:
    on, how = ctx.precision
    if on is True:
        return None
    return 65 if on is False else 45, Suggestion(
        "mixed-precision",
        "Turn on mixed precision (bf16): activations take half the memory",
        how if on is False else f"not known whether it is on ({how})",
        f'with unimem.mixed_precision("bf16", backend="{ctx.traits.name}"):  # around the step',
    )


def checkpointing(ctx: Context) -> Scored | None:
    seen_bytes = sum(memory.total_bytes for memory in ctx.live if memory.framework == ctx.framework)
    allocated = ctx.snapshot.allocated if ctx.snapshot is not None else None
    hidden = allocated is not None and allocated > 2 * seen_bytes
    return 58 if hidden else 35, Suggestion(
        "checkpointing",
        "Checkpoint activations: recompute them in the backward pass instead of keeping them",
        (
            f"live tensors Python sees hold {format_bytes(seen_bytes)} of {format_bytes(allocated)} allocated: "
            "the rest is mostly activations saved for the backward pass"
            if hidden
            else "trades about a third more compute for most of the activation memory"
        ),
        ctx.traits.checkpoint_code or None,
    )


RULES: tuple[Rule, ...] = (
    too_large,
    allocator,
    raise_cap,
    smaller_batch,
    fresh_process,
    mixed_precision,
    checkpointing,
)
POOL_RULES: tuple[PoolRule, ...] = (free_other_pool,)  # run once per other framework's pool


def suggest(ctx: Context) -> list[Suggestion]:
    """Every rule's suggestion for ``ctx``, most promising first."""
    scored = [found for rule in RULES if (found := rule(ctx)) is not None]
    scored += [found for pool in ctx.pools for rule in POOL_RULES if (found := rule(ctx, pool)) is not None]
    scored.sort(key=lambda pair: -pair[0])  # stable: ties keep the order above
    return [suggestion for _, suggestion in scored]
