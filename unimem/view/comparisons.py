"""A comparison as the page shows it: the table ``unimem compare`` prints, its notes, and per
workload a chart of the memory peak and one of the median step time."""

from __future__ import annotations

from typing import Any

from unimem.compare.harness import Comparison, failures, table_rows, timing_notes, unsupported

__all__ = ["comparison_part"]


def comparison_part(comparison: Comparison, file: str | None) -> dict[str, Any]:
    """A comparison as the page shows it: the terminal's table, its notes, and per workload the
    memory and step-time figures of each framework and configuration (None where a run failed)."""
    header, rows = table_rows(comparison)
    memory = "process_peak" if comparison.has_gpu else "host_peak_rss"
    results = comparison.results
    frameworks = sorted({run["framework"] for run in results})
    configs = comparison.configs
    configs += sorted({run["config"] for run in results} - set(configs))
    charts = []
    for workload in sorted({run["workload"] for run in results}):
        found = {
            (run["framework"], run["config"]): run for run in results if run["workload"] == workload and run.get("ok")
        }
        for key, label, unit in (
            (
                memory,
                "process peak on the GPU (NVML)" if comparison.has_gpu else "host peak RSS (no GPU here)",
                "bytes",
            ),
            ("step_ms", "median step time", "ms"),
        ):
            values = [
                [found[fw, config].get(key) if (fw, config) in found else None for config in configs]
                for fw in frameworks
            ]
            charts.append({"title": f"{workload}: {label}", "unit": unit, "values": values})
    return {
        "file": file,
        "machine": comparison.machine,
        "header": header,
        "rows": rows,
        "notes": [*timing_notes(comparison), *(f"failed: {line}" for line in failures(comparison))]
        + [f"unsupported: {line}" for line in unsupported(comparison)],
        "frameworks": frameworks,
        "configs": configs,
        "charts": charts,
    }
