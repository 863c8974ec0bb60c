"""``find_batch_size`` over ranks: every trial agreed, the same answer on every rank.

torch: 2 and 4 processes on gloo on the CPU, forked from one interpreter that imported torch
(as tests/test_cluster.py does), each rank with its own simulated memory: a forward hook
raises torch's own ``OutOfMemoryError`` above the rank's largest size, so a trial fails on one
rank while it runs on another. JAX: 2 processes through its CPU multi-process runtime. Every
run has a deadline, so a hang fails the test instead of blocking it. Settings are
process-global: every search over ranks runs in fresh processes.
"""

from __future__ import annotations

import pytest
from conftest import free_port, gather_ranks, run_json, run_ranks

import unimem
from unimem.errors import ConfigError
from unimem.search.batch_size import find_batch_size
from unimem.training.accumulation import plan_accumulation

# Forks ``WORLD`` ranks that each run ``rank_main(rank)`` (defined by the test's code) on gloo,
# and emits their results by rank; a rank that dies or hangs ends the run within its deadline.
_FORK = """
import multiprocessing, os, sys, time, traceback, warnings
import torch, torch.distributed as dist
import unimem
from unimem import host_memory

host_memory.available = lambda: None  # the ranks' memory is what LIMITS simulate, not this host's
LIMITS = LIMITS_HERE
WORLD = len(LIMITS)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 4)
        self.norm = torch.nn.BatchNorm1d(4)  # a buffer: DDP broadcasts it in forward unless told not to

    def forward(self, x):
        return self.norm(self.layer(x))


def model_on(rank):
    '''A DDP model whose forward runs out of memory above this rank's largest size.'''
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(Net())

    def simulated_memory(module, args):
        if args[0].shape[0] > LIMITS[rank]:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {args[0].shape[0]} MiB (rank {rank}'s simulated limit)")

    ddp.module.register_forward_pre_hook(simulated_memory)
    return ddp


def run_rank(rank, port, queue):
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank),
                       "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(WORLD)})
    try:
        dist.init_process_group("gloo")
        out = {"rank": rank}
        out.update(rank_main(rank))
        dist.barrier()  # the store lives in rank 0: it must outlive the others' last reads
    except BaseException as exc:
        out = {"rank": rank, "crashed": traceback.format_exc()}
    queue.put(out)


# RANK_MAIN_HERE

"""


def _fork_ranks(limits: list[int], code: str, deadline: float = 90) -> dict[int, dict]:
    script = _FORK.replace("LIMITS_HERE", repr(limits)).replace("# RANK_MAIN_HERE", code, 1)
    script += gather_ranks(len(limits), "run_rank", f"rank, {str(free_port())!r}, queue", deadline)
    results = run_json(script, timeout=deadline + 60)
    assert len(results) == len(limits), f"only {len(results)} of {len(limits)} ranks answered (a hang): {results}"
    crashed = [r["crashed"] for r in results if "crashed" in r]
    assert not crashed, "\n\n".join(crashed)
    return {r["rank"]: r for r in results}


def _sizes(search: dict) -> list[list]:
    return [[t["batch_size"], t["fits"]] for t in search["trials"] + search["confirmations"]]


# --- torch: every rank returns the same size ----------------------------------------------------

_BLIND = """
import contextlib, io

def rank_main(rank):
    ddp = model_on(rank)

    def step(n):  # the search runs it under ddp.no_sync() (model=)
        ddp(torch.randn(n, 8)).sum().backward()
        ddp.zero_grad(set_to_none=True)

    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        found = unimem.find_batch_size(step, start=4, margin=0.0, model=ddp, progress=True, max_trials=30,
                                       return_trials=True, timeout=60)
    # The search left DDP as it was: the next step synchronises gradients and buffers again.
    ddp(torch.randn(2, 8)).sum().backward()
    return {"search": found.as_dict(), "printed": printed.getvalue(), "synced": bool(ddp.require_backward_grad_sync),
            "broadcast": bool(ddp.broadcast_buffers)}
"""


@pytest.fixture(scope="module")
def two_ranks():
    """2 ranks on gloo; rank 1 runs out of memory above 37, rank 0 above 100."""
    return _fork_ranks([100, 37], _BLIND)


@pytest.mark.covers("torch:ranks.batch_size")
@pytest.mark.slow
def test_two_ranks_return_the_smaller_ranks_largest(two_ranks):
    searches = [two_ranks[rank]["search"] for rank in (0, 1)]
    assert [s["batch_size"] for s in searches] == [37, 37]  # margin=0: exactly rank 1's largest
    assert all(s["world_size"] == 2 and s["converged"] for s in searches)
    assert _sizes(searches[0]) == _sizes(searches[1]), "every rank tried the same sizes with the same outcome"
    failures = [t for t in searches[0]["trials"] if not t["fits"]]
    assert failures and all("rank 1" in t["error"] for t in failures), "a failure names the rank it came from"
    assert searches[0]["smallest_failure"] == 38


@pytest.mark.slow
def test_a_size_that_failed_on_one_rank_failed_on_every_rank(two_ranks):
    for rank in (0, 1):
        trials = two_ranks[rank]["search"]["trials"]
        assert not any(t["fits"] and t["batch_size"] > 37 for t in trials)
        assert any(not t["fits"] and t["batch_size"] <= 100 for t in trials), "rank 0 ran a size rank 1 could not"


@pytest.mark.slow
def test_progress_prints_on_rank_0_only(two_ranks):
    assert "find_batch_size" in two_ranks[0]["printed"]
    assert two_ranks[1]["printed"] == ""


@pytest.mark.slow
def test_the_ddp_model_is_restored_after_the_search(two_ranks):
    for rank in (0, 1):
        assert two_ranks[rank]["synced"] and two_ranks[rank]["broadcast"]


_OWN_NO_SYNC = """
def rank_main(rank):
    ddp = model_on(rank)

    def step(n):  # no model=: the step keeps its own trial out of the gradient all-reduce
        with ddp.no_sync():
            ddp(torch.randn(n, 8)).sum().backward()
        ddp.zero_grad(set_to_none=True)

    # Trials run without buffer broadcasting: a rank failing before its forward leaves no one behind.
    ddp.broadcast_buffers = False
    found = unimem.find_batch_size(step, start=2, margin=0.0, max_trials=30, return_trials=True, timeout=60)
    return {"search": found.as_dict()}
"""


@pytest.mark.covers("torch:ranks.batch_size")
@pytest.mark.slow
def test_four_ranks_agree_with_the_steps_own_no_sync():
    results = _fork_ranks([90, 60, 75, 41], _OWN_NO_SYNC, deadline=120)
    searches = [results[rank]["search"] for rank in range(4)]
    assert {s["batch_size"] for s in searches} == {41}
    assert all(_sizes(s) == _sizes(searches[0]) for s in searches)
    assert all(s["world_size"] == 4 for s in searches)


# Peaks from measure=: rank r needs 1000 + (r + 1) x 100 bytes a sample, so rank 1 reaches the
# limit at half rank 0's size; the fit must follow the larger peaks to land within the margin.
_MEASURED = """
LIMIT = 100_000

def rank_main(rank):
    last = {}

    def step(n):
        need = 1000 + (rank + 1) * 100 * n
        if need > LIMIT:
            raise RuntimeError(f"CUDA out of memory. Tried to allocate {need} bytes")
        last["peak"] = need

    found = unimem.find_batch_size(step, start=8, measure=lambda: last.get("peak"), limit=LIMIT, baseline=1000,
                                   target_global_batch=3000, return_trials=True, timeout=60)
    return {"search": found.as_dict(), "int": int(found)}
"""


@pytest.mark.slow
def test_measured_peaks_are_combined_by_the_largest_and_the_plan_meets_the_global_batch():
    results = _fork_ranks([0, 0], _MEASURED)
    searches = [results[rank]["search"] for rank in (0, 1)]
    largest = (100_000 - 1000) // 200  # rank 1's largest: 495
    answer = searches[0]["batch_size"]
    assert searches[1]["batch_size"] == answer and (1 - 0.05) * largest <= answer <= largest
    assert _sizes(searches[0]) == _sizes(searches[1])
    assert [t["peak"] for t in searches[0]["trials"]] == [t["peak"] for t in searches[1]["trials"]]
    assert all(t["peak"] == 1000 + 200 * t["batch_size"] for t in searches[0]["trials"] if t["fits"])
    expected = plan_accumulation(3000, answer, 2)
    for search in searches:
        assert search["plan"] == dict(expected.__dict__)
    assert expected.steps * 2 * expected.micro_batch >= 3000 and expected.micro_batch <= answer


# --- failures: no rank hangs ----------------------------------------------------------------------

_RAISES = """
def rank_main(rank):
    ddp = model_on(rank)

    def step(n):
        if rank == 1 and n >= 16:
            raise ValueError(f"a bad batch of {n} on rank 1")  # not out of memory: the search stops
        ddp(torch.randn(n, 8)).sum().backward()

    started = time.monotonic()
    try:
        unimem.find_batch_size(step, start=4, model=ddp, timeout=60)
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - started}
    return {"error": None}
"""


@pytest.mark.slow
def test_a_rank_whose_forward_raises_stops_every_rank_at_once():
    results = _fork_ranks([1000, 1000], _RAISES)
    assert results[1]["error"] == "ValueError" and "rank 1" in results[1]["message"]
    stopped = results[0]
    assert stopped["error"] == "ClusterError", stopped
    assert "rank 1's step raised" in stopped["message"] and "ValueError: a bad batch of 16" in stopped["message"]
    assert stopped["seconds"] < 30, "rank 0 stopped on rank 1's word, long before its 60 s timeout"


@pytest.mark.covers("torch:ranks.batch_size")
@pytest.mark.slow
def test_an_out_of_memory_error_in_one_ranks_forward_leaves_no_rank_waiting():
    # Rank 1 fails inside forward at every size above 3 while rank 0 would go on to backward:
    # with buffers to broadcast and gradients to reduce, only the agreed no_sync trials keep them in step.
    results = _fork_ranks([1000, 3], _BLIND, deadline=60)
    assert [results[r]["search"]["batch_size"] for r in (0, 1)] == [3, 3]


_MISSING = """
def rank_main(rank):
    if rank == 1:
        time.sleep(6)  # never calls find_batch_size
        return {"error": None}
    started = time.monotonic()
    try:
        unimem.find_batch_size(lambda n: None, start=4, max_size=64, timeout=2)
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - started}
    return {"error": None}
"""


@pytest.mark.slow
def test_a_rank_that_never_arrives_is_named_after_the_timeout():
    results = _fork_ranks([8, 8], _MISSING)
    missing = results[0]
    assert missing["error"] == "ClusterError", missing
    assert "rank(s) 1 of 2 did not reach the start of the search within timeout=2 s" in missing["message"]
    assert 2 <= missing["seconds"] < 15


_DIFFERENT = """
def rank_main(rank):
    try:
        unimem.find_batch_size(lambda n: None, start=4 * (rank + 1), max_size=64, timeout=20)
    except Exception as exc:
        return {"error": type(exc).__name__, "parameter": getattr(exc, "parameter", None), "message": str(exc)}
    return {"error": None}
"""


@pytest.mark.slow
def test_ranks_passing_different_arguments_are_told_which():
    results = _fork_ranks([8, 8], _DIFFERENT)
    for rank in (0, 1):
        assert results[rank]["error"] == "ConfigError" and results[rank]["parameter"] == "start"
        assert "every rank of a collective search must pass the same arguments" in results[rank]["message"]


_SHARDED = """
from torch.distributed.fsdp import fully_shard

def rank_main(rank):
    sharded = fully_shard(torch.nn.Sequential(torch.nn.Linear(8, 4)))
    try:
        unimem.find_batch_size(lambda n: None, start=4, model=sharded, timeout=20)
    except unimem.ConfigError as exc:
        return {"parameter": exc.parameter, "message": str(exc)}
    return {"parameter": None}
"""


@pytest.mark.slow
def test_a_model_whose_forward_communicates_is_refused():
    results = _fork_ranks([8, 8], _SHARDED)
    for rank in (0, 1):
        assert results[rank]["parameter"] == "model"
        assert "FSDPModule" in results[rank]["message"] and "DDP" in results[rank]["message"]


# --- JAX: the coordinator's store ------------------------------------------------------------------

_JAX = """
import os
import jax
import unimem

rank = int(os.environ["RANK_UNDER_TEST"])
jax.distributed.initialize(coordinator_address="127.0.0.1:" + os.environ["PORT"], num_processes=2, process_id=rank)
largest = [50, 23][rank]

def step(n):  # process-local: no computation spans the processes
    if n > largest:
        raise MemoryError(f"RESOURCE_EXHAUSTED: out of memory allocating {n} MiB")
    jax.numpy.ones((n, 4)).sum().block_until_ready()

found = unimem.find_batch_size(step, start=4, margin=0.0, max_trials=30, return_trials=True, timeout=60)
emit({"rank": rank, "search": found.as_dict()})
"""


@pytest.mark.covers("jax:ranks.batch_size")
@pytest.mark.slow
def test_jax_processes_agree_through_the_coordinator():
    port = str(free_port())
    envs = [{"RANK_UNDER_TEST": str(rank), "PORT": port, "JAX_PLATFORMS": "cpu"} for rank in range(2)]
    results = {r["rank"]: r["search"] for r in run_ranks(_JAX, envs, timeout=120)}
    assert [results[r]["batch_size"] for r in (0, 1)] == [23, 23]
    assert _sizes(results[0]) == _sizes(results[1]) and results[0]["world_size"] == 2


# --- one process ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -3, True, 2.5, "64"])
def test_target_global_batch_is_checked_before_any_trial(value):
    calls = []
    with pytest.raises(ConfigError) as caught:
        find_batch_size(calls.append, start=4, target_global_batch=value)
    assert caught.value.parameter == "target_global_batch" and calls == []


@pytest.mark.parametrize(("name", "value"), [("timeout", 0), ("timeout", float("nan")), ("collective", "yes")])
def test_rank_arguments_are_checked(name, value):
    with pytest.raises(ConfigError) as caught:
        find_batch_size(lambda n: None, start=4, **{name: value})
    assert caught.value.parameter == name


def _fits_below(largest: int):
    def step(n: int) -> None:
        if n > largest:
            raise MemoryError(f"out of memory at {n}")

    return step


@pytest.mark.slow
def test_a_single_process_plans_the_global_batch_and_tries_no_larger_share():
    found = find_batch_size(
        _fits_below(1000), backend="nvml", start=4, target_global_batch=100, return_trials=True, progress=False
    )
    assert found.world_size == 1 and found.batch_size == 100, "no micro-batch above the target is tried"
    assert found.plan == plan_accumulation(100, 100, 1) and "plan: global batch 100" in str(found)
    assert find_batch_size(_fits_below(1000), backend="nvml", start=4, target_global_batch=100) == 100, (
        "the int alone otherwise"
    )
    small = find_batch_size(
        _fits_below(30), backend="nvml", start=4, margin=0.0, target_global_batch=100, return_trials=True
    )
    assert small.batch_size == 30 and small.plan is not None
    assert (small.plan.steps, small.plan.sizes(0)) == (4, (25, 25, 25, 25))
    assert small.as_dict()["plan"] == {"global_batch": 100, "world_size": 1, "steps": 4, "micro_batch": 25}


def test_a_single_process_without_a_target_has_no_plan():
    found = find_batch_size(_fits_below(30), backend="nvml", start=4, return_trials=True)
    assert found.plan is None and found.world_size == 1 and "plan:" not in str(found)


def test_collective_true_without_a_runtime_is_a_clear_error():
    with pytest.raises(unimem.ClusterError, match="collective=True"):
        find_batch_size(_fits_below(30), backend="nvml", start=4, collective=True)


def test_a_model_no_framework_knows_is_refused():
    with pytest.raises(ConfigError) as caught:
        find_batch_size(_fits_below(30), backend="nvml", start=4, model=object())
    assert caught.value.parameter == "model"


def test_a_launcher_without_a_runtime_is_the_cluster_views_error(pyjson):
    # Before, each rank searched alone, silently enough to be missed, while cluster_stats raised.
    code = """
    import unimem
    out = {}
    for name, call in (("search", lambda: unimem.find_batch_size(lambda n: None, start=4, max_size=16)),
                       ("view", lambda: unimem.cluster_stats())):
        try:
            call()
        except unimem.ClusterError as exc:
            out[name] = str(exc)
    out["alone"] = unimem.find_batch_size(lambda n: None, backend="nvml", start=4, max_size=16, collective=False)
    emit(out)
    """
    out = pyjson(code, env={"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert out["alone"] == 16
    said = "the environment says this is rank 1 of 2 (launcher), but no distributed runtime is initialised"
    assert said in out["search"] and said in out["view"] and "collective=False" in out["search"]


# --- end to end: search, plan, accumulate and the loss scaler under DDP ------------------------

_END_TO_END = """
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

def rank_main(rank):
    ddp = model_on(rank)

    def step(n):
        ddp(torch.randn(n, 8)).sum().backward()
        ddp.zero_grad(set_to_none=True)

    found = unimem.find_batch_size(step, start=2, margin=0.0, model=ddp, target_global_batch=100, max_trials=30,
                                   return_trials=True, timeout=60, backend="torch")
    plan = found.plan
    reduced = []
    current = [None]

    def counting(state, bucket):
        reduced.append(current[0])
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, counting)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(plan.global_batch, 8, generator=gen), torch.randn(plan.global_batch, 4, generator=gen)
    share = plan.share(rank)
    xs, ys = x[share], y[share]
    sizes = []
    for optimizer_step in range(2):
        for mb in unimem.accumulate(plan, rank, model=ddp):
            current[0] = (optimizer_step, mb.index)
            sizes.append(mb.size)
            loss = torch.nn.functional.mse_loss(ddp(xs[mb.slice]), ys[mb.slice]) * mb.weight
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    params = [p.detach().flatten().tolist() for p in ddp.parameters()]
    return {"answer": found.batch_size, "plan": [plan.global_batch, plan.world_size, plan.steps, plan.micro_batch],
            "sizes": sizes, "reduced": [list(r) for r in reduced], "scale": scaler.get_scale(), "params": params,
            "share": [share.start, share.stop]}
"""


@pytest.mark.slow
def test_search_plan_accumulation_and_scaler_together_under_ddp():
    results = _fork_ranks([100, 37], _END_TO_END, deadline=120)
    for rank in (0, 1):
        r = results[rank]
        assert r["answer"] == 37, "the smaller rank's largest, on every rank"
        # 100 samples over 2 ranks at most 37 a micro-batch: 2 steps of 25 on each rank.
        assert r["plan"] == [100, 2, 2, 25] and r["sizes"] == [25, 25, 25, 25]
        # Gradients are all-reduced on each optimizer step's last micro-batch only.
        assert r["reduced"] and {tuple(x) for x in r["reduced"]} == {(0, 1), (1, 1)}
        assert r["scale"] == 2.0**8, "one scaler update per optimizer step (growth needs 2000 good steps)"
    assert results[0]["share"] == [0, 50] and results[1]["share"] == [50, 100]
    # DDP kept the replicas equal: every rank applied the same averaged gradient.
    assert results[0]["params"] == results[1]["params"]


def test_a_capacity_read_again_is_agreed_over_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each rank reads its own pool before a predicted run; every rank must hold the same limit,
    # the smallest one known, or they would place different sizes.
    import threading
    import time
    import types

    from unimem.search import state
    from unimem.search.framework import Framework
    from unimem.search.limit import Limit
    from unimem.search.ranks import Ranks

    class Store:
        def __init__(self, shared: dict[str, str], rank: int) -> None:
            self.shared, self.rank, self.world_size = shared, rank, 2

        def set(self, key: str, value: str) -> None:
            self.shared[key] = value

        def get(self, key: str, timeout: float) -> str | None:
            deadline = time.monotonic() + timeout
            while key not in self.shared and time.monotonic() < deadline:
                time.sleep(0.001)
            return self.shared.get(key)

    capacities = {0: 8_000, 1: 6_000}
    monkeypatch.setattr(state, "take_snapshot", lambda run: None)
    monkeypatch.setattr(state, "capacity_of", lambda run, snapshot: capacities[run.ranks.rank])
    shared: dict[str, str] = {}
    limits: dict[int, tuple[bool, Limit | None]] = {}

    def rank(r: int) -> None:
        settings = types.SimpleNamespace(limit=None, measure=None, device=0)
        run = state.Run(settings, framework=Framework("jax"), limit=Limit(9_000, "capacity"))  # type: ignore[arg-type]
        run.ranks = Ranks(Store(shared, r), "test store", 5.0, "t/")
        limits[r] = (state.reread_capacity(run), run.limit)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert limits == {0: (True, Limit(6_000, "capacity")), 1: (True, Limit(6_000, "capacity"))}
