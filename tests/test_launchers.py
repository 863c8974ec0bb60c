"""``configure`` called again, and ``configuration()``, under every launcher's variables.

Calls add up under a launcher as in a single process, and the rank's pin stays in force
beside the settings: ``configuration()`` shows it. Each case runs in a fresh interpreter
(configure is process-global). The launches at the end run two real gloo ranks on the CPU,
with ``unimem run`` around ``torchrun`` and inside it, and a script that calls ``configure``
and ``configuration`` on each rank.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import conftest
import pytest
from conftest import SLURM_ALL_GPUS, SLURM_ONE_GPU_PER_TASK, free_port, run_ranks, subprocess_env

TORCHRUN = {**conftest.TORCHRUN, "CUDA_VISIBLE_DEVICES": "0,1"}
# As a user sets them by hand (or a launcher other than torchrun): no GPU count known here.
LOCAL_RANK_ONLY = {"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
OPEN_MPI = {**conftest.OPEN_MPI, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
MPICH = {
    "PMI_RANK": "3",
    "PMI_SIZE": "4",
    "MPI_LOCALRANKID": "1",
    "MPI_LOCALNRANKS": "2",
    "CUDA_VISIBLE_DEVICES": "0,1",
}

_AGAIN = """
import os, warnings
import unimem
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = unimem.configure(backend=["torch", "jax"], fraction=0.5)
    again = unimem.configure(backend=["torch", "jax"], fraction=0.5)
    third = unimem.configure(backend="torch", allocator="expandable")
in_force = unimem.configuration()
emit({
    "again": again.as_dict()["actions"],
    "third": third.as_dict()["actions"],
    "in_force": in_force.as_dict(),
    "table": str(in_force),
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "warnings": [str(w.message) for w in caught],
})
"""


@pytest.mark.parametrize(
    "env, pin",
    [
        (LOCAL_RANK_ONLY, 1),
        (TORCHRUN, 1),
        (SLURM_ONE_GPU_PER_TASK, 0),
        (SLURM_ALL_GPUS, 1),
        (OPEN_MPI, 1),
        (MPICH, 1),
    ],
    ids=["local-rank", "torchrun", "slurm-one-gpu-per-task", "slurm-all-gpus", "open-mpi", "mpich"],
)
def test_calls_add_up_and_configuration_shows_the_pin(pyjson, env, pin):
    result = pyjson(_AGAIN, env=env)
    in_force = result["in_force"]
    assert set(in_force) == {"torch", "jax"}
    assert in_force["torch"]["pin"] == pin and in_force["jax"]["pin"] == pin
    assert in_force["torch"]["fraction"] == 0.5 and in_force["jax"]["fraction"] == 0.5
    assert in_force["torch"]["allocator"] == "expandable"  # the third call added to the first two
    # The same call again pins the same device: nothing is replaced, nothing is warned.
    assert [(a["setting"], a["value"], a["replaced"]) for a in result["again"] if a["setting"] == "pin"] == [
        ("pin", pin, ""),
        ("pin", pin, ""),
    ]
    assert result["warnings"] == []
    assert f"torch: not imported, this rank pinned to device {pin}" in result["table"]
    assert f"torch.cuda.set_device({pin}) at CUDA init" in result["table"]
    assert result["visible"] == env.get("CUDA_VISIBLE_DEVICES")  # the pin goes through the framework's call


def test_configuration_alone_after_one_call_under_a_launcher(pyjson):
    code = """
    import unimem
    unimem.configure(backend="torch", fraction=0.5)
    emit(unimem.configuration()["torch"].as_dict())
    """
    torch = pyjson(code, env=LOCAL_RANK_ONLY)
    assert (torch["pin"], torch["fraction"], torch["devices"]) == (1, 0.5, None)


def test_per_rank_devices_stay_per_rank_in_a_later_call(pyjson):
    code = """
    import os, unimem
    unimem.configure(backend="torch", devices="per-rank")
    later = unimem.configure(backend="torch", fraction=0.5)
    emit([later.as_dict()["actions"], unimem.configuration()["torch"].as_dict(), os.environ["CUDA_VISIBLE_DEVICES"],
          unimem.local_device()])
    """
    actions, torch, visible, local = pyjson(code, env={**TORCHRUN, "CUDA_VISIBLE_DEVICES": "2,3"})
    # No set_device(1): the rank sees one GPU, as device 0.
    assert [a["setting"] for a in actions] == ["devices", "fraction"]
    assert actions[0]["target"] == "CUDA_VISIBLE_DEVICES=3" and actions[0]["status"] == "unchanged"
    assert (torch["pin"], torch["fraction"], visible, local) == (1, 0.5, "3", 0)


def test_devices_chosen_stay_unpinned_in_a_later_call(pyjson):
    code = """
    import os, unimem
    unimem.configure(backend="torch", devices=[0])
    later = unimem.configure(backend="torch", fraction=0.8)
    emit([later.as_dict()["actions"], unimem.configuration()["torch"].as_dict()])
    """
    actions, torch = pyjson(code, env=TORCHRUN)
    # Not read as two local ranks sharing the one GPU left visible: nothing pinned, the fraction whole.
    assert [(a["setting"], a["value"]) for a in actions] == [("fraction", 0.8)]
    assert (torch["pin"], torch["devices"], torch["fraction"]) == (None, [0], 0.8)


def test_devices_that_would_renumber_the_gpus_under_a_pin_are_refused(pyjson):
    code = """
    import os, unimem
    unimem.configure(backend="torch")
    try:
        unimem.configure(backend="torch", devices=[1])
    except unimem.ConfigError as exc:
        refused = [exc.parameter, str(exc), os.environ["CUDA_VISIBLE_DEVICES"]]
    try:
        unimem.configure(backend="torch", devices="per-rank")
    except unimem.ConfigError as exc:
        refused += [exc.parameter, os.environ["CUDA_VISIBLE_DEVICES"]]
    kept = unimem.configure(backend="torch", devices=[0, 1])  # device 1 is still GPU 1
    emit([refused, kept.as_dict()["actions"], unimem.configuration()["torch"].pin])
    """
    refused, kept, pin = pyjson(code, env=TORCHRUN)
    parameter, message, visible, parameter_again, visible_again = refused
    assert parameter == parameter_again == "devices" and visible == visible_again == "0,1"
    assert "pinned torch to device 1" in message and "first configure() call" in message
    assert [a["target"] for a in kept] == ["CUDA_VISIBLE_DEVICES=0,1"] and pin == 1


_JAX_RANK = """
import os
import jax
import unimem

rank = int(os.environ["RANK_UNDER_TEST"])
jax.distributed.initialize(coordinator_address="127.0.0.1:" + os.environ["PORT"], num_processes=2, process_id=rank)
unimem.configure(backend="jax", growth=True)
unimem.configure(backend="jax", fraction=0.5)
in_force = unimem.configuration()
me = unimem.rank_info()
emit({"rank": rank, "info": [me.rank, me.world_size, me.launcher], "jax": in_force["jax"].as_dict(),
      "table": str(in_force)})
"""


@pytest.mark.slow
def test_calls_add_up_in_a_jax_multiprocess_runtime():
    """Two JAX processes of one job (``jax.distributed``): one process per host owns its devices."""
    port = str(free_port())
    envs = [{"RANK_UNDER_TEST": str(rank), "PORT": port, "JAX_PLATFORMS": "cpu"} for rank in range(2)]
    results = sorted(run_ranks(_JAX_RANK, envs), key=lambda r: r["rank"])
    for rank, result in enumerate(results):
        assert result["info"] == [rank, 2, "jax runtime"]
        jax = result["jax"]
        assert (jax["growth"], jax["fraction"], jax["pin"]) == (True, 0.5, None)
        assert "XLA_CLIENT_MEM_FRACTION=0.5" in result["table"]


# --- launching: unimem run around torchrun, and torchrun around unimem run ----------------------

_SCRIPT = """
import json, os
import unimem

unimem.configure(backend="torch", fraction=0.5)
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
in_force = unimem.configuration()
print("WORKER " + json.dumps({"rank": dist.get_rank(), "pin": in_force["torch"].pin,
      "fraction": in_force["torch"].fraction, "sum": total.item(), "run": os.environ.get("UNIMEM_RUN"),
      "table": str(in_force)}), flush=True)
dist.destroy_process_group()
"""


def _torchrun() -> list[str]:
    """The venv's ``torchrun``, two ranks on this host, on a port of their own."""
    return [
        str(Path(sys.executable).with_name("torchrun")),
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
    ]


def _launch(command: list[str], cwd: Path) -> dict[int, dict]:
    proc = subprocess.run(command, env=subprocess_env(), cwd=str(cwd), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-6000:]
    # The ranks share torchrun's stdout: their lines may interleave, so each object is matched alone.
    found = [json.loads(match) for match in re.findall(r"WORKER (\{[^{}]*\})", proc.stdout)]
    return {worker["rank"]: worker for worker in found}


def _each_rank_configured(workers: dict[int, dict]) -> None:
    assert set(workers) == {0, 1}
    for rank, worker in workers.items():
        assert worker["run"] == "1" and worker["sum"] == 2.0
        # No GPU count here (no NVML, no CUDA_VISIBLE_DEVICES): one GPU per local rank is assumed.
        assert worker["pin"] == rank and worker["fraction"] == 0.5
        assert f"this rank pinned to device {rank}" in worker["table"]


@pytest.mark.slow
def test_unimem_run_around_torchrun_with_configure_in_the_script(tmp_path):
    (tmp_path / "script.py").write_text(_SCRIPT)
    command = [sys.executable, "-m", "unimem", "run", "--fraction", "0.5", "--", *_torchrun(), "script.py"]
    _each_rank_configured(_launch(command, tmp_path))


@pytest.mark.slow
def test_torchrun_around_unimem_run_with_configure_in_the_script(tmp_path):
    (tmp_path / "script.py").write_text(_SCRIPT)
    inner = ["-m", "unimem", "run", "--fraction", "0.5", "--", sys.executable, "script.py"]
    _each_rank_configured(_launch([*_torchrun(), *inner], tmp_path))
