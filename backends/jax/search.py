"""What ``find_batch_size`` asks of JAX: the peak a lowered step will reach, read from XLA's
compiled program without running it, and the cause of a step's "Array has been deleted" after
an out-of-memory error. Importing this module imports nothing of JAX.

On a GPU whose pool grows on demand a lowered step is compiled for its figures in a fresh process
(``_fresh_compile``) into JAX's persistent compilation cache, and loaded here: autotuning there takes
none of this process's pool, nothing compiles here, and the program sized is the program that runs
(where the cache cannot serve, its kernel choices are loaded here instead). Before a predicted call,
the pool is grown by one region for all the call adds (``search_make_room``). Without ``lower=`` the
calls themselves are sized as they run (``search_compiled_call``): what a call compiles is compiled
in a fresh process and its figures read before it runs, a program that cannot fit refused then."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from unimem.backends.base import CompiledProgram, Search
from unimem.backends.jax._fresh_compile import (
    AUTOTUNE_FLAG,
    FRESH_PLATFORMS,
    REMAT,
    FreshCompileError,
    autotune_directory,
    close_compilers,
    compile_lowered,
    compile_through_cache,
    compiled_during_call,
    load_autotuned,
    peak_of,
    platform,
)

from unimem.memory_stats import MemoryStats

__all__ = ["JaxSearch"]

# A failed call deletes the arrays it was given to donate; JAX's own message names no cause.
_DONATED = (
    "unimem.find_batch_size: an earlier trial ran out of memory, and a JAX call that fails deletes "
    "the arrays it was given to donate (donate_argnums). Search with a step that does not donate "
    "(or passes copies), then donate in training with the size found"
)


def _compiled(lowered: Any) -> Any:
    """``lowered`` compiled (a ``Lowered`` caches what it compiled: sizing it twice compiles once)."""
    stage = lowered
    if not hasattr(stage, "memory_analysis") and hasattr(stage, "lower") and not hasattr(stage, "compile"):
        stage = stage.lower()  # a Traced
    if not hasattr(stage, "memory_analysis") and hasattr(stage, "compile"):
        stage = stage.compile()  # a Lowered
    return stage


def _nbytes(tree: Any) -> list[int]:
    """The bytes of each array described in ``tree`` (shapes and dtypes)."""
    import jax
    import numpy as np

    sizes = []
    for leaf in jax.tree_util.tree_leaves(tree):
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is not None and dtype is not None:
            sizes.append(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    return sizes


class JaxSearch(Search):
    """JAX in the batch search (``SearchTopic``): peaks predicted from XLA's compiled step, a pool's room."""

    rematerializes = True  # XLA recomputes activations to stay under its limit
    saturation_cause = "XLA rematerializes: it recomputes activations to fit under its limit"
    predicts_concurrently = True  # XLA compiles with the interpreter released
    # XLA's GPU scheduler rematerializes past 95% of its memory limit (xla_gpu_memory_limit_slop_factor,
    # default 95); the limit is the pool's (on an H200 the "99.52 GiB" XLA logged under a 104.85 GiB pool).
    remat_share = 0.95
    kept_outputs_note = (
        "XLA does not free a failed execution's output buffers, which stay in use until the process ends; "
        "this process now fits less than a fresh one"
    )

    @property
    def fresh_process_advice(self) -> str | None:
        """A fresh process compiles the step with the kernel choices made for the search, not autotuning
        its own: on an H200 a first step's own autotuning took 32-64 GiB of regions before its
        temporaries (docs/measurements.md)."""
        if self._served is not None:
            return (
                f'start it with JAX_COMPILATION_CACHE_DIR="{self._served}", which holds the executables and '
                "kernel choices made for the search: it then loads a size the search compiled, and compiles another "
                "without autotuning, whose buffers would take regions of its own pool"
            )
        return (
            f'start it with XLA_FLAGS="{AUTOTUNE_FLAG}={autotune_directory()}", which holds the kernel choices '
            "made for the search: it then compiles the step without autotuning, whose buffers would take regions "
            "of its own pool"
        )

    _served: str | None = None  # the persistent compilation cache the search's sizes were compiled into

    def search_done(self) -> None:
        """The processes that compiled the search's sizes leave now: each holds a context on the device,
        which the training after the search may need."""
        close_compilers()
        self._served = _through_cache[-1] if _through_cache else None
        _through_cache.clear()

    def search_notes(self) -> list[str]:
        """Where the search's sizes were compiled into the persistent compilation cache: that the answer's
        step is there, and how another process loads it rather than compiling it (autotuning on buffers
        of its own pool: on an H200 the whole-GPU Flax MLP's answer, 2,045,670, did not run in a fresh
        process that compiled it; docs/measurements.md)."""
        if self._served is None:
            return []
        return [
            f"each size was compiled in a fresh process into JAX's persistent compilation cache ({self._served}), "
            "which this process reads: training here loads the answer's compiled step instead of compiling it. "
            f'Another process loads it where JAX_COMPILATION_CACHE_DIR="{self._served}" is set; compiling the step '
            "itself, it autotunes on buffers from its own pool, which may leave too little room at this size"
        ]

    def search_capacity(self, snapshot: MemoryStats) -> int | None:
        """The bytes a trial's peak may reach: the cap, less what a pool grown on demand cannot give
        a step. With growth on, XLA's allocator takes regions from the device as it needs them and
        cuts each request from one region, and a step's temporaries come as one buffer: all a step
        adds is held to one piece, the room left under the cap or the largest free block, whichever
        is larger (free blocks beside it may take a few small outputs: left out, on the safe side).
        Compilations and runs can grow the pool (XLA autotunes on real buffers), so the search reads
        this again before each call. The search uses it where no step's largest buffer is predicted
        (no ``lower=``); with predictions it holds the peak against the cap and the largest buffer
        against ``search_largest_buffer``. A pool grown to its limit has no room left under it: its
        largest free block is all one buffer gets (a preallocated pool is one region, whose free
        block is about the cap less what is in use)."""
        limit, pool, in_use, block = snapshot.limit, snapshot.reserved, snapshot.allocated, snapshot.largest_free_block
        if limit is None or pool is None or in_use is None or block is None:
            return limit
        return min(limit, in_use + max(limit - pool, block))

    def search_largest_buffer(self, snapshot: MemoryStats) -> int | None:
        """The largest buffer XLA's allocator can hand out now: its largest free block, or a new
        region in the room left under the cap, whichever is larger. A pool grown on demand keeps
        every region it took (compilations take some: XLA autotunes on real buffers), and a buffer
        is cut from one region. None where the figures are unknown (the CPU)."""
        limit, pool, block = snapshot.limit, snapshot.reserved, snapshot.largest_free_block
        if limit is None or pool is None or block is None:
            return None
        return max(block, limit - pool)

    def search_room_after_region(self, snapshot: MemoryStats) -> int | None:
        """The largest buffer XLA's allocator could hand out after a compilation took one more region: with
        growth on, the pool grows in regions, a new one at least twice the last (which holds the largest
        free block) and, where they doubled one by one, about as large as the pool so far; XLA autotunes a
        compilation's kernels on real buffers, which may take one. A region at least as large as what is
        left under the limit takes all of it, and is one free block again after the autotuning: the room
        stays. None for a preallocated pool (one region: a compilation takes nothing from the device) or
        unknown figures."""
        limit, pool, block = snapshot.limit, snapshot.reserved, snapshot.largest_free_block
        if limit is None or pool is None or block is None or pool >= limit:
            return None
        left, region = limit - pool, max(pool, 2 * block)
        return max(block, left - region if region < left else left)

    def search_make_room(self, snapshot: MemoryStats, adds: int, device: int) -> None:
        """With growth on, XLA's allocator grows its pool by regions of doubling size (a power of two
        bytes), a new one when no free block holds a request, and cuts every later buffer from them.
        A step's inputs, made before it runs, then take a region of their own up to twice their size,
        and its temporaries may find too little room beside it (on an H200 a Flax MLP's 8.2 GiB inputs
        took a 16 GiB region and its 90.4 GiB of temporaries failed under a 104.85 GiB limit, where
        one region for both had held them). So, where the call adds more than the largest free
        block and the room under the limit holds it: one buffer a little under ``adds`` grows the pool by
        a region that holds all the call adds (or all the room left), and is given back at once. An
        allocation that fails changes nothing."""
        limit, pool, block = snapshot.limit, snapshot.reserved, snapshot.largest_free_block
        if limit is None or pool is None or block is None or adds <= block or adds > limit - pool:
            return
        # Half the power of two at or above ``adds`` and a byte takes that power of two in a pool that
        # doubles its regions; ``adds`` less a sixty-fourth (at most 64 MiB) nearly all of it in one that
        # grows otherwise. Either way less than ``adds``: the call's own peak passes it and is read.
        slack = min(adds // 64, 64 << 20)
        _grow_pool(max((1 << (adds - 1).bit_length()) // 2 + 1, adds - slack), device)

    @contextlib.contextmanager
    def search_compiled_call(self) -> Iterator[list[CompiledProgram] | None]:
        """On a pool grown on demand, every program a measured call compiles is compiled in a fresh process
        into the persistent compilation cache and loaded here (``compiled_during_call``): its autotuning
        takes no region of this pool, and its figures give the call's peak where XLA's cannot (a peak is
        never reset: one below an earlier high-water mark reads as none). None elsewhere."""
        if not _grows_on_demand():
            yield None
            return
        with compiled_during_call() as served:
            if served is None:
                yield None
                return
            recorded, directory = served
            yield recorded
            if recorded and directory not in _through_cache:
                _through_cache.append(directory)

    def predict_rematerialized(self, lowered: Any) -> bool | None:
        """Whether XLA rematerialized ``lowered``'s compiled program (recomputes values to fit under its
        limit, and runs slower): its optimized HLO defines clones named ``*.remat*``. None when the compiled
        text is not available."""
        hit = self.__dict__.get("_sized_cache", {}).get(id(lowered))
        if hit is not None and hit[0] is lowered and hit[1] is not None:
            text = hit[1]["text"]  # sized already: its compiled text, not a second compilation
        else:
            try:
                text = _compiled(lowered).as_text()
            except Exception:  # a stage without compiled text (an older JAX, a foreign object)
                return None
        return None if not isinstance(text, str) or not text else REMAT.search(text) is not None

    def predict_peak(self, lowered: Any) -> int | None:
        """The peak bytes of ``lowered`` (a ``jax.stages.Traced``, ``Lowered`` or ``Compiled``), or
        None when it is none of those or XLA gives no memory analysis. Compiles what is not compiled.

        On a GPU XLA's ``peak_memory_in_bytes`` is the peak of its buffer assignment (arguments,
        outputs and the temporaries' block), which is what the device's allocator then holds. On the
        CPU that field counts arguments and outputs only, while the temporaries are allocated too:
        there the peak is arguments + outputs + temporaries - the bytes outputs alias from arguments.
        Both agree with the measured peak (docs/measurements.md, "batch-size search")."""
        sized = self._sized(lowered)
        return None if sized is None else sized["peak"]

    def predict_largest_buffer(self, lowered: Any) -> int | None:
        """The largest single buffer a run of ``lowered`` allocates: XLA takes all of a program's
        temporaries as one buffer (on an H200 the request that ran out was exactly
        ``temp_size_in_bytes``: docs/measurements.md), and each argument and output as its own.
        None when XLA gives no memory analysis."""
        sized = self._sized(lowered)
        return None if sized is None else sized["largest"]

    def _sized(self, lowered: Any) -> dict[str, Any] | None:
        """``lowered``'s figures (peak, largest buffer, compiled text), each step sized once: the last
        few are kept, the object beside them so that its id is not reused while kept."""
        cache: dict[int, tuple[Any, dict[str, Any] | None]] = self.__dict__.setdefault("_sized_cache", {})
        hit = cache.get(id(lowered))
        if hit is not None and hit[0] is lowered:
            return hit[1]
        found = _size(lowered)
        cache[id(lowered)] = (lowered, found)
        while len(cache) > _KEPT:
            del cache[next(iter(cache))]
        return found

    def explain_step_error(self, exc: BaseException, after_oom: bool) -> str | None:
        """The cause of JAX's "Array has been deleted" raised by a step after an earlier trial's
        out-of-memory error (the step donated its state, which the failed call deleted); else None."""
        return _DONATED if after_oom and "has been deleted" in str(exc) else None


# The persistent compilation caches that served this process's sizing (``compile_through_cache``).
_through_cache: list[str] = []
_KEPT = 16  # sized steps remembered: a round of the search sizes two, and asks three figures of each


def _grow_pool(nbytes: int, device: int) -> None:
    """A buffer of ``nbytes`` on local device ``device``, given back at once (the pool keeps the region it
    took); an out-of-memory error changes nothing and is let go."""
    jax = sys.modules.get("jax")  # a pool that grows has JAX imported; none to grow otherwise
    if jax is None:
        return
    import jax.numpy as jnp

    try:
        buffer = jnp.zeros((nbytes,), jnp.uint8, device=jax.local_devices()[device])
        buffer.block_until_ready()
        buffer.delete()
    except jax.errors.JaxRuntimeError as exc:
        if "RESOURCE_EXHAUSTED" not in str(exc):
            raise


def _grows_on_demand() -> bool:
    """Whether this process's pool is grown on demand (growth on), so that a compilation here would
    keep the regions its autotuning takes."""
    jax = sys.modules.get("jax")  # a step lowered by JAX has imported it; nothing else is sized this way
    if jax is None:
        return False
    preallocate = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").strip().lower()
    allocator = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").strip().lower()
    return jax.default_backend() in FRESH_PLATFORMS and (preallocate in ("false", "0") or allocator == "platform")


def _size(lowered: Any) -> dict[str, Any] | None:
    """The figures of ``lowered``: on a pool grown on demand a ``Lowered`` is compiled in a fresh process
    and loaded here from the persistent compilation cache (no compilation here: the step's own call
    finds it too); where that cache cannot serve, compiled there and its kernel choices loaded here
    (a compilation without autotuning); else it is compiled here."""
    stage = lowered
    if hasattr(lowered, "as_text") and hasattr(lowered, "_lowering") and _grows_on_demand():
        try:
            stage, directory = compile_through_cache(lowered)
            if directory not in _through_cache:
                _through_cache.append(directory)
        except FreshCompileError:
            try:
                compile_lowered(lowered)  # autotunes there; the choices land in the shared directory
            except FreshCompileError:
                pass  # compiled here below, autotuning in this process as JAX does
            else:
                stage = load_autotuned(lowered)  # kept in memory: the step's own compilation finds them
    stage = _compiled(stage)
    analysis = stage.memory_analysis() if hasattr(stage, "memory_analysis") else None
    if analysis is None:
        return None
    sizes = [int(analysis.temp_size_in_bytes)]
    for info in ("args_info", "out_info"):
        try:
            sizes += _nbytes(getattr(stage, info))
        except Exception:  # an older JAX without it: the temporaries alone
            continue
    try:
        text = stage.as_text()
    except Exception:  # a stage without compiled text (an older JAX, a foreign object)
        text = None
    return {
        "peak": peak_of(analysis, platform(stage)),
        "largest": max(sizes),
        "text": text,
    }
