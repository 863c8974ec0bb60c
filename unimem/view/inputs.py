"""What ``write_view`` is handed, sorted: recordings and comparisons, as objects or their files,
each file read as a recording or else as ``unimem compare``'s JSON."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from unimem.compare.harness import Comparison
from unimem.compare.loading import check_run, read_comparison
from unimem.errors import ConfigError
from unimem.observe.recording import Recording, load_recording

__all__ = ["sort_inputs"]


def sort_inputs(
    inputs: Sequence[Recording | Comparison | str | os.PathLike[str]], max_bytes: int | None
) -> tuple[list[tuple[Recording, str | None]], list[tuple[Comparison, str | None]]]:
    """The recordings and the comparisons among ``inputs``, each with its file's name (None for an object).

    Raises:
        ConfigError: ``inputs`` is not a list of recordings, comparisons or their files, it is
            empty, or a file or a comparison passed in is damaged (the message says which).
    """
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
                check_run(run, f"comparison {len(comparisons) + 1}, result {index + 1}")
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
        comparison = read_comparison(path, max_bytes)
        if comparison is None:
            raise  # not a comparison either: the recording's error says what is wrong
        return comparison
