"""``find_batch_size(lower=...)`` against compilers that rematerialize, in few compilations.

Past its limit XLA rematerializes a step (it recomputes values to fit, and runs slower): the
peaks of those programs flatten and read as if they fit. The search takes a size whose compiled
program was rematerialized as beyond the answer, compiles nothing past the smallest such size,
and says in its notes where rematerialization begins. It places the answer in few
compilations: on the three curves an H200 measured (``compilers.SETTINGS``: each on the whole GPU
and under an 8 GiB cap, replayed with the pool XLA's allocator grows and its autotuning's
regions), at most four after the start's, none above 1.5 times the answer, and within the margin
of the largest size that runs at full speed in the process as the search left it. Everything
here is simulated (``compilers``): nothing imports a framework, and time is a simulated clock.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any

import pytest
from compilers import (
    FLAX_MLP,
    FLAX_MLP_FRESH,
    FLAX_MLP_RAN,
    FLAX_MLP_RECORDED,
    JAX_MLP,
    SETTINGS,
    Compiler,
    Device,
    Simulated,
    install,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from unimem.backends.jax.search import JaxSearch

import unimem
from unimem import registry
from unimem.search import framework, runner, scale

MARGIN = 0.05


@pytest.fixture
def simulated(monkeypatch: pytest.MonkeyPatch) -> Simulated:
    return install(monkeypatch)


@dataclasses.dataclass
class Outcome:
    found: unimem.BatchSizeSearch
    device: Device
    compiled: list[int]  # every size compiled from the start's on, the step's own compilations included
    seconds: float  # the search's, on the simulated clock
    largest: int  # the largest size that runs at full speed in the process as the search left it


def search(simulated: Simulated, compiler: Compiler, start: int | None = None, **kwargs: Any) -> Outcome:
    """Warm up at the start (as a training script does: it compiles and runs it), then search."""
    device = Device(compiler, **kwargs)
    simulated.device = device
    start = start or compiler.start
    device.step(start)
    device.calls.clear()
    first, began = len(device.compilations) - 1, device.clock
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", unimem.UnimemWarning)
        found = unimem.find_batch_size(device.step, start=start, backend="jax", lower=device.lower, return_trials=True)
    seconds = device.clock - began
    return Outcome(found, device, device.compilations[first:], seconds, device.largest())


def check(outcome: Outcome) -> None:
    """What every search with predictions must show, by the simulated device's own count."""
    found, device = outcome.found, outcome.device
    assert [n for n, _ in device.calls] == [t.batch_size for t in found.trials + found.confirmations], str(found)
    assert not any(device.compiler.rematerialized(n) for n, _ in device.calls), str(found)  # none ran slower
    assert found.batch_size in {n for n, ok in device.calls if ok}, str(found)
    remat = [i for i, n in enumerate(outcome.compiled) if device.compiler.rematerialized(n)]
    if remat:  # nothing compiled past a size known to be rematerialized
        first = outcome.compiled[remat[0]]
        assert all(n < first for n in outcome.compiled[remat[0] + 1 :]), outcome.compiled


@pytest.mark.parametrize("compiler", SETTINGS.values(), ids=SETTINGS.keys())
def test_the_measured_curves_take_four_compilations_after_the_start_none_far_past_the_answer(
    simulated: Simulated, compiler: Compiler
) -> None:
    # As the H200 measured them: the temporaries per sample rise with the size and level off (a
    # line from small sizes overshoots two to seven times), each compilation autotunes on real
    # buffers and may take a region from the pool, a compilation costs its measured seconds.
    outcome = search(simulated, compiler)
    found, device = outcome.found, outcome.device
    check(outcome)
    assert found.converged and found.failed_calls == 0, str(found)
    assert len(outcome.compiled) <= 5 and found.compile_calls <= 5, outcome.compiled  # the start's included
    assert max(outcome.compiled) <= 1.5 * found.batch_size, (outcome.compiled, found.batch_size)
    assert found.batch_size >= (1 - MARGIN) * outcome.largest, (found.batch_size, outcome.largest)
    assert outcome.seconds <= 4 * compiler.compile_seconds(found.batch_size) + 10, outcome.seconds
    # Ten steps at the answer run in the process that searched, without a compilation more.
    compiled = len(device.compilations)
    for _ in range(10):
        device.step(found.batch_size)
    assert all(ok for _, ok in device.calls[-10:]) and len(device.compilations) == compiled
    # The notes say where the compiler would begin to rematerialize.
    note = next(n for n in found.notes if "rematerialize" in n)
    assert f"the largest: {max(outcome.compiled)}" in note, found.notes


def test_the_replay_compiles_what_the_h200_compiled_from_far_past_the_start(
    simulated: Simulated, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On the H200 the Flax MLP's search compiled 8192 (1024 times its start) and then 2036400, twice
    # the answer and rematerialized: a line through 8192, where XLA's temporaries were a seventh of
    # what they level off at, crossed the limit far past it. From the start's neighbourhood
    # (``FIRST_REACH``) nothing is compiled past 1.5 times the answer (above); from 8192, the H200's.
    monkeypatch.setattr(scale, "FIRST_REACH", 1024)
    outcome = search(simulated, SETTINGS["flax-mlp-whole-gpu"])
    first, guess = outcome.compiled[1:3]
    assert first == 8192 and abs(guess - 2_036_400) <= 100, outcome.compiled
    assert outcome.device.compiler.rematerialized(guess) and guess > 1.5 * outcome.found.batch_size


@pytest.mark.parametrize("compiler", [FLAX_MLP, JAX_MLP], ids=["flax-mlp", "jax-mlp"])
def test_a_limit_set_by_rematerialization_is_found_without_running_a_rematerialized_size(
    simulated: Simulated, compiler: Compiler
) -> None:
    # No region taken by a compilation: the room no longer binds, XLA's limit does. Its own estimate
    # of a program's peak runs 2% over the buffer assignment's, so it rematerializes a little before
    # the predicted onset: the first size placed there is rematerialized, and the answer lies under it.
    outcome = search(simulated, dataclasses.replace(compiler, tracker=1.02), autotune=0.0)
    found = outcome.found
    check(outcome)
    assert found.converged and found.failed_calls == 0, str(found)
    assert found.batch_size >= (1 - MARGIN) * outcome.largest, (found.batch_size, outcome.largest)
    assert max(outcome.compiled) <= 1.5 * found.batch_size, (outcome.compiled, found.batch_size)
    assert len(outcome.compiled) <= 6, outcome.compiled
    remat = sorted(n for n in outcome.compiled if outcome.device.compiler.rematerialized(n))
    clean = sorted(n for n in outcome.compiled if n < remat[0])
    note = next(n for n in found.notes if "rematerializes the step from" in n)
    assert f"from batch size {remat[0]}" in note and f"without it: {clean[-1]}" in note, found.notes


def test_a_call_gets_one_region_for_all_it_adds_before_it_runs(
    simulated: Simulated, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On an H200 the first size placed, 2,153,337, failed: its 8.2 GiB of inputs, made before the call,
    # took a region of their own (16 GiB, a power of two) and left its 90.4 GiB of temporaries 88.6 GiB
    # under the 104.85 GiB limit. Grown by one region for all the call adds before it runs, the pool holds
    # them: the placed size runs, first call, none failed.
    grown = search(simulated, FLAX_MLP_FRESH, apart=True)
    check(grown)
    assert grown.found.failed_calls == 0 and grown.found.step_calls == 1, str(grown.found)
    assert grown.found.batch_size >= (1 - MARGIN) * grown.largest, (grown.found.batch_size, grown.largest)
    monkeypatch.setattr(registry.get_backend("jax").search, "search_make_room", lambda *args: None)
    apart = search(simulated, FLAX_MLP_FRESH, apart=True)
    assert apart.found.failed_calls >= 1 and apart.found.batch_size < grown.found.batch_size, str(apart.found)


@pytest.mark.parametrize(("name", "times"), [("jax-transformer-whole-gpu", 512), ("jax-mlp-whole-gpu", 512)])
def test_the_placed_size_runs_before_a_start_that_would_take_its_room(
    simulated: Simulated, name: str, times: int
) -> None:
    # No warm-up: the search's first run is its own. A start run first keeps the regions it took,
    # and a large one cuts the room the answer then has (the transformer from 1024: 556 where the
    # search from 2 finds 722): the size placed from the compiled sizes runs first, the start never.
    compiler = SETTINGS[name]
    answers = []
    for start in (compiler.start, compiler.start * times):
        device = Device(compiler)
        simulated.device = device
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", unimem.UnimemWarning)
            found = unimem.find_batch_size(
                device.step, start=start, backend="jax", lower=device.lower, return_trials=True
            )
        assert found.converged and found.failed_calls == 0, str(found)
        assert [n for n, _ in device.calls] == [found.batch_size], device.calls  # one call: the answer
        assert found.trials[0].reason == "predicted", found.trials
        answers.append(found.batch_size)
    assert answers[1] >= (1 - MARGIN) * answers[0], answers


@pytest.mark.parametrize("short", [0.2, 0.3])
@pytest.mark.parametrize("name", ["jax-transformer-whole-gpu", "jax-transformer-8gib"])
def test_a_placed_first_call_that_fails_is_followed_by_the_start(
    simulated: Simulated, monkeypatch: pytest.MonkeyPatch, name: str, short: float
) -> None:
    # The device holds less than its figures say, so the first call, placed from the compiled sizes,
    # fails with nothing run yet. The start runs next, so that the splits after have a size that fit
    # below the failure: without it they crept down a margin a call, each failure keeping its outputs,
    # until "even batch size 1 does not fit". It finds what a search opened by the start finds.
    compiler = SETTINGS[name]

    def searched(open_with_start: bool) -> unimem.BatchSizeSearch:
        if open_with_start:
            monkeypatch.setattr(runner, "placed_first", lambda run, first: None)
        device = Device(compiler)
        simulated.device = device

        def step(n: int) -> None:
            if compiler.peak(n) + device.kept > (1 - short) * compiler.limit:
                device.compile(n)
                device.calls.append((n, False))
                device.kept += compiler.outputs  # as XLA keeps a failed execution's outputs
                raise MemoryError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
            device.step(n)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", unimem.UnimemWarning)
            return unimem.find_batch_size(
                step, start=compiler.start, backend="jax", lower=device.lower, return_trials=True
            )

    placed, opened = searched(False), searched(True)
    assert [t.reason for t in placed.trials[:2]] == ["predicted", "start"], placed.trials
    assert not placed.trials[0].fits and placed.trials[1].fits
    assert placed.converged and placed.batch_size >= (1 - 2 * MARGIN) * opened.batch_size, (placed, opened)


def search_without_lower(simulated: Simulated, compiler: Compiler, autotune: float, **device_kwargs: Any) -> Outcome:
    """Warm up at the start, then search on the measured peaks alone (no ``lower=``)."""
    device = Device(compiler, autotune=autotune, **device_kwargs)
    simulated.device = device
    device.step(compiler.start)
    device.calls.clear()
    first, began = len(device.compilations), device.clock
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", unimem.UnimemWarning)
        found = unimem.find_batch_size(device.step, start=compiler.start, backend="jax", return_trials=True)
    return Outcome(found, device, device.compilations[first:], device.clock - began, device.largest())


def check_without_lower(outcome: Outcome) -> None:
    """At most six calls, two of them failed; converged on a size that ran, within the margin of the
    largest that runs in the process as the search left it."""
    found, calls = outcome.found, outcome.device.calls
    assert len(calls) <= 6 and sum(not ok for _, ok in calls) <= 2, str(found)
    assert found.converged and found.batch_size in {n for n, ok in calls if ok}, str(found)
    assert found.batch_size >= (1 - MARGIN) * outcome.largest, (str(found), outcome.largest)


@pytest.mark.parametrize("autotune", [0.22, 0.4])
def test_the_whole_gpu_flax_mlp_without_lower_takes_six_calls_and_two_failures(
    simulated: Simulated, autotune: float
) -> None:
    # Measured peaks only, on the whole H200 with growth on, where a failure costs 18 s: each call's
    # compilation and temporaries take regions that stay, so the cap is no capacity. The room left is
    # read again after each call; once a size took about all of it, the closing size ends it.
    # The curve as recorded: where XLA's bytes a sample dip at 8192 as the lower= search read them,
    # the sure step from 8678 overshoots as that search's line did (an open case of the measured path).
    check_without_lower(search_without_lower(simulated, FLAX_MLP_RECORDED, autotune))


@pytest.mark.parametrize("autotune", [0.1, 0.22, 0.4])
def test_the_h200_search_of_the_whole_gpu_flax_mlp_without_lower_replayed(
    simulated: Simulated, autotune: float
) -> None:
    # On the H200 (the peaks it read: compilers.FLAX_MLP_RAN) the search took 8, 5957, 953658, then
    # 2175621, which failed: its sure step held to the room as it was before the calls took their
    # regions, where 64 GiB was now the largest piece. Then 1331318 filled the room as it counts (all a
    # step adds in one piece), and one margin at a time, 1401388, 1475146 and 1552786 (failed): 8 calls,
    # 2 failed. The room read after each call, and two margins past a first size that filled it within
    # its count (the step's batch and outputs lie beside its temporaries): six calls at most.
    outcome = search_without_lower(simulated, FLAX_MLP_RAN, autotune)
    assert [n for n, _ in outcome.device.calls[:2]] == [8, 5957], str(outcome.found)  # the H200's, replayed
    check_without_lower(outcome)


@pytest.mark.parametrize("apart", [False, True])
@pytest.mark.parametrize("compiler", [FLAX_MLP_RAN, FLAX_MLP_FRESH], ids=lambda c: c.name)
def test_the_whole_gpu_flax_mlp_without_lower_sized_as_it_runs(
    simulated: Simulated, monkeypatch: pytest.MonkeyPatch, compiler: Compiler, apart: bool
) -> None:
    # Each size a call compiles is compiled in a fresh process (nothing autotuned here) and its figures
    # read. After the first such call, one region of all the room: on the H200 the call at 953658 grew a
    # 64 GiB region of its own that held every later size to it (1475146 at most). The peaks the region
    # hides are the compiled programs', and a rematerialized program bounds the answer as with lower=.
    def fresh_largest() -> int:
        fresh = Device(compiler, autotune=0.0, apart=apart)
        fresh.step(compiler.start)
        return fresh.largest()

    outcome = search_without_lower(simulated, compiler, 0.0, apart=apart, elsewhere=True)
    found = outcome.found
    check_without_lower(outcome)
    assert found.failed_calls == 0, str(found)
    assert found.batch_size >= (1 - MARGIN) * fresh_largest(), (str(found), fresh_largest())
    assert all(t.peak is not None for t in found.trials[1:] if t.fits), found.trials  # hidden peaks read
    assert not compiler.rematerialized(found.batch_size)
    slower = [t for t in found.trials if not t.fits]
    assert all(compiler.rematerialized(t.batch_size) and "rematerialized" in (t.error or "") for t in slower)
    said = [note for note in found.notes if "rematerialized the step at batch size" in note]
    assert len(said) == (1 if slower else 0), found.notes

    # Without the region, the call that grew one of its own holds the search to it (on the measured
    # peaks; the other curve's second call is large enough to take all the room by itself).
    if compiler is FLAX_MLP_RAN:
        make_room = framework.Framework.make_room  # the predicted calls' region stays; the whole room's goes
        monkeypatch.setattr(
            framework.Framework, "make_room", lambda self, peak=None: None if peak is None else make_room(self, peak)
        )
        held = search_without_lower(simulated, compiler, 0.0, apart=apart, elsewhere=True)
        assert held.found.batch_size < 0.8 * found.batch_size, str(held.found)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    per_sample=st.integers(4 << 10, 4 << 20),
    rise=st.floats(1.0, 4.0),
    knee=st.integers(4, 50_000),
    held_share=st.floats(0.01, 0.3),
    tracker=st.floats(1.0, 1.02),
    start=st.sampled_from([1, 2, 8, 64]),
)
def test_random_compilers_never_run_a_rematerialized_size(
    simulated: Simulated, per_sample: int, rise: float, knee: int, held_share: float, tracker: float, start: int
) -> None:
    # Temporaries per sample rising ``rise`` times to level off past ``knee``, a limit of 8 GiB,
    # parameters and optimizer state a share of it, XLA rematerializing past 95% of it; no region
    # taken by a compilation (each is then only a matter of time).
    limit = 8 << 30
    held = int(held_share * limit)
    curve = tuple((n, per_sample / rise ** max(0.0, 1 - n / knee)) for n in sorted({1, knee // 2 or 1, knee, 4 * knee}))
    compiler = Compiler(
        "random", curve, ((1, 1.0), (1 << 20, 10.0)), args0=held, args_per_sample=per_sample // 16, outputs=held,
        held=held, limit=limit, pool=held + (64 << 20), block=64 << 20, autotune=0.0, start=start,
        parameter=held // 8, tracker=tracker,
    )  # fmt: skip
    if compiler.peak(start) > limit or compiler.rematerialized(start):
        return
    outcome = search(simulated, compiler)
    check(outcome)
    assert outcome.found.failed_calls == 0, str(outcome.found)
    assert outcome.found.batch_size >= (1 - MARGIN) * outcome.largest, (outcome.found, outcome.largest)


def test_lower_may_say_itself_whether_the_compiler_rematerialized(simulated: Simulated) -> None:
    # (peak, largest buffer, rematerialized) from lower(): the third is honoured as the framework's
    # own answer would be; anything but True or False there is a ConfigError naming lower.
    device = Device(dataclasses.replace(JAX_MLP, autotune=0.0))
    simulated.device = device
    device.step(64)
    c = device.compiler

    def lower(n: int) -> tuple[int, int, bool]:
        return c.peak(n), c.temp(n), n >= 30_000  # rematerialized from 30000 on, whatever the peaks say

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", unimem.UnimemWarning)
        found = unimem.find_batch_size(device.step, start=64, backend="jax", lower=lower, return_trials=True)
    assert found.batch_size < 30_000 and all(n < 30_000 for n, _ in device.calls), str(found)
    assert found.batch_size >= (1 - MARGIN) * 29_999 and found.converged, str(found)
    assert any("rematerializes the step from batch size" in n for n in found.notes), found.notes
    calls = len(device.calls)
    with pytest.raises(unimem.ConfigError) as raised:
        unimem.find_batch_size(device.step, start=64, backend="jax", lower=lambda n: (c.peak(n), c.temp(n), "no"))
    assert raised.value.parameter == "lower" and "True or False" in str(raised.value)
    assert len(device.calls) == calls  # refused before any call of the step


class _Compiled:
    """A compiled program as JAX gives it (``memory_analysis``, ``as_text``), with the text given."""

    def __init__(self, text: str | None) -> None:
        self.text = text

    def memory_analysis(self) -> None:
        return None

    def as_text(self) -> str | None:
        return self.text


def test_jax_reads_rematerialization_from_the_names_xla_gives_its_clones() -> None:
    search = JaxSearch(registry.get_backend("jax"))
    clean = (
        "HloModule jit_train\n\nENTRY %main {\n  %p0 = f32[8]{0} parameter(0)\n  ROOT %neg = f32[8]{0} negate(%p0)\n}"
    )
    assert search.predict_rematerialized(_Compiled(clean)) is False
    for name in ("%multiply.remat", "multiply.remat2", "ROOT gte.remat.1", "%fusion.3.remat_compressed"):
        text = clean.replace("  ROOT %neg", f"  {name} = f32[8]{{0}} multiply(%p0, %p0)\n  ROOT %neg")
        assert search.predict_rematerialized(_Compiled(text)) is True, name
    # A user's function named so appears in metadata and file tables, never as an instruction.
    named = clean.replace("negate(%p0)", 'negate(%p0), metadata={op_name="jit(train)/my.remat/neg"}')
    assert search.predict_rematerialized(_Compiled(named + '\nFunctionNames\n1 "block.remat"')) is False
    assert search.predict_rematerialized(_Compiled(None)) is None
    assert search.remat_share == 0.95


def test_jax_room_after_a_region_and_in_a_pool_grown_to_its_limit() -> None:
    # With growth on, the next region is about as large as the pool so far; a pool at its limit
    # (preallocated) takes none.
    search = JaxSearch(registry.get_backend("jax"))
    GiB = 1 << 30

    def pool(reserved: int, block: int) -> unimem.MemoryStats:
        return unimem.MemoryStats(
            "jax", 0, allocated=GiB // 2, reserved=reserved, limit=8 * GiB, largest_free_block=block
        )

    assert search.search_room_after_region(pool(2 * GiB, GiB // 2)) == 4 * GiB
    assert search.search_room_after_region(pool(3 * GiB, 2 * GiB)) == 2 * GiB
    assert search.search_room_after_region(pool(8 * GiB, 7 * GiB)) is None
    # A pool grown in one region (the whole GPU after compiling one large size): the next region is
    # twice that one, not as large as the pool.
    whole = unimem.MemoryStats("jax", 0, allocated=GiB, reserved=17 * GiB, limit=104 * GiB, largest_free_block=16 * GiB)
    assert search.search_room_after_region(whole) == 104 * GiB - 17 * GiB - 32 * GiB
    # A region at least as large as what is left under the limit takes all of it, one block again after.
    assert search.search_room_after_region(pool(5 * GiB, 2 * GiB)) == 3 * GiB
    assert search.search_room_after_region(unimem.MemoryStats("jax", 0, limit=8 * GiB)) is None
    # A pool grown to its limit has no room under it: one buffer gets its largest free block.
    assert search.search_capacity(pool(8 * GiB, 3 * GiB)) == GiB // 2 + 3 * GiB


def test_jax_grows_one_region_for_all_a_call_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    # XLA's pool doubles its regions: a buffer over half the power of two at or above what the call adds
    # takes that power of two (or all the room left), and is under what the call adds, whose own peak
    # is then read. Nothing where a free block holds it, where the room under the limit cannot, or
    # where the pool is preallocated (at its limit).
    from unimem.backends.jax import search as jax_search

    asked: list[int] = []
    monkeypatch.setattr(jax_search, "_grow_pool", lambda nbytes, device: asked.append(nbytes))
    search = JaxSearch(registry.get_backend("jax"))
    GiB = 1 << 30

    def pool(reserved: int, block: int, limit: int = 104 * GiB) -> unimem.MemoryStats:
        return unimem.MemoryStats("jax", 0, allocated=GiB, reserved=reserved, limit=limit, largest_free_block=block)

    for adds in (98 * GiB, 8 * GiB + 1, 8 * GiB, 3 * GiB + 12345, GiB // 8 + 1):
        asked.clear()
        search.search_make_room(pool(GiB // 4, GiB // 8), adds, 0)
        region = 1 << (adds - 1).bit_length()
        assert len(asked) == 1 and region // 2 < asked[0] <= adds and 1 << (asked[0] - 1).bit_length() == region
        assert adds - asked[0] <= max(adds // 64, 1)  # nearly all of it, where the pool grows otherwise
    asked.clear()
    search.search_make_room(pool(GiB, 2 * GiB), 2 * GiB, 0)  # a free block holds it
    search.search_make_room(pool(90 * GiB, GiB), 20 * GiB, 0)  # more than the room under the limit
    search.search_make_room(pool(104 * GiB, 50 * GiB), 60 * GiB, 0)  # a pool at its limit
    search.search_make_room(unimem.MemoryStats("jax", 0), 60 * GiB, 0)  # no figures (the CPU)
    assert asked == []


@pytest.mark.slow
@pytest.mark.covers("jax:batch_size")
def test_a_real_compiled_step_reads_as_not_rematerialized(need: Any, pyjson: Any) -> None:
    need("jax")
    r = pyjson(
        """
        import jax, jax.numpy as jnp
        from unimem import registry
        f = jax.jit(jax.grad(lambda w, x: (jnp.tanh(x @ w) @ w.T).sum()))
        lowered = f.lower(jnp.ones((256, 256)), jax.ShapeDtypeStruct((64, 256), jnp.float32))
        search = registry.get_backend("jax").search
        remat = search.predict_rematerialized
        emit({"lowered": remat(lowered), "compiled": remat(lowered.compile())})
        """
    )
    assert r == {"lowered": False, "compiled": False}


@pytest.mark.parametrize("compiler", SETTINGS.values(), ids=SETTINGS.keys())
@pytest.mark.parametrize("autotune", [None, 0.0], ids=["autotuned-here", "choices-loaded"])
def test_the_notes_say_how_much_more_a_fresh_process_would_fit(
    simulated: Simulated, compiler: Compiler, autotune: float | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # The regions a pool grown on demand keeps (its compilations' autotuning, its runs) bound what this
    # process fits; a fresh one that loads the kernel choices made here (no autotuning of its own) holds
    # only the step at its start. Where that is clearly more, the notes say so, how much, and how to start it.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    outcome = search(simulated, compiler, **({} if autotune is None else {"autotune": autotune}))
    answer = outcome.found.batch_size
    fresh = Device(compiler, autotune=0.0)
    fresh.step(compiler.start)
    fits = fresh.largest()
    said = [n for n in outcome.found.notes if "a fresh process would fit" in n]
    if fits * (1 - 3 * MARGIN) > answer:
        assert said, (answer, fits, outcome.found.notes)
    if fits * (1 - MARGIN) <= answer:
        assert not said, (answer, fits, said)
    if said:
        told = int(re.search(r"batch size (\d+)", said[0]).group(1))  # type: ignore[union-attr]
        assert answer < told and abs(told - fits) <= MARGIN * fits, (answer, told, fits)
        assert f'XLA_FLAGS="--xla_gpu_per_fusion_autotune_cache_dir={tmp_path}' in said[0], said[0]
