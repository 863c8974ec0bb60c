"""``unimem view``'s page in a real headless Chromium (Debian's, driven by Playwright): it loads with
no console error and fetches nothing, draws every series of every lane, zooms under the wheel,
shows a mark's figures on hover; its thinning is the PNG's, point for point.

The browser is required: where Chromium or the playwright wheel is missing these tests fail
(``bash scripts/setup.sh test`` installs both); ``UNIMEM_TEST_BROWSER=none`` turns them off on
purpose, and names the binary to drive otherwise.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from test_view import _compare_file
from view_pages import BROWSER, GIB, INSTALL, Loaded, browser_problem, chromium, synthetic_run

from unimem.observe.thinning import spaced, thin_line
from unimem.sizes import format_bytes
from unimem.view import write_view

pytestmark = pytest.mark.slow  # a browser's start alone takes seconds on two cores


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if BROWSER.lower() == "none":
        pytest.skip("UNIMEM_TEST_BROWSER=none: the browser tests are off on purpose")
    problem = browser_problem()
    if problem is not None:
        pytest.fail(
            f"{problem}: the browser tests need it. Install it with {INSTALL}, "
            "or set UNIMEM_TEST_BROWSER=none to leave these tests out on purpose",
            pytrace=False,
        )
    with chromium() as started:
        yield started


@pytest.fixture(scope="module")
def loaded(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    folder = tmp_path_factory.mktemp("view")
    runs = [synthetic_run(20_000, rank=0, marks_every=2000), synthetic_run(12_000, rank=1, seed=1, marks_every=2000)]
    page = write_view([*runs, _compare_file(folder)], folder / "memory.html")
    opened = Loaded(browser, page.path)
    yield opened
    opened.close()


# Per lane, the pixels of the timeline's canvas in each figure's colour: the colour itself or
# blended with the white behind it (an antialiased edge), at least a third of it.
COLOURED = """() => unimemView.lanes.map((lane) => {
  const { width, height } = lane.canvas;
  const pixels = lane.canvas.getContext("2d").getImageData(0, 0, width, height).data;
  const counts = {};
  for (const [figure, [colour]] of Object.entries(unimemView.styles)) {
    const rgb = [1, 3, 5].map((at) => parseInt(colour.slice(at, at + 2), 16));
    let count = 0;
    for (let i = 0; i < pixels.length; i += 4) {
      const shares = [];
      let white = true;
      rgb.forEach((c, k) => {
        if (c < 230) shares.push((255 - pixels[i + k]) / (255 - c));
        else white = white && pixels[i + k] > 225;
      });
      if (white && Math.min(...shares) > 0.33 && Math.max(...shares) - Math.min(...shares) < 0.12) count++;
    }
    counts[figure] = count;
  }
  return counts;
})"""


def _redrawn(loaded: Loaded, action: Any) -> None:
    draws = loaded.js("unimemView.draws")
    action()
    loaded.page.wait_for_function(f"unimemView.draws > {draws}", timeout=10_000)


def test_the_page_loads_draws_every_series_zooms_and_shows_a_marks_figures(loaded: Loaded) -> None:
    assert loaded.errors == [] and loaded.requests == [] and loaded.js("unimemView.error") is None
    assert loaded.js("performance.getEntriesByName('drawn').length") == 1
    shown = ["allocated", "reserved", "process_used", "device_used", "host_rss"]
    drawn = loaded.js("unimemView.drawn")
    assert [(row["lane"], row["figure"]) for row in drawn] == [
        (lane, f) for lane in ("rank 0", "rank 1") for f in shown
    ]
    assert all(0 < row["points"] <= 4 * 1200 for row in drawn)  # thinned to the canvas's columns
    for counts in loaded.js(COLOURED):
        assert all(counts[figure] > 50 for figure in shown), counts  # each line is on the canvas

    # A legend entry shows the device's total, hidden at first.
    _redrawn(loaded, lambda: loaded.page.locator(".lane").first.get_by_role("button", name="device total").click())
    assert ("rank 0", "device_total") in {(row["lane"], row["figure"]) for row in loaded.js("unimemView.drawn")}

    # The wheel zooms in around the pointer: fewer samples in view, the time under the pointer kept.
    box = loaded.page.locator(".plot").first.bounding_box()
    loaded.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    before = loaded.js("[unimemView.x0, unimemView.x1, unimemView.drawn[0].inView]")
    _redrawn(loaded, lambda: loaded.page.mouse.wheel(0, -600))
    after = loaded.js("[unimemView.x0, unimemView.x1, unimemView.drawn[0].inView]")
    assert after[1] - after[0] < 0.5 * (before[1] - before[0]) and after[2] < 0.5 * before[2]
    assert before[0] < after[0] < after[1] < before[1]

    # Hovering a mark shows its label and its figures, as unimem formats bytes.
    x, y, label, allocated, reserved = loaded.js(
        """() => {
          const lane = unimemView.lanes[0];
          const rect = lane.canvas.getBoundingClientRect();
          const mark = lane.marks.find((m) => m.t > unimemView.x0 && m.t < unimemView.x1);
          const x = rect.left + lane.last.x(mark.t);
          return [x, rect.top + rect.height / 2, mark.label, mark.allocated, mark.reserved];
        }"""
    )
    loaded.page.mouse.move(x, y)
    tooltip = loaded.page.locator("#tooltip")
    assert tooltip.is_visible()
    assert tooltip.inner_text().splitlines() == [
        label,
        tooltip.inner_text().splitlines()[1],
        f"allocated {format_bytes(allocated)}",
        f"reserved {format_bytes(reserved)}",
    ]
    # Away from marks: every figure shown, read at the pointer.
    loaded.page.mouse.move(x + 40, y)
    assert "allocated (framework) 1." in tooltip.inner_text() and "GiB" in tooltip.inner_text()

    charts = loaded.js("unimemView.charts.map((chart) => chart.bars.length)")
    assert charts == [2, 2]  # two runs succeeded: a bar each, in the memory and the step-time chart
    assert loaded.errors == []


def test_the_pages_thinning_and_bytes_are_the_pngs(loaded: Loaded) -> None:
    rnd = random.Random(7)
    cases = []
    for size, buckets, gaps in ((3000, 40, 0.05), (5000, 7, 0.3), (400, 1, 0.0), (12, 5, 0.2), (2000, 60, 0.9)):
        times = sorted(rnd.uniform(0, 100) for _ in range(size))
        times[10:14] = [times[10]] * 4  # equal times
        values = [None if rnd.random() < gaps else rnd.randrange(0, 5) * GIB for _ in range(size)]  # ties
        lo, hi = (size // 5, size - size // 7) if size > 100 else (0, size)
        cases.append((times, values, buckets, lo, hi))
    got = loaded.js(
        """(cases) => cases.map(([times, values, buckets, lo, hi]) => {
          const nan = values.map((v) => (v === null ? NaN : v));
          const out = unimemView.thinLine(Float64Array.from(times), Float64Array.from(nan), buckets, lo, hi);
          return [out.t, out.v.map((v) => (Number.isNaN(v) ? null : v))];
        })""",
        cases,
    )
    for (times, values, buckets, lo, hi), (t, v) in zip(cases, got, strict=True):
        expected_t, expected_v = thin_line(times[lo:hi], values[lo:hi], buckets)
        assert t == expected_t and v == expected_v
        assert len(t) < hi - lo or hi - lo <= 4 * buckets  # each case thins, or is short enough to stay whole

    positions = [rnd.uniform(0, 500) for _ in range(300)] + [float("nan"), 3.0, 3.0]
    assert loaded.js("(p) => unimemView.spaced(p, 14)", [p if p == p else None for p in positions]) == spaced(
        positions, 14
    )
    counts = [0, 1, 1023, 1024, 1536 << 20, 1207959552, 1208590336, (1 << 53) - 1, 5 << 40, 999 << 30, 10**12 + 1]
    assert loaded.js("(c) => c.map(unimemView.formatBytes)", counts) == [format_bytes(c) for c in counts]
