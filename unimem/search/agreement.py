"""A batch search over ranks: the arguments and each call of the step as every rank saw them,
agreed through the runtime's key-value store (the transport: ``unimem.search.ranks``)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from unimem.errors import ConfigError
from unimem.search.limit import Limit, bytes_of
from unimem.search.ranks import Outcome, known, worst

if TYPE_CHECKING:
    from unimem.search.ranks import Ranks
    from unimem.search.settings import Settings
    from unimem.search.state import Start

__all__ = ["agree", "agree_open"]


def agree_open(settings: Settings, over: Ranks, limit: Limit | None, start: Start) -> tuple[Limit | None, Start]:
    """Before the first trial: the ranks passed the same arguments; the limit is the smallest
    over ranks, the bytes in use before the search the largest (so one model holds on every rank)."""
    mine = settings.fingerprint()
    payload = {"kind": "start", "size": 0, "settings": mine}  # the arguments are compared below, by name
    payload.update(limit=bytes_of(limit), baseline=start.baseline, running_peak=start.running_peak)
    answers = over.exchange(payload)
    for rank, theirs in sorted(answers.items()):
        for name, value in theirs["settings"].items():
            if value != mine.get(name):
                raise ConfigError(
                    name,
                    f"rank {rank} passed {name}={value!r} where rank {over.rank} passed {mine.get(name)!r}: "
                    "every rank of a collective search must pass the same arguments",
                )
    every = list(answers.values())
    smallest = worst([p["limit"] for p in every], min)
    agreed = None if smallest is None or limit is None else Limit(smallest, limit.source)
    baseline, running_peak = worst([p["baseline"] for p in every]), worst([p["running_peak"] for p in every])
    return agreed, replace(start, baseline=baseline, running_peak=running_peak)


def agree(over: Ranks | None, kind: str, size: int, outcome: Outcome, elapsed: float) -> tuple[Outcome, float | None]:
    """A call of the step as every rank saw it: it fit only where it fit on every rank, the figures
    are the largest over ranks; and the longest any rank has searched (``elapsed``: this rank's
    seconds; None in a single process). (The limit needs no agreeing here: every rank holds the one
    agreed at the start, and each re-read of it is agreed as it is read.)"""
    if over is None:
        return outcome, None
    answers = over.exchange({"kind": kind, "size": size, "elapsed": elapsed, **outcome.__dict__})
    every = [p for _, p in sorted(answers.items())]
    longest = max(p.get("elapsed", elapsed) for p in every)  # so that every rank stops at the same trial
    failed = [(rank, p["error"]) for rank, p in sorted(answers.items()) if p["error"] is not None]
    error = None
    if failed:
        rank, text = failed[0]
        more = f" (and rank(s) {', '.join(str(r) for r, _ in failed[1:])})" if len(failed) > 1 else ""
        error = f"rank {rank}{more}: {text}"
    fits = error is None
    agreed = Outcome(
        error,
        max(p["seconds"] for p in every),
        worst([p["peak"] for p in every]) if fits else None,
        worst([p["peak_reserved"] for p in every]) if fits else None,
        known([p["kept"] for p in every]),
        known([p["overhead"] for p in every]) if fits else None,
        worst([p.get("in_use") for p in every]),
    )
    return agreed, longest
