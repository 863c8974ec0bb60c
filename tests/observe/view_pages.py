"""Runs for ``unimem view``'s tests and benchmark, the page's parts read back, and the browser that draws it.

``synthetic_run`` makes a run as ``monitor()`` records one: the framework's counters and the NVML
sampler's readings interleaved, a saw-tooth of allocations, a burst of failed readings, a mark
every few thousand samples. ``chromium`` starts Debian's Chromium (``/usr/bin/chromium``, or the
binary ``UNIMEM_TEST_BROWSER`` names) through Playwright: no browser is downloaded.
tests/observe/test_view_browser.py and benchmarks/bench_view.py use both.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import random
import re
import shutil
import zlib
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from unimem.observe.recording import Recording
from unimem.observe.samples import Mark, Sample

GIB = 1 << 30
MIB = 1 << 20
START = 1_700_000_000.0
# The Chromium the browser tests drive; "none" turns them off on purpose (they fail when it is missing).
BROWSER = os.environ.get("UNIMEM_TEST_BROWSER", "/usr/bin/chromium")
INSTALL = "bash scripts/setup.sh test (as root, or with sudo: it installs Debian's chromium and the playwright wheel)"


def synthetic_run(samples: int, *, rank: int | None = None, marks_every: int = 5000, seed: int = 0) -> Recording:
    """``samples`` readings 10 ms apart: odd ones the framework's, even ones the sampler's."""
    rnd = random.Random(seed)
    rows: list[Sample] = []
    marks: list[Mark] = []
    for i in range(samples):
        t = START + i * 0.01 + rnd.uniform(0, 0.002)
        if i % 2:
            allocated = GIB + (i % 400) * 2 * MIB + rnd.randrange(0, MIB, 512)
            rows.append(Sample(t, "framework", allocated=allocated, reserved=3 * GIB))
        elif samples // 3 <= i < samples // 3 + 8:
            rows.append(Sample(t, "device", error="NVML: GPU is lost"))
        else:
            process = 3 * GIB + 512 * MIB + rnd.randrange(0, 64 * 1024, 4096)
            host = 2 * GIB + rnd.randrange(0, 4 * MIB, 4096)
            rows.append(
                Sample(t, "device", process_used=process, device_used=4 * GIB, device_total=80 * GIB, host_rss=host)
            )
        if i % marks_every == marks_every // 2:
            marks.append(Mark(t, f"step {i // marks_every}", allocated=GIB + i * 1000, reserved=3 * GIB))
    meta: dict[str, Any] = {"backend": "torch", "device": 0, "interval": 0.01, "limit": 6 * GIB, "started": START}
    if rank is not None:
        meta.update(rank=rank, world_size=2)
    return Recording(rows, marks, meta)


def page_parts(path: Path) -> tuple[dict[str, Any], array[float]]:
    """A page's manifest and its arrays, decoded as the page's script decodes them."""
    text = path.read_text(encoding="utf-8")
    manifest = json.loads(_script(text, "unimem-manifest"))
    shuffled = zlib.decompress(base64.b64decode(_script(text, "unimem-data")))
    count = len(shuffled) // 8
    raw = bytearray(len(shuffled))
    for byte in range(8):
        raw[byte::8] = shuffled[byte * count : (byte + 1) * count]
    return manifest, array("d", bytes(raw))


def _script(text: str, name: str) -> str:
    found = re.search(rf'<script type="[^"]+" id="{name}">(.*?)</script>', text, re.DOTALL)
    assert found, f"the page has no {name} script"
    return found.group(1)


def browser_problem() -> str | None:
    """Why the browser tests cannot run here; None when they can."""
    if importlib.util.find_spec("playwright") is None:
        return "the playwright wheel is not installed"
    if shutil.which(BROWSER) is None:
        return f"no Chromium at {BROWSER}"
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Playwright's ``Browser``), closed after the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=BROWSER, headless=True)
        try:
            yield browser
        finally:
            browser.close()


class Loaded:
    """A page opened in the browser, with what went wrong while it loaded."""

    def __init__(self, browser: Any, path: Path, width: int = 1200, height: int = 900) -> None:
        self.page = browser.new_page(viewport={"width": width, "height": height})
        self.errors: list[str] = []
        self.requests: list[str] = []
        url = path.resolve().as_uri()
        self.page.on("console", lambda message: message.type == "error" and self.errors.append(message.text))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("request", lambda request: request.url != url and self.requests.append(request.url))
        self.page.goto(url)
        self.page.wait_for_function("window.unimemView && (unimemView.ready || unimemView.error)", timeout=60_000)

    def js(self, code: str, argument: Any = None) -> Any:
        return self.page.evaluate(code, argument)

    def close(self) -> None:
        self.page.close()
