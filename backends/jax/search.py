"""What ``find_batch_size`` asks of JAX: the peak a lowered step will reach, read from XLA's
compiled program without running it, and the cause of a step's "Array has been deleted" after
an out-of-memory error. Importing this module imports nothing of JAX."""

from __future__ import annotations

from typing import Any

from unimem.memory_stats import MemoryStats

__all__ = ["capacity", "explain_step_error", "predict_peak"]

# A failed call deletes the arrays it was given to donate; JAX's own message names no cause.
_DONATED = (
    "unimem.find_batch_size: an earlier trial ran out of memory, and a JAX call that fails deletes "
    "the arrays it was given to donate (donate_argnums). Search with a step that does not donate "
    "(or passes copies), then donate in training with the size found"
)


def explain_step_error(exc: BaseException, after_oom: bool) -> str | None:
    """The cause of JAX's "Array has been deleted" raised by a step after an earlier trial's
    out-of-memory error (the step donated its state, which the failed call deleted); else None."""
    return _DONATED if after_oom and "has been deleted" in str(exc) else None


def _platform(compiled: Any) -> str | None:
    """The platform (``"cpu"``, ``"gpu"``, ``"cuda"``, ``"tpu"``) the program was compiled for."""
    import jax

    for sharding in jax.tree_util.tree_leaves((compiled.input_shardings, compiled.output_shardings)):
        for device in getattr(sharding, "device_set", ()):
            return str(device.platform)
    return None


def predict_peak(lowered: Any) -> int | None:
    """The peak bytes of ``lowered`` (a ``jax.stages.Traced``, ``Lowered`` or ``Compiled``), or
    None when it is none of those or XLA gives no memory analysis. Compiles what is not compiled.

    On a GPU XLA's ``peak_memory_in_bytes`` is the peak of its buffer assignment (arguments,
    outputs and the temporaries' block), which is what the device's allocator then holds. On the
    CPU that field counts arguments and outputs only, while the temporaries are allocated too:
    there the peak is arguments + outputs + temporaries - the bytes outputs alias from arguments.
    Both agree with the measured peak (docs/measurements.md, "batch-size search")."""
    stage = lowered
    if not hasattr(stage, "memory_analysis") and hasattr(stage, "lower") and not hasattr(stage, "compile"):
        stage = stage.lower()  # a Traced
    if not hasattr(stage, "memory_analysis") and hasattr(stage, "compile"):
        stage = stage.compile()  # a Lowered
    analysis = stage.memory_analysis() if hasattr(stage, "memory_analysis") else None
    if analysis is None:
        return None
    held = (
        int(analysis.argument_size_in_bytes)
        + int(analysis.output_size_in_bytes)
        + int(analysis.temp_size_in_bytes)
        - int(analysis.alias_size_in_bytes)
    )
    peak = int(getattr(analysis, "peak_memory_in_bytes", 0) or 0)
    # XLA's CPU figure leaves the temporaries out; elsewhere its own peak is the one to hold.
    return held if _platform(stage) == "cpu" or peak <= 0 else peak


def capacity(snapshot: MemoryStats) -> int | None:
    """The bytes a trial's peak may reach: the cap, less what a pool grown on demand cannot give
    a step. With growth on, XLA's allocator takes regions from the device as it needs them and
    cuts each request from one region, and a step's temporaries come as one buffer: all a step
    adds is held to one piece, the room left under the cap or the largest free block, whichever
    is larger (free blocks beside it may take a few small outputs: left out, on the safe side).
    Compilations and runs can grow the pool (XLA autotunes on real buffers), so the search reads
    this again before each run. An upper bound only: on an H200 the largest step a grown pool ran
    was 70% of its cap (docs/measurements.md). A preallocated pool is one region: then the cap."""
    limit, pool, in_use, block = snapshot.limit, snapshot.reserved, snapshot.allocated, snapshot.largest_free_block
    if limit is None or pool is None or in_use is None or block is None or pool >= limit:
        return limit
    return min(limit, in_use + max(limit - pool, block))
