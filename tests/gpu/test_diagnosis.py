"""Diagnosis on the GPU: real OOMs explained, torch's pool fragmentation measured, the batch
size that fits found. Each scenario runs in a fresh interpreter (its code is below); the
pytest process imports no framework.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

MiB = 1 << 20
GiB = 1 << 30
MARK = "UNIMEM_DIAGNOSIS_RESULT "

_PRELUDE = f"""
import json, sys
R = {{}}
def emit():
    print({MARK!r} + json.dumps(R, default=str), flush=True)
"""

# torch under a 2200 MiB cap: one 2 GiB segment split into 20 blocks of 100 MiB, every other
# one freed (1048 MiB free in pieces of at most 100 MiB), then a 300 MiB request: no free
# block is large enough and a new segment would pass the cap.
TORCH_FRAGMENTED = """
import unimem
unimem.configure(backend="torch", limit="2200MiB")
import torch
MiB = 1 << 20
big = torch.empty(2048 * MiB, dtype=torch.uint8, device="cuda")
del big  # cached: one 2 GiB segment
blocks = [torch.empty(100 * MiB, dtype=torch.uint8, device="cuda") for _ in range(20)]
for i in range(0, 20, 2):
    blocks[i] = None
frag = unimem.fragmentation("torch")
R["fragmentation_before"] = frag.as_dict()
R["summary"] = unimem.summary("torch")
allocated_before = torch.cuda.memory_allocated()
def step():
    extra = torch.empty(300 * MiB, dtype=torch.uint8, device="cuda")
    return extra
try:
    with unimem.oom_guard(batch_size=64):
        step()
    R["oom"] = False
except unimem.OutOfMemory as exc:
    R["oom"] = True
    R["cause"] = f"{type(exc.__cause__).__module__}.{type(exc.__cause__).__qualname__}"
    R["is_oom"] = unimem.is_oom(exc.__cause__)
    R["report"] = exc.report.as_dict()
    R["text"] = str(exc.report)
R["allocated_after_equals_before"] = torch.cuda.memory_allocated() == allocated_before
emit()
"""

# JAX preallocates 75% of the device at its first op; torch in the same process then asks
# for more than the rest of the device.
TORCH_NEXT_TO_JAX = """
import jax, jax.numpy as jnp
jnp.ones(1).block_until_ready()
import torch, unimem
GiB = 1 << 30
try:
    with unimem.oom_guard():
        torch.empty(60 * GiB, dtype=torch.uint8, device="cuda")
    R["oom"] = False
except unimem.OutOfMemory as exc:
    R["oom"] = True
    R["report"] = exc.report.as_dict()
    R["text"] = str(exc.report)
emit()
"""

JAX_OOM = """
import unimem
unimem.configure(backend="jax", fraction=0.05)
import jax, jax.numpy as jnp
keep = jnp.ones((1024, 1024)).block_until_ready()
R["fragmentation"] = unimem.fragmentation("jax").as_dict()
def step():
    return jnp.zeros(16 << 30, dtype=jnp.uint8).block_until_ready()
try:
    with unimem.oom_guard(batch_size=32):
        step()
    R["oom"] = False
except unimem.OutOfMemory as exc:
    R["oom"] = True
    R["cause"] = f"{type(exc.__cause__).__module__}.{type(exc.__cause__).__qualname__}"
    R["is_oom"] = unimem.is_oom(exc.__cause__)
    R["report"] = exc.report.as_dict()
emit()
"""

# One training step of an MLP with Adam; the search under a cap, then the answer re-run.
TORCH_SEARCH = """
import gc, unimem
unimem.configure(backend="torch", fraction=0.02)
import torch
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
    torch.nn.Linear(2048, 1024),
).cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
def step(n):
    optimizer.zero_grad(set_to_none=True)
    x = torch.randn(n, 1024, device="cuda")
    loss = torch.nn.functional.mse_loss(model(x), x)
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
step(1)
gc.collect()
reserved_before = torch.cuda.memory_reserved()
process_before = unimem.stats("torch").process_used
search = unimem.find_batch_size(step, start=32, return_trials=True)
R["search"] = search.as_dict()
R["reserved_before"], R["reserved_after"] = reserved_before, torch.cuda.memory_reserved()
R["process_before"], R["process_after"] = process_before, unimem.stats("torch").process_used
step(search.batch_size)  # the answer runs again
R["reran"] = True
emit()
"""

JAX_SEARCH = """
import functools, unimem
unimem.configure(backend="jax", fraction=0.02)
import jax, jax.numpy as jnp
sizes = [1024, 2048, 2048, 1024]
keys = jax.random.split(jax.random.PRNGKey(0), len(sizes))
params = [(jax.random.normal(k, (a, b)) / a**0.5, jnp.zeros(b)) for k, a, b in zip(keys, sizes[:-1], sizes[1:])]
def loss_fn(params, x):
    h = x
    for w, b in params[:-1]:
        h = jax.nn.relu(h @ w + b)
    w, b = params[-1]
    return jnp.mean((h @ w + b - x) ** 2)
@functools.partial(jax.jit, static_argnums=(1,))
def train(params, n):
    x = jax.random.normal(jax.random.PRNGKey(1), (n, 1024))
    loss, grads = jax.value_and_grad(loss_fn)(params, x)
    return jax.tree_util.tree_map(lambda p, g: p - 1e-4 * g, params, grads), loss
state = {"params": params}
def step(n):
    new, loss = train(state["params"], n)
    loss.block_until_ready()
    state["params"] = new
# Warm up at the search's start: the first step of a new size loads libraries once (NVML
# sees the process grow, and jax.clear_caches() frees none of it; docs/measurements.md),
# which the search's "after / before" must not count as its own.
step(32)
in_use_before = unimem.stats("jax").allocated
process_before = unimem.stats("jax").process_used
search = unimem.find_batch_size(step, start=32, return_trials=True)
R["search"] = search.as_dict()
R["in_use_before"], R["in_use_after"] = in_use_before, unimem.stats("jax").allocated
R["process_before"], R["process_after"] = process_before, unimem.stats("jax").process_used
import gc
jax.clear_caches(); gc.collect()  # what of the growth outside the pool compiled steps hold
R["process_after_clear_caches"] = unimem.stats("jax").process_used
R["live_arrays"] = [[list(a.shape), a.nbytes] for a in jax.live_arrays()]
R["largest_layer"] = max(w.nbytes + b.nbytes for w, b in state["params"])
if search.confirmed is not False:  # False: it warned that the answer no longer runs here
    step(search.batch_size)
    R["reran"] = True
emit()
"""


@pytest.fixture
def scenario_code(run_code: Any) -> Any:
    """``scenario_code(CODE)``: one scenario below in a fresh interpreter; what it reported."""
    return lambda code, timeout=240: run_code(_PRELUDE + textwrap.dedent(code), MARK, timeout=timeout)


# A Flax model (linen, optax's Adam, as its users train it) searched with lower= under an 8 GiB cap with
# growth on: each size compiled in a fresh process into the persistent compilation cache (empty at the
# start), loaded here; nothing compiled in this process, neither the sizing nor the step's own calls.
JAX_SEARCH_LOWERED = """
import os, tempfile, threading
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp()
import unimem
unimem.configure(backend="jax", growth=True, limit="8GiB")
import jax, jax.numpy as jnp, optax
import flax.linen as nn
from jax import monitoring
compiled_here, loaded_here, hit = [], [], threading.local()
def on_event(event, **_):
    if event == "/jax/compilation_cache/cache_hits":
        hit.on = True
def on_duration(event, seconds, **kw):
    if event == "/jax/core/compile/backend_compile_duration" and kw.get("fun_name") == "jit(train)":
        (loaded_here if getattr(hit, "on", False) else compiled_here).append(seconds)
    if event == "/jax/core/compile/backend_compile_duration":
        hit.on = False
monitoring.register_event_listener(on_event)
monitoring.register_event_duration_secs_listener(on_duration)
class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        for _ in range(4):
            x = nn.relu(nn.Dense(2048)(x))
        return nn.Dense(10)(x)
model, tx = MLP(), optax.adam(1e-3)
params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 1024)))
state = {"params": params, "opt": tx.init(params)}
@jax.jit
def train(params, opt, x, y):
    def loss_fn(p):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, loss
def step(n):
    x, y = jnp.ones((n, 1024)), jnp.zeros((n,), jnp.int32)
    state["params"], state["opt"], loss = train(state["params"], state["opt"], x, y)
    loss.block_until_ready()
def lower(n):
    return train.lower(state["params"], state["opt"], jax.ShapeDtypeStruct((n, 1024), jnp.float32),
                       jax.ShapeDtypeStruct((n,), jnp.int32))
step(8)  # the warm-up, as a training script runs one
from unimem.backends.jax import _fresh_compile
fresh_before, compiled_here[:] = len(_fresh_compile.fresh_compilations), []
search = unimem.find_batch_size(step, start=8, lower=lower, return_trials=True)
R["search"] = search.as_dict()
R["compiled_here"], R["fresh"] = list(compiled_here), _fresh_compile.fresh_compilations[fresh_before:]
R["cache_dir"] = jax.config.jax_compilation_cache_dir
compiled_here[:], loaded_here[:] = [], []
step(search.batch_size)  # training's first step after the search
R["after"] = {"compiled_here": list(compiled_here), "loaded_here": len(loaded_here)}
emit()
"""

# The same model and step searched without lower=, on the whole GPU: each call sized as it runs.
JAX_SEARCH_MEASURED = JAX_SEARCH_LOWERED.replace("lower=lower, ", "").replace(', limit="8GiB"', "")
assert JAX_SEARCH_MEASURED.count("lower=") == 0 and "8GiB" not in JAX_SEARCH_MEASURED


@pytest.mark.covers("torch:oom", "torch:fragmentation")
def test_torch_fragmented_pool_is_measured_and_explained(scenario_code: Any, record: Any) -> None:
    r = scenario_code(TORCH_FRAGMENTED)
    before = r["fragmentation_before"]
    record(
        share=before["share"],
        free_in_pool=before["free_in_pool"],
        largest_free_block=before["largest_free_block"],
        free_blocks=before["free_blocks"],
    )
    assert before["largest_free_block"] == 100 * MiB
    assert before["free_in_pool"] >= 1000 * MiB and before["free_blocks"] >= 10
    assert before["share"] > 0.85
    assert "fragmentation" in r["summary"] and "n/a" not in r["summary"].split("fragmentation")[1].splitlines()[0]
    assert r["oom"] is True and r["is_oom"] is True
    assert r["cause"] == "torch.OutOfMemoryError"
    report = r["report"]
    record(requested=report["requested_bytes"], suggestions=[s["kind"] for s in report["suggestions"]])
    assert report["requested_bytes"] == 300 * MiB
    assert report["place"] == "cuda:0"
    assert report["fragmentation"]["share"] > 0.85
    assert report["suggestions"][0]["kind"] == "allocator", r["text"]
    assert 'allocator="expandable"' in report["suggestions"][0]["code"]
    assert report["stats"]["limit"] is not None and abs(report["stats"]["limit"] - 2200 * MiB) <= MiB
    assert r["allocated_after_equals_before"] is True  # the failed step held nothing afterwards


@pytest.mark.covers("torch:oom", "jax:stats.reserved")
def test_torch_oom_next_to_jax_preallocation_points_at_jax(scenario_code: Any, record: Any) -> None:
    r = scenario_code(TORCH_NEXT_TO_JAX)
    assert r["oom"] is True
    report = r["report"]
    pools = {pool["framework"]: pool for pool in report["other_pools"]}
    record(jax_reserved=pools.get("jax", {}).get("reserved"), first=report["suggestions"][0]["kind"])
    assert report["requested_bytes"] == 60 * GiB
    assert pools["jax"]["reserved"] > 60 * GiB and pools["jax"]["idle"] > 60 * GiB
    first = report["suggestions"][0]
    assert first["kind"] == "free-other-pool", r["text"]
    assert first["code"] == 'unimem.configure(backend="jax", growth=True)'


@pytest.mark.covers("jax:oom", "jax:fragmentation")
def test_jax_oom_is_explained_and_its_pool_figures_read(scenario_code: Any, record: Any) -> None:
    r = scenario_code(JAX_OOM)
    frag = r["fragmentation"]
    record(largest_free_block=frag["largest_free_block"], free_in_pool=frag["free_in_pool"], share=frag["share"])
    assert isinstance(frag["largest_free_block"], int) and isinstance(frag["free_in_pool"], int)
    assert 0 < frag["largest_free_block"] <= frag["free_in_pool"]
    assert r["oom"] is True and r["is_oom"] is True
    assert r["cause"].endswith("JaxRuntimeError")
    report = r["report"]
    record(requested=report["requested_bytes"], suggestions=[s["kind"] for s in report["suggestions"]])
    assert report["requested_bytes"] is not None and abs(report["requested_bytes"] - (16 << 30)) <= 16 << 20
    assert report["suggestions"][0]["kind"] == "too-large"  # 16 GiB in a 7 GB pool
    shapes = [item["shape"] for entry in report["live"] for item in entry["largest"]]
    assert [1024, 1024] in shapes


def _check_search(search: dict[str, Any], record: Any, *, max_trials: int) -> None:
    trials = search["trials"]
    record(
        batch_size=search["batch_size"],
        trials=len(trials),
        smallest_failure=search["smallest_failure"],
        seconds=search["seconds"],
        sizes=[t["batch_size"] for t in trials],
        reasons=[t["reason"] for t in trials],
        kept=[t["kept"] for t in trials if not t["fits"]],
        notes=search["notes"],
    )
    assert search["converged"] is True
    assert search["smallest_failure"] is not None
    # The answer is within the margin of the largest size that fits (below the smallest failure).
    largest_run = max(t["batch_size"] for t in trials if t["fits"])
    assert largest_run >= (1 - search["margin"]) * (search["smallest_failure"] - 1)
    # The answer re-runs after the search's last failure, or one size lower did (near the
    # cap, what fits depends on the pool's history).
    if search["confirmations"] and search["confirmed"]:
        lower = [t["batch_size"] for t in search["confirmations"] if t["reason"] == "confirm"][-1]
        assert search["batch_size"] == lower
        assert lower in (largest_run, max(1, math.floor((1 - search["margin"]) * largest_run)))
    else:
        assert search["batch_size"] == largest_run
    # The GPU figures were read: trials that fit have peaks (JAX knows none below an earlier
    # peak; the model may be None
    # when only one size lies past a plateau; the sure bound from it steered the search).
    assert sum(1 for t in trials if t["fits"] and t["peak"]) >= 2, "no peaks: the GPU figures were not read"
    assert len(trials) <= max_trials
    record(confirmed=search["confirmed"], confirmations=[(t["batch_size"], t["fits"]) for t in search["confirmations"]])


@pytest.mark.covers("torch:batch_size")
def test_torch_find_batch_size_under_a_cap(scenario_code: Any, record: Any) -> None:
    r = scenario_code(TORCH_SEARCH)
    _check_search(r["search"], record, max_trials=8)
    record(reserved_before=r["reserved_before"], reserved_after=r["reserved_after"])
    assert r["reran"] is True
    assert r["reserved_after"] <= r["reserved_before"]
    if r["process_before"] is not None:
        assert r["process_after"] <= r["process_before"] * 1.01


@pytest.mark.covers("jax:batch_size")
def test_jax_find_batch_size_under_a_cap(scenario_code: Any, record: Any) -> None:
    r = scenario_code(JAX_SEARCH)
    # This step's peaks are not a line in the batch (their slope grows with the batch), and
    # near the cap XLA rematerializes, so sizes past the one whose peak reached the cap still
    # fit: past peaks that stopped rising the search climbs in steps that grow, and is allowed
    # 8 trials. A JAX failure is slow and keeps the step's outputs, so the search climbs from
    # below: at most two failures. The measured shape is in docs/measurements.md.
    _check_search(r["search"], record, max_trials=8)
    assert sum(1 for t in r["search"]["trials"] if not t["fits"]) <= 2
    record(
        in_use_before=r["in_use_before"],
        in_use_after=r["in_use_after"],
        process_before=r["process_before"],
        process_after=r["process_after"],
        process_after_clear_caches=r["process_after_clear_caches"],
        live_array_bytes=sum(n for _, n in r["live_arrays"]),
    )
    # The answer runs again in this process, or the search said it does not (JAX's pool
    # after an OOM) with what to do; either way the process holds no more than before
    # (NVML: the pool and the process's context; XLA's bytes in use are recorded above).
    # What the failed trials left in use (XLA keeps a failed execution's outputs) is what
    # the search reports: the bytes in use after it, less those before.
    # Read right after a step, XLA's bytes in use alternate by one layer's parameters from
    # step to step (benchmarks/results/jax_search_process_growth-gpu-constant-key.json), so
    # the reading after the search may be either: that much either way is not the search's.
    kept = sum(t["kept"] or 0 for t in r["search"]["trials"] if not t["fits"])
    assert abs((r["in_use_after"] - r["in_use_before"]) - kept) <= r["largest_layer"] + (1 << 20)
    if r["search"]["confirmed"] is False:
        assert any("fresh process" in note for note in r["search"]["notes"])
    else:
        assert r["reran"] is True
    assert r["process_after"] <= r["process_before"] * 1.01


def test_jax_search_with_lower_on_a_growing_pool_compiles_nothing_in_the_searching_process(
    scenario_code: Any, record: Any
) -> None:
    r = scenario_code(JAX_SEARCH_LOWERED, timeout=420)
    search = r["search"]
    record(batch_size=search["batch_size"], calls=search["step_calls"], fresh=r["fresh"], notes=search["notes"])
    # Every size sized was compiled once, in a fresh process; none here, not the trials' own calls.
    # The start size is the warm-up's, which JAX holds compiled in memory: sized without compiling.
    assert r["compiled_here"] == [] and len(r["fresh"]) == search["compile_calls"] - 1 >= 1, r
    # Each call placed from the predictions ran: one region grown for all it adds before it.
    assert search["failed_calls"] == 0 and search["converged"], search
    # Training's first step after the search loads the answer's step: no compilation here.
    assert r["after"] == {"compiled_here": [], "loaded_here": 1}, r["after"]
    assert any(f'JAX_COMPILATION_CACHE_DIR="{r["cache_dir"]}"' in note for note in search["notes"]), search["notes"]


def test_jax_search_without_lower_on_a_growing_pool_sizes_each_call_as_it_runs(scenario_code: Any, record: Any) -> None:
    r = scenario_code(JAX_SEARCH_MEASURED, timeout=420)
    search = r["search"]
    trials = search["trials"]
    record(
        batch_size=search["batch_size"],
        calls=search["step_calls"],
        failed=search["failed_calls"],
        sizes=[(t["batch_size"], t["fits"], t["peak"]) for t in trials],
        fresh=r["fresh"],
        notes=search["notes"],
    )
    # What each call compiled was compiled in a fresh process and loaded: none of the step's compiled here.
    assert r["compiled_here"] == [] and r["fresh"], r
    # One region of all the room after the first call sized; every call's peak read (from the compiled
    # program where XLA's peak hid it); a call that could not fit refused before it ran (nothing kept),
    # a rematerialized one taken as past the answer; at most six calls, two of them failed.
    assert search["converged"] and search["step_calls"] <= 6 and search["failed_calls"] <= 2, search
    assert all(t["peak"] for t in trials[1:] if t["fits"]), trials
    failed = [t for t in trials if not t["fits"] and "rematerialized" not in t["error"]]
    assert all("not run" in t["error"] and (t["kept"] or 0) < 64 << 20 for t in failed), failed
    # The answer's temporaries lie in the one region: past the 64 GiB a region of a middle size's own held
    # the searches before it to (on an H200, 1475146 at most for a model like this one).
    answer = max(t["peak"] for t in trials if t["fits"] and t["batch_size"] == search["batch_size"])
    assert answer > 64 << 30, trials
    # The answer runs in this process: training's first step loads it (the search dropped its executables).
    assert r["after"]["compiled_here"] == [], r["after"]
