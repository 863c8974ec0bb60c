"""The ranks of a collective ``find_batch_size``: every rank's outcome of each call, exchanged
through the distributed runtime's key-value store (never the step's own process group), and
the rules that combine them (a size fits only where it fit on every rank; figures are the
largest over ranks, the limit the smallest)."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from unimem import ranks
from unimem.errors import ClusterError
from unimem.search.framework import distributed_store

if TYPE_CHECKING:
    from unimem.backends.base import KeyValueStore

__all__ = ["Outcome", "Ranks", "connect", "known", "worst"]

_searches = itertools.count(1)  # each search's keys apart from an earlier one's in the same store


@dataclass
class Ranks:
    """The ranks of a collective search, and the rounds they agree in.

    Each round every rank sets its payload under a key of its own for that round, then reads
    every other rank's with one deadline: a key-value store, not a collective, so a rank that
    never comes is named instead of hanging the others, and nothing passes through the step's
    own process group (an NCCL collective would stage through the current device).
    """

    store: KeyValueStore
    transport: str
    timeout: float
    prefix: str
    rounds: int = 0

    @property
    def rank(self) -> int:
        return self.store.rank

    @property
    def world_size(self) -> int:
        return self.store.world_size

    def post(self, payload: dict[str, Any]) -> str:
        """Publish this rank's payload for the next round; returns the round's key prefix."""
        self.rounds += 1
        key = f"{self.prefix}{self.rounds}/"
        self.store.set(key + str(self.rank), json.dumps(payload))
        return key

    def exchange(self, payload: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """Every rank's payload of this round, by rank. ``payload`` names its ``kind`` and ``size``.

        Raises:
            ClusterError: A rank did not answer within ``timeout``; a rank's step raised (not an
                out-of-memory error); or the ranks were at different points of the search.
        """
        key = self.post(payload)
        deadline = time.monotonic() + self.timeout
        answers: dict[int, dict[str, Any]] = {self.rank: payload}
        missing = []
        for other in range(self.world_size):
            if other != self.rank:
                raw = self.store.get(key + str(other), deadline - time.monotonic())
                if raw is None:
                    missing.append(other)
                else:
                    answers[other] = json.loads(raw)
        what = (
            "the start of the search"
            if payload["kind"] == "start"
            else f"the {payload['kind']} of batch size {payload['size']}"
        )
        # Half a second early: a read that failed before the deadline failed for another reason than time.
        if missing and time.monotonic() < deadline - 0.5:
            raise ClusterError(
                f"find_batch_size: the {self.transport}'s store stopped answering at {what} (rank {self.rank} "
                f"could not read rank(s) {', '.join(map(str, missing))} of {self.world_size}): the process hosting "
                "it may have exited or failed; see that rank's log"
            )
        if missing:
            raise ClusterError(
                f"find_batch_size: rank(s) {', '.join(map(str, missing))} of {self.world_size} did not reach {what} "
                f"within timeout={self.timeout:g} s (rank {self.rank} waited, through the {self.transport}). Every "
                "rank must call find_batch_size with the same arguments, and its step must make no collective "
                "(pass model= with the DDP module, or run the step under no_sync()); raise timeout= if one trial "
                "can take longer"
            )
        raised = {rank: p["raised"] for rank, p in sorted(answers.items()) if p.get("raised")}
        if raised:
            rank, text = next(iter(raised.items()))
            raise ClusterError(
                f"find_batch_size stopped on every rank: rank {rank}'s step raised at {what} (not an out-of-memory "
                f"error): {text}"
            )
        points = {(p["kind"], p["size"]) for p in answers.values()}
        if len(points) > 1:
            where = "; ".join(f"rank {r}: {p['kind']} {p['size']}" for r, p in sorted(answers.items()))
            raise ClusterError(
                f"find_batch_size: the ranks are at different points of the search ({where}): each rank must call "
                "it once, with the same arguments"
            )
        return answers


def connect(collective: bool | None, timeout: float) -> Ranks | None:
    """The ranks to agree with: the first framework's distributed runtime with several ranks;
    None for a single process, or with ``collective=False``."""
    if collective is False:
        return None
    found = distributed_store()
    if found is not None:
        name, store = found
        return Ranks(store, f"{name} runtime", timeout, f"unimem/find_batch_size/{next(_searches)}/")
    missing_runtime = ranks.runtime_missing(
        "find_batch_size" if collective is None else "find_batch_size(collective=True)"
    )
    if missing_runtime is not None:
        if collective is None:
            # Searching alone would answer this rank's size while the others agree on theirs.
            raise ClusterError(f"{missing_runtime}; or pass collective=False to search this rank alone on purpose")
        raise missing_runtime
    if collective:
        raise ClusterError(
            "find_batch_size(collective=True): no distributed runtime with several ranks is initialised in this "
            "process; initialise it first, or leave collective=None"
        )
    return None


def worst(values: list[Any], pick: Callable[[list[Any]], Any] = max) -> Any:
    """The ranks' figures combined: ``pick`` of them, None when a rank does not know its figure."""
    return None if any(v is None for v in values) else pick(values)


def known(values: list[Any]) -> Any:
    """The largest figure any rank knows; None when none does."""
    return max((v for v in values if v is not None), default=None)


@dataclass(frozen=True)
class Outcome:
    """One call of the step, as every rank agrees on it (or as this process saw it alone)."""

    error: str | None
    seconds: float
    peak: int | None = None
    peak_reserved: int | None = None
    kept: int | None = None
    overhead: int | None = None
    in_use: int | None = None  # bytes in use before the call (a leak shows as their growth)
