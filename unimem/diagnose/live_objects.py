"""What holds memory in this process: the largest live tensors and arrays per framework.

Read at an out-of-memory failure, while the failed step's frames are still alive. Each
backend scans its own (its ``diagnose`` topic's ``live_memory``); frameworks whose scan walks the garbage
collector's objects share one pass over ``gc.get_objects()`` (a fraction of a second for
a million objects), others list their own live arrays. Only the ``top`` largest are kept,
as descriptions (``unimem.live_memory``).
"""

from __future__ import annotations

import gc
import warnings

from unimem import registry
from unimem.errors import BackendUnavailable
from unimem.live_memory import LiveMemory

__all__ = ["scan"]


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
