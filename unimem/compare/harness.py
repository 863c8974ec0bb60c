"""``unimem compare``: the same workloads in every installed framework, side by side.

Each (framework, workload, configuration) runs in a fresh process (``unimem.compare.worker``),
one after another; figures a machine cannot give are None. The configurations, the warm-up and
when step times are not comparable: docs/guides/compare.md.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unimem import registry
from unimem.compare.worker import CONFIGS, SAVERS
from unimem.compare.workloads import SIZES
from unimem.errors import ConfigError
from unimem.sizes import counted

__all__ = [
    "CONFIGS",
    "QUICK_CONFIGS",
    "SAVERS",
    "Comparison",
    "compare",
    "failures",
    "plan_runs",
    "table_rows",
    "timing_notes",
    "unsupported",
]

WORKLOADS = ("mlp", "transformer")
# What `unimem compare` runs unless told (--full runs every configuration): each framework's own
# behaviour (JAX and TensorFlow preallocate) beside the one cap configure() makes in all of them.
# Every run is a fresh process that imports its framework, so the grid's size is the command's
# time: 12 runs with three frameworks keep `scripts/main.sh` within minutes on a 2-core machine;
# the savers' runs are the slowest (their warm-up imports what checkpointing needs, in every run).
QUICK_CONFIGS = ("default", "cap")
# 2: every run warms up the comparison's paths first; step times carry min, max, quartiles, load.
SCHEMA_VERSION = 2
# A run's step times spread over this share of their median (interquartile range) are not a figure
# to compare: something else took the CPU or the device during the steps.
SPREAD_LIMIT = 0.20


@dataclass
class Comparison:
    """All runs of one comparison plus where and with what they ran."""

    results: list[dict[str, Any]]
    machine: dict[str, Any] = field(default_factory=dict)

    @property
    def has_gpu(self) -> bool:
        return any(r.get("process_peak") is not None or r.get("peak_reserved") is not None for r in self.results)

    @property
    def configs(self) -> list[str]:
        """The configurations its runs ran, in the order of ``CONFIGS`` (one it does not know is left out)."""
        return [config for config in CONFIGS if any(run["config"] == config for run in self.results)]

    @property
    def times_comparable(self) -> bool:
        """False when the machine was loaded or a run's step times spread widely (``timing_notes``)."""
        return not timing_notes(self)

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "machine": self.machine,
            "times_comparable": self.times_comparable,
            "notes": timing_notes(self),
            "results": self.results,
        }

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), indent=2) + "\n", encoding="utf-8")


def _machine(size: str, steps: int) -> dict[str, Any]:
    installed = registry.available_backends()
    versions = {name: registry.get_backend(name).version() for name in _runners() if name in installed}
    from unimem.device_view import usable

    try:
        view, _ = usable()
        devices = view.devices() if view is not None else []
    except Exception:  # the machine's description is best effort: a comparison runs without it
        devices = []
    return {
        "date": _dt.date.today().isoformat(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": devices[0]["name"] if devices else "CPU only (no NVIDIA GPU)",
        "driver": devices[0]["driver"] if devices else None,
        "versions": versions,
        "size": size,
        "steps": steps,
        "cores": os.cpu_count(),
        "load_average": _load(),
    }


def _load() -> float | None:
    """The host's 1-minute load average; None where the platform has none."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def _runners() -> list[str]:
    """The frameworks whose adapter runs the reference workloads, in registry order."""
    found = []
    for name in registry.FRAMEWORKS:
        try:
            if registry.adapter_class(name).runs_workloads:
                found.append(name)
        except ImportError:  # an adapter this install does not ship
            continue
    return found


def _listed(names: Sequence[str]) -> str:
    """``a, b or c``."""
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


def _run_one(
    framework: str, workload: str, config: str, size: str, steps: int, timeout: float, warm: Sequence[str]
) -> dict[str, Any]:
    """One run in a fresh process, with the load average as it starts.

    Read before the run, not after: the run's own threads (as many as the cores, or more for
    TensorFlow's pools) would count against it; other processes show either way.
    """
    load = _load()
    result = _run_worker(framework, workload, config, size, steps, timeout, warm)
    result["load_average"] = load
    return result


def _run_worker(
    framework: str, workload: str, config: str, size: str, steps: int, timeout: float, warm: Sequence[str]
) -> dict[str, Any]:
    env = dict(os.environ)
    for var, value in registry.adapter_class(framework).workload_env.items():
        env.setdefault(var, value)
    cmd = [sys.executable, "-m", "unimem.compare.worker", framework, workload, config, size, str(steps)]
    cmd.append(",".join(warm))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"framework": framework, "workload": workload, "config": config, "ok": False, "error": "timed out"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        return {
            "framework": framework,
            "workload": workload,
            "config": config,
            "ok": False,
            "error": f"worker exited {proc.returncode}: {tail[0][:300]}",
        }
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def plan_runs(
    frameworks: Sequence[str] | None = None,
    workloads: Sequence[str] = WORKLOADS,
    configs: Sequence[str] = tuple(CONFIGS),
    *,
    size: str = "small",
    steps: int = 5,
) -> list[tuple[str, str, str]]:
    """The runs a comparison would make, ``(framework, workload, configuration)`` in order; runs nothing.

    Args:
        frameworks: Framework names; None (default): every installed one that runs the workloads.
        workloads: ``"mlp"``, ``"transformer"`` (default both).
        configs: Configurations from ``CONFIGS`` (default all).
        size: ``"small"`` (default) or ``"large"``.
        steps: Timed steps per run (default 5).

    Returns:
        One entry per run, in the order ``compare`` makes them.

    Raises:
        ConfigError: A framework, workload, configuration, size or step count is unknown or invalid.
    """
    runners = _runners()
    names = [registry.canonical_name(f, parameter="frameworks") for f in frameworks] if frameworks else None
    if names is None:
        names = [n for n in runners if n in registry.available_backends()]
    if not names:
        raise ConfigError(
            "frameworks", f"no framework that runs the workloads is installed; pip install {_listed(runners)}"
        )
    for name in names:
        if name not in runners:
            raise ConfigError("frameworks", f"{name} runs no workload; name {_listed(runners)}")
    for workload in workloads:
        if workload not in WORKLOADS:
            raise ConfigError("workloads", f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    for config in configs:
        if config not in CONFIGS:
            raise ConfigError("configs", f"unknown configuration {config!r}; choose from {', '.join(CONFIGS)}")
    if size not in SIZES:
        raise ConfigError("size", f"unknown size {size!r}; choose from {', '.join(SIZES)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError("steps", f"expected a whole number of steps, 1 or more, got {steps!r}")
    return [(framework, workload, config) for framework in names for workload in workloads for config in configs]


def compare(
    frameworks: Sequence[str] | None = None,
    workloads: Sequence[str] = WORKLOADS,
    configs: Sequence[str] = tuple(CONFIGS),
    *,
    size: str = "small",
    steps: int = 5,
    timeout: float = 600.0,
    progress: Callable[[str], None] | None = None,
    on_result: Callable[[Comparison], None] | None = None,
) -> Comparison:
    """Run every workload under every configuration in each framework, each run in a fresh process.

    See docs/guides/compare.md for the configurations, the warm-up and when times are comparable.

    Args:
        frameworks: Framework names; None (default): every installed one that runs the workloads.
        workloads: ``"mlp"``, ``"transformer"`` (default both).
        configs: Configurations from ``CONFIGS`` (default all; ``unimem compare`` runs ``QUICK_CONFIGS``).
        size: ``"small"`` (default) or ``"large"``.
        steps: Timed steps per run, after two untimed ones (default 5).
        timeout: Seconds a run may take before its row says it timed out (default 600).
        progress: Called with ``"run 3 of 12: framework · workload · config"`` as each run starts.
        on_result: Called with the comparison so far after each run (to save as it goes).

    Returns:
        The comparison: every run's figures and the machine they ran on.

    Raises:
        ConfigError: A framework, workload, configuration, size or step count is unknown or invalid.
    """
    runs = plan_runs(frameworks, workloads, configs, size=size, steps=steps)
    comparison = Comparison([], _machine(size, steps))
    for number, (framework, workload, config) in enumerate(runs, start=1):
        if progress is not None:
            progress(f"run {number} of {len(runs)}: {framework} · {workload} · {config}")
        comparison.results.append(_run_one(framework, workload, config, size, steps, timeout, configs))
        if on_result is not None:
            on_result(comparison)  # e.g. save as it goes: a long run stopped early keeps its rows
    return comparison


def table_rows(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """Header and rows for the terminal table; n/a for what this machine cannot give."""
    from unimem.sizes import format_bytes

    header = [
        "framework",
        "workload",
        "config",
        "params",
        "held at start",
        "host RSS at start",
        "peak allocated",
        "peak reserved",
        "process peak (NVML)",
        "host peak RSS",
        "step ms (min–max)",
    ]
    rows = []
    for r in comparison.results:
        if not r.get("ok"):
            # The reason goes under the table (``failures``): a long message in a cell would
            # widen its column for every row.
            outcome = "unsupported" if r.get("unsupported") else "failed"
            rows.append([r["framework"], r["workload"], r["config"], outcome] + [""] * 7)
            continue
        rows.append(
            [
                r["framework"],
                r["workload"],
                r["config"],
                f"{r['parameters'] / 1e6:.2f}M",
                format_bytes(r.get("start_process_used")),
                format_bytes(r.get("start_host_rss")),
                format_bytes(r.get("peak_allocated")),
                format_bytes(r.get("peak_reserved")),
                format_bytes(r.get("process_peak")),
                format_bytes(r.get("host_peak_rss")),
                _step_cell(r),
            ]
        )
    # Columns this machine cannot fill (device figures without a GPU) would only say n/a.
    keep = [i for i in range(len(header)) if i < 3 or any(row[i] not in ("n/a", "") for row in rows)]
    return [header[i] for i in keep], [[row[i] for i in keep] for row in rows]


def _step_cell(run: dict[str, Any]) -> str:
    """``"26.9 (25.1–30.2)"``: the median step and the fastest and slowest timed steps, in ms."""
    median = f"{run['step_ms']:.1f}"
    low, high = run.get("step_ms_min"), run.get("step_ms_max")
    return median if low is None or high is None else f"{median} ({low:.1f}–{high:.1f})"


def timing_notes(comparison: Comparison) -> list[str]:
    """Why the step times are not comparable, one line per reason; empty when nothing says so.

    Two reasons: the load average before a run was above the machine's cores (other processes
    took CPU time the steps needed), or a run's timed steps spread over ``SPREAD_LIMIT`` of their
    median (interquartile range: one slow step alone does not count).
    """
    timed = [r for r in comparison.results if r.get("ok")]
    notes = []
    cores = comparison.machine.get("cores")
    loads = [r["load_average"] for r in timed if isinstance(r.get("load_average"), (int, float))]
    if isinstance(cores, int) and loads and max(loads) > cores:
        loaded = sum(1 for load in loads if load > cores)
        notes.append(
            f"step times are not comparable: the load average was up to {max(loads):.1f} on {cores} cores "
            f"({counted(loaded, 'run')} started above {cores}): other processes took the CPU the steps needed; "
            "run again on an idle machine"
        )
    spread = [r for r in timed if isinstance(r.get("step_spread"), (int, float)) and r["step_spread"] > SPREAD_LIMIT]
    if spread:
        spread.sort(key=lambda r: -r["step_spread"])
        listed = ", ".join(f"{r['framework']} · {r['workload']} · {r['config']} {r['step_spread']:.0%}" for r in spread)
        notes.append(
            f"step times are not comparable: in {counted(len(spread), 'run')} the middle half of the timed steps "
            f"spread over {SPREAD_LIMIT:.0%} of their median ({listed}); run again on an idle machine, "
            "or with more --steps"
        )
    return notes


def failures(comparison: Comparison) -> list[str]:
    """One line per failed run: ``framework · workload · config: reason``."""
    return [
        f"{r['framework']} · {r['workload']} · {r['config']}: {r.get('error', '?')}"
        for r in comparison.results
        if not r.get("ok") and not r.get("unsupported")
    ]


def unsupported(comparison: Comparison) -> list[str]:
    """One line per configuration a framework cannot run: ``framework · workload · config: why``."""
    return [
        f"{r['framework']} · {r['workload']} · {r['config']}: {r.get('error', '?')}"
        for r in comparison.results
        if r.get("unsupported")
    ]
