"""Gradient accumulation through ``unimem.accumulate``: the accumulated gradient is the large batch's.

The test process never imports a framework (conftest enforces it): each framework's checks run
once in a fresh interpreter, on a small MLP without dropout, and each test asserts one part of
what that run recorded. A target of 10 with micro-batches of at most 4 runs sizes 4, 3, 3, so a
loss divided by the step count would be wrong; weighted by ``mb.weight`` it is not.

torch also runs the fp16 loss scaler (``torch.amp.GradScaler("cpu")``) with one ``update()``
per optimizer step, and 2 gloo processes under ``DistributedDataParallel``: every rank ends
with the single-process large-batch gradient, and the all-reduce runs on the last micro-batch
only (counted by a communication hook). A hang fails the test at its timeout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, free_port, gather_ranks, need_framework, run_json, subprocess_env

import unimem
from unimem.errors import ConfigError
from unimem.training.accumulation import AccumulationPlan, MicroBatch, accumulate, accumulate_grads, plan_accumulation

# Every framework's accumulation in fresh processes and under DDP: the slow set.
pytestmark = pytest.mark.slow

TOLERANCE = 1e-5

_TORCH = r"""
import torch
import unimem

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
x, y = torch.randn(10, 6), torch.randn(10, 2)
loss_fn = torch.nn.functional.mse_loss

def grads():
    return [p.grad.clone() for p in model.parameters()]

def max_diff(a, b):
    return max(float((u - v).abs().max()) for u, v in zip(a, b))

model.zero_grad()
loss_fn(model(x), y).backward()
large = grads()

plan = unimem.plan_accumulation(10, micro_batch=4)
R = {"sizes": list(plan.sizes(0))}
model.zero_grad()
seen = []
for mb in unimem.accumulate(plan, model=model, backend="torch"):
    seen.append([mb.index, mb.size, mb.start, mb.last])
    (loss_fn(model(x[mb.slice]), y[mb.slice]) * mb.weight).backward()
R["seen"] = seen
R["weighted"] = max_diff(grads(), large)

model.zero_grad()
for mb in unimem.accumulate(plan):
    (loss_fn(model(x[mb.slice]), y[mb.slice]) / plan.steps).backward()
R["by_step_count"] = max_diff(grads(), large)

# accumulate_grads on returned gradients (torch.autograd.grad), beside the .grad path.
total = None
params = list(model.parameters())
for mb in unimem.accumulate(plan):
    g = torch.autograd.grad(loss_fn(model(x[mb.slice]), y[mb.slice]), params)
    total = unimem.accumulate_grads(total, list(g), mb.weight, backend="torch")
R["summed"] = max_diff(total, large)

# The fp16 loss scaler, GradScaler's loop: scale per micro-batch, step and update once per step.
policy = unimem.mixed_precision("fp16", backend="torch")
scaler = policy.loss_scaler(initial_scale=2.0**10, growth_interval=2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the gradients stay comparable
calls = {"update": 0, "step": 0}
inner = scaler.grad_scaler
original_update, original_step = inner.update, inner.step
def counted_update(*a, **k):
    calls["update"] += 1
    return original_update(*a, **k)
def counted_step(*a, **k):
    calls["step"] += 1
    return original_step(*a, **k)
inner.update, inner.step = counted_update, counted_step
scales, scaled = [], []
for _ in range(2):
    optimizer.zero_grad()
    for mb in unimem.accumulate(plan):
        scaler.scale(loss_fn(model(x[mb.slice]), y[mb.slice]) * mb.weight).backward()
    scaler.step(optimizer)  # unscales p.grad in place, once
    scaled.append(max_diff(grads(), large))
    scaler.update()
    scales.append(scaler.scale_value)
R["scaler"] = {"calls": calls, "scales": scales, "diff": scaled, "enabled": scaler.enabled}
emit(R)
"""

_TENSORFLOW = r"""
import numpy as np
import tensorflow as tf
import keras
import unimem

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(2)])
rng = np.random.default_rng(0)
x = tf.constant(rng.standard_normal((10, 6)), tf.float32)
y = tf.constant(rng.standard_normal((10, 2)), tf.float32)

def loss_of(xs, ys):
    return tf.reduce_mean(tf.square(model(xs) - ys))

def max_diff(a, b):
    return max(float(tf.reduce_max(tf.abs(u - v))) for u, v in zip(a, b))

with tf.GradientTape() as tape:
    loss = loss_of(x, y)
large = tape.gradient(loss, model.trainable_variables)

plan = unimem.plan_accumulation(10, micro_batch=4)
total = None
for mb in unimem.accumulate(plan):
    with tf.GradientTape() as tape:
        loss = loss_of(x[mb.slice], y[mb.slice])
    grads = tape.gradient(loss, model.trainable_variables)
    total = unimem.accumulate_grads(total, grads, mb.weight, backend="tensorflow")
R = {"eager": max_diff(total, large)}

@tf.function
def accumulated(x, y):
    total = None
    for mb in unimem.accumulate(plan):  # a Python loop: unrolled when traced
        with tf.GradientTape() as tape:
            loss = loss_of(x[mb.slice], y[mb.slice]) * mb.weight
        total = unimem.accumulate_grads(total, tape.gradient(loss, model.trainable_variables), backend="tensorflow")
    return total

R["graph"] = max_diff(accumulated(x, y), large)
try:
    unimem.accumulate_grads(total, total[:1], 0.5, backend="tensorflow")
    R["mismatch"] = None
except unimem.ConfigError as exc:
    R["mismatch"] = exc.parameter
try:
    list(unimem.accumulate(plan, model=model, backend="tensorflow"))
    R["no_sync"] = None
except unimem.UnsupportedFeature as exc:
    R["no_sync"] = str(exc)
emit(R)
"""

_JAX = r"""
import jax, jax.numpy as jnp
import unimem

k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(0), 4)
params = {"w1": jax.random.normal(k1, (6, 16)) * 0.3, "b1": jnp.zeros(16), "w2": jax.random.normal(k2, (16, 2)) * 0.3}
x, y = jax.random.normal(k3, (10, 6)), jax.random.normal(k4, (10, 2))

def loss_of(p, xs, ys):
    return jnp.mean((jnp.tanh(xs @ p["w1"] + p["b1"]) @ p["w2"] - ys) ** 2)

def max_diff(a, b):
    leaves = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    return max(float(jnp.max(jnp.abs(u - v))) for u, v in leaves)

large = jax.grad(loss_of)(params, x, y)
plan = unimem.plan_accumulation(10, micro_batch=4)
grad = jax.jit(jax.grad(loss_of))  # one compilation per distinct size: 4 and 3 here
total = None
for mb in unimem.accumulate(plan):
    total = unimem.accumulate_grads(total, grad(params, x[mb.slice], y[mb.slice]), mb.weight, backend="jax")
R = {"eager": max_diff(total, large)}

@jax.jit
def accumulated(p, x, y):
    total = None
    for mb in unimem.accumulate(plan):  # unrolled when traced: slices of static sizes
        total = unimem.accumulate_grads(total, jax.grad(loss_of)(p, x[mb.slice], y[mb.slice]), mb.weight, backend="jax")
    return total

R["jit"] = max_diff(accumulated(params, x, y), large)
try:
    unimem.accumulate_grads(total, {"w1": total["w1"]}, 0.5, backend="jax")
    R["mismatch"] = None
except unimem.ConfigError as exc:
    R["mismatch"] = exc.parameter
emit(R)
"""

_SCRIPTS = {"torch": _TORCH, "tensorflow": _TENSORFLOW, "jax": _JAX}
_runs: dict[str, Any] = {}


def _run(framework: str) -> Any:
    need_framework(framework)
    if framework not in _runs:
        _runs[framework] = run_json(_SCRIPTS[framework], timeout=300)
    return _runs[framework]


# --- the plan's micro-batches, without a framework --------------------------------------------


def test_micro_batches_of_unequal_sizes_cover_the_share_with_weights_summing_to_one() -> None:
    plan = plan_accumulation(10, micro_batch=4)
    seen = list(accumulate(plan))
    assert [mb.size for mb in seen] == [4, 3, 3]
    assert [mb.slice for mb in seen] == [slice(0, 4), slice(4, 7), slice(7, 10)]
    assert [mb.last for mb in seen] == [False, False, True]
    assert sum(mb.weight for mb in seen) == pytest.approx(1.0)
    assert all(isinstance(mb, MicroBatch) for mb in seen)


def test_under_data_parallel_means_each_rank_weighs_by_the_world_size() -> None:
    plan = plan_accumulation(10, micro_batch=4, world_size=2)
    shares = [plan.share(rank) for rank in range(2)]
    assert shares[0].start == 0 and shares[0].stop == shares[1].start and shares[1].stop == 10
    for rank in range(2):
        mean = list(accumulate(plan, rank))
        total = list(accumulate(plan, rank, reduction="sum"))
        assert sum(mb.size for mb in mean) == shares[rank].stop - shares[rank].start
        for a, b in zip(mean, total, strict=True):
            assert a.weight == pytest.approx(2 * b.weight) and b.weight == pytest.approx(b.size / 10)
    # Averaged over the two ranks, the weights of every micro-batch sum to one.
    assert sum(mb.weight for r in range(2) for mb in accumulate(plan, r)) / 2 == pytest.approx(1.0)


def test_the_rank_comes_from_the_launcher_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_accumulation(7, micro_batch=2, world_size=2)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert [mb.size for mb in accumulate(plan)] == list(plan.sizes(1))
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError) as info:
        list(accumulate(plan))
    assert info.value.parameter == "plan"


@pytest.mark.parametrize(
    "call, parameter",
    [
        (lambda: list(accumulate("plan")), "plan"),  # type: ignore[arg-type]
        (lambda: list(accumulate(plan_accumulation(10, 4), rank=1)), "rank"),
        (lambda: list(accumulate(plan_accumulation(10, 4, 2), rank=-1)), "rank"),
        (lambda: list(accumulate(plan_accumulation(10, 4), reduction="avg")), "reduction"),
        (lambda: plan_accumulation(10, 4, 2).share(2), "rank"),
        (lambda: accumulate_grads(None, [1.0], float("nan"), backend="torch"), "weight"),
        (lambda: accumulate_grads(None, [1.0], True, backend="torch"), "weight"),  # type: ignore[arg-type]
        (lambda: accumulate_grads(None, [1.0], 0.5, backend="mxnet"), "backend"),
    ],
)
def test_bad_input_is_a_config_error_naming_the_parameter(call: Any, parameter: str) -> None:
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.parameter == parameter


def test_a_plan_for_several_ranks_needs_a_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError) as info:
        list(accumulate(plan_accumulation(10, 4, world_size=2)))
    assert info.value.parameter == "rank" and "rank=" in str(info.value)


def test_the_plan_type_is_the_public_one() -> None:
    assert unimem.accumulate is accumulate and unimem.MicroBatch is MicroBatch
    assert unimem.accumulate_grads is accumulate_grads
    assert isinstance(plan_accumulation(3, 1), AccumulationPlan)
    for name in ("accumulate", "accumulate_grads", "MicroBatch"):
        assert name in unimem.__all__


# --- each framework, on the CPU ------------------------------------------------------------


@pytest.mark.covers("torch:accumulate")
def test_torch_weighted_micro_batches_give_the_large_batch_gradient() -> None:
    r = _run("torch")
    assert r["sizes"] == [4, 3, 3]
    assert r["seen"] == [[0, 4, 0, False], [1, 3, 4, False], [2, 3, 7, True]]
    assert r["weighted"] < TOLERANCE
    assert r["summed"] < TOLERANCE
    # Dividing by the step count is wrong when the sizes differ: the check can tell.
    assert r["by_step_count"] > 100 * TOLERANCE


@pytest.mark.covers("torch:accumulate")
def test_torch_loss_scaler_updates_once_per_optimizer_step() -> None:
    r = _run("torch")["scaler"]
    assert r["enabled"]
    assert r["calls"] == {"update": 2, "step": 2}  # 2 optimizer steps of 3 micro-batches each
    # growth_interval=2: the scale doubles after 2 good optimizer steps, not after 2 micro-batches.
    assert r["scales"] == [2.0**10, 2.0**11]
    assert max(r["diff"]) < 1e-4  # unscaled once: the large batch's gradient (fp16 scale, fp32 model)


@pytest.mark.covers("tensorflow:accumulate")
def test_tensorflow_tape_gradients_summed_give_the_large_batch_gradient() -> None:
    r = _run("tensorflow")
    assert r["eager"] < TOLERANCE and r["graph"] < TOLERANCE
    assert r["mismatch"] == "grads"
    assert "accumulate_grads" in r["no_sync"]


@pytest.mark.covers("jax:accumulate")
def test_jax_grads_summed_give_the_large_batch_gradient() -> None:
    r = _run("jax")
    assert r["eager"] < TOLERANCE and r["jit"] < TOLERANCE
    assert r["mismatch"] == "grads"


# --- torch DDP, 2 gloo processes -----------------------------------------------------------

_DDP = r"""
import multiprocessing, os, time
import torch, torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
import unimem

def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))

def data():
    gen = torch.Generator().manual_seed(1)
    return torch.randn(10, 6, generator=gen), torch.randn(10, 2, generator=gen)

def rank_main(rank, port, queue):
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank), "WORLD_SIZE": "2"})
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
    x, y = data()
    reference = build()
    torch.nn.functional.mse_loss(reference(x), y).backward()
    large = [p.grad for p in reference.parameters()]

    model = torch.nn.parallel.DistributedDataParallel(build())
    synced = []
    current = [None]
    def counting(state, bucket):
        synced.append(current[0])
        return allreduce_hook(state, bucket)
    model.register_comm_hook(None, counting)

    plan = unimem.plan_accumulation(10, micro_batch=2, world_size=2)
    share = plan.share(rank)
    xs, ys = x[share], y[share]
    # No rank= given: accumulate asks the initialised process group, as under a launcher.
    sizes = []
    for mb in unimem.accumulate(plan, model=model, backend="torch"):
        current[0] = mb.index
        sizes.append(mb.size)
        (torch.nn.functional.mse_loss(model(xs[mb.slice]), ys[mb.slice]) * mb.weight).backward()
    diff = max(float((p.grad - g).abs().max()) for p, g in zip(model.parameters(), large))
    queue.put({"rank": rank, "sizes": sizes, "synced": synced, "diff": diff, "share": [share.start, share.stop]})
    dist.destroy_process_group()

"""


@pytest.mark.covers("torch:accumulate")
def test_torch_ddp_syncs_on_the_last_micro_batch_only_and_every_rank_gets_the_large_batch_gradient() -> None:
    need_framework("torch")
    results = run_json(
        (_DDP + gather_ranks(2, "rank_main", "rank, FREE_PORT, queue")).replace("FREE_PORT", repr(str(free_port()))),
        timeout=150,
    )
    assert len(results) == 2, results
    by_rank = {r["rank"]: r for r in results}
    # 10 samples, 2 ranks, micro-batches of at most 2: 3 steps each, sizes 2,2,1 on both.
    assert by_rank[0]["sizes"] == by_rank[1]["sizes"] == [2, 2, 1]
    assert by_rank[0]["share"] == [0, 5] and by_rank[1]["share"] == [5, 10]
    for r in results:
        assert r["synced"] == [2], r  # one all-reduce (one bucket), in the last micro-batch's backward
        assert r["diff"] < TOLERANCE, r


# --- the example script ------------------------------------------------------------------------


def _example(*args: str) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(REPO) / "examples" / "train.py"), *args]
    proc = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=300, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result


@pytest.mark.parametrize("framework", ["torch", "tensorflow", "jax"])
def test_the_example_trains_with_remat_and_a_target_batch(framework: str) -> None:
    need_framework(framework)
    args = ["--backend", framework, "--precision", "fp32", "--epochs", "2", "--samples", "1000"]
    result = _example(*args, "--batch-size", "48", "--target-batch", "100", "--remat")
    assert result["accumulation"] == {"global_batch": 100, "steps": 3, "sizes": [34, 33, 33]}
    assert result["remat"] is True
    assert result["final_loss"] < result["first_loss"]
