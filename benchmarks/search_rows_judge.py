"""What bench_search_rows.py's rows are judged by: the targets, the largest size seen running on each
model (``best_seen``), each row's share of it, and the summary the benchmark prints. Pure: no
framework, no device."""

from __future__ import annotations

from typing import Any

# What the rows are judged by (the summary prints them): torch's share is against the confirmed
# ``true_max``; JAX's against ``best_seen``, the largest size seen running (a growing pool's history
# decides what fits, so no fresh-process bracket is the largest that runs).
TARGETS: dict[str, Any] = {
    "torch": {"share": 0.95, "step_calls": 6},
    "jax_lower": {
        "share_best_seen": 0.95,
        "failed_calls": 0,
        "compile_calls": 5,
        "seconds": "4 x compile_seconds_at_answer + 10",
        "answer_runs_in_process": True,
    },
    "jax_without_lower": {"share_best_seen": 0.95, "step_calls": 6, "failed_calls": 2},
    "share_best_seen_by_model": {"jax-mlp": 0.96, "jax-transformer": 0.96},
}
# Sizes seen running at full speed on an NVIDIA H200 in an earlier run of this benchmark: there
# ``best_seen`` never falls below them (a run whose pool history is less lucky would hide them).
SEEN_ON_H200 = {
    "flax-mlp": 2_166_754,  # the search without lower=: its answer, and ten steps after it in its process
    "jax-mlp": 41_212,  # a fresh process, bisecting above an answer of 40,950
    "jax-transformer": 52,  # the search's answer, in its process and in a fresh one
}


def floors(gpu_name: str | None) -> dict[str, int]:
    """The sizes ``best_seen`` starts from on this GPU: ``SEEN_ON_H200`` on an H200, else none
    (another device holds other sizes)."""
    return dict(SEEN_ON_H200) if gpu_name and "H200" in gpu_name else {}


def sizes_seen_running(row: dict[str, Any]) -> list[int]:
    """Every size one row saw running at full speed: its search's (or baseline's) calls that ran (less
    those the search found rematerialized), the answer's ten
    steps in the searching process, the probes that ran at full speed there after the search, and
    the fresh processes' runs at full speed (the answer's and the probes')."""
    detail = row.get("detail") or {}
    slower = set(detail.get("rematerialized") or [])  # ran, but not at full speed
    sizes = [size for size, ran, *_ in detail.get("calls") or [] if ran and size not in slower]
    found = row.get("found")
    if found and row.get("same_process_ok"):
        sizes.append(found)
    sizes += [size for size, ran, *_ in row.get("in_process_calls") or [] if ran]
    fresh = row.get("fresh") or {}
    if found and fresh.get("answer_fits_fresh"):
        sizes.append(found)
    sizes += [size for size, ran, *_ in fresh.get("probes") or [] if ran]
    return sizes


def best_seen(rows: list[dict[str, Any]], floor: int | None = None) -> int | None:
    """The largest size the rows of one model saw running, never below ``floor`` (None: nothing seen)."""
    sizes = [size for row in rows for size in sizes_seen_running(row)]
    return max([*sizes, *([floor] if floor else [])], default=None)


def apply_best_seen(rows: list[dict[str, Any]], seen_before: dict[str, int]) -> None:
    """Give every JAX row that answered its model's ``best_seen`` (all the model's rows together,
    with ``seen_before``'s floor), ``share_best_seen`` and, for unimem's, ``targets_met``. Run it
    again as rows arrive: each run starts from the rows alone."""
    names = {row["name"] for row in rows if row.get("framework") == "jax" and "name" in row}
    for name in sorted(names):
        group = [row for row in rows if row.get("name") == name]
        seen = best_seen(group, seen_before.get(name))
        for row in group:
            if "found" not in row:
                continue
            row.update(best_seen=seen, best_seen_floor=seen_before.get(name))
            row["share_best_seen"] = row["found"] / seen if seen and row["found"] else None
            if row.get("method") == "unimem":
                row["targets_met"] = jax_targets(row)


def jax_targets(row: dict[str, Any]) -> dict[str, bool | None]:
    """Whether a JAX row of unimem's search meets ``TARGETS`` (None: not known). With ``lower=``:
    its share of ``best_seen``, no failed call, at most 5 compilations (the start's included),
    seconds within 4 compilations at the answer and 10 s, and the answer running in the searching
    process; without: its share, at most 6 calls and 2 failed. ``jax-mlp`` and ``jax-transformer``
    are held to their own share."""
    lower = bool(row.get("lower"))
    wanted = TARGETS["jax_lower" if lower else "jax_without_lower"]
    least = TARGETS["share_best_seen_by_model"].get(row.get("name"), wanted["share_best_seen"])
    share = row.get("share_best_seen")
    met: dict[str, bool | None] = {"share_best_seen": None if share is None else share >= least}
    met["failed_calls"] = row["failed_calls"] <= wanted["failed_calls"]
    if lower:
        seconds_at = row.get("compile_seconds_at_answer")
        met["compile_calls"] = row["compile_calls"] <= wanted["compile_calls"]
        met["seconds"] = None if seconds_at is None else row["seconds"] <= 4 * seconds_at + 10
        met["answer_runs_in_process"] = row.get("same_process_ok")
    else:
        met["step_calls"] = row["step_calls"] <= wanted["step_calls"]
    return met


def torch_targets(row: dict[str, Any]) -> dict[str, bool | None]:
    """Whether a torch row of unimem's search meets ``TARGETS["torch"]`` (None: no confirmed ``true_max``)."""
    share = row.get("share")
    wanted = TARGETS["torch"]
    return {
        "share": None if share is None else share >= wanted["share"],
        "step_calls": row["step_calls"] <= wanted["step_calls"],
    }


def target_lines() -> list[str]:
    """``TARGETS`` in words, for the summary."""
    lower, without = TARGETS["jax_lower"], TARGETS["jax_without_lower"]
    own = ", ".join(f"{name} >= {share:.0%}" for name, share in TARGETS["share_best_seen_by_model"].items())
    return [
        f"targets: torch: >= {TARGETS['torch']['share']:.0%} of true_max in <= {TARGETS['torch']['step_calls']} calls",
        f"targets: JAX with lower=: >= {lower['share_best_seen']:.0%} of best_seen, {lower['failed_calls']} failed, "
        f"<= {lower['compile_calls']} compilations, seconds <= {lower['seconds']}, the answer runs in the "
        "searching process",
        f"targets: JAX without lower=: >= {without['share_best_seen']:.0%} of best_seen, "
        f"<= {without['step_calls']} calls, <= {without['failed_calls']} failed",
        f"targets: by model, of best_seen: {own}",
    ]


def _missed(row: dict[str, Any]) -> str:
    met = row.get("targets_met")
    if not met:
        return ""
    missed = [name for name, ok in met.items() if ok is False]
    unknown = [name for name, ok in met.items() if ok is None]
    return "; targets " + (
        ("missed: " + ", ".join(missed) if missed else "met")
        + (f" (not known: {', '.join(unknown)})" if unknown else "")
    )


def _probe(entry: list[Any] | None) -> str:
    return "" if not entry else f"{entry[0]} {'ran' if entry[1] else 'did not run'}"


def row_line(row: dict[str, Any]) -> str:
    """One row in a line: its answer, its shares, its calls, what the probes 5% above it saw, and its targets."""
    if "found" not in row:
        return f"{row.get('model')} {row.get('method')}: {row.get('skipped') or 'error'}"
    method = row["method"] + ("" if "lower" not in row else " (lower=)" if row["lower"] else " (no lower=)")
    share, seen = row.get("share"), row.get("share_best_seen")
    parts = [
        f"{row['framework']:<6} {row.get('name') or row.get('model')} {method}: found {row['found']}",
        f"{'?' if share is None else f'{share:.1%}'} of true_max {row.get('true_max')}",
    ]
    if "best_seen" in row:
        parts.append(f"{'?' if seen is None else f'{seen:.1%}'} of best_seen {row['best_seen']}")
    parts.append(f"{row['step_calls']} calls, {row['failed_calls']} failed, {row.get('compile_calls')} compiled")
    parts.append(f"{row['seconds']:.1f} s, same process {row['same_process_ok']}")
    if row.get("compile_seconds_at_answer") is not None:
        parts.append(f"{row['compile_seconds_at_answer']} s a compile")
    fresh = (row.get("fresh") or {}).get("five_percent")
    if row.get("in_process_5_percent") or fresh:
        in_process = _probe(row.get("in_process_5_percent")) or "not probed"
        parts.append(f"+5%: {in_process} in process, {_probe(fresh) or 'not probed'} fresh")
    return ", ".join(parts) + (" (gave up)" if row.get("gave_up") else "") + _missed(row)


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """The targets, then one line a row."""
    return [*target_lines(), *(row_line(row) for row in rows)]
