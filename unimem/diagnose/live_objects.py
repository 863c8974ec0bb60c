"""What holds memory in this process: the largest live tensors and arrays per framework.

Read at an out-of-memory failure, while the failed step's frames are still alive. Each
backend scans its own (its ``diagnose`` topic's ``live_memory``); frameworks whose scan walks the garbage
collector's objects share one pass over ``gc.get_objects()`` (a fraction of a second for
a million objects), others list their own live arrays. Only the ``top`` largest are kept,
as descriptions: the report must not keep a tensor alive.

Python sees only tensors that have a Python object: autograd's saved activations and
gradients that were never read from Python live in C++ and are missing here, which is
why the report compares what it found with the allocator's ``allocated``.
"""

from __future__ import annotations

import gc
import heapq
import warnings
from dataclasses import dataclass

from unimem import registry
from unimem.errors import BackendUnavailable
from unimem.sizes import format_bytes

__all__ = ["LiveMemory", "LiveObject", "Tally", "scan"]


@dataclass(frozen=True)
class LiveObject:
    """One live tensor, array or variable, described (not referenced)."""

    framework: str
    kind: str  # "tensor", "parameter", "gradient", "array", "variable"
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    device: str

    def __str__(self) -> str:
        shape = ", ".join(str(d) for d in self.shape)
        return f"{format_bytes(self.nbytes):>10}  {self.kind} {self.dtype}[{shape}] on {self.device}"


@dataclass(frozen=True)
class LiveMemory:
    """The live tensors of one framework on the failing device: counts and the largest."""

    framework: str
    device: str | None  # the device looked at; None: every device
    count: int
    total_bytes: int
    largest: tuple[LiveObject, ...]
    method: str  # how they were found


class Tally:
    """Counts the live objects a scan finds and keeps the ``top`` largest (a min-heap:
    a scan over a million objects must not sort them all)."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.count = 0
        self.total = 0
        self._heap: list[tuple[int, int, LiveObject]] = []

    def add(self, item: LiveObject) -> None:
        self.count += 1
        self.total += item.nbytes
        entry = (item.nbytes, id(item), item)
        if len(self._heap) < self.top:
            heapq.heappush(self._heap, entry)
        elif self.top and entry[0] > self._heap[0][0]:
            heapq.heapreplace(self._heap, entry)

    def result(self, framework: str, device: str | None, method: str) -> LiveMemory:
        largest = tuple(item for _, _, item in sorted(self._heap, key=lambda entry: -entry[0]))
        return LiveMemory(framework, device, self.count, self.total, largest, method)


def scan(frameworks: list[str], places: dict[str, str | None], top: int) -> list[LiveMemory]:
    """The live tensors of each framework in ``frameworks`` (already imported ones
    only) on ``places[framework]`` (``"cuda:0"``, ``"gpu:0"``, ``"cpu"``; None: all)."""
    adapters = []
    for name in frameworks:
        try:
            adapters.append((name, registry.get_backend(name)))
        except BackendUnavailable:  # not installed: it holds nothing here
            continue
    found: list[LiveMemory] = []
    objects = gc.get_objects() if any(adapter.diagnose.scan_needs_gc for _, adapter in adapters) else []
    try:
        # Some objects warn when merely inspected (deprecated lazy proxies such as
        # torch.distributed.reduce_op): the scan must not spray the user's log.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, adapter in adapters:
                given = objects if adapter.diagnose.scan_needs_gc else []
                result = adapter.diagnose.live_memory(given, places.get(name), top)
                if result is not None:
                    found.append(result)
    finally:
        objects.clear()  # the list holds every object in the process: let go at once
    return found
