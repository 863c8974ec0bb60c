"""Simulated XLA compilers and devices for the batch search with ``lower=``: the three curves an
H200 measured (benchmarks/results/jax_compile_curve-gpu-h200.json), replayed on the whole GPU and
under an 8 GiB cap, and random ones.

A ``Compiler`` says, for each batch size, what XLA's memory analysis of the compiled training
step says (arguments, outputs, temporaries), how long the compilation took, and whether XLA
rematerialized the program: past ``REMAT_SHARE`` of the pool's limit (XLA's GPU scheduler
limit), the program is rematerialized and its temporaries flatten, so its peak reads as if it
fit. A ``Device`` holds one compiler's program and a pool grown on demand as XLA's allocator
grows it (regions each twice the last, each request cut from one region, a step's temporaries
one buffer), where each compilation autotunes on real buffers (``autotune`` of its temporaries)
and so may take a region. It answers the JAX adapter's ``stats``/``reset_peak``/``clear_cache``
and its search topic's sizing (``install``), and keeps a simulated clock: compilations, runs
and failures take the seconds the H200 took. Nothing here imports a framework.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from device_view import no_collection, show_a_device
from unimem.backends.base import CompiledProgram
from unimem.backends.jax import search as jax_search

import unimem
from unimem import registry
from unimem.search import runner

GiB = 1 << 30
REMAT_SHARE = 0.95  # XLA rematerializes a program whose peak would pass this share of the pool's limit
FLATTENED = 0.9  # the temporaries of a rematerialized program, as a share of what they would be
FAIL_SECONDS = 18.0  # a failed step on the H200 (16-21 s for the Flax MLP)
RUN_SECONDS = 0.5


@dataclass(frozen=True)
class Compiler:
    """XLA's figures for one training step: ``curve`` is ``(batch size, temporaries per sample)``
    as measured (interpolated in log size between, held flat past the last), ``seconds`` the
    compilation times measured; arguments are ``args0 + args_per_sample × n``."""

    name: str
    curve: tuple[tuple[int, float], ...]
    seconds: tuple[tuple[int, float], ...]
    args0: int
    args_per_sample: int
    outputs: int
    held: int  # bytes in use before the search: parameters and optimizer state
    limit: int  # the pool's limit
    pool: int  # the pool before the search, and its largest free block then
    block: int
    autotune: float  # share of the temporaries a compilation autotunes on
    start: int
    parameter: int  # the largest parameter (an argument and an output of the step)
    tracker: float = 1.0  # XLA's own estimate of a program's peak, over the buffer assignment's

    def _interp(self, points: tuple[tuple[int, float], ...], n: int) -> float:
        sizes = [p[0] for p in points]
        if n <= sizes[0]:
            return points[0][1]
        if n >= sizes[-1]:
            return points[-1][1]
        i = bisect.bisect_right(sizes, n)
        (n0, v0), (n1, v1) = points[i - 1], points[i]
        share = (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))
        return v0 + share * (v1 - v0)

    def natural_temp(self, n: int) -> int:
        return int(n * self._interp(self.curve, n))

    def args(self, n: int) -> int:
        return self.args0 + self.args_per_sample * n

    def natural_peak(self, n: int) -> int:
        return self.args(n) + self.outputs + self.natural_temp(n)

    def rematerialized(self, n: int) -> bool:
        return self.tracker * self.natural_peak(n) > REMAT_SHARE * self.limit

    def temp(self, n: int) -> int:
        """The temporaries of the program XLA compiles: flattened where it rematerialized."""
        return int(FLATTENED * self.natural_temp(n)) if self.rematerialized(n) else self.natural_temp(n)

    def peak(self, n: int) -> int:
        return self.args(n) + self.outputs + self.temp(n)

    def compile_seconds(self, n: int) -> float:
        return self._interp(self.seconds, n)


def _points(rows: list[tuple[int, int]]) -> tuple[tuple[int, float], ...]:
    return tuple((n, temp / n) for n, temp in rows)


# benchmarks/results/jax_compile_curve-gpu-h200.json (2026-12-02, jax 0.11.2): the temporaries of the
# default compilation at each size below XLA's rematerialization; the pool when the H200's search began
# (benchmarks/results/search-gpu-h200.json, each row's ``before``: the warm-up's run took one more region
# than its compilation), or after compiling the start where no search row recorded it. XLA rematerialized
# the Flax MLP's 1.5M, whose peak by the buffer assignment is 97.9% of its limit: its own estimate of a
# peak runs at least 2.2% higher.
FLAX_MLP_RECORDED = Compiler(
    "flax-mlp",
    _points([(8, 5144), (1024, 33565720), (65536, 4328534808), (262144, 17213436696), (524288, 34393305880),
             (860000, 56446366488), (1048576, 68761432856)]),
    ((8, 1.329), (1024, 2.694), (65536, 2.997), (262144, 4.304), (524288, 5.885), (860000, 8.018),
     (1048576, 8.073), (1500000, 12.442), (2080000, 13.421)),
    args0=100884604, args_per_sample=4100, outputs=100885056, held=100889600, limit=112583507968,
    pool=283115520, block=134217728, autotune=0.22, start=8, parameter=1024 * 1024 * 4, tracker=1.022,
)  # fmt: skip
# The curve has no size between 1024 and 65536. The H200's search compiled 8192 there, and its first
# guess, 2036400, is where XLA's temporaries at 8192 put it: 73.7 MB, 9 kB a sample, under the 33 kB of
# 1024 and the 66 kB from 65536 on (a line through them crosses the limit seven times past the answer).
FLAX_MLP = dataclasses.replace(FLAX_MLP_RECORDED, curve=tuple(sorted(FLAX_MLP_RECORDED.curve + ((8192, 8997.375),))))
JAX_MLP = Compiler(
    "jax-mlp",
    _points([(64, 2363928), (709, 36468248), (1418, 75517464), (4096, 67116568), (16384, 1610620440),
             (40950, 4193287704), (42001, 4300909080), (62504, 6400416024)]),
    ((64, 3.106), (709, 3.473), (1418, 3.661), (4096, 3.623), (16384, 4.06), (40950, 4.723), (42001, 4.786),
     (62504, 5.207)),
    args0=704852228, args_per_sample=8192, outputs=704852232, held=704852224, limit=8554283008,
    pool=2183135232, block=771751936, autotune=0.4, start=64, parameter=4096 * 4096 * 4,
)  # fmt: skip
JAX_TRANSFORMER = Compiler(
    "jax-transformer",
    _points([(2, 56641304), (8, 822111512), (23, 2797626136), (46, 5595229976), (52, 6325039896)]),
    ((2, 10.552), (8, 19.572), (23, 22.223), (46, 18.982), (52, 24.125)),
    args0=604078084, args_per_sample=2097152, outputs=604078872, held=616663552, limit=8554283008,
    pool=2145386496, block=918552576, autotune=0.12, start=2, parameter=1024 * 4096 * 4,
)  # fmt: skip


def _ran(held: int, outputs: int, per_sample: int, peaks: tuple[tuple[int, int], ...]) -> tuple[tuple[int, float], ...]:
    """Temporaries per sample from the peaks a search read (each less the bytes held, the step's outputs
    and its batch), as ``Device.step`` reads them back."""
    return _points([(n, peak - held - outputs - per_sample * n) for n, peak in peaks])


# The whole-GPU Flax MLP as the H200's search without lower= ran it (docs/measurements.md, "Every call
# counted"): the peaks it read at 5957, 953658, 1331318, 1401388 and 1475146, and at the start the
# process's peak after the warm-up; the bytes held and the pool's largest free block as the search
# began, and the seconds each size took to compile as the step ran it. XLA ran these programs with 30%
# fewer temporaries a sample than the curve above compiled.
FLAX_MLP_RAN = dataclasses.replace(
    FLAX_MLP_RECORDED,
    name="flax-mlp-ran",
    curve=_ran(134513920, FLAX_MLP_RECORDED.outputs, FLAX_MLP_RECORDED.args_per_sample,
               ((8, 281539840), (5957, 818457856), (953658, 48129417472), (1331318, 67206245376),
                (1401388, 70723012608), (1475146, 74426746368))),
    seconds=((5957, 3.542), (953658, 6.128), (1331318, 7.151), (1401388, 7.86), (1475146, 8.288),
             (1552786, 8.552), (2175621, 11.384)),
    held=134513920,
    block=79691776,
)  # fmt: skip
# The whole-GPU Flax MLP as the H200's search with lower= compiled it in fresh processes, loading each
# executable (benchmarks/results/search-gpu-h200.json, 2026-12-04): the temporaries of the sizes compiled,
# each compilation's seconds there, and nothing taken from this process's pool by compiling.
FLAX_MLP_FRESH = dataclasses.replace(
    FLAX_MLP_RAN,
    name="flax-mlp-fresh",
    curve=_points([(8, 4194304), (1024, 33565720), (262144, 17212178432), (1508755, 69589254144),
                   (2045670, 94349578240), (2153337, 97110392832)]),
    seconds=((1024, 2.573), (262144, 3.587), (1508755, 8.061), (2045670, 10.656), (2153337, 10.999)),
    autotune=0.0,
    tracker=1.0,  # 2,153,337 (98.85 GiB by the buffer assignment) compiled without rematerialization
)  # fmt: skip
MEASURED = (FLAX_MLP, JAX_MLP, JAX_TRANSFORMER)
WHOLE_GPU = FLAX_MLP.limit  # an H200's pool with growth on and no cap (104.85 GiB)
CAPPED = JAX_MLP.limit  # the same under configure(limit="8GiB")
# Each measured curve on the whole GPU and under the cap (the bytes a sample held past its last size).
SETTINGS = {
    f"{c.name}-{where}": dataclasses.replace(c, limit=limit)
    for c in MEASURED
    for where, limit in (("whole-gpu", WHOLE_GPU), ("8gib", CAPPED))
}


class Program:
    """What ``lower(n)`` returns: the compiled step of one size, as the JAX adapter's search topic
    reads it (``memory_analysis()``, ``as_text()``); compiling it is the device's (``Device.compile``)."""

    def __init__(self, device: Device, n: int) -> None:
        self.device, self.n = device, n

    def memory_analysis(self) -> Any:
        return self.device.compile(self.n)

    def as_text(self) -> str:
        remat = self.device.compiler.rematerialized(self.n)
        body = "  %multiply.remat = f32[8]{0} multiply(f32[8]{0} %p0, f32[8]{0} %p0)\n" if remat else ""
        return f"HloModule jit_train\n\nENTRY %main {{\n  %p0 = f32[8]{{0}} parameter(0)\n{body}}}\n"


@dataclass
class Analysis:
    argument_size_in_bytes: int
    output_size_in_bytes: int
    temp_size_in_bytes: int
    alias_size_in_bytes: int
    peak_memory_in_bytes: int


@dataclass
class Device:
    """One compiler's step on a simulated H200 pool grown on demand (see the module's docstring)."""

    compiler: Compiler
    autotune: float | None = None  # overrides the compiler's
    # A call's inputs and outputs take their piece of the pool before its temporaries (else only the
    # temporaries are held against it).
    apart: bool = False
    # Each size a call compiles is compiled in a fresh process and sized as the call runs (set
    # ``autotune`` 0 with it: nothing is autotuned here).
    elsewhere: bool = False
    refused: list[int] = field(default_factory=list)  # sizes refused before they ran (``elsewhere``)
    regions: list[int] = field(default_factory=list)  # the pool's free regions beside its first piece
    pool: int = 0
    block: int = 0  # the first piece's free block
    grow: int = 0  # the next region's size (XLA's allocator doubles it)
    kept: int = 0
    clock: float = 0.0
    compiled: dict[int, Analysis] = field(default_factory=dict)
    compilations: list[int] = field(default_factory=list)  # every size compiled, the step's own included
    calls: list[tuple[int, bool]] = field(default_factory=list)
    peak: int = 0
    mark: int | None = None  # where the peak was reset, as JAX does it: a peak not past it reads None

    def __post_init__(self) -> None:
        c = self.compiler
        self.pool, self.block = c.pool, c.block
        self.grow = 1 << max(0, (c.block - 1).bit_length())  # the last region: a power of two over its block
        if self.autotune is None:
            self.autotune = c.autotune

    # --- the pool -------------------------------------------------------------------------------
    @property
    def largest_free(self) -> int:
        return max([self.block, *self.regions])

    @property
    def room(self) -> int:
        return max(self.largest_free, self.compiler.limit - self.pool)

    def take(self, size: int) -> bool:
        """A buffer of ``size`` bytes for a moment (freed after): from a free block, else a new region."""
        return size <= self.largest_free or self._region(size)

    def _region(self, size: int) -> bool:
        """A new region for a buffer of ``size`` bytes, as XLA's allocator grows its pool: the next
        region's size, doubled until it holds the buffer, at most the room left under the limit."""
        available = self.compiler.limit - self.pool
        if size > available:
            return False
        region, doubled = self.grow, False
        while size > region:
            region, doubled = 2 * region, True
        region = min(region, available)
        self.regions.append(region)
        self.pool += region
        self.grow = region if doubled else 2 * region
        return True

    def take_call(self, n: int) -> bool:
        """What a call of size ``n`` takes from the pool: its temporaries alone, or with ``apart`` its
        inputs and outputs first, then its temporaries beside them."""
        c = self.compiler
        return self.take_beside(c.args_per_sample * n + c.outputs, c.temp(n)) if self.apart else self.take(c.temp(n))

    def take_beside(self, first: int, then: int) -> bool:
        """A buffer of ``first`` bytes (a step's inputs, made before it runs, and its outputs), then one of
        ``then`` (its temporaries) while the first is held, both freed after: each cut from the smallest
        free block that holds it (a best fit), else from a new region."""
        pieces = [self.block, *self.regions]
        fit = [piece for piece in pieces if piece >= first]
        if fit:
            pieces.remove(min(fit))
            pieces.append(min(fit) - first)
        elif self._region(first):
            pieces.append(self.regions[-1] - first)
        else:
            return False
        return then <= max(pieces) or self._region(then)

    # --- XLA ---------------------------------------------------------------------------------------
    def compile(self, n: int) -> Analysis:
        """Compile size ``n`` (once): the seconds it takes, and its autotuning's buffers from the pool."""
        if n not in self.compiled:
            c = self.compiler
            self.clock += c.compile_seconds(n)
            self.compilations.append(n)
            assert self.autotune is not None
            self.take(int(self.autotune * c.temp(n)))
            self.compiled[n] = Analysis(c.args(n), c.outputs, c.temp(n), 0, c.peak(n))
        return self.compiled[n]

    def fits(self, n: int) -> bool:
        """Whether ``n`` runs now, after its compilation (not rematerialized: at full speed)."""
        self.compile(n)
        c = self.compiler
        return not c.rematerialized(n) and c.peak(n) + self.kept <= c.limit and self.take_call(n)

    def step(self, n: int) -> None:
        self.compile(n)  # the step's own compilation where the search's did not serve it
        c = self.compiler
        if self.elsewhere and (c.peak(n) + self.kept > c.limit or c.temp(n) > self.room):
            # Sized before it ran, and refused: no run, nothing kept (``_fresh_compile.cannot_run``).
            self.calls.append((n, False))
            self.refused.append(n)
            raise MemoryError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate (sized: not run)")
        ok = c.peak(n) + self.kept <= c.limit and self.take_call(n)
        self.calls.append((n, ok))
        if not ok:
            self.clock += FAIL_SECONDS
            self.kept += c.outputs  # XLA keeps a failed execution's outputs
            raise MemoryError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
        self.clock += RUN_SECONDS
        self.peak = max(self.peak, c.held + self.kept + c.peak(n) - c.args0)

    def lower(self, n: int) -> Program:
        return Program(self, n)

    def largest(self, most: int = 1 << 26) -> int:
        """The largest size that runs at full speed in this process as it is now (each probe on a
        copy of it: it compiles the size, then runs it), bisected; 0 if none."""

        def runs(n: int) -> bool:
            return copy.deepcopy(self).fits(n)

        low, high = 0, 1
        while high <= most and runs(high):
            low, high = high, 2 * high
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if runs(middle) else (low, middle)
        return low

    # --- what the JAX adapter reads -----------------------------------------------------------------
    def stats(self, device: int = 0, *, nvml: bool = True) -> unimem.MemoryStats:
        c = self.compiler
        return unimem.MemoryStats(
            backend="jax",
            device=device,
            allocated=c.held + self.kept,
            reserved=self.pool,
            peak_allocated=None if self.mark is not None and self.peak <= self.mark else self.peak,
            limit=c.limit,
            largest_free_block=self.largest_free,
        )

    def reset_peak(self, device: int = 0) -> None:
        self.mark = self.peak  # JAX cannot reset its peak: a later one reads only where it passes this

    def clear_cache(self, device: int = 0) -> int:
        return 0


class Simulated:
    """The device the patched JAX adapter answers for."""

    device: Device | None = None


def install(monkeypatch: pytest.MonkeyPatch) -> Simulated:
    """The JAX adapter's figures and its search topic's sizing answered by ``Simulated.device``
    (``predict_rematerialized``, ``search_room_after_region`` and ``remat_share`` stay the
    adapter's own), the search timed by its clock, and no garbage collection per failure."""
    current = Simulated()
    jax = registry.get_backend("jax")

    def answer(name: str) -> Any:
        return lambda *a, **k: getattr(current.device, name)(*a, **k)

    for name in ("stats", "reset_peak", "clear_cache"):
        monkeypatch.setattr(jax, name, answer(name))

    def predict_peak(lowered: Any) -> int | None:
        return int(lowered.memory_analysis().peak_memory_in_bytes) if isinstance(lowered, Program) else None

    def predict_largest_buffer(lowered: Any) -> int | None:
        if not isinstance(lowered, Program):
            return None
        a, c = lowered.memory_analysis(), lowered.device.compiler
        return max(a.temp_size_in_bytes, c.args_per_sample * lowered.n, c.parameter)

    def grow_pool(nbytes: int, device: int) -> None:
        """The search grows the pool by one buffer given back at once (``search_make_room``): XLA's peak
        passes it."""
        d = current.device
        if d is not None and d.take(nbytes):
            d.peak = max(d.peak, d.compiler.held + d.kept + nbytes)

    @contextlib.contextmanager
    def compiled_call() -> Iterator[list[CompiledProgram] | None]:
        d = current.device
        if d is None or not d.elsewhere:
            yield None
            return
        first, recorded = len(d.compilations), []
        try:
            yield recorded
        finally:
            c = d.compiler
            recorded += [
                CompiledProgram(c.peak(n), c.args(n), c.rematerialized(n), n in d.refused)
                for n in d.compilations[first:]
            ]

    monkeypatch.setattr(jax_search, "_grow_pool", grow_pool)
    monkeypatch.setattr(jax.search, "search_compiled_call", compiled_call)
    monkeypatch.setattr(jax.search, "predict_peak", predict_peak)
    monkeypatch.setattr(jax.search, "predict_largest_buffer", predict_largest_buffer)
    monkeypatch.setattr(runner, "clock", lambda: current.device.clock if current.device else 0.0)
    no_collection(monkeypatch)
    show_a_device(monkeypatch)
    return current
