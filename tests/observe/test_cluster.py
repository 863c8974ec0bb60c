"""The cluster view over real multi-process runs on the CPU, and launching under torchrun.

torch: 4 processes on gloo, as torchrun would start them on two nodes of two ranks each
(``GROUP_RANK`` is the node). JAX: 2 processes through its CPU multi-process runtime. Each
rank holds a different, known number of bytes; the view must put each figure under the
right rank, node and local rank. A rank asking alone must come back within its timeout
(each run has its own timeout, so a hang fails the test).
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest
from conftest import free_port, gather_ranks, run_json, run_ranks, subprocess_env

import unimem
from unimem.errors import ClusterError, ConfigError
from unimem.observe.cluster import ClusterStats, RankStats

MiB = 1 << 20


_TORCH_RANKS = """
import multiprocessing, os, time, warnings
import torch, torch.distributed as dist
import unimem


def rank_main(rank, port, queue):
    # As torchrun starts them on 2 nodes of 2 ranks: GROUP_RANK is the node.
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank), "WORLD_SIZE": "4",
                       "LOCAL_RANK": str(rank % 2), "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": str(rank // 2),
                       "TORCHELASTIC_RUN_ID": "test"})
    dist.init_process_group("gloo")
    held = torch.ones((rank + 1) * 48 * 2**20, dtype=torch.uint8)  # resident: (rank + 1) x 48 MiB
    known = unimem.MemoryStats("torch", 0, allocated=(rank + 1) * 1000, peak_allocated=(rank + 1) * 200 * 2**20)
    measured = unimem.cluster_stats(timeout=60)
    given = unimem.cluster_stats(snapshot=known, timeout=60)
    me = unimem.rank_info()
    out = {"rank": rank, "info": [me.rank, me.world_size, me.local_rank, me.node, me.launcher]}
    out.update(measured=measured.as_dict(), given=given.as_dict(), table=str(given))
    if rank == 0:  # misuse: rank 0 asks alone
        started = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            alone = unimem.cluster_stats(snapshot=known, timeout=2)
        out["alone"] = {"missing": list(alone.missing), "seconds": time.monotonic() - started,
                        "warnings": [str(w.message) for w in caught], "table": str(alone)}
    queue.put(out)
    del held


"""


@pytest.fixture(scope="module")
def torch_run():
    """4 gloo ranks on 2 simulated nodes (one run, several tests read it)."""
    results = run_json(
        (_TORCH_RANKS + gather_ranks(4, "rank_main", "rank, FREE_PORT, queue")).replace(
            "FREE_PORT", repr(str(free_port()))
        ),
        timeout=150,
    )
    return {r["rank"]: r for r in results}


@pytest.mark.slow
def test_every_rank_reads_its_node_and_local_rank(torch_run):
    for rank, result in torch_run.items():
        assert result["info"] == [rank, 4, rank % 2, rank // 2, "torchrun"]


@pytest.mark.covers("torch:ranks.cluster")
@pytest.mark.slow
def test_the_view_gathers_every_rank_under_the_right_rank(torch_run):
    for result in torch_run.values():  # every rank gets the whole view
        view = result["given"]
        assert view["world_size"] == 4 and view["missing"] == [] and view["transport"] == "torch runtime"
        for rank, answer in view["per_rank"].items():
            rank = int(rank)
            assert answer["rank"] == rank and answer["figures"]["allocated"] == (rank + 1) * 1000
            assert (answer["local_rank"], answer["node"]) == (rank % 2, rank // 2)
        assert (view["min"]["allocated"], view["max"]["allocated"], view["mean"]["allocated"]) == (1000, 4000, 2500)
        assert view["outlier"] == {"rank": 3, "figure": "peak_allocated", "value": 800 * MiB, "mean": 500.0 * MiB}
    table = torch_run[0]["table"]
    assert "outlier: rank 3" in table and "mean" in table


@pytest.mark.slow
def test_measured_host_memory_differs_by_rank_as_allocated(torch_run):
    per_rank = torch_run[1]["measured"]["per_rank"]
    rss = [per_rank[str(rank)]["figures"].get("host_rss") for rank in range(4)]
    if rss[0] is None:
        pytest.skip("MemoryStats has no host_rss figure here")
    steps = [later - earlier for earlier, later in zip(rss, rss[1:], strict=False)]
    assert all(step > 24 * MiB for step in steps), rss  # each rank holds 48 MiB more than the one before
    outlier = torch_run[1]["measured"]["outlier"]  # 72 MiB above the mean: named when that is 10% of it
    assert outlier is None or outlier["rank"] == 3 or outlier["figure"] != "host_rss"


@pytest.mark.covers("torch:ranks.cluster")
@pytest.mark.slow
def test_a_rank_asking_alone_returns_within_the_timeout(torch_run):
    alone = torch_run[0]["alone"]
    assert alone["missing"] == [1, 2, 3] and alone["seconds"] < 15
    assert any("did not answer" in w and "every rank must call" in w for w in alone["warnings"])
    assert "did not answer" in alone["table"]


_JAX_RANKS = """
import os, time, warnings
import jax
import unimem

rank = int(os.environ["RANK_UNDER_TEST"])
jax.distributed.initialize(coordinator_address="127.0.0.1:" + os.environ["PORT"], num_processes=2, process_id=rank)
me = unimem.rank_info()
known = unimem.MemoryStats("jax", 0, allocated=(rank + 1) * 300 * 2**20)
for _ in range(3):  # the third call replaces the first's key
    view = unimem.cluster_stats(snapshot=known, timeout=60)
out = {"rank": rank, "info": [me.rank, me.world_size, me.launcher], "view": view.as_dict()}
if rank == 0:
    started = time.monotonic()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        alone = unimem.cluster_stats(snapshot=known, timeout=2)
    out["alone"] = [list(alone.missing), time.monotonic() - started]
emit(out)
"""


@pytest.mark.covers("jax:ranks.cluster")
@pytest.mark.slow
def test_jax_multiprocess_runtime_gathers_and_a_lone_rank_returns():
    port = str(free_port())
    envs = [{"RANK_UNDER_TEST": str(rank), "PORT": port, "JAX_PLATFORMS": "cpu"} for rank in range(2)]
    results = {r["rank"]: r for r in run_ranks(_JAX_RANKS, envs, timeout=120)}
    for rank, result in results.items():
        assert result["info"] == [rank, 2, "jax runtime"]  # read from jax.distributed, no launcher variables
        view = result["view"]
        assert view["transport"] == "jax runtime" and view["missing"] == []
        assert [view["per_rank"][str(r)]["figures"]["allocated"] for r in range(2)] == [300 * MiB, 600 * MiB]
        assert view["outlier"]["rank"] == 1
    missing, seconds = results[0]["alone"]
    assert missing == [1] and seconds < 15


# --- launching: unimem run around torchrun, and torchrun around unimem run ------------------------

_WORKER = """
import json, os, sys
from unimem.backends.base import pending_hooks
import unimem
print("WORKER " + json.dumps({"rank": os.environ.get("LOCAL_RANK"), "hooks": pending_hooks("torch"),
      "local_device": unimem.local_device(), "run": os.environ.get("UNIMEM_RUN")}), flush=True)
"""


def _torchrun(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
    ]


def _workers(proc: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    assert proc.returncode == 0, proc.stderr[-5000:]
    # The workers share torchrun's stdout: their lines may interleave, so each object is matched alone.
    found = [json.loads(match) for match in re.findall(r"WORKER (\{[^{}]*\})", proc.stdout)]
    return {w["rank"]: w for w in found}


@pytest.mark.slow
def test_unimem_run_around_torchrun_configures_every_worker(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_WORKER)
    unimem_run = [sys.executable, "-m", "unimem", "run", "-b", "torch", "--fraction", "0.5", "-v", "--"]
    proc = subprocess.run(
        [*unimem_run, *_torchrun(free_port()), str(script)],
        env=subprocess_env({"CUDA_VISIBLE_DEVICES": "0,1"}),
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    workers = _workers(proc)
    assert set(workers) == {"0", "1"}
    for rank, worker in workers.items():
        assert worker["run"] == "1" and "unimem.torch.at_init" in worker["hooks"]
        assert worker["local_device"] == int(rank)
    for rank in ("0", "1"):  # each worker's own Applied, printed by its startup hook
        assert f"torch.cuda.set_device({rank}) at CUDA init" in proc.stderr


@pytest.mark.slow
def test_torchrun_around_unimem_run_configures_every_worker(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_WORKER)
    inner = ["-m", "unimem", "run", "-b", "torch", "--fraction", "0.5", "-v", "--", sys.executable, str(script)]
    proc = subprocess.run(
        [*_torchrun(free_port()), *inner],
        env=subprocess_env({"CUDA_VISIBLE_DEVICES": "0,1"}),
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    workers = _workers(proc)
    assert set(workers) == {"0", "1"} and all("unimem.torch.at_init" in w["hooks"] for w in workers.values())
    assert "torch.cuda.set_device(1) at CUDA init" in proc.stderr


# --- one process, and misuse ------------------------------------------------------------------


def test_a_single_process_answers_for_itself():
    view = unimem.cluster_stats(snapshot=unimem.MemoryStats("torch", 0, allocated=5), timeout=1)
    assert view.world_size == 1 and view.transport == "single process" and view.missing == ()
    assert view.per_rank[0].figures["allocated"] == 5 and view.outlier is None
    assert "rank" in str(view)


def test_several_ranks_without_a_runtime_is_a_clear_error(pyjson):
    code = """
    import unimem
    try:
        unimem.cluster_stats()
    except unimem.ClusterError as exc:
        emit(str(exc))
    """
    message = pyjson(code, env={"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert "rank 0 of 2" in message and "init_process_group" in message


def test_arguments_are_checked_before_anything_is_sent():
    with pytest.raises(ConfigError) as caught:
        unimem.cluster_stats(timeout=0)
    assert caught.value.parameter == "timeout"
    with pytest.raises(ConfigError) as caught:
        unimem.cluster_stats(snapshot={"allocated": 1})  # type: ignore[arg-type]
    assert caught.value.parameter == "snapshot"
    assert issubclass(ClusterError, unimem.UnimemError)


def _answer(rank: int, **figures: int | None) -> RankStats:
    return RankStats(rank, rank % 2, rank // 2, "host", 100 + rank, rank % 2, "torch", dict(figures))


def test_spread_over_ranks_ignores_unknown_figures_and_missing_ranks():
    view = ClusterStats(
        3,
        {0: _answer(0, allocated=100 * MiB, reserved=None), 1: None, 2: _answer(2, allocated=300 * MiB, reserved=None)},
        "torch runtime",
    )
    assert view.missing == (1,) and view.figures == ("allocated",)
    assert (view.min["allocated"], view.max["allocated"], view.mean["allocated"]) == (100 * MiB, 300 * MiB, 200.0 * MiB)
    assert view.min["reserved"] is None
    assert view.outlier is not None and (view.outlier.rank, view.outlier.figure) == (2, "allocated")
    lines = str(view).splitlines()
    assert any(line.startswith("1 ") and "did not answer" in line for line in lines)
    equal = ClusterStats(2, {0: _answer(0, allocated=7), 1: _answer(1, allocated=7)}, "torch runtime")
    assert equal.outlier is None


def _spread(*values: int) -> ClusterStats:
    return ClusterStats(len(values), {r: _answer(r, host_rss=v) for r, v in enumerate(values)}, "torch runtime")


def test_an_outlier_is_named_only_for_a_material_spread():
    """Named when the highest rank is at least 10% of the mean and at least 64 MiB above it."""
    # Identical ranks but for rounding: 0.01 MiB over 230 MiB is no outlier, nor said in the table.
    noise = _spread(230 * MiB, 230 * MiB, 230 * MiB + 10 * 1024)
    assert noise.outlier is None and "outlier" not in str(noise)
    # 10% of the mean but under 64 MiB: small processes differ by that much.
    assert _spread(100 * MiB, 160 * MiB).outlier is None  # 30 MiB above a 130 MiB mean
    # 64 MiB but under 10% of the mean: large processes differ by that much.
    assert _spread(10_000 * MiB, 10_800 * MiB, 10_000 * MiB).outlier is None  # 533 MiB above, 5%
    # Both: named, in the table too.
    both = _spread(1000 * MiB, 1300 * MiB)  # 150 MiB above a 1150 MiB mean: 13%
    assert both.outlier is not None and (both.outlier.rank, both.outlier.figure) == (1, "host_rss")
    assert "outlier: rank 1, host_rss 1.27 GiB (mean 1.12 GiB)" in str(both)
    # Exactly at both bounds counts.
    mean = 640 * MiB
    edge = _spread(mean - 64 * MiB, mean + 64 * MiB)  # 64 MiB above a 640 MiB mean: 10% exactly
    assert edge.outlier is not None and edge.outlier.value == mean + 64 * MiB


def test_a_stale_rank_is_shown_with_its_age_and_left_out_of_the_spread():
    stale = dataclasses.replace(_answer(1, allocated=99), stale=True, age=12.5)
    view = ClusterStats(2, {0: _answer(0, allocated=10), 1: stale}, "torch runtime")
    assert view.missing == (1,) and view.stale == {1: 12.5}
    assert view.max["allocated"] == 10 and view.outlier is None
    row = next(line for line in str(view).splitlines() if line.startswith("1 "))
    assert "stale, 12.5 s old" in row and "99 B" in row
    assert view.as_dict()["per_rank"]["1"]["age"] == 12.5 and view.as_dict()["stale"] == {"1": 12.5}


def test_the_cluster_error_is_one_of_unimems_errors() -> None:
    from unimem import errors

    assert unimem.ClusterError is errors.ClusterError is ClusterError
    assert issubclass(ClusterError, unimem.UnimemError) and issubclass(ClusterError, RuntimeError)


# --- the store's bookkeeping: keys, stale ranks, a store that goes ------------------------------

_BOOKKEEPING = """
import multiprocessing, os, signal, time, warnings
import torch.distributed as dist
import unimem


def start(rank, port):
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank), "WORLD_SIZE": "2",
                       "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"})
    dist.init_process_group("gloo")
    return dist.distributed_c10d._get_default_store(), unimem.MemoryStats("torch", 0, allocated=(rank + 1) * 1000)


def killed(queue, out):
    queue.put(out)
    queue.close()
    queue.join_thread()
    os.kill(os.getpid(), signal.SIGKILL)


def later_call(timeout):
    began = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            view = unimem.cluster_stats(snapshot=KNOWN[0], timeout=timeout)
            out = {"view": view.as_dict(), "table": str(view)}
        except unimem.ClusterError as exc:
            out = {"error": str(exc)}
    out.update(seconds=time.monotonic() - began, warnings=[str(w.message) for w in caught])
    return out


KNOWN = []


def keys_then_stale(rank, port, calls, queue):
    store, known = start(rank, port)
    KNOWN.append(known)
    before = store.num_keys()
    counts = []
    for call in range(calls):
        view = unimem.cluster_stats(snapshot=known, timeout=60)
        assert view.missing == () and not view.stale, str(view)
        if call in (0, calls - 1):
            counts.append(store.num_keys() - before)
    out = {"rank": rank, "counts": counts}
    if rank == 1:
        killed(queue, out)  # published its last figures, then killed
    time.sleep(1.0)
    out["later"] = later_call(2)
    queue.put(out)


def store_goes(rank, port, calls, queue):
    store, known = start(rank, port)
    KNOWN.append(known)
    unimem.cluster_stats(snapshot=known, timeout=60)
    if rank == 0:
        killed(queue, {"rank": 0})  # the process hosting the store
    time.sleep(1.0)
    queue.put({"rank": 1, "later": later_call(20)})


context = multiprocessing.get_context("fork")
queue = context.Queue()
ranks = [context.Process(target=__TARGET__, args=(rank, __PORT__, __CALLS__, queue)) for rank in range(2)]
for process in ranks:
    process.start()
results, deadline = [], time.monotonic() + 120
while len(results) < 2 and time.monotonic() < deadline:
    try:
        results.append(queue.get(timeout=1))
    except Exception:  # queue.Empty: stop once every rank has ended
        if all(p.exitcode is not None for p in ranks):
            break
for process in ranks:
    process.join(5)
    if process.is_alive():
        process.kill()
emit(sorted(results, key=lambda r: r["rank"]))
"""


def _bookkeeping(target: str, calls: int) -> dict[int, dict]:
    code = _BOOKKEEPING.replace("__TARGET__", target).replace("__PORT__", repr(str(free_port())))
    code = code.replace("__CALLS__", str(calls))
    return {r["rank"]: r for r in run_json(code, timeout=180)}


def _keys_and_stale(calls: int) -> None:
    run = _bookkeeping("keys_then_stale", calls)
    for rank in (0, 1):
        # Before, every call left a key per rank for good: 3 keys became 1,003 after 500 calls.
        first, last = run[rank]["counts"]
        assert first <= 4 and last == 4, run[rank]  # two per rank, one per call's parity: 2 x world size
    later = run[0]["later"]
    view = later["view"]
    # Rank 1 published its figures, then was killed: shown with them, stale, and left out of the spread.
    assert view["missing"] == [1] and list(view["stale"]) == ["1"] and view["stale"]["1"] >= 1.0
    assert view["per_rank"]["1"]["stale"] and view["per_rank"]["1"]["figures"]["allocated"] == 2000
    assert view["max"]["allocated"] == 1000 and view["outlier"] is None
    assert "stale, " in later["table"] and "did not answer" in later["table"]
    assert any("rank(s) 1 did not answer" in w and "rank 1's" in w and "old" in w for w in later["warnings"])


@pytest.mark.covers("torch:ranks.cluster")
@pytest.mark.slow
def test_the_store_holds_two_keys_per_rank_and_a_killed_rank_is_stale() -> None:
    _keys_and_stale(20)


@pytest.mark.slow
def test_a_thousand_calls_leave_two_keys_per_rank() -> None:
    _keys_and_stale(1000)


@pytest.mark.slow
def test_when_the_store_goes_the_message_says_the_time_that_passed() -> None:
    later = _bookkeeping("store_goes", 1)[1]["later"]
    said = later.get("error") or " ".join(later["warnings"])
    assert "store" in said and "20 s" not in said, said  # before: "did not answer within 30 s" after 1.2 s
    assert later["seconds"] < 20, later
