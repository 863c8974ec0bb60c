"""A recording as the page carries it: one lane of lines, marks, failed readings and its cap, the
samples packed into float64 arrays.

Every sample travels (nothing is thinned here: the page thins what is in view at each draw). The
arrays travel as float64 (exact for byte counts below 2**53), byte-shuffled (the first byte of
every value, then the second, ...: a figure's high bytes repeat, and deflate packs them) and
deflated, in base64; docs/guides/view.md gives the page's size per million samples.
"""

from __future__ import annotations

import base64
import math
import sys
import zlib
from array import array
from collections.abc import Sequence
from typing import Any

from unimem.observe.plotting import FIGURE_LABELS, Streams
from unimem.observe.recording import Recording
from unimem.observe.thinning import shortened

__all__ = ["FIGURES", "TEXT_CHARS", "Arrays", "recording_lane"]

# Every byte figure a sample can carry, in the order the legend lists them.
FIGURES = ("allocated", "reserved", "peak", "process_used", "device_used", "device_total", "host_rss", "host_peak")
# Listed but not drawn until clicked: the device's whole memory would flatten every other line.
_HIDDEN = frozenset({"device_total"})
_COMPRESSION = 1  # zlib level: a tenth larger than level 6, a quarter of its time on a million samples
# Text read from a recording travels cut to what the page can show (a mark's label of megabytes
# must not make a page of megabytes), and at most so many notes a lane.
TEXT_CHARS = 500
_NOTES = 100


class Arrays:
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


def recording_lane(recording: Recording, label: str, file: str | None, arrays: Arrays) -> dict[str, Any]:
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
        [time, errors.setdefault(shortened(error, TEXT_CHARS), len(errors))]
        for time, error in sorted(recording.gaps, key=_first)
        if math.isfinite(time)
    ]
    meta = recording.meta
    limit = meta.get("limit")
    return {
        "label": label,
        "file": file,
        "about": shortened(_about(recording), TEXT_CHARS),
        "notes": _notes(recording.notes),
        "samples": len(recording.samples),
        "lines": lines,
        "marks": [
            [mark.time, shortened(mark.label, TEXT_CHARS), mark.allocated, mark.reserved]
            for mark in sorted(recording.marks, key=_time)
            if math.isfinite(mark.time)
        ],
        "gaps": gaps,
        "errors": list(errors),
        "limit": limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None,
    }


def _notes(notes: list[str]) -> list[str]:
    """A lane's notes as the page shows them: each cut to ``TEXT_CHARS``, at most ``_NOTES`` of them."""
    shown = [shortened(note, TEXT_CHARS) for note in notes[:_NOTES]]
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
