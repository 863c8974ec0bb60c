"""Memory over time in the browser: one self-contained HTML page, zoomable, marks on hover.

``write_view`` turns recordings and ``unimem compare`` results into one page. Each recording is
a lane (several are ranks, labelled as ``plot_recordings`` labels them) with every figure it
holds on one wall-clock axis, its marks and its failed readings; each comparison is a table and
charts. The script, the style and the data are inside the page: it opens without a network.

The page draws on a 2D canvas (no WebGL: a headless machine has no GPU). Every sample travels in
the page (``unimem.view.lanes`` packs them), and each draw thins what is in view to the canvas's
width in pixels by the rule of ``unimem.observe.thinning`` (first, lowest, highest and last point
per pixel column): the PNG's rule, written once in Python and mirrored line for line by
``assets/thinning.js``, which a test holds to the same points. So a peak seen in the whole run is
there at every zoom level.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from unimem.compare.harness import Comparison
from unimem.errors import ConfigError
from unimem.observe.files import check_max_bytes, check_target, write_atomically
from unimem.observe.plotting import RankLine, rank_labels, times_of
from unimem.observe.recording import Recording
from unimem.observe.thinning import axis_origin, shortened
from unimem.view.comparisons import comparison_part
from unimem.view.inputs import sort_inputs
from unimem.view.lanes import FIGURES, TEXT_CHARS, Arrays, recording_lane
from unimem.view.template import fill

__all__ = ["FIGURES", "ViewPage", "view_html", "write_view"]


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
        unimem.view.write_view(["memory.rank0.json", "memory.rank1.json"], "memory.html")
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
    recordings, comparisons = sort_inputs(inputs, check_max_bytes(max_bytes))
    if title is not None and not isinstance(title, str):
        raise ConfigError("title", f"expected text or None, got {type(title).__name__}")
    arrays = Arrays()
    labelled, notes = rank_labels(recordings) if len(recordings) > 1 else (_single(recordings), [])
    order = sorted(range(len(recordings)), key=lambda i: (labelled[i][1] is None, labelled[i][1] or 0, i))
    origin = axis_origin([(recording.meta.get("started"), times_of(recording)) for recording, _ in recordings])
    lanes = [recording_lane(recordings[i][0], labelled[i][0], recordings[i][1], arrays) for i in order]
    drawn = tuple(
        RankLine(labelled[i][0], labelled[i][1], recordings[i][1], len(recordings[i][0].samples)) for i in order
    )
    manifest = {
        "title": title or _title(recordings, comparisons, drawn),
        "origin": origin,
        "arrays": arrays.layout,
        "lanes": lanes,
        "notes": notes,
        "comparisons": [comparison_part(comparison, file) for comparison, file in comparisons],
    }
    page = fill(manifest, arrays.packed())
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


def _title(
    recordings: list[tuple[Recording, str | None]],
    comparisons: list[tuple[Comparison, str | None]],
    lanes: tuple[RankLine, ...],
) -> str:
    if len(recordings) == 1:
        meta = recordings[0][0].meta
        if not meta and recordings[0][1]:
            return f"unimem: {recordings[0][1]}"  # a CSV keeps no metadata: its file names it
        return shortened(f"unimem: {meta.get('backend') or 'no framework'}, device {meta.get('device', 0)}", TEXT_CHARS)
    if recordings:
        what = "ranks" if all(lane.rank is not None for lane in lanes) else "recordings"
        return f"unimem: {len(recordings)} {what}"
    machine = comparisons[0][0].machine
    return f"unimem compare · {machine.get('device', '?')} · size {machine.get('size', '?')}"
