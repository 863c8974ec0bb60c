"""``unimem view``: recordings and comparison results as one self-contained HTML page.

Registered on the ``unimem`` command group by main.py. Imports no framework.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from unimem.cli.exits import fail, option_error
from unimem.cli.observe import MAX_BYTES_HELP, default_output, max_bytes_option, recording_files
from unimem.errors import ConfigError, UnimemError
from unimem.sizes import format_bytes

__all__ = ["view"]


@click.command("view")
@click.argument("recordings", nargs=-1, required=True)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Page to write (default: the first file's name with .html; several: memory.rank0.json gives "
    "memory.ranks.html).",
)
@click.option("--title", default=None, help="Title of the page.")
@click.option("--open", "open_page", is_flag=True, help="Open the page in the default web browser.")
@click.option("--max-bytes", "max_bytes", default=None, help=MAX_BYTES_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print what was written as one JSON line.")
def view(
    recordings: tuple[str, ...],
    output: Path | None,
    title: str | None,
    open_page: bool,
    max_bytes: str | None,
    as_json: bool,
) -> None:
    """Memory over time as one HTML page that opens without a network: zoom, pan, hover.

    Every figure of each recording (JSON, CSV or a streamed .jsonl) on one timeline; several
    recordings (unimem view memory.rank0.json memory.rank1.json, or a quoted pattern such as
    'memory.rank*.json') are one lane per rank on one wall-clock axis. A compare.json written by
    unimem compare --out is shown as its table and charts. The wheel zooms, a drag pans, hovering
    a mark shows its figures.
    """
    import webbrowser

    from unimem.observe.files import check_target
    from unimem.view import write_view

    cap = max_bytes_option(max_bytes)
    files = recording_files(recordings)
    target = output or default_output(files, ".html")
    try:
        check_target(target, ".html")
    except ConfigError as exc:
        raise option_error(exc, "'--output'") from None
    page = write_view(files, target, title=title, max_bytes=cap)
    lanes = [
        {"label": lane.label, "rank": lane.rank, "file": lane.file, "samples": lane.samples} for lane in page.lanes
    ]
    if as_json:
        done = {"output": str(target), "bytes": page.size, "lanes": lanes, "comparisons": list(page.comparisons)}
        click.echo(json.dumps({**done, "notes": list(page.notes)}))
    else:
        shown = [f"{lane['label']} ({lane['file']}, {lane['samples']} samples)" for lane in lanes]
        shown += [f"comparison ({file})" for file in page.comparisons]
        click.echo(f"wrote {target} ({format_bytes(page.size)}): {', '.join(shown)}")
        for note in page.notes:
            click.echo(f"note: {note}")
    if open_page and not webbrowser.open(target.resolve().as_uri()):
        fail("view", UnimemError(f"no web browser to open it here; open {target.resolve().as_uri()} in one"))
