"""A recording's plain data: ``Sample``, ``Mark``, their fields, and the series that keeps them bounded.

Shared by every maker of a recording (``monitor()``, its sampler process, ``MemoryHook``), the
``Recording`` (``unimem.observe.recording``) and the loader (``unimem.observe.loading``). Figures
unimem could not know are ``None``, never 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from unimem.errors import ConfigError

__all__ = [
    "BLOCK_ROWS",
    "CSV_HEADER",
    "CSV_META_PREFIXES",
    "DEFAULT_MAX_SAMPLES",
    "FORMAT",
    "INT_FIELDS",
    "MARK_FIELDS",
    "MARK_FIGURES",
    "ROWS_FORMAT",
    "SAMPLE_FIELDS",
    "SOURCES",
    "SOURCE_DEVICE",
    "SOURCE_FRAMEWORK",
    "SOURCE_STEP",
    "BoundedSeries",
    "Mark",
    "Sample",
    "failed_readings_note",
    "merge_samples",
]

# The JSON ``to_json`` writes: the samples and the marks each as blocks of at most ``BLOCK_ROWS``,
# one block a line, a block an object of columns (one array per field). A copy cut short keeps
# every whole block; the columns load in a fraction of the time one object per sample takes.
FORMAT = "unimem.recording/3"
ROWS_FORMAT = "unimem.recording/1"  # the JSON written before: one object per sample or mark, one a line
BLOCK_ROWS = 1000

# Where a sample came from.
SOURCE_FRAMEWORK = "framework"  # the framework's allocator counters, read in this process
SOURCE_DEVICE = "device"  # NVML (device and this process) and host RSS, read by the sampler process
SOURCE_STEP = "step"  # a training step boundary (MemoryHook, Keras callback)
# The first line of a CSV written before CSVs counted their rows: the recording's metadata as JSON,
# after the name of the module that wrote it (it moved once). The earliest CSVs have no such line.
CSV_META_PREFIXES = ("# unimem.observe.recording ", "# unimem.recording ")
CSV_HEADER = "# unimem.recording/2 "  # a CSV's first line: {"rows": n, "meta": {...}} as JSON
DEFAULT_MAX_SAMPLES = 20_000


@dataclass(frozen=True)
class Sample:
    """One reading. ``time`` is Unix time; byte counts are int or None (unknown).

    ``peak`` is the highest ``allocated`` since the previous step sample (step
    samples only); ``peak_exact`` is False when it is a lower bound (JAX); ``host_peak``
    is the same for the process's resident host memory.
    ``error`` is set when the reading failed: the sample is a gap in the data.
    Each source fills only the figures it reads; the others stay None.

    Attributes:
        time (float): When it was read (Unix time, seconds).
        source (str): ``"framework"`` (allocator counters, read in this process),
            ``"device"`` (NVML and host RSS, read by the sampler process) or ``"step"``
            (a training step boundary: ``MemoryHook``, the Keras callback).
        allocated (int | None): Bytes in live tensors/arrays.
        reserved (int | None): Bytes the framework's pool holds.
        peak (int | None): Highest ``allocated`` since the previous step sample, in bytes
            (step samples only).
        peak_exact (bool | None): False when ``peak`` is a lower bound (JAX).
        process_used (int | None): NVML's bytes for this process on the device.
        device_used (int | None): Bytes in use on the whole device.
        device_total (int | None): The device's total bytes.
        host_rss (int | None): This process's resident host memory (resident set size), in bytes.
        host_peak (int | None): Highest ``host_rss`` since the previous step sample, in bytes
            (step samples only; a lower bound where the host's high-water mark cannot be reset).
        step (int | None): The step number (step samples only).
        error (str | None): Why the reading failed; None for a good reading.
    """

    time: float
    source: str
    allocated: int | None = None
    reserved: int | None = None
    peak: int | None = None
    peak_exact: bool | None = None
    process_used: int | None = None
    device_used: int | None = None
    device_total: int | None = None
    host_rss: int | None = None
    host_peak: int | None = None
    step: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Mark:
    """An event (``monitor.mark("epoch 2")``) with the framework's counters at that moment.

    Attributes:
        time (float): When it was marked (Unix time, seconds).
        label (str): The event's name.
        allocated (int | None): Bytes in live tensors/arrays then; None if unknown.
        reserved (int | None): Bytes the framework's pool held then; None if unknown.
    """

    time: float
    label: str
    allocated: int | None = None
    reserved: int | None = None


SAMPLE_FIELDS = [f.name for f in dataclasses.fields(Sample)]
MARK_FIELDS = ("time", "label", "allocated", "reserved")
MARK_FIGURES = ("allocated", "reserved")  # the figures a mark carries
INT_FIELDS = {
    "allocated",
    "reserved",
    "peak",
    "process_used",
    "device_used",
    "device_total",
    "host_rss",
    "host_peak",
    "step",
}

SOURCES = frozenset({SOURCE_FRAMEWORK, SOURCE_DEVICE, SOURCE_STEP})


def _primary(sample: Sample) -> int:
    """The figure decimation keeps the maximum of (its peaks must survive)."""
    for value in (sample.peak, sample.allocated, sample.process_used, sample.reserved, sample.device_used):
        if value is not None:
            return value
    host = sample.host_peak if sample.host_peak is not None else sample.host_rss
    return -1 if host is None else host


def _keep(a: Sample, b: Sample) -> Sample:
    """Of two neighbours, the one decimation keeps: a gap first (gaps must stay visible), then the higher."""
    if (a.error is None) != (b.error is None):
        return a if a.error is not None else b
    return a if _primary(a) >= _primary(b) else b


class BoundedSeries:
    """A list of samples that never holds more than ``capacity`` of them.

    When full, neighbouring pairs are merged (keeping the gap, else the higher
    reading, so peaks survive) and from then on every ``stride`` incoming samples
    are merged into one: resolution stays uniform over the whole run and halves
    each time the series fills, memory stays fixed.
    """

    def __init__(self, capacity: int, keep: Callable[[Any, Any], Any] = _keep) -> None:
        if capacity < 2:
            raise ConfigError("max_samples", f"expected at least 2, got {capacity}")
        self.capacity = capacity
        self.stride = 1
        self._keep = keep
        self._items: list[Any] = []
        self._pending: Any = None
        self._pending_count = 0
        self.seen = 0

    def add(self, item: Any) -> None:
        self.seen += 1
        self._pending = item if self._pending is None else self._keep(self._pending, item)
        self._pending_count += 1
        if self._pending_count < self.stride:
            return
        self._items.append(self._pending)
        self._pending, self._pending_count = None, 0
        if len(self._items) >= self.capacity:
            items = self._items
            merged = [self._keep(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]
            if len(items) % 2:
                merged.append(items[-1])
            self._items = merged
            self.stride *= 2

    def extend(self, items: Sequence[Any]) -> None:
        """``add`` each of ``items`` in turn; at once while they fit without a merge."""
        if self.stride == 1 and len(self._items) + len(items) < self.capacity:
            self._items.extend(items)
            self.seen += len(items)
            return
        for item in items:
            self.add(item)

    def items(self) -> list[Any]:
        return [*self._items, self._pending] if self._pending is not None else list(self._items)

    def __len__(self) -> int:
        return len(self._items) + (self._pending is not None)


def failed_readings_note(count: int, first: str) -> str:
    """The note a recording carries when device readings failed: how often, and the first error."""
    return f"device readings failed {count} times (gaps in the data); first error: {first}"


def merge_samples(*streams: Iterable[Sample]) -> list[Sample]:
    """Samples of several streams as one list in time order."""
    merged = [sample for stream in streams for sample in stream]
    merged.sort(key=attrgetter("time"))
    return merged
