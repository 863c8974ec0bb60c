"""Ranks from the launcher's environment, each rank pinned to its own GPU, and stray memory.

``rank_info`` and ``pin_for`` are pure over an environment mapping; ``configure`` under a
launcher's environment runs in fresh interpreters (pinning registers process-global hooks
and may set CUDA_VISIBLE_DEVICES). There is no GPU here: the tests check the plan, what is
set, and that nothing is set where it cannot be.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import OPEN_MPI, SLURM_ALL_GPUS, SLURM_ONE_GPU_PER_TASK, TORCHRUN

import unimem
from unimem import ranks, registry
from unimem.errors import ConfigError, UnimemWarning

# --- who am I -------------------------------------------------------------------


def test_torchrun_environment_gives_rank_node_and_local_rank():
    info = ranks.rank_info(TORCHRUN, runtime=False)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.node) == (3, 4, 1, 2, 1)
    assert info.launcher == "torchrun" and info.distributed


def test_lightning_style_environment_reads_node_rank():
    env = {"LOCAL_RANK": "0", "NODE_RANK": "2", "WORLD_SIZE": "8", "RANK": "4"}
    info = ranks.rank_info(env, runtime=False)
    assert (info.node, info.rank, info.launcher) == (2, 4, "launcher")


def test_slurm_environment_gives_tasks_per_node_and_its_gpus():
    info = ranks.rank_info(SLURM_ONE_GPU_PER_TASK, runtime=False)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.node) == (3, 4, 1, 2, 1)
    assert info.launcher == "slurm" and info.gpus == ("4", "5")


def test_slurm_uneven_tasks_per_node_are_read_per_node():
    env = {"SLURM_PROCID": "6", "SLURM_LOCALID": "0", "SLURM_NTASKS": "7", "SLURM_NODEID": "3"}
    assert ranks.rank_info({**env, "SLURM_TASKS_PER_NODE": "2(x3),1"}, runtime=False).local_world_size == 1
    assert ranks.rank_info({**env, "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "2(x3),1"}).local_world_size == 2


def test_torchrun_inside_slurm_is_read_as_torchrun():
    """torchrun's variables describe the worker; SLURM's describe the task that ran torchrun."""
    info = ranks.rank_info({**SLURM_ALL_GPUS, **TORCHRUN}, runtime=False)
    assert info.launcher == "torchrun" and info.local_rank == 1


def test_open_mpi_environment():
    info = ranks.rank_info(OPEN_MPI, runtime=False)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.node) == (5, 8, 1, 4, 1)
    assert info.launcher == "mpi"


def test_no_launcher_is_one_process():
    info = ranks.rank_info({}, runtime=False)
    assert info == unimem.RankInfo() and not info.distributed and info.launcher == "none"
    assert ranks.local_device({}) == 0
    assert ranks.metadata({}) == {}
    assert ranks.rank_path("memory.json", {}) == Path("memory.json")


def test_a_garbled_rank_variable_is_named():
    with pytest.raises(ConfigError) as caught:
        ranks.rank_info({"LOCAL_RANK": "one"}, runtime=False)
    assert caught.value.parameter == "LOCAL_RANK"


@pytest.mark.parametrize(
    ("env", "parameter", "size_var"),
    [
        ({"RANK": "5", "WORLD_SIZE": "2"}, "RANK", "WORLD_SIZE"),  # no launcher: torch.distributed reads them
        ({"RANK": "5", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "RANK", "WORLD_SIZE"),
        ({**TORCHRUN, "RANK": "4"}, "RANK", "WORLD_SIZE"),  # the last rank of 4 is 3
        ({**TORCHRUN, "LOCAL_RANK": "2"}, "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        ({**OPEN_MPI, "OMPI_COMM_WORLD_RANK": "8"}, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ({"PMI_RANK": "2", "PMI_SIZE": "2"}, "PMI_RANK", "PMI_SIZE"),
        ({**SLURM_ONE_GPU_PER_TASK, "SLURM_PROCID": "9"}, "SLURM_PROCID", "SLURM_NTASKS"),
        ({"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "0"}, "RANK", "WORLD_SIZE"),
    ],
)
def test_a_rank_outside_its_world_is_a_config_error_naming_both_variables(env, parameter, size_var):
    with pytest.raises(ConfigError) as caught:
        ranks.rank_info(env, runtime=False)
    assert caught.value.parameter == parameter
    assert size_var in str(caught.value) and "fix or unset" in str(caught.value)


def test_the_last_rank_of_a_world_is_inside_it():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    info = ranks.rank_info(env, runtime=False)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (1, 2, 1, 2)
    assert ranks.rank_info({"RANK": "1", "WORLD_SIZE": "2"}, runtime=False) == unimem.RankInfo()


def test_configure_under_a_rank_outside_its_world_changes_nothing(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    before = dict(os.environ)
    with pytest.raises(ConfigError) as caught:
        unimem.configure(backend="torch", fraction=0.5)
    assert caught.value.parameter == "RANK"
    assert dict(os.environ) == before and len(unimem.configuration()) == 0


def test_each_rank_writes_its_own_file_with_its_rank_in_the_metadata():
    assert str(ranks.rank_path("out/memory.json", TORCHRUN)) == os.path.join("out", "memory.rank3.json")
    meta = ranks.metadata(TORCHRUN)
    assert (meta["rank"], meta["local_rank"], meta["world_size"], meta["node"]) == (3, 1, 4, 1)


# --- which GPU is mine -------------------------------------------------------------------


def _info(env):
    return ranks.rank_info(env, runtime=False)


def test_each_local_rank_gets_its_own_gpu():
    pin = ranks.pin_for(_info(TORCHRUN), visible=2)
    assert (pin.device, pin.share) == (1, 1)


def test_slurm_one_gpu_per_task_is_device_0_whatever_the_local_rank():
    pin = ranks.pin_for(_info(SLURM_ONE_GPU_PER_TASK), visible=1)
    assert (pin.device, pin.share, pin.one_per_task) == (0, 1, True)
    assert "SLURM_LOCALID" not in pin.note and "device 0" in pin.note


def test_slurm_with_every_gpu_of_the_node_indexes_by_local_rank():
    pin = ranks.pin_for(_info(SLURM_ALL_GPUS), visible=2)
    assert (pin.device, pin.share, pin.one_per_task) == (1, 1, False)


def test_more_local_ranks_than_gpus_share_them_round_robin():
    four_on_two = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "RANK": "3", "WORLD_SIZE": "4"}
    pin = ranks.pin_for(_info(four_on_two), visible=2)
    assert (pin.device, pin.share) == (1, 2) and "NCCL" in pin.note
    two_on_one = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "RANK": "1", "WORLD_SIZE": "2"}
    assert (ranks.pin_for(_info(two_on_one), visible=1).device, ranks.pin_for(_info(two_on_one), visible=1).share) == (
        0,
        2,
    )


def test_nothing_is_pinned_for_one_process_per_node_or_without_a_gpu():
    one_per_node = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "RANK": "2", "WORLD_SIZE": "4"}
    assert ranks.pin_for(_info(one_per_node), visible=8) is None
    assert ranks.pin_for(_info(TORCHRUN), visible=0) is None
    assert ranks.pin_for(_info({}), visible=2) is None


def test_unknown_gpu_count_assumes_one_gpu_per_local_rank():
    pin = ranks.pin_for(_info(TORCHRUN), visible=None)
    assert pin.device == 1 and "unknown" in pin.note


def test_visible_gpus_counts_cuda_visible_devices_entries():
    assert ranks.visible_gpus({"CUDA_VISIBLE_DEVICES": "3,5"}) == 2
    assert ranks.visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb,-1"}) == 2  # CUDA stops at -1
    assert ranks.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert ranks.visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == 0
    with pytest.raises(unimem.ConfigError) as info:  # 4 would stay hidden behind -1
        ranks.visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb,-1,4"})
    assert info.value.parameter == "CUDA_VISIBLE_DEVICES"


# --- configure under a launcher (fresh processes) ------------------------------------------

_PLAN = """
import os, sys, warnings
import unimem
from unimem.backends.base import pending_hooks
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    applied = unimem.configure(**KWARGS)
emit({
    "actions": applied.as_dict()["actions"],
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "jax_ids": os.environ.get("JAX_LOCAL_DEVICE_IDS"),
    "hooks": pending_hooks("torch") + pending_hooks("jax"),
    "imported": [m for m in ("torch", "jax") if m in sys.modules],
    "local_device": unimem.local_device(),
    "warnings": [str(w.message) for w in caught],
})
"""


def _configure(pyjson, env, **kwargs):
    return pyjson(_PLAN.replace("KWARGS", repr(kwargs)), env=env)


def _pins(result, setting="pin"):
    return [a for a in result["actions"] if a["setting"] == setting]


@pytest.mark.covers("torch:ranks.pin")
def test_torchrun_rank_is_pinned_by_the_framework_call_at_start(pyjson):
    result = _configure(pyjson, {**TORCHRUN, "CUDA_VISIBLE_DEVICES": "0,1"}, backend="torch", fraction=0.5)
    (pin,) = _pins(result)
    assert (pin["backend"], pin["value"], pin["method"], pin["status"]) == ("torch", 1, "hook", "pending")
    assert pin["target"] == "torch.cuda.set_device(1) at CUDA init"
    assert "local rank 1 of 2 (torchrun)" in pin["note"]
    # The pin goes through CUDA's init, not the environment: set_device(LOCAL_RANK) in the script still works.
    assert result["visible"] == "0,1"
    assert "unimem.torch.at_init" in result["hooks"] and result["imported"] == []
    (cap,) = [a for a in result["actions"] if a["setting"] == "fraction"]
    assert cap["value"] == 0.5  # one rank per GPU: the cap is a fraction of its own GPU
    assert result["local_device"] == 1 and result["warnings"] == []


@pytest.mark.covers("jax:ranks.pin")
def test_jax_rank_is_pinned_through_its_visible_devices_flag(pyjson):
    result = _configure(pyjson, {**TORCHRUN, "CUDA_VISIBLE_DEVICES": "0,1"}, backend="jax")
    (pin,) = _pins(result)
    assert (pin["value"], pin["method"], pin["status"]) == (1, "hook", "pending")
    assert "jax_cuda_visible_devices" in pin["target"] and result["jax_ids"] == "1"
    assert "unimem.jax.pin" in result["hooks"] and result["visible"] == "0,1"


def test_slurm_one_gpu_per_task_pins_device_0_and_says_why(pyjson):
    result = _configure(pyjson, SLURM_ONE_GPU_PER_TASK, backend="torch")
    (pin,) = _pins(result)
    assert pin["value"] == 0 and pin["target"] == "torch.cuda.set_device(0) at CUDA init"
    assert "one GPU" in pin["note"] and "use device 0" in pin["note"]
    assert result["visible"] == "5" and result["local_device"] == 0


def test_ranks_sharing_a_gpu_split_the_fraction(pyjson):
    two_on_one = {
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    result = _configure(pyjson, two_on_one, backend="torch", fraction=0.8)
    (pin,) = _pins(result)
    assert pin["value"] == 0 and "2 local ranks share GPU 0" in pin["note"] and "0.4 per rank" in pin["note"]
    (cap,) = [a for a in result["actions"] if a["setting"] == "fraction"]
    assert cap["value"] == pytest.approx(0.4) and "0.4" in cap["target"]


def test_per_rank_devices_sets_cuda_visible_devices_to_the_rank_gpu(pyjson):
    result = _configure(
        pyjson, {**TORCHRUN, "CUDA_VISIBLE_DEVICES": "2,3"}, backend=["torch", "jax"], devices="per-rank"
    )
    (torch_step,) = [a for a in result["actions"] if a["backend"] == "torch"]
    assert (torch_step["setting"], torch_step["target"], torch_step["status"]) == (
        "devices",
        "CUDA_VISIBLE_DEVICES=3",
        "pending",
    )
    assert "numbered 0" in torch_step["note"]
    assert _pins(result) == []  # no framework call: the rank sees one GPU, device 0
    assert result["visible"] == "3" and result["local_device"] == 0
    assert result["jax_ids"] == "0"  # jax.distributed.initialize must not ask for device LOCAL_RANK


def test_per_rank_devices_twice_counts_from_the_launcher_value(pyjson):
    code = (
        "import os, unimem\n"
        "unimem.configure(backend='torch', devices='per-rank')\n"
        "again = unimem.configure(backend='torch', devices='per-rank')\n"
        "emit([again.as_dict()['actions'], os.environ['CUDA_VISIBLE_DEVICES'], unimem.local_device()])\n"
    )
    actions, visible, local = pyjson(code, env={**TORCHRUN, "CUDA_VISIBLE_DEVICES": "2,3"})
    assert [(a["target"], a["status"]) for a in actions] == [("CUDA_VISIBLE_DEVICES=3", "unchanged")]
    assert (visible, local) == ("3", 0)


def test_per_rank_devices_from_the_environment(pyjson):
    code = (
        "import os, unimem\n"
        "applied = unimem.configure_from_env()\n"
        "emit([applied.as_dict(), os.environ['CUDA_VISIBLE_DEVICES']])\n"
    )
    env = {**TORCHRUN, "CUDA_VISIBLE_DEVICES": "6,7", "UNIMEM_BACKEND": "torch", "UNIMEM_DEVICES": "per-rank"}
    applied, visible = pyjson(code, env=env)
    assert visible == "7" and [a["setting"] for a in applied["actions"]] == ["devices"]


def test_no_pin_without_a_launcher_or_when_the_user_chose_devices(pyjson):
    alone = _configure(pyjson, {"CUDA_VISIBLE_DEVICES": "0,1"}, backend="torch", fraction=0.5)
    assert _pins(alone) == [] and alone["local_device"] == 0
    chosen = _configure(pyjson, {**TORCHRUN, "CUDA_VISIBLE_DEVICES": "0,1"}, backend="torch", devices=[0])
    assert _pins(chosen) == [] and chosen["visible"] == "0"
    per_rank_alone = _configure(pyjson, {}, backend="torch", devices="per-rank")
    (said,) = per_rank_alone["actions"]
    assert said["status"] == "unchanged" and "nothing to pin" in said["note"] and per_rank_alone["visible"] is None


def test_auto_spread_pins_the_frameworks_that_can(pyjson):
    result = _configure(pyjson, {**TORCHRUN, "CUDA_VISIBLE_DEVICES": "0,1"}, fraction=0.5)
    assert sorted(a["backend"] for a in _pins(result)) == ["jax", "torch"]
    assert not [w for w in result["warnings"] if "pin" in w]


@pytest.mark.slow
def test_nothing_is_set_when_the_framework_cannot_pin_here(pyjson):
    """torch imported without CUDA: the pin is skipped with a warning, never an error, and nothing is set."""
    code = "import torch\n" + _PLAN.replace("KWARGS", repr({"backend": "torch"}))
    result = pyjson(code, env={**TORCHRUN, "CUDA_VISIBLE_DEVICES": "0,1"})
    (pin,) = _pins(result)
    assert pin["status"] == "skipped" and "no CUDA device" in pin["note"]
    assert result["hooks"] == [] and result["visible"] == "0,1"
    assert any("pin not applied" in w for w in result["warnings"])


# --- stray memory (NVML faked in this process) ----------------------------------------------


class FakeNvml:
    def __init__(self, listed, count=2):
        self.listed = listed
        self.count = count

    def status(self):
        return "ok"

    def device_count(self):
        return self.count

    def processes(self, index):
        return self.listed.get(index, [])

    def devices(self):
        return [{"index": i, "uuid": f"GPU-{i}{i}"} for i in range(self.count)]


@pytest.fixture
def rank1(monkeypatch):
    for key, value in {**TORCHRUN, "RANK": "1", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _fake(listed, count=2):
    registry._instances[registry.FRAMEWORK_FREE] = FakeNvml(listed, count)  # restored by conftest


def test_memory_on_a_gpu_not_its_own_is_reported_with_the_fix(rank1):
    me = os.getpid()
    _fake({0: [(me, 520 << 20), (99999, 1 << 30)], 1: [(me, 4 << 30)]})
    with pytest.warns(
        UnimemWarning, match=r"rank 1 holds 520(\.00)? MiB on GPU 0, which is not its own \(GPU 1\)"
    ) as w:
        found = unimem.stray_memory()
    assert "set_device(local_rank)" in str(w[0].message)
    assert found.own == 1 and found.stray == ((0, 520 << 20),) and found.seen is True


def test_own_gpu_is_found_through_cuda_visible_devices(rank1, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-00,GPU-11")
    me = os.getpid()
    _fake({0: [(me, 300 << 20)], 1: [(me, 1 << 30)]})
    with pytest.warns(UnimemWarning):
        found = unimem.stray_memory()
    assert found.own == 1 and found.stray == ((0, 300 << 20),)


def test_a_process_nvml_cannot_see_is_cannot_see_not_absent(rank1, monkeypatch):
    _fake({0: [(4242, 1 << 30)]})
    monkeypatch.setattr(registry, "started_frameworks", lambda: ["torch"])
    found = unimem.stray_memory()
    assert found.seen is False and found.stray == () and "cannot see" in found.note and "PID namespace" in found.note


def test_without_nvml_stray_memory_cannot_be_checked(rank1):
    from unimem.errors import BackendUnavailable

    class NoNvml(FakeNvml):
        def status(self):
            return "nvml: nvmlInit failed (no driver)"

    registry._instances[registry.FRAMEWORK_FREE] = NoNvml({})
    found = unimem.stray_memory()
    assert found.seen is None and found.note.startswith("cannot see") and BackendUnavailable


_STAND_IN_TORCH = {
    "torch/__init__.py": "from . import cuda\n",
    "torch/cuda.py": (
        "calls, queued = [], []\n"
        "def is_initialized(): return False\n"
        "def is_available(): return True\n"
        "def _lazy_call(fn): queued.append(fn)\n"
        "def device_count(): return 2\n"
        "class _Props: total_memory = 80 << 30\n"
        "def get_device_properties(device): return _Props()\n"
        "def set_device(device): calls.append(['set_device', device])\n"
        "def set_per_process_memory_fraction(fraction, device): calls.append(['fraction', fraction, device])\n"
        "def start(): [fn() for fn in queued]  # what CUDA's lazy init does with queued calls\n"
    ),
}


@pytest.mark.covers("torch:ranks.pin")
def test_at_cuda_init_the_pin_comes_first_and_the_cap_touches_the_rank_gpu_alone(pyjson, tmp_path):
    """A stand-in torch records the calls made at CUDA init: set_device(rank's GPU) before anything,
    and the cap on that GPU only (a cap on another GPU would start a context there)."""
    for name, text in _STAND_IN_TORCH.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    code = (
        "import unimem\n"
        "unimem.configure(backend='torch', fraction=0.5)\n"
        "import torch\n"
        "torch.cuda.start()\n"
        "emit(torch.cuda.calls)\n"
    )
    env = {**TORCHRUN, "CUDA_VISIBLE_DEVICES": "0,1", "PYTHONPATH": str(tmp_path)}
    assert pyjson(code, env=env) == [["set_device", 1], ["fraction", 0.5, 1]]


@pytest.mark.covers("jax:ranks.pin")
@pytest.mark.slow
def test_jax_sees_only_the_rank_gpu_once_imported(pyjson):
    code = (
        "import unimem\n"
        "unimem.configure(backend='jax')\n"
        "import jax\n"
        "emit(jax.config._read('jax_cuda_visible_devices'))\n"
    )
    assert pyjson(code, env={**TORCHRUN, "CUDA_VISIBLE_DEVICES": "0,1", "JAX_PLATFORMS": "cpu"}) == "1"
