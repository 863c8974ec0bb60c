"""Memory over time in the browser: one self-contained HTML page, zoomable, marks on hover.

``write_view`` turns recordings and ``unimem compare`` results into one page. Each recording is
a lane (several are ranks, labelled as ``plot_recordings`` labels them) with every figure it
holds on one wall-clock axis, its marks and its failed readings; each comparison is a table and
charts. The script, the style and the data are inside the page: it opens without a network.

The page draws on a 2D canvas (no WebGL: a headless machine has no GPU). Every sample travels in
the page, and each draw thins what is in view to the canvas's width in pixels by the rule of
``unimem.observe.thinning`` (first, lowest, highest and last point per pixel column): the PNG's
rule, written once in Python and mirrored line for line by ``view_page/thinning.js``, which a
test holds to the same points. So a peak seen in the whole run is there at every zoom level.

The samples travel as float64 (exact for byte counts below 2**53), byte-shuffled (the first byte
of every value, then the second, ...: a figure's high bytes repeat, and deflate packs them) and
deflated, in base64; docs/guides/view.md gives the page's size per million samples.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import re
import sys
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unimem.errors import ConfigError
from unimem.observe.files import (
    check_max_bytes,
    check_target,
    figure,
    parse_json,
    read_recording,
    shown,
    write_atomically,
)
from unimem.observe.loading import JSON_MEMORY
from unimem.observe.plotting import FIGURE_LABELS, RankLine, Streams, rank_labels, times_of
from unimem.observe.recording import Recording, load_recording
from unimem.observe.thinning import axis_origin, shortened

if TYPE_CHECKING:
    from unimem.compare.harness import Comparison

__all__ = ["FIGURES", "ViewPage", "view_html", "write_view"]

# Every byte figure a sample can carry, in the order the legend lists them.
FIGURES = ("allocated", "reserved", "peak", "process_used", "device_used", "device_total", "host_rss", "host_peak")
# Listed but not drawn until clicked: the device's whole memory would flatten every other line.
_HIDDEN = frozenset({"device_total"})
_PAGE = "view_page"  # the page's template, style and scripts: package data beside this module
_COMPRESSION = 1  # zlib level: a tenth larger than level 6, a quarter of its time on a million samples
_RUN_TEXTS = ("framework", "workload", "config")
# Text read from a recording travels cut to what the page can show (a mark's label of megabytes
# must not make a page of megabytes), and at most so many notes a lane.
_TEXT_CHARS = 500
_NOTES = 100
_RUN_BYTES = (
    "start_process_used",
    "start_host_rss",
    "peak_allocated",
    "peak_reserved",
    "process_peak",
    "host_peak_rss",
)


@dataclass(frozen=True)
class ViewPage:
    """What ``write_view`` wrote.

    Attributes:
        path (Path): The HTML page.
        lanes (tuple[RankLine, ...]): One per recording, in rank order: its label, rank, file and
            samples.
        comparisons (tuple[str | None, ...]): The file of each comparison shown (None for one
            passed in as an object).
        notes (tuple[str, ...]): What did not match between the recordings (as ``plot_recordings``
            says it), shown on the page too.
        size (int): The page's size in bytes.
    """

    path: Path
    lanes: tuple[RankLine, ...]
    comparisons: tuple[str | None, ...]
    notes: tuple[str, ...]
    size: int


def write_view(
    inputs: Sequence[Recording | Comparison | str | os.PathLike[str]],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    max_bytes: int | str | None = None,
) -> ViewPage:
    """Write one self-contained HTML page of recordings and comparison results.

    Each recording is a lane: every figure it knows over time (the device's total is listed, and
    drawn when clicked), its marks (hover one for its figures), its failed readings and its cap.
    Several recordings are ranks: one lane each, in rank order, on one wall-clock axis. Each
    comparison (``unimem compare``'s compare.json) is a table and a chart per workload. The mouse
    wheel zooms, a drag pans, a double click shows the whole run again.

    Args:
        inputs: ``Recording`` objects, ``unimem.compare.harness.Comparison`` objects, or the files
            they were saved to (a recording's JSON, CSV or JSON Lines; a compare.json), in any mix.
        path: The page to write (``.html``), in a folder that exists; written whole or not at all.
        title: The page's title; None (default): what the page shows (the backend and device of
            one recording, how many ranks, or the comparison's device).
        max_bytes: A cap on the size of each file read (see ``unimem.load_recording``); None
            (default): the memory rule ``load_recording`` keeps.

    Returns:
        The page's path, its lanes, the comparisons it shows, notes and its size in bytes.

    Raises:
        ConfigError: ``path`` is not an ``.html`` path in a folder that exists, ``inputs`` is not
            a list of recordings and comparisons or their files, or a file is neither (the message
            names the file and the problem). Nothing is written then.

    Example:
        ```python
        unimem.observe.view.write_view(["memory.rank0.json", "memory.rank1.json"], "memory.html")
        ```
    """
    target = check_target(path, ".html")
    text, lanes, comparisons, notes = _render(inputs, title, max_bytes)
    data = text.encode("utf-8")
    write_atomically(target, data)
    return ViewPage(target, lanes, comparisons, notes, len(data))


def view_html(
    inputs: Sequence[Recording | Comparison | str | os.PathLike[str]],
    *,
    title: str | None = None,
    max_bytes: int | str | None = None,
) -> str:
    """The page ``write_view`` writes, as text (to serve it, or to embed it elsewhere).

    Args:
        inputs: As ``write_view``'s.
        title: As ``write_view``'s.
        max_bytes: As ``write_view``'s.

    Returns:
        The whole HTML document.

    Raises:
        ConfigError: As ``write_view``, for ``inputs``.
    """
    return _render(inputs, title, max_bytes)[0]


def _render(
    inputs: Sequence[Recording | Comparison | str | os.PathLike[str]], title: str | None, max_bytes: object
) -> tuple[str, tuple[RankLine, ...], tuple[str | None, ...], tuple[str, ...]]:
    """The page's text, its lanes, the files of its comparisons and the notes."""
    recordings, comparisons = _sorted(inputs, check_max_bytes(max_bytes))
    if title is not None and not isinstance(title, str):
        raise ConfigError("title", f"expected text or None, got {type(title).__name__}")
    arrays = _Arrays()
    labelled, notes = rank_labels(recordings) if len(recordings) > 1 else (_single(recordings), [])
    order = sorted(range(len(recordings)), key=lambda i: (labelled[i][1] is None, labelled[i][1] or 0, i))
    origin = axis_origin([(recording.meta.get("started"), times_of(recording)) for recording, _ in recordings])
    lanes = [_lane(recordings[i][0], labelled[i][0], recordings[i][1], arrays) for i in order]
    drawn = tuple(
        RankLine(labelled[i][0], labelled[i][1], recordings[i][1], len(recordings[i][0].samples)) for i in order
    )
    manifest = {
        "title": title or _title(recordings, comparisons, drawn),
        "origin": origin,
        "arrays": arrays.layout,
        "lanes": lanes,
        "notes": notes,
        "comparisons": [_comparison_part(comparison, file) for comparison, file in comparisons],
    }
    page = _fill(manifest, arrays.packed())
    return page, drawn, tuple(file for _, file in comparisons), tuple(notes)


def _single(recordings: list[tuple[Recording, str | None]]) -> list[tuple[str, int | None]]:
    """One recording's label: its rank where it has one, else its file (no other lane to tell apart)."""
    if not recordings:
        return []
    recording, file = recordings[0]
    rank = recording.meta.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool):
        return [(f"rank {rank}", rank)]
    return [(file or "recording", None)]


def _sorted(
    inputs: Sequence[Recording | Comparison | str | os.PathLike[str]], max_bytes: int | None
) -> tuple[list[tuple[Recording, str | None]], list[tuple[Comparison, str | None]]]:
    """The recordings and the comparisons among ``inputs``, each with its file's name (None for an object)."""
    from unimem.compare.harness import Comparison

    if isinstance(inputs, (str, bytes, os.PathLike, Recording, Comparison)) or not isinstance(inputs, Sequence):
        raise ConfigError("inputs", "expected a list of recordings, comparisons or their files, e.g. [r0, r1]")
    if not inputs:
        raise ConfigError("inputs", "nothing to show: pass at least one recording or compare.json")
    recordings: list[tuple[Recording, str | None]] = []
    comparisons: list[tuple[Comparison, str | None]] = []
    for item in inputs:
        if isinstance(item, Recording):
            recordings.append((item, None))
        elif isinstance(item, Comparison):
            for index, run in enumerate(item.results):
                _check_run(run, f"comparison {len(comparisons) + 1}, result {index + 1}")
            comparisons.append((item, None))
        elif isinstance(item, (str, os.PathLike)) and os.fspath(item):
            read = _read(item, max_bytes)
            if isinstance(read, Recording):
                recordings.append((read, Path(item).name))
            else:
                comparisons.append((read, Path(item).name))
        else:
            raise ConfigError("inputs", f"expected recordings, comparisons or paths, got {type(item).__name__}")
    return recordings, comparisons


def _read(path: str | os.PathLike[str], max_bytes: int | None) -> Recording | Comparison:
    """The recording, or else the comparison, a file holds; a ``ConfigError`` when it is neither."""
    try:
        return load_recording(path, max_bytes=max_bytes)
    except ConfigError:
        if Path(path).suffix.lower() != ".json":
            raise
        content, source = read_recording(path, max_bytes, JSON_MEMORY)
        data = parse_json(content, str(source))
        if not isinstance(data, dict) or "results" not in data or "format" in data:
            raise  # not a comparison either: the recording's error says what is wrong
        return load_comparison(data, str(source))


def load_comparison(data: object, where: str) -> Comparison:
    """``unimem compare``'s JSON (``Comparison.as_dict()``) as a ``Comparison``, its figures checked.

    Args:
        data: The parsed JSON document.
        where: The file it was read from, for the errors.

    Returns:
        The comparison.

    Raises:
        ConfigError: A run is not an object, names no framework, workload or configuration, or
            holds a figure that is not a number (the message names the file and the run).
    """
    from unimem.compare.harness import Comparison

    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise ConfigError("path", f"{where} is not unimem compare's JSON (no 'results' array); write one with --out")
    machine = data.get("machine", {})
    if not isinstance(machine, dict):
        raise ConfigError("path", f"{where}: 'machine' is {shown(machine)}, expected an object")
    for index, run in enumerate(data["results"]):
        _check_run(run, f"{where}, result {index + 1}")
    return Comparison(list(data["results"]), dict(machine))


def _check_run(run: object, where: str) -> None:
    """One run of a comparison holds what the table and the charts read."""
    if not isinstance(run, dict):
        raise ConfigError("path", f"{where} is {shown(run)}, expected an object")
    for name in _RUN_TEXTS:
        if not isinstance(run.get(name), str):
            raise ConfigError("path", f"{where}: {name} is {shown(run.get(name))}, expected text")
    for name in _RUN_BYTES:
        figure(run.get(name), name, where)
    required = ("parameters", "step_ms") if run.get("ok") else ()
    for name in ("parameters", "step_ms", "step_ms_min", "step_ms_max", "step_spread", "load_average"):
        value = run.get(name)
        if value is None and name not in required:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError("path", f"{where}: {name} is {shown(value)}, expected a finite number")


# --- the data the page carries -------------------------------------------------------------------


class _Arrays:
    """Every float64 array the page carries, packed one after another; a time array that two
    figures of one stream share travels once."""

    def __init__(self) -> None:
        self.layout: list[tuple[int, int]] = []  # (first value, length) of each array
        self._values = array("d")
        self._times: list[tuple[list[float], int]] = []

    def add(self, values: Sequence[float | None]) -> int:
        """Add an array (None becomes NaN: a gap); its index."""
        start = len(self._values)
        gaps = values.count(None)
        if gaps:  # found by list.index, in C: a million values with a few gaps stay fast
            values = list(values)
            at = 0
            for _ in range(gaps):
                at = values.index(None, at)
                values[at] = math.nan
        self._values.extend(array("d", values))  # type: ignore[arg-type]  # no None left
        self.layout.append((start, len(self._values) - start))
        return len(self.layout) - 1

    def add_times(self, times: list[float]) -> int:
        """Add a time array, or find the same one added before; its index."""
        for known, index in self._times:
            if known == times:
                return index
        index = self.add(times)
        self._times.append((times, index))
        return index

    def packed(self) -> str:
        """The arrays as base64 of deflated, byte-shuffled little-endian float64."""
        values = array("d", self._values)
        if sys.byteorder == "big":
            values.byteswap()
        raw = values.tobytes()
        shuffled = b"".join(raw[byte::8] for byte in range(8))
        return base64.b64encode(zlib.compress(shuffled, _COMPRESSION)).decode("ascii")


def _lane(recording: Recording, label: str, file: str | None, arrays: _Arrays) -> dict[str, Any]:
    """One recording's lane: its figures' lines, marks, failed readings, cap and what is known of it."""
    streams = Streams(recording.samples, max(1, len(recording.samples)))  # as many columns as samples: not thinned
    lines = []
    for name in FIGURES:
        times, values = streams.line(name)
        if times:
            lines.append(
                {
                    "figure": name,
                    "label": FIGURE_LABELS.get(name, name.replace("_", " ")),
                    "t": arrays.add_times(times),
                    "v": arrays.add(values),
                    "known": streams.known(name),
                    "shown": name not in _HIDDEN,
                }
            )
    errors: dict[str, int] = {}
    gaps = [
        [time, errors.setdefault(shortened(error, _TEXT_CHARS), len(errors))]
        for time, error in sorted(recording.gaps, key=_first)
        if math.isfinite(time)
    ]
    meta = recording.meta
    limit = meta.get("limit")
    return {
        "label": label,
        "file": file,
        "about": shortened(_about(recording), _TEXT_CHARS),
        "notes": _notes(recording.notes),
        "samples": len(recording.samples),
        "lines": lines,
        "marks": [
            [mark.time, shortened(mark.label, _TEXT_CHARS), mark.allocated, mark.reserved]
            for mark in sorted(recording.marks, key=_time)
            if math.isfinite(mark.time)
        ],
        "gaps": gaps,
        "errors": list(errors),
        "limit": limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None,
    }


def _notes(notes: list[str]) -> list[str]:
    """A lane's notes as the page shows them: each cut to ``_TEXT_CHARS``, at most ``_NOTES`` of them."""
    shown = [shortened(note, _TEXT_CHARS) for note in notes[:_NOTES]]
    return shown + ([f"... and {len(notes) - _NOTES} more notes"] if len(notes) > _NOTES else [])


def _time(mark: Any) -> float:
    return float(mark.time)


def _first(gap: tuple[float, str]) -> float:
    return gap[0]


def _about(recording: Recording) -> str:
    """One line on what a recording is: framework, device, rank, interval."""
    meta = recording.meta
    parts = [str(meta.get("backend") or "no framework"), f"device {meta.get('device', 0)}"]
    if meta.get("rank") is not None:
        size = meta.get("world_size")
        parts.append(f"rank {meta['rank']}" + (f" of {size}" if size is not None else ""))
    if meta.get("host"):
        parts.append(f"host {meta['host']}")
    interval = meta.get("interval")
    if isinstance(interval, (int, float)) and not isinstance(interval, bool):
        parts.append(f"every {interval:g} s")
    return " · ".join(parts)


def _title(
    recordings: list[tuple[Recording, str | None]],
    comparisons: list[tuple[Comparison, str | None]],
    lanes: tuple[RankLine, ...],
) -> str:
    if len(recordings) == 1:
        meta = recordings[0][0].meta
        if not meta and recordings[0][1]:
            return f"unimem: {recordings[0][1]}"  # a CSV keeps no metadata: its file names it
        return shortened(
            f"unimem: {meta.get('backend') or 'no framework'}, device {meta.get('device', 0)}", _TEXT_CHARS
        )
    if recordings:
        what = "ranks" if all(lane.rank is not None for lane in lanes) else "recordings"
        return f"unimem: {len(recordings)} {what}"
    machine = comparisons[0][0].machine
    return f"unimem compare · {machine.get('device', '?')} · size {machine.get('size', '?')}"


def _comparison_part(comparison: Comparison, file: str | None) -> dict[str, Any]:
    """A comparison as the page shows it: the terminal's table, its notes, and per workload the
    memory and step-time figures of each framework and configuration (None where a run failed)."""
    from unimem.compare.harness import CONFIGS, failures, table_rows, timing_notes, unsupported

    header, rows = table_rows(comparison)
    memory = "process_peak" if comparison.has_gpu else "host_peak_rss"
    results = comparison.results
    frameworks = sorted({run["framework"] for run in results})
    configs = [config for config in CONFIGS if any(run["config"] == config for run in results)]
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


# --- the page ----------------------------------------------------------------------------------


def _asset(name: str) -> str:
    return (resources.files("unimem.observe") / _PAGE / name).read_text(encoding="utf-8")


def _script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element: no ``<`` can close it or open a comment."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def _fill(manifest: dict[str, Any], packed: str) -> str:
    """The template with its slots (``{{NAME}}``) filled: the style, the scripts, the manifest, the data.

    The template is cut at its slots once, so text put in (a mark's label) is never read as a slot.
    """
    contents = {
        "TITLE": html.escape(manifest["title"]),
        "STYLE": _asset("view.css"),
        "SCRIPT": _asset("thinning.js") + _asset("view.js"),
        "MANIFEST": _script_json(manifest),
        "DATA": packed,
    }
    parts = re.split(r"\{\{([A-Z]+)\}\}", _asset("page.html"))
    return "".join(contents[part] if index % 2 else part for index, part in enumerate(parts))
