"""The cluster view: every rank's ``MemoryStats``, gathered through the framework's own runtime.

Each rank publishes its snapshot, numbered by the call and stamped with the time, under one
key of its own in the key-value store of the distributed runtime the script initialised
(torch's c10d store, JAX's coordinator), replacing what it published at its last call, then
reads the others' keys until each shows this call, by one deadline for the whole call. It is
a collective in that every rank must call it; a rank that does not is reported as "did not
answer" once the deadline passes (with its last figures, marked stale with their age, where it
answered an earlier call), and the call returns what it has instead of hanging the job.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import socket
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from unimem import ranks, registry
from unimem.config import check_device
from unimem.errors import ClusterError, ConfigError, UnimemWarning
from unimem.memory_stats import MemoryStats
from unimem.sizes import format_bytes
from unimem.snapshots import read_snapshot

if TYPE_CHECKING:
    from unimem.backends.base import KeyValueStore

__all__ = ["ClusterStats", "Outlier", "RankStats", "cluster_stats"]

DEFAULT_TIMEOUT = 60.0  # seconds every rank may take to reach the call after the first
# Figures that count things, not bytes.
_COUNTS = ("num_allocs", "num_ooms")
# The figure an outlier is judged by: the first one any rank knows.
_KEY_FIGURES = ("peak_allocated", "allocated", "peak_reserved", "reserved", "process_used", "host_rss")
# An outlier is named only for a material spread: the highest rank holds at least this share of the
# mean more than the mean AND at least this many bytes more. Ranks of one job differ by a little
# (rank 0 logs, allocators round): 0.01 MiB over 230 MiB is noise, not a rank to look at.
OUTLIER_SHARE = 0.10
OUTLIER_BYTES = 64 << 20
_calls = itertools.count(1)  # every rank numbers its calls alike, so that call n's answers meet
_KEY = "unimem/cluster/"  # + the call's parity and the rank: two keys per rank, each replaced every other call
_POLL = 0.2  # the longest pause, in seconds, between two reads of the ranks not heard from yet


@dataclass(frozen=True)
class RankStats:
    """One rank's answer.

    Attributes:
        rank (int): Its global rank.
        local_rank (int | None): Its rank on its node.
        node (int | None): Its node's index.
        host (str): Its host name.
        pid (int): Its process id.
        device (int): The device its figures are for.
        backend (str): The backend its figures come from.
        figures (dict[str, int | None]): Every figure of its ``MemoryStats`` (bytes, or counts for
            ``num_allocs``/``num_ooms``); None where unknown.
        stray (tuple[tuple[int, int | None], ...]): ``(NVML index, bytes)`` it holds on GPUs not
            its own (``unimem.stray_memory``).
        stray_note (str): Why stray memory could not be checked there, when it could not.
        stale (bool): It did not answer this call: these are its figures from an earlier one (its
            last), which the min, max, mean and outlier leave out.
        age (float | None): Seconds from the moment it published these figures to the moment this
            rank read them (by the two hosts' clocks); None for this rank's own.
    """

    rank: int
    local_rank: int | None
    node: int | None
    host: str
    pid: int
    device: int
    backend: str
    figures: dict[str, int | None]
    stray: tuple[tuple[int, int | None], ...] = ()
    stray_note: str = ""
    stale: bool = False
    age: float | None = None


@dataclass(frozen=True)
class Outlier:
    """The rank with the most of the key figure, where it stands out from the mean (by 10% of the
    mean and by 64 MiB at least): the one a cap equal on every rank must fit.

    Attributes:
        rank (int): The rank.
        figure (str): The figure judged (the first of peak allocated, allocated, peak reserved,
            reserved, NVML's process used, host RSS that any rank knows).
        value (int): Its value there.
        mean (float): The mean over the ranks that answered.
    """

    rank: int
    figure: str
    value: int
    mean: float


def _figures(snapshot: MemoryStats) -> dict[str, int | None]:
    skip = ("backend", "device", "timestamp", "fragmentation")
    return {
        key: value
        for key, value in snapshot.as_dict().items()
        if key not in skip and (value is None or (isinstance(value, int) and not isinstance(value, bool)))
    }


@dataclass(frozen=True)
class ClusterStats:
    """Every rank's memory, and the spread over ranks. ``str()`` prints a table.

    Returned by ``unimem.cluster_stats()``.

    Attributes:
        world_size (int): Ranks in the job.
        per_rank (dict[int, RankStats | None]): Each rank's answer; for a rank that did not answer
            this call before the deadline, its last figures marked ``stale``, or None where it never
            answered.
        transport (str): What the figures were gathered through (``"torch runtime"``,
            ``"jax runtime"``, ``"single process"``).
    """

    world_size: int
    per_rank: dict[int, RankStats | None]
    transport: str

    @property
    def missing(self) -> tuple[int, ...]:
        """Ranks that did not answer this call (they never called, or not before the deadline),
        stale ones included."""
        return tuple(rank for rank, answer in sorted(self.per_rank.items()) if answer is None or answer.stale)

    @property
    def stale(self) -> dict[int, float | None]:
        """Ranks shown with their last figures from an earlier call, and those figures' age in seconds."""
        return {rank: answer.age for rank, answer in sorted(self.per_rank.items()) if answer and answer.stale}

    def _answers(self) -> list[RankStats]:
        """The answers to this call (stale ones left out)."""
        return [a for _, a in sorted(self.per_rank.items()) if a is not None and not a.stale]

    @property
    def _names(self) -> tuple[str, ...]:
        """Every figure any rank sent, in ``MemoryStats`` order."""
        answers = [a for a in self.per_rank.values() if a is not None]  # stale ones' columns too
        return tuple(dict.fromkeys(name for a in answers for name in a.figures))

    @property
    def figures(self) -> tuple[str, ...]:
        """The figures some rank knows, in ``MemoryStats`` order."""
        return tuple(name for name in self._names if self._values(name))

    def _values(self, name: str) -> list[tuple[int, int]]:
        return [(a.rank, value) for a in self._answers() if (value := a.figures.get(name)) is not None]

    @property
    def min(self) -> dict[str, int | None]:
        """Smallest value of each figure over the ranks that know it (None: none does)."""
        return {name: min((v for _, v in self._values(name)), default=None) for name in self._names}

    @property
    def max(self) -> dict[str, int | None]:
        """Largest value of each figure over the ranks that know it (None: none does)."""
        return {name: max((v for _, v in self._values(name)), default=None) for name in self._names}

    @property
    def mean(self) -> dict[str, float | None]:
        """Mean of each figure over the ranks that know it (None: none does)."""
        out: dict[str, float | None] = {}
        for name in self._names:
            values = [v for _, v in self._values(name)]
            out[name] = sum(values) / len(values) if values else None
        return out

    @property
    def outlier(self) -> Outlier | None:
        """The rank with the most of the key figure, when it stands out: at least ``OUTLIER_SHARE``
        (10%) of the mean above the mean and at least ``OUTLIER_BYTES`` (64 MiB) above it. None with
        fewer than two answers, or a smaller spread."""
        for name in _KEY_FIGURES:
            values = self._values(name)
            if not values:
                continue
            if len(values) < 2:
                return None
            rank, value = max(values, key=lambda item: (item[1], -item[0]))
            mean = sum(v for _, v in values) / len(values)
            above = value - mean
            if above < OUTLIER_BYTES or above < OUTLIER_SHARE * mean:
                return None
            return Outlier(rank, name, value, mean)
        return None

    def as_dict(self) -> dict[str, Any]:
        """The view as plain data, JSON-ready.

        Returns:
            ``{"world_size", "transport", "missing", "stale", "per_rank": {rank: {...} or None}, "min",
            "max", "mean", "outlier"}``.
        """
        outlier = self.outlier
        return {
            "world_size": self.world_size,
            "transport": self.transport,
            "missing": list(self.missing),
            "stale": {str(rank): age for rank, age in self.stale.items()},
            "per_rank": {str(r): None if a is None else a.__dict__ for r, a in sorted(self.per_rank.items())},
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "outlier": None if outlier is None else outlier.__dict__,
        }

    def __str__(self) -> str:
        names = self.figures
        show = {n: (lambda v: "n/a" if v is None else str(round(v))) if n in _COUNTS else format_bytes for n in names}
        header = ["rank", "node", "local", "device", *names, "answer"]
        rows: list[list[str]] = []
        for rank, answer in sorted(self.per_rank.items()):
            if answer is None:
                rows.append([str(rank), "did not answer", *[""] * (len(header) - 2)])
                continue
            where = [
                "" if answer.node is None else str(answer.node),
                "" if answer.local_rank is None else str(answer.local_rank),
            ]
            said = "this call" if not answer.stale else f"stale, {_age(answer.age)} old: did not answer"
            row = [str(rank), *where, str(answer.device), *(show[n](answer.figures.get(n)) for n in names), said]
            rows.append(row)
        for label, table in (("min", self.min), ("max", self.max), ("mean", self.mean)):
            figures = (show[n](None if (v := table[n]) is None else int(v)) for n in names)
            rows.append([label, "", "", "", *figures, ""])
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        title = f"unimem: {self.world_size} rank(s), gathered through the {self.transport}"
        lines = [title, "-" * len(title)]
        lines += ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in [header, *rows]]
        outlier = self.outlier
        if outlier is not None:
            lines.append(
                f"outlier: rank {outlier.rank}, {outlier.figure} {format_bytes(outlier.value)} "
                f"(mean {format_bytes(int(outlier.mean))})"
            )
        if self.missing:
            lines.append(f"did not answer: rank(s) {', '.join(map(str, self.missing))} (every rank must call it)")
        if self.stale:
            ages = ", ".join(f"rank {rank}: {_age(age)} old" for rank, age in self.stale.items())
            lines.append(f"stale: last figures shown, left out of min/max/mean ({ages})")
        for rank, answer in sorted(self.per_rank.items()):
            for gpu, used in () if answer is None else answer.stray:
                lines.append(f"stray: rank {rank} holds {format_bytes(used)} on GPU {gpu}, not its own")
        return "\n".join(lines)


def _age(seconds: float | None) -> str:
    return "of unknown age" if seconds is None else f"{seconds:.1f} s"


def _transport() -> tuple[str, KeyValueStore] | None:
    for name in registry.imported_frameworks():
        found = registry.get_backend(name).distributed.distributed_store()
        if found is not None:
            return f"{name} runtime", found
    return None


def _record(rank: int, snapshot: MemoryStats, info: ranks.RankInfo) -> RankStats:
    stray = ranks.stray_memory(warn=False)
    return RankStats(
        rank=rank,
        local_rank=info.local_rank,
        node=info.node,
        host=socket.gethostname(),
        pid=os.getpid(),
        device=snapshot.device,
        backend=snapshot.backend,
        figures=_figures(snapshot),
        stray=stray.stray,
        stray_note=stray.note,
    )


@dataclass
class _Heard:
    """What one call read from the store."""

    latest: dict[int, dict[str, Any]]  # each other rank's latest answer: {"call", "time", "record"}
    waiting: list[int]  # ranks whose answer to this call did not come
    seconds: float  # how long this rank waited
    lost: bool  # the store stopped answering this rank before the deadline


def _key(call: int, rank: int) -> str:
    """Where ``rank`` answers ``call``: a rank one call ahead writes the other key, so that its next
    answer never replaces the one a slower rank is still reading (a rank cannot be two calls ahead
    of one that answered, since every call waits for every rank's answer)."""
    return f"{_KEY}{call % 2}/{rank}"


def _latest(store: KeyValueStore, rank: int) -> dict[str, Any] | None:
    """``rank``'s latest answer to any call (None: it never answered)."""
    found = [json.loads(raw) for parity in (0, 1) if (raw := store.get(f"{_KEY}{parity}/{rank}", 0)) is not None]
    return max(found, key=lambda entry: int(entry["call"]), default=None)


def _gather(store: KeyValueStore, transport: str, record: dict[str, Any], timeout: float) -> _Heard:
    """Publish ``record`` as this rank's answer to this call; read every other rank's until it holds
    this call's answer, by one deadline (or until the store stops answering); then the last answer
    of each rank that did not answer this one."""
    call, began = next(_calls), time.monotonic()
    try:
        store.set(_key(call, store.rank), json.dumps({"call": call, "time": time.time(), "record": record}))
    except Exception as exc:  # c10d's DistStoreError, JAX's runtime error: the store itself has gone
        raise ClusterError(
            f"cluster_stats: the {transport}'s store did not take this rank's figures ({type(exc).__name__}: "
            f"{exc}); the process hosting it may have exited: see that rank's log"
        ) from exc
    deadline, pause = began + timeout, 0.005
    heard = _Heard({}, [rank for rank in range(store.world_size) if rank != store.rank], 0.0, False)
    while True:
        for rank in list(heard.waiting):
            raw = store.get(_key(call, rank), 0)
            if raw is not None and int((entry := json.loads(raw))["call"]) >= call:
                heard.latest[rank] = entry
                heard.waiting.remove(rank)
        left = deadline - time.monotonic()
        if not heard.waiting or left <= 0:
            break
        if store.get(_key(call, store.rank), 0) is None:  # its own answer unreadable: the store has gone
            heard.lost = True
            break
        time.sleep(min(pause, left))
        pause = min(2 * pause, _POLL)
    heard.seconds = time.monotonic() - began
    if not heard.lost:
        for rank in heard.waiting:
            last = _latest(store, rank)
            if last is not None:
                heard.latest[rank] = last
    return heard


def _view(store: KeyValueStore, transport: str, own: RankStats, heard: _Heard) -> ClusterStats:
    """The answers read, as a view: the others' records by rank, stale where they did not answer this call."""
    now = time.time()
    per_rank: dict[int, RankStats | None] = {own.rank: own}
    for rank in range(store.world_size):
        if rank == own.rank:
            continue
        entry = heard.latest.get(rank)
        if entry is None:
            per_rank[rank] = None
            continue
        data = dict(entry["record"])
        data["stray"] = tuple(tuple(pair) for pair in data["stray"])
        answer = RankStats(**data)
        per_rank[rank] = dataclasses.replace(answer, stale=rank in heard.waiting, age=max(0.0, now - entry["time"]))
    return ClusterStats(store.world_size, per_rank, transport)


def _warn(view: ClusterStats, heard: _Heard, timeout: float) -> None:
    """Say which ranks did not answer, and how long this rank really waited."""
    if not view.missing:
        return
    who = f"rank(s) {', '.join(map(str, view.missing))}"
    if heard.lost:
        said = (
            f"the {view.transport}'s store stopped answering {heard.seconds:.1f} s into the call (the process "
            f"hosting it may have exited: see that rank's log); {who} not heard from"
        )
    else:
        said = (
            f"{who} did not answer in the {heard.seconds:.1f} s this rank waited (timeout={timeout:g} s); every "
            "rank must call cluster_stats() (it is a collective), not one rank alone"
        )
    if view.stale:
        said += "; shown with their last figures: " + ", ".join(
            f"rank {rank}'s {_age(age)} old" for rank, age in view.stale.items()
        )
    warnings.warn(f"cluster_stats: {said}", UnimemWarning, stacklevel=3)


def _check_timeout(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise ConfigError("timeout", f"expected a positive number of seconds, got {timeout!r}")
    return float(timeout)


def cluster_stats(
    backend: str | None = None,
    device: int | None = None,
    *,
    snapshot: MemoryStats | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> ClusterStats:
    """Every rank's memory, gathered through the distributed runtime the script initialised.

    Call it on every rank, like any collective: each rank publishes its snapshot in the
    runtime's key-value store (torch's c10d store, JAX's coordinator; two keys per rank, reused)
    and reads the others' by one deadline. A rank that does not call it before ``timeout`` is
    reported as "did not answer" (``missing``) with a warning: ``if rank == 0: cluster_stats()``
    returns after ``timeout`` with rank 0 alone, never hangs; a rank that answered an earlier
    call is shown with its last figures, marked ``stale`` with their ``age``. After such a call
    the ranks' calls are out of step (each counts its calls): every later call must again be
    made by every rank. Nothing is sent through NCCL, so no rank starts a context on a GPU not
    its own.

    Args:
        backend: The backend whose figures each rank reports, as for ``stats()``.
        device: The device each rank reports; None (default): its own (``local_device()``).
        snapshot: A snapshot to publish instead of taking one (what the rank measured itself).
        timeout: Seconds to wait for the other ranks, from this rank's call (default 60).

    Returns:
        Every rank's figures, their min / max / mean, the outlier rank, and the ranks that
        did not answer; a single process answers for itself alone.

    Raises:
        ConfigError: ``timeout`` is not a positive number, ``device`` is not an index,
            ``snapshot`` is not a ``MemoryStats``; or as from ``stats()``.
        ClusterError: The environment says there are several ranks (``WORLD_SIZE``, ...) but
            no distributed runtime is initialised here: initialise it first (``find_batch_size``
            says the same); or the store did not take this rank's figures (its host has gone).

    Warns:
        UnimemWarning: Some ranks did not answer before the deadline, or the store stopped
            answering; with the seconds this rank really waited.

    Example:
        ```python
        torch.distributed.init_process_group("nccl")
        ...
        view = unimem.cluster_stats()  # on every rank
        if view.outlier is not None:
            print(f"rank {view.outlier.rank} peaks highest")
        ```
    """
    timeout = _check_timeout(timeout)
    if snapshot is not None and not isinstance(snapshot, MemoryStats):
        raise ConfigError("snapshot", f"expected a MemoryStats (from unimem.stats()), got {type(snapshot).__name__}")
    if snapshot is None:
        where = ranks.local_device() if device is None else check_device(device)
        snapshot = read_snapshot(registry.resolve(backend, "query"), where)
    info = ranks.rank_info(runtime=False)
    found = _transport()
    if found is None:
        missing_runtime = ranks.runtime_missing("cluster_stats", info)
        if missing_runtime is not None:
            raise missing_runtime
        own = _record(info.rank or 0, snapshot, info)
        return ClusterStats(1, {own.rank: own}, "single process")
    transport, store = found
    own = _record(store.rank, snapshot, info)
    heard = _gather(store, transport, own.__dict__, timeout)
    view = _view(store, transport, own, heard)
    _warn(view, heard, timeout)
    return view
