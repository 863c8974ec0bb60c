"""Who this process is among many: its rank, node and local rank, and the GPU that is its own.

Ranks come from the launcher's variables (first launcher found wins), else an initialised
distributed runtime. A rank is pinned by the framework's own device call, not by
``CUDA_VISIBLE_DEVICES``, unless ``devices="per-rank"``. Which variables, and why the pin is
made so: docs/guides/many-gpus.md.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unimem import device_view, in_force, registry
from unimem.config import Settings, visible_entries
from unimem.errors import ClusterError, ConfigError, UnimemWarning
from unimem.sizes import format_bytes

if TYPE_CHECKING:
    from unimem.backends.steps import Step

__all__ = [
    "PER_RANK",
    "Pin",
    "RankInfo",
    "StrayMemory",
    "check_pins_kept",
    "local_device",
    "metadata",
    "pin_for",
    "pin_steps",
    "rank_info",
    "rank_path",
    "runtime_missing",
    "stray_memory",
    "visible_gpus",
]

PER_RANK = "per-rank"  # configure(devices=PER_RANK): CUDA_VISIBLE_DEVICES set to the rank's GPU
_VISIBLE = "CUDA_VISIBLE_DEVICES"
_FIX = "make no tensor before torch.cuda.set_device(local_rank), or call unimem.configure() before the framework starts"

# What unimem wrote into CUDA_VISIBLE_DEVICES for devices="per-rank", and the value before:
# indices count among the devices the launcher gave, not among the one unimem left visible.
_written: dict[str, str | None] = {"original": None, "value": None}


@dataclass(frozen=True)
class RankInfo:
    """This process among many, as its launcher (or a distributed runtime) describes it; ``unimem.rank_info()``.

    A figure the environment does not give is None.

    Attributes:
        rank (int | None): Global rank, 0 to ``world_size - 1``.
        world_size (int | None): Processes in the job.
        local_rank (int | None): Rank among the processes of this node.
        local_world_size (int | None): Processes on this node.
        node (int | None): This node's index among the job's nodes.
        launcher (str): Where the figures came from: ``"torchrun"``, ``"launcher"`` (``LOCAL_RANK``
            without torchrun's other variables), ``"mpi"``, ``"slurm"``, ``"<backend> runtime"``
            or ``"none"``.
        gpus (tuple[str, ...] | None): The GPUs SLURM gave the job on this node
            (``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``); None elsewhere.
    """

    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    local_world_size: int | None = None
    node: int | None = None
    launcher: str = "none"
    gpus: tuple[str, ...] | None = None

    @property
    def distributed(self) -> bool:
        """True when this process is one of several (in the job, or on this node)."""
        return (self.world_size or 1) > 1 or (self.local_world_size or 1) > 1


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(name, f"expected a whole number, got {raw!r}; fix or unset the variable") from None
    if value < 0:
        raise ConfigError(name, f"expected 0 or more, got {value}; fix or unset the variable")
    return value


def _tasks_on_node(env: Mapping[str, str], node: int | None) -> int | None:
    """Tasks on this node from SLURM's ``2(x3),1`` form (nodes 0-2 hold 2 tasks each, node 3 one)."""
    per_node = _int(env, "SLURM_NTASKS_PER_NODE")
    if per_node is not None:
        return per_node
    raw = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not raw or node is None:
        return None
    counts: list[int] = []
    for part in raw.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node] if node < len(counts) else None


def _from_env(env: Mapping[str, str]) -> RankInfo | None:
    if env.get("LOCAL_RANK") is not None:
        elastic = "TORCHELASTIC_RUN_ID" in env or "GROUP_RANK" in env
        node = _int(env, "GROUP_RANK")
        return RankInfo(
            rank=_int(env, "RANK"),
            world_size=_int(env, "WORLD_SIZE"),
            local_rank=_int(env, "LOCAL_RANK"),
            local_world_size=_int(env, "LOCAL_WORLD_SIZE"),
            node=node if node is not None else _int(env, "NODE_RANK"),
            launcher="torchrun" if elastic else "launcher",
        )
    if env.get("OMPI_COMM_WORLD_RANK") is not None:
        return RankInfo(
            rank=_int(env, "OMPI_COMM_WORLD_RANK"),
            world_size=_int(env, "OMPI_COMM_WORLD_SIZE"),
            local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
            local_world_size=_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
            node=_int(env, "OMPI_COMM_WORLD_NODE_RANK"),
            launcher="mpi",
        )
    if env.get("PMI_RANK") is not None:
        return RankInfo(
            rank=_int(env, "PMI_RANK"),
            world_size=_int(env, "PMI_SIZE"),
            local_rank=_int(env, "MPI_LOCALRANKID"),
            local_world_size=_int(env, "MPI_LOCALNRANKS"),
            launcher="mpi",
        )
    if env.get("SLURM_PROCID") is not None:
        node = _int(env, "SLURM_NODEID")
        gpus = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS")
        world = _int(env, "SLURM_STEP_NUM_TASKS")
        return RankInfo(
            rank=_int(env, "SLURM_PROCID"),
            world_size=world if world is not None else _int(env, "SLURM_NTASKS"),
            local_rank=_int(env, "SLURM_LOCALID"),
            local_world_size=_tasks_on_node(env, node),
            node=node,
            launcher="slurm",
            gpus=tuple(g.strip() for g in gpus.split(",") if g.strip()) if gpus else None,
        )
    return None


def _variables(env: Mapping[str, str], launcher: str) -> tuple[str, str, str, str]:
    """The variables ``launcher``'s rank, world size, local rank and processes per node came from."""
    if launcher in ("torchrun", "launcher"):
        return "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"
    if launcher == "slurm":
        world = "SLURM_STEP_NUM_TASKS" if _int(env, "SLURM_STEP_NUM_TASKS") is not None else "SLURM_NTASKS"
        per_node = next(
            (name for name in ("SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE") if env.get(name)),
            "SLURM_TASKS_PER_NODE",
        )
        return "SLURM_PROCID", world, "SLURM_LOCALID", per_node
    if "OMPI_COMM_WORLD_RANK" in env:
        return (
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        )
    return "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"


def _check_within(info: RankInfo, names: tuple[str, str, str, str]) -> None:
    """A rank counts from 0 to the world size less one, and a local rank likewise on its node: a rank
    outside its world is a launcher's variables disagreeing, which would hang or misplace the job.

    Raises:
        ConfigError: Naming the rank's variable, with the world's.
    """
    rank_var, world_var, local_var, node_var = names
    for index, size, index_var, size_var in (
        (info.rank, info.world_size, rank_var, world_var),
        (info.local_rank, info.local_world_size, local_var, node_var),
    ):
        if index is None or size is None or index < size:
            continue
        span = "leaves no rank" if size == 0 else f"counts ranks 0 to {size - 1}"
        raise ConfigError(
            index_var,
            f"{index_var}={index} is outside the world: {size_var}={size} {span}; the launcher's variables "
            f"disagree: fix or unset {index_var} and {size_var}, or start the script with its launcher "
            "(torchrun, mpirun, srun), which sets them",
        )


def rank_info(environ: Mapping[str, str] | None = None, *, runtime: bool = True) -> RankInfo:
    """This process's rank, node and local rank, from its launcher's environment; starts and imports nothing.

    Which launchers' variables it reads: [Which rank am I](../guides/many-gpus.md#which-rank-am-i-rank_info).

    Args:
        environ: The environment to read (default: ``os.environ``).
        runtime: Also ask an initialised distributed runtime when the environment says nothing.

    Returns:
        The figures found; every one None (``launcher="none"``) in a single process.

    Raises:
        ConfigError: A rank variable is not a whole number of 0 or more, or a rank is outside its world
            (``RANK=5`` with ``WORLD_SIZE=2``): ``exc.parameter`` names the variable.

    Example:
        ```python
        me = unimem.rank_info()
        if me.distributed:
            print(f"rank {me.rank} of {me.world_size}, node {me.node}, local rank {me.local_rank}")
        ```
    """
    env = os.environ if environ is None else environ
    found = _from_env(env)
    if found is not None:
        _check_within(found, _variables(env, found.launcher))
        return found
    # No launcher found: torch.distributed's env:// start still reads these two.
    _check_within(RankInfo(rank=_int(env, "RANK"), world_size=_int(env, "WORLD_SIZE")), _variables(env, "torchrun"))
    if runtime:
        for name in registry.imported_frameworks():
            store = registry.get_backend(name).distributed.distributed_store()
            if store is not None:
                return RankInfo(rank=store.rank, world_size=store.world_size, launcher=f"{name} runtime")
    return RankInfo()


def _visible_value(env: Mapping[str, str]) -> str | None:
    """CUDA_VISIBLE_DEVICES as the launcher set it (before unimem narrowed it per rank)."""
    current = env.get(_VISIBLE)
    if current is not None and current == _written["value"]:
        return _written["original"]
    return current


def visible_gpus(environ: Mapping[str, str] | None = None) -> int | None:
    """GPUs this process's launcher lets it see: ``CUDA_VISIBLE_DEVICES``'s entries, else NVML's count.

    Args:
        environ: The environment to read (default: ``os.environ``).

    Returns:
        The count (0 when ``CUDA_VISIBLE_DEVICES`` hides every GPU); None when neither the
        variable nor NVML can tell.
    """
    env = os.environ if environ is None else environ
    raw = _visible_value(env)
    if raw is not None:
        return len(visible_entries(raw))
    view, _ = device_view.usable()
    return None if view is None else view.device_count()


@dataclass(frozen=True)
class Pin:
    """The GPU a rank should use, as the framework counts devices, and why.

    Attributes:
        device (int): The device index among those the launcher made visible.
        share (int): Local ranks on that GPU (1: it is the rank's own; more: they split it).
        note (str): How it was decided, for ``Applied``.
        one_per_task (bool): The launcher gave this task exactly one GPU (SLURM's GPU
            binding): it is device 0, whatever the local rank.
    """

    device: int
    share: int
    note: str
    one_per_task: bool = False


def pin_for(info: RankInfo, visible: int | None) -> Pin | None:
    """The GPU ``info``'s rank should use, given ``visible`` GPUs; None when there is nothing to pin.

    Nothing is pinned for a single process, for one process per node (it may use every GPU
    of the node, as JAX's one-process-per-host does), or when no GPU is visible.

    Args:
        info: The rank, as ``rank_info()`` reads it.
        visible: GPUs visible to the process (``visible_gpus()``); None if unknown.

    Returns:
        The device, how many local ranks share it and why; or None.
    """
    local, per_node = info.local_rank, info.local_world_size
    if local is None or visible == 0:
        return None
    if per_node == 1 or (per_node is None and local == 0 and (info.world_size or 1) == 1):
        return None
    who = f"local rank {local}" + (f" of {per_node}" if per_node is not None else "") + f" ({info.launcher})"
    if visible is None:
        return Pin(
            local,
            1,
            f"{who}: device {local}; how many GPUs are visible is unknown here (no NVML, "
            f"{_VISIBLE} unset), so one GPU per local rank is assumed",
        )
    node_gpus = len(info.gpus) if info.gpus else None
    if visible == 1 and info.launcher == "slurm" and (node_gpus is None or per_node is None or node_gpus >= per_node):
        return Pin(
            0,
            1,
            f"{who}: SLURM gives this task one GPU ({_VISIBLE}={os.environ.get(_VISIBLE)}), which is device 0 "
            f"here; indexing devices by the local rank fails on every rank but 0: use device 0 "
            "(unimem.local_device())",
            one_per_task=True,
        )
    if local < visible and (per_node is None or per_node <= visible):
        return Pin(local, 1, f"{who}: its own GPU, device {local}")
    device = local % visible
    share = len(range(device, per_node, visible)) if per_node is not None else 2
    return Pin(
        device,
        share,
        f"{who}: {share if per_node is not None else 'several'} local ranks share GPU {device} ({visible} "
        f"visible for {per_node if per_node is not None else 'more'} local ranks); gloo allows it, NCCL refuses "
        "two ranks on one GPU",
    )


def local_device(environ: Mapping[str, str] | None = None) -> int:
    """The device index (as the framework counts) that is this rank's own; 0 for a single process.

    Pass it as ``device=`` to ``stats``, ``track`` and ``monitor``; 0 under ``devices="per-rank"``.
    How it is chosen: [One GPU per rank](../guides/many-gpus.md#one-gpu-per-rank-the-pin).

    Args:
        environ: The environment to read (default: ``os.environ``).

    Returns:
        The index.

    Raises:
        ConfigError: A rank variable cannot be read (as from ``rank_info()``).
    """
    env = os.environ if environ is None else environ
    if _written["value"] is not None and env.get(_VISIBLE) == _written["value"]:
        return 0
    pin = pin_for(rank_info(env, runtime=False), visible_gpus(env))
    return 0 if pin is None else pin.device


def runtime_missing(what: str, info: RankInfo | None = None) -> ClusterError | None:
    """The error for a call that works over ranks (``what``) where the environment says there are
    several ranks but no distributed runtime is initialised in this process; None where that is not so.

    Every such call says it alike: working alone there would give this rank its own answer while the
    others agree on another (find_batch_size), or a view of one rank (cluster_stats).
    """
    info = rank_info(runtime=False) if info is None else info
    if (info.world_size or 1) <= 1:
        return None
    return ClusterError(
        f"{what}: the environment says this is rank {info.rank} of {info.world_size} ({info.launcher}), but no "
        "distributed runtime is initialised in this process to gather through: call "
        "torch.distributed.init_process_group or jax.distributed.initialize first"
    )


def _per_rank(devices: object) -> bool:
    return isinstance(devices, str) and devices.strip().lower() == PER_RANK


def configure_devices(devices: object) -> object:
    """``configure``'s ``devices`` as the validated model takes it: None for ``"per-rank"``, which
    ``pin_steps`` makes instead; anything else unchanged."""
    return None if _per_rank(devices) else devices


def _split_fraction(names: Sequence[str], settings: dict[str, Settings], pin: Pin) -> str:
    """Divide each cap among the ranks sharing the GPU; the words saying so."""
    if pin.share <= 1:
        return ""
    said = ""
    for name in names:
        given = settings[name]
        if given.fraction is not None:
            settings[name] = dataclasses.replace(given, fraction=given.fraction / pin.share)
            said = f"; fraction {given.fraction:g} is split: {given.fraction / pin.share:.4g} per rank"
        elif given.limit is not None:
            said = f"; limit is per rank: the {pin.share} ranks may take {pin.share} x {format_bytes(given.limit)}"
    return said


def pin_steps(names: Sequence[str], settings: dict[str, Settings], *, devices: object, spread: bool) -> list[Step]:
    """The steps that pin this rank to its GPU, for ``configure``; pure but for ``settings``.

    Under a launcher, each framework in ``names`` gets a ``"pin"`` step (its own device call,
    made when it starts) or, with ``devices="per-rank"``, a ``"devices"`` step
    (``CUDA_VISIBLE_DEVICES`` set to the rank's GPU). Ranks sharing a GPU divide a ``fraction``
    among them: ``settings`` is updated in place, and the step's note says so. A pin is
    automatic, so it never refuses: where a framework cannot pin, its step is skipped.

    A call without ``devices`` keeps what an earlier call made, so every call under the launcher
    gives the same pin (docs/guides/many-gpus.md#one-gpu-per-rank-the-pin).

    Args:
        names: The backends being configured.
        settings: Their settings, by name; a fraction is divided where ranks share a GPU.
        devices: ``configure``'s ``devices`` argument; explicit indices mean the user chose: nothing is pinned.
        spread: The settings go to every installed framework: one that cannot pin is left out when another can.

    Returns:
        The steps, first among the plan's (empty when there is nothing to pin).
    """
    per_rank = _per_rank(devices)
    if devices is not None and not per_rank:
        return []
    if devices is None:
        if _per_rank_in_force():
            per_rank = True  # an earlier call narrowed CUDA_VISIBLE_DEVICES to the rank's GPU: it stays so
        elif in_force.devices_chosen(names):
            return []  # an earlier call chose the devices: nothing is pinned, as that call pinned nothing
    frameworks = [name for name in names if registry.is_framework(name)]
    info = rank_info(runtime=False)
    if not info.distributed and not per_rank:
        return []
    pin = pin_for(info, visible_gpus())
    if pin is None:
        if not per_rank:
            return []
        note = "no rank in this process's environment (one process per node, or no launcher): nothing to pin"
        return [
            s
            for name in frameworks
            for s in registry.get_backend(name).distributed.plan_pin(None, per_rank=True, note=note)
        ]
    note = pin.note + _split_fraction(frameworks, settings, pin)
    if per_rank:
        note += f"; {_VISIBLE} shows this rank only its GPU, numbered 0: use device 0, not the local rank"
    steps = [
        s
        for name in frameworks
        for s in registry.get_backend(name).distributed.plan_pin(pin.device, per_rank=per_rank, note=note)
    ]
    if per_rank:
        _remember_visible(steps)
    if spread and any(s.status != "skipped" for s in steps):
        steps = [s for s in steps if s.status != "skipped"]
    return steps


def _per_rank_in_force() -> bool:
    """Whether ``CUDA_VISIBLE_DEVICES`` still holds what ``devices="per-rank"`` wrote."""
    return _written["value"] is not None and os.environ.get(_VISIBLE) == _written["value"]


def check_pins_kept(plans: Sequence[Step]) -> None:
    """Refuse a call whose ``CUDA_VISIBLE_DEVICES`` would renumber the GPUs under a framework pin
    from an earlier call. Changes nothing.

    The pin is a device index among the GPUs the launcher made visible (``set_device(1)`` at CUDA
    init); new ``CUDA_VISIBLE_DEVICES`` would leave that index naming another GPU, or none.

    Raises:
        ConfigError: A step of ``plans`` writes ``CUDA_VISIBLE_DEVICES`` so (``devices``).
    """
    pins = in_force.framework_pins()
    if not pins:
        return
    for step in plans:
        writes = step.setting == "devices" and step.target.startswith(f"{_VISIBLE}=")
        if not writes or step.status in ("unchanged", "skipped") or step.too_late or step.unsupported:
            continue
        visible = list(step.value)  # indices among the devices visible now, as the launcher set them
        for name, device in pins.items():
            if device < len(visible) and visible[device] == device:
                continue  # the pinned index still names the same GPU
            raise ConfigError(
                "devices",
                f"an earlier configure() call pinned {name} to device {device}, this rank's GPU among those the "
                f"launcher made visible; {step.target} would number the devices afresh, so that index would "
                "name another GPU or none. Pass devices in the first configure() call (unimem run --devices), "
                "or leave devices out",
            )


def _remember_visible(steps: list[Step]) -> None:
    """Record what a per-rank step writes, so that a later call counts from the launcher's value."""
    original = _visible_value(os.environ)
    for step in steps:
        inner = step.run
        if step.setting != "devices" or inner is None:
            continue
        value = step.target.partition("=")[2]

        def run(inner: Any = inner, value: str = value) -> None:
            inner()
            _written["original"], _written["value"] = original, value

        step.run = run


def metadata(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """This process's rank, for a recording's metadata; empty for a single process.

    Args:
        environ: The environment to read (default: ``os.environ``).

    Returns:
        ``{"rank", "local_rank", "world_size", "node", "host"}`` when the process is one of
        several, else ``{}``.
    """
    try:
        info = rank_info(environ)
    except ConfigError:  # a garbled rank variable must not break a recording; configure() names it
        return {}
    if not info.distributed:
        return {}
    import socket  # here, not at the top: configure() imports this module

    return {
        "rank": info.rank,
        "local_rank": info.local_rank,
        "world_size": info.world_size,
        "node": info.node,
        "host": socket.gethostname(),
    }


def rank_path(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> Path:
    """``path`` with this process's rank in its name (``memory.json`` -> ``memory.rank3.json``); unchanged for one.

    Args:
        path: The file a recording, a profile or a report is written to.
        environ: The environment to read (default: ``os.environ``).

    Returns:
        The path for this rank.

    Example:
        ```python
        with unimem.monitor(0.05, device=unimem.local_device()) as m:
            train()
        m.to_json(unimem.rank_path("memory.json"))
        ```
    """
    target = Path(path)
    info = rank_info(environ)
    if not info.distributed or info.rank is None:
        return target
    return target.with_name(f"{target.stem}.rank{info.rank}{target.suffix}")


@dataclass(frozen=True)
class StrayMemory:
    """Memory this process holds on GPUs that are not its own, as NVML lists it; ``unimem.stray_memory()``.

    Attributes:
        rank (int | None): This process's rank.
        own (int | None): Its own GPU, as NVML numbers GPUs; None when it has none (a single
            process, or no GPU).
        held (tuple[tuple[int, int | None], ...]): ``(NVML index, bytes)`` of every GPU where
            NVML lists this process.
        seen (bool | None): True when NVML lists this process where it holds memory; False
            when it cannot see it (another PID namespace: a container); None without NVML.
        note (str): Why it cannot tell, when it cannot.
    """

    rank: int | None
    own: int | None
    held: tuple[tuple[int, int | None], ...]
    seen: bool | None
    note: str = ""

    @property
    def stray(self) -> tuple[tuple[int, int | None], ...]:
        """``(NVML index, bytes)`` held on GPUs other than its own (empty when it has no own GPU)."""
        if self.own is None:
            return ()
        return tuple((gpu, used) for gpu, used in self.held if gpu != self.own)

    def messages(self) -> list[str]:
        """One sentence per stray GPU, naming the rank, the GPU and the fix."""
        who = f"rank {self.rank}" if self.rank is not None else f"pid {os.getpid()}"
        return [
            f"{who} holds {format_bytes(used)} on GPU {gpu}, which is not its own (GPU {self.own}): {_FIX}"
            for gpu, used in self.stray
        ]


def _own_nvml_index(view: Any, device: int) -> int | None:
    raw = _visible_value(os.environ)
    if raw is None:
        return device
    entries = visible_entries(raw)
    if device >= len(entries):
        return None
    entry = entries[device]
    if entry.isdigit():
        return int(entry)
    for row in view.devices():
        if str(row.get("uuid", "")).startswith(entry if entry.startswith(("GPU-", "MIG-")) else f"GPU-{entry}"):
            return int(row["index"])
    return None


def stray_memory(*, warn: bool = True) -> StrayMemory:
    """Memory this rank holds on GPUs other than its own, from NVML's process lists.

    Typically the context a tensor made before ``set_device`` leaves on GPU 0; in a container NVML may not
    see the process at all (``seen=False``): [One GPU per rank](../guides/many-gpus.md#one-gpu-per-rank-the-pin).

    Args:
        warn: Warn (``UnimemWarning``) for each stray GPU, naming the rank, the GPU and the fix.

    Returns:
        What NVML lists for this process, and its own GPU.

    Warns:
        UnimemWarning: With ``warn``, once per GPU where this rank holds memory that is not its own.

    Example:
        ```python
        unimem.stray_memory()  # warns: rank 1 holds ... on GPU 0, which is not its own (GPU 1): ...
        ```
    """
    info = rank_info()
    view, status = device_view.usable()
    if view is None:
        return StrayMemory(info.rank, None, (), None, f"cannot see: {status}")
    pid = os.getpid()
    held: list[tuple[int, int | None]] = []
    for index in range(view.device_count() or 0):
        held += [(index, used) for proc, used in view.processes(index) if proc == pid]
    own = None
    if info.distributed:
        pin = pin_for(info, visible_gpus())
        own = None if pin is None else _own_nvml_index(view, local_device())
    if not held and registry.started_frameworks():
        note = (
            "cannot see: a framework has started its device runtime but NVML lists this process "
            f"(pid {pid}) on no GPU; it runs in another PID namespace (a container without --pid=host)"
        )
        return StrayMemory(info.rank, own, (), False, note)
    found = StrayMemory(info.rank, own, tuple(held), True)
    if warn:
        for message in found.messages():
            warnings.warn(message, UnimemWarning, stacklevel=2)
    return found
