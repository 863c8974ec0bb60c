"""Capability entries: what a backend can do, how, and when it must be asked.

The tables live in each backend as data; ``compat_matrix.md``, ``capabilities()``
and every "is this supported" check read those tables and nothing else.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["FEATURES", "Level", "Phase", "Support", "When"]


class Level(str, enum.Enum):
    NATIVE = "native"  # a public framework API does it
    ENV = "env"  # an environment variable the framework reads does it
    EMULATED = "emulated"  # unimem does it with the framework's primitives
    UNSUPPORTED = "unsupported"

    def __str__(self) -> str:
        return self.value


class When(str, enum.Enum):
    ANYTIME = "anytime"
    BEFORE_INIT = "before-init"  # before the framework touches the GPU
    BEFORE_IMPORT = "before-import"  # before ``import framework``

    def __str__(self) -> str:
        return self.value


class Phase(enum.IntEnum):
    """How far a framework has got in this process; settings expire as it moves on."""

    NOT_IMPORTED = 0
    IMPORTED = 1  # imported, no device runtime yet
    INITIALIZED = 2  # device runtime started: allocator and visible devices are fixed

    def allows(self, when: When) -> bool:
        if when is When.ANYTIME:
            return True
        if when is When.BEFORE_INIT:
            return self < Phase.INITIALIZED
        return self is Phase.NOT_IMPORTED

    def describe(self) -> str:
        return {
            Phase.NOT_IMPORTED: "not imported",
            Phase.IMPORTED: "imported, device not started",
            Phase.INITIALIZED: "device runtime started",
        }[self]


@dataclass(frozen=True)
class Support:
    """One backend's support for one feature."""

    level: Level
    api: str = ""  # the native call or env var, exactly as a user would write it
    when: When = When.ANYTIME
    note: str = ""

    @property
    def supported(self) -> bool:
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
}
