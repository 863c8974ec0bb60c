"""``unimem view`` on a million samples: the page's size, its first draw and a wheel zoom's redraw.

    python benchmarks/bench_view.py [--samples 1000000] [--runs 3] [--out FILE] [--machine LABEL]

One recording of ``--samples`` readings (tests/observe/view_pages.py's run: the framework's
counters and the sampler's NVML readings interleaved, 10 ms apart, marks and failed readings) is
written as a page once. Headless Chromium (Debian's, through Playwright) starts once, and its
start is not counted; then, ``--runs`` times, a fresh tab opens the page and the benchmark reads:

- drawn: navigation start to the page's ``performance.mark("drawn")`` (the data decoded, every
  lane's first draw done), and when each stage before it ended: the page parsed and its script
  started, the data inflated, decoded (the byte shuffle undone), laid out in lanes;
- zoom: one wheel event over the first lane (zooming in around the middle of the whole run) to
  the end of the redraw it asks for, canvases flushed; the redraw alone; and ``span``, the
  seconds in view after that zoom.

Targets, reported and not asserted: drawn <= 3 s and zoom <= 0.5 s, medians on 2 cores. The load
average before and after goes with the figures: on a loaded machine they are upper bounds.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "observe"))
import view_pages  # noqa: E402  (the run and the browser the tests use, from their folder)

from unimem.view import write_view  # noqa: E402

TARGETS_MS = {"drawn": 3000.0, "zoom": 500.0}
ZOOM = """async () => {
  const plot = document.querySelector(".plot");
  const rect = plot.getBoundingClientRect();
  const draws = unimemView.draws;
  const start = performance.now();
  const wheel = { deltaY: -600, clientX: rect.left + rect.width / 2, clientY: rect.top + rect.height / 2 };
  plot.dispatchEvent(new WheelEvent("wheel", { ...wheel, bubbles: true, cancelable: true }));
  while (unimemView.draws === draws) await new Promise((done) => requestAnimationFrame(done));
  for (const lane of unimemView.lanes) lane.canvas.getContext("2d").getImageData(0, 0, 1, 1);  // rasterised
  const { start: from, end } = unimemView.lastDraw;
  return { zoom: performance.now() - start, redraw: end - from, span: unimemView.x1 - unimemView.x0 };
}"""


def spread(values: list[float]) -> dict[str, float]:
    """Median, min, max and the spread (max - min) as a share of the median."""
    median = statistics.median(values)
    return {
        "median": round(median, 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
        "spread": round((max(values) - min(values)) / median, 3) if median else 0.0,
        "n": len(values),
    }


def one_load(browser: Any, page_path: Path) -> dict[str, float]:
    """Open the page in a fresh tab; its first draw and one zoom, in ms."""
    loaded = view_pages.Loaded(browser, page_path, width=1400, height=900)
    try:
        if loaded.errors or loaded.js("unimemView.error"):
            raise RuntimeError(f"the page failed: {loaded.errors or loaded.js('unimemView.error')}")
        drawn = loaded.js("performance.getEntriesByName('drawn')[0].startTime")
        stages = loaded.js("unimemView.timings")  # ms since navigation start, as the drawn mark
        zoomed = loaded.js(ZOOM)
        return {"drawn": drawn, **zoomed, **{f"stage_{name}": value for name, value in stages.items()}}
    finally:
        loaded.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=None, help="JSON file to write (default: stdout)")
    parser.add_argument("--machine", default=None, help="a label for the machine")
    args = parser.parse_args(argv)
    problem = view_pages.browser_problem()
    if problem:
        sys.exit(f"bench_view: {problem}; install it with {view_pages.INSTALL}")
    result = benchlib.header("view", args.machine, sys.argv)
    result["playwright"] = importlib.metadata.version("playwright")
    recording = view_pages.synthetic_run(args.samples)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        page = write_view([recording], Path(tmp) / "memory.html")
        written = time.perf_counter() - started
        loads = []
        with view_pages.chromium() as browser:
            result["chromium"] = browser.version
            for _ in range(args.runs):
                loads.append(one_load(browser, page.path))
    result["samples"] = args.samples
    result["marks"] = len(recording.marks)
    result["page_bytes"] = page.size
    result["page_mib_per_million_samples"] = round(page.size / (1 << 20) * 1_000_000 / args.samples, 2)
    result["write_s"] = round(written, 2)
    result["unit"] = "ms"
    result["targets_ms"] = TARGETS_MS
    for name in ("drawn", "zoom", "redraw"):
        result[f"{name}_ms"] = spread([load[name] for load in loads])
    result["runs_ms"] = [{name: round(value, 1) for name, value in load.items()} for load in loads]
    result["met"] = {name: result[f"{name}_ms"]["median"] <= target for name, target in TARGETS_MS.items()}
    result["load_average_after"] = list(os.getloadavg())
    benchlib.write(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
