"""The memory figures the trainers' callbacks add to their logs, framework-free.

One name per figure, the same in every integration (``mem_peak``, ``mem_host_rss``, ...): a
dashboard reads the same keys from a Keras, Lightning or Hugging Face run. Only known figures
are logged: a figure the framework does not keep (on the CPU, the device's) is left out, never 0.
"""

from __future__ import annotations

from unimem.observe.track import Tracked

__all__ = ["FIGURES", "combine", "figures"]

# The keys, in the order a row of figures is exchanged between ranks.
FIGURES = ("mem_allocated", "mem_reserved", "mem_peak", "mem_process", "mem_host_rss", "mem_host_peak")


def figures(tracked: Tracked, host_rss: int | None) -> dict[str, int]:
    """The known figures of one step (or epoch): bytes at its end, its peaks, the process's host memory."""
    end = tracked.end
    known = {
        "mem_allocated": end.allocated if end else None,
        "mem_reserved": end.reserved if end else None,
        "mem_peak": tracked.peak,
        "mem_process": end.process_used if end else None,
        "mem_host_rss": host_rss,
        "mem_host_peak": tracked.host_peak,
    }
    return {key: int(value) for key, value in known.items() if value is not None}


def combine(rows: list[dict[str, int]]) -> dict[str, int]:
    """Several ranks' figures (one dict per rank, by rank) as one log line: each figure's largest over the
    ranks where every rank knows it, and each rank's peak as ``mem_peak_rank{r}``."""
    combined = {key: max(row[key] for row in rows) for key in FIGURES if rows and all(key in row for row in rows)}
    for rank, row in enumerate(rows):
        if "mem_peak" in row:
            combined[f"mem_peak_rank{rank}"] = row["mem_peak"]
    return combined
