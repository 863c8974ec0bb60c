"""What loading and plotting a long recording costs: a million samples and 20,000 marks, end to end.

    python benchmarks/bench_plot.py [--samples 1000000] [--marks 20000] [--runs 3] [--out FILE] [--machine LABEL]

The recording (framework counters and NVML readings interleaved, a failed reading every 997
NVML samples, marks spread evenly) is written once per format: ``to_json`` (``.json``, columns),
``to_csv`` (``.csv``), and the JSON Lines stream ``monitor(path=...)`` writes (``.jsonl``, with
``max_samples`` set to the sample count, so the loader keeps every sample). Then, per format,
``--runs`` fresh processes, each timing ``import unimem``, ``load_recording`` and
``Recording.plot`` to the default 1000 × 500 PNG, in wall-clock and CPU seconds (the CPU seconds
move far less with other work on the machine); the parent times each whole process too
(interpreter start included). matplotlib's import (the first plot of a process pays it) is timed
apart. Each figure is the median, min and max over the runs.

Run it alone on the machine: other work in it moves every figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib

HERE = Path(__file__).resolve().parent
START = 1_700_000_000.0
STEP = 0.001  # seconds between two samples: a 1 kHz monitor


def _recording(samples: int, marks: int) -> Any:
    from unimem.observe.recording import Recording
    from unimem.observe.samples import Mark, Sample

    rows = []
    for i in range(samples):
        t = START + i * STEP
        base = int((1 + math.sin(i / 5000)) * (1 << 30))
        if i % 2:
            rows.append(Sample(t, "framework", allocated=base + (i * 7919) % (1 << 20), reserved=base + (1 << 29)))
        elif i % 997 == 0:
            rows.append(Sample(t, "device", error="NVML: timeout"))
        else:
            rows.append(
                Sample(t, "device", process_used=base + (1 << 30), device_used=base + (3 << 30), host_rss=2 << 30)
            )
    span = samples * STEP
    labelled = [Mark(START + (k + 0.5) * span / marks, f"step {k}") for k in range(marks)]
    meta = {"backend": "torch", "device": 0, "limit": 6 << 30, "started": START, "max_samples": samples}
    return Recording(rows, labelled, meta)


def _write_stream(recording: Any, path: Path) -> None:
    """The recording as a monitor's JSON Lines stream (header, records in time order, end record)."""
    from unimem.observe.stream import DEVICE, FRAMEWORK, MARK, STREAM_FORMAT, encode

    records = [(s.time, s) for s in recording.samples] + [(m.time, m) for m in recording.marks]
    records.sort(key=lambda item: item[0])
    with path.open("wb") as handle:
        handle.write(encode({"format": STREAM_FORMAT, "meta": recording.meta}))
        for _, item in records:
            if not hasattr(item, "source"):
                handle.write(encode([MARK, item.time, item.label, item.allocated, item.reserved]))
            elif item.source == "device":
                handle.write(
                    encode(
                        [
                            DEVICE,
                            item.time,
                            item.device_total,
                            item.device_used,
                            item.process_used,
                            item.host_rss,
                            item.error,
                        ]
                    )
                )
            else:
                handle.write(encode([FRAMEWORK, item.time, item.allocated, item.reserved, item.error]))
        end = {"samples": len(recording.samples), "marks": len(recording.marks), "meta": recording.meta}
        handle.write(encode({"end": end}))


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One fresh process: import, load, plot; wall and CPU seconds for each, and what was drawn."""
    clocks = [(time.perf_counter(), time.process_time())]
    import unimem

    clocks.append((time.perf_counter(), time.process_time()))
    recording = unimem.load_recording(spec["path"])
    clocks.append((time.perf_counter(), time.process_time()))
    import matplotlib.backends.backend_agg
    import matplotlib.figure  # noqa: F401  # imported by the first plot of a process: timed apart

    clocks.append((time.perf_counter(), time.process_time()))
    recording.plot(spec["png"])
    clocks.append((time.perf_counter(), time.process_time()))
    result: dict[str, Any] = {"samples": len(recording.samples), "marks": len(recording.marks)}
    for index, name in enumerate(("import", "load", "matplotlib_import", "plot")):
        result[f"{name}_s"] = clocks[index + 1][0] - clocks[index][0]
        result[f"{name}_cpu_s"] = clocks[index + 1][1] - clocks[index][1]
    result["load_and_plot_s"] = clocks[4][0] - clocks[1][0]
    result["load_and_plot_cpu_s"] = clocks[4][1] - clocks[1][1]
    return result


def measure(path: Path, png: Path, runs: int) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []
    process: list[float] = []
    for _ in range(runs):
        begun = time.perf_counter()
        result = benchlib.run_child(__file__, {"path": str(path), "png": str(png)}, 600, cpu_only=True)
        process.append(time.perf_counter() - begun)
        if "error" in result:
            return {"error": result}
        seen.append(result)
    keys = [key for key in seen[0] if key.endswith("_s")]
    figures = {key: _spread([run[key] for run in seen]) for key in keys}
    figures["process_s"] = _spread(process)
    return {
        "file_bytes": path.stat().st_size,
        "samples_loaded": seen[0]["samples"],
        "marks_loaded": seen[0]["marks"],
        **figures,
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--marks", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=None, help="JSON file to write (default: stdout)")
    parser.add_argument("--machine", default=None, help="a label for the machine")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(benchlib.RESULT_MARK + json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    result = benchlib.header("plot", args.machine, sys.argv)
    result["recording"] = {"samples": args.samples, "marks": args.marks, "png": "1000 x 500 (default)"}
    recording = _recording(args.samples, args.marks)
    with tempfile.TemporaryDirectory() as folder:
        saved = {
            "json": recording.to_json(Path(folder) / "memory.json"),
            "csv": recording.to_csv(Path(folder) / "memory.csv"),
            "jsonl": Path(folder) / "memory.jsonl",
        }
        _write_stream(recording, saved["jsonl"])
        del recording
        result["formats"] = {
            name: measure(path, Path(folder) / f"{name}.png", args.runs) for name, path in saved.items()
        }
    # Other work on the machine moves the wall-clock figures (the CPU seconds far less): its load at the end.
    result["load_average_after"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    benchlib.write(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
