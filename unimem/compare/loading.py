"""``unimem compare``'s JSON (``Comparison.as_dict()``) read back and checked, run by run: a
comparison read from a file holds what its table and charts read, or a ``ConfigError`` names the
file, the run and the figure. The file itself is read as a recording's is (size cap, encoding)."""

from __future__ import annotations

import math
import os

from unimem.compare.harness import Comparison
from unimem.errors import ConfigError
from unimem.observe.files import figure, parse_json, read_recording, shown
from unimem.observe.loading import JSON_MEMORY

__all__ = ["check_run", "load_comparison", "read_comparison"]

_RUN_TEXTS = ("framework", "workload", "config")
_RUN_BYTES = (
    "start_process_used",
    "start_host_rss",
    "peak_allocated",
    "peak_reserved",
    "process_peak",
    "host_peak_rss",
)


def read_comparison(path: str | os.PathLike[str], max_bytes: int | None) -> Comparison | None:
    """The comparison a JSON file holds, its figures checked; None when the document is no
    comparison (not an object with ``results``, or a recording's, which names its ``format``).

    Raises:
        ConfigError: The file cannot be read or parsed, or it is a comparison whose runs are
            damaged (see ``load_comparison``).
    """
    content, source = read_recording(path, max_bytes, JSON_MEMORY)
    data = parse_json(content, str(source))
    if not isinstance(data, dict) or "results" not in data or "format" in data:
        return None
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
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise ConfigError("path", f"{where} is not unimem compare's JSON (no 'results' array); write one with --out")
    machine = data.get("machine", {})
    if not isinstance(machine, dict):
        raise ConfigError("path", f"{where}: 'machine' is {shown(machine)}, expected an object")
    for index, run in enumerate(data["results"]):
        check_run(run, f"{where}, result {index + 1}")
    return Comparison(list(data["results"]), dict(machine))


def check_run(run: object, where: str) -> None:
    """One run of a comparison holds what the table and the charts read.

    Raises:
        ConfigError: ``run`` is not an object, names no framework, workload or configuration, or
            holds a figure that is not a number; the message starts with ``where``.
    """
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
