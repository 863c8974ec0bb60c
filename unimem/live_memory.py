"""The live tensors and arrays of one framework, described: ``LiveObject``, ``LiveMemory``, and
``Tally``, which counts a scan and keeps the ``top`` largest.

Each backend's ``diagnose`` topic answers ``live_memory`` with these; ``unimem.diagnose.live_objects``
runs the scan over the frameworks at an out-of-memory failure. Only descriptions are kept: the
report must not keep a tensor alive.

Python sees only tensors that have a Python object: autograd's saved activations and
gradients that were never read from Python live in C++ and are missing here, which is
why the report compares what it found with the allocator's ``allocated``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from unimem.sizes import format_bytes

__all__ = ["LiveMemory", "LiveObject", "Tally"]


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
