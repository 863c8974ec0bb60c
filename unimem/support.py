"""Capability entries: what a backend can do, how, and when it must be asked.

The tables live in each backend as data; ``compat_matrix.md``, ``capabilities()``
and every "is this supported" check read those tables and nothing else.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["FEATURES", "Level", "Phase", "Support", "When"]


class Level(str, enum.Enum):
    """How a backend does a feature. A ``str`` enum: ``str(level)`` is its value.

    Attributes:
        NATIVE: ``"native"``: a public framework API does it.
        ENV: ``"env"``: an environment variable the framework reads does it.
        EMULATED: ``"emulated"``: unimem does it with the framework's primitives.
        UNSUPPORTED: ``"unsupported"``: the backend cannot do it.
    """

    NATIVE = "native"  # a public framework API does it
    ENV = "env"  # an environment variable the framework reads does it
    EMULATED = "emulated"  # unimem does it with the framework's primitives
    UNSUPPORTED = "unsupported"

    def __str__(self) -> str:
        return self.value


class When(str, enum.Enum):
    """By when a feature must be asked for. A ``str`` enum: ``str(when)`` is its value.

    Attributes:
        ANYTIME: ``"anytime"``: it can be asked for at any point.
        BEFORE_INIT: ``"before-init"``: before the framework touches the GPU.
        BEFORE_IMPORT: ``"before-import"``: before ``import framework``.
    """

    ANYTIME = "anytime"
    BEFORE_INIT = "before-init"  # before the framework touches the GPU
    BEFORE_IMPORT = "before-import"  # before ``import framework``

    def __str__(self) -> str:
        return self.value


class Phase(enum.IntEnum):
    """How far a framework has got in this process; settings expire as it moves on.

    An ``IntEnum``: phases compare in order (``Phase.IMPORTED < Phase.INITIALIZED``).

    Attributes:
        NOT_IMPORTED: ``0``: the framework is not imported.
        IMPORTED: ``1``: imported, no device runtime yet.
        INITIALIZED: ``2``: device runtime started: allocator and visible devices are fixed.
    """

    NOT_IMPORTED = 0
    IMPORTED = 1  # imported, no device runtime yet
    INITIALIZED = 2  # device runtime started: allocator and visible devices are fixed

    def allows(self, when: When) -> bool:
        """Whether a feature that must be asked for by ``when`` can still be asked for in this phase.

        Args:
            when: By when the feature must be asked for.

        Returns:
            True for ``When.ANYTIME``; for ``When.BEFORE_INIT`` while the device runtime has
            not started; for ``When.BEFORE_IMPORT`` only before the import.
        """
        if when is When.ANYTIME:
            return True
        if when is When.BEFORE_INIT:
            return self < Phase.INITIALIZED
        return self is Phase.NOT_IMPORTED

    def describe(self) -> str:
        """The phase in words, as ``unimem.summary()`` prints it.

        Returns:
            ``"not imported"``, ``"imported, device not started"`` or ``"device runtime started"``.
        """
        return {
            Phase.NOT_IMPORTED: "not imported",
            Phase.IMPORTED: "imported, device not started",
            Phase.INITIALIZED: "device runtime started",
        }[self]


@dataclass(frozen=True)
class Support:
    """One backend's support for one feature: an entry of ``unimem.capabilities(backend)``.

    Attributes:
        level (Level): How the backend does it (native, env, emulated or unsupported).
        api (str): The native call or environment variable, exactly as a user would write
            it; empty when there is none.
        when (When): By when it must be asked for.
        note (str): Limits, or why it is unsupported and what to use instead.

    Example:
        ```python
        support = unimem.capabilities("jax")["reset_peak"]
        print(support.level, support.when, support.note)
        ```
    """

    level: Level
    api: str = ""  # the native call or env var, exactly as a user would write it
    when: When = When.ANYTIME
    note: str = ""

    @property
    def supported(self) -> bool:
        """Whether the backend can do the feature at all (its level is not ``UNSUPPORTED``)."""
        return self.level is not Level.UNSUPPORTED


# Rows of compat_matrix.md, in order, with the sentence that heads each row.
FEATURES: dict[str, str] = {
    "fraction": "cap as a share of device memory (`fraction=`)",
    "limit": "cap in bytes (`limit=`)",
    "growth": "allocate on demand, no preallocation (`growth=True`)",
    "preallocate": "preallocate the allowance (`growth=False`)",
    "allocator.default": "allocator `default`",
    "allocator.async": "allocator `async` (cudaMallocAsync)",
    "allocator.expandable": "allocator `expandable` (expandable segments)",
    "allocator.uncached": "allocator `uncached` (memory returns on free)",
    "devices": "visible devices (`devices=`)",
    "stats.allocated": "`stats().allocated` (live tensors)",
    "stats.reserved": "`stats().reserved` (pool held from the device)",
    "stats.peak": "`stats().peak_allocated` / `peak_reserved`",
    "stats.limit": "`stats().limit`",
    "stats.largest_free_block": "`stats().largest_free_block`",
    "stats.num_allocs": "`stats().num_allocs` / `num_ooms`",
    "stats.device": "`stats().device_total` / `device_free`",
    "stats.process_used": "`stats().process_used` (NVML, this process)",
    "reset_peak": "`reset_peak()`",
    "clear_cache": "`clear_cache()` gives cached memory back",
    "precision.bf16": "mixed precision bf16 (`mixed_precision('bf16')`)",
    "precision.fp16": "mixed precision fp16 (`mixed_precision('fp16')`)",
    "precision.loss_scaling": "dynamic loss scaling (`policy.loss_scaler()`)",
    "oom": "out-of-memory errors recognised (`is_oom`, `oom_guard`)",
    "fragmentation": "pool fragmentation (`unimem.fragmentation()`, OOM reports)",
    "batch_size": "largest batch that fits (`find_batch_size`)",
    "remat.full": "recompute every activation in the backward pass (`remat(fn, 'full')`)",
    "remat.matmuls": "keep only matmul outputs, recompute the rest (`remat(fn, 'matmuls')`)",
    "remat.offload": "keep saved activations on the host (`remat(fn, 'offload')`, `offload()`)",
    "accumulate": "gradient accumulation to a global batch (`accumulate`, `accumulate_grads`)",
    "ranks.pin": "each rank pinned to its own GPU (`configure()` under a launcher)",
    "ranks.cluster": "every rank's figures gathered (`cluster_stats()`)",
    "ranks.batch_size": "one batch size agreed by every rank (`find_batch_size` under a distributed runtime)",
}
