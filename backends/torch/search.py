"""What ``find_batch_size`` asks of torch: the bytes a trial may reach, the pool's overhead,
and the moment to empty the cache in the settle call.

torch is read from ``sys.modules`` only: a search that runs these has already run a step.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from unimem.memory_stats import MemoryStats

__all__ = ["at_first_forward", "capacity", "pool_overhead"]


def capacity(snapshot: MemoryStats) -> int | None:
    """The cap, and no more than the pool plus the device's free bytes: the caching allocator
    can grow only into what the device still has, whatever the cap says."""
    bounds = [snapshot.limit]
    if snapshot.reserved is not None and snapshot.device_free is not None:
        bounds.append(snapshot.reserved + snapshot.device_free)
    known = [b for b in bounds if b is not None]
    return min(known) if known else None


def pool_overhead(peak: int | None, peak_reserved: int | None) -> int:
    """The pool's bytes beyond those in use at a trial's peak: the cap bounds what the caching
    allocator reserves, which moves in whole segments, not the bytes in use."""
    if peak is None or peak_reserved is None:
        return 0
    return max(0, peak_reserved - peak)


@contextlib.contextmanager
def at_first_forward(action: Callable[[], object]) -> Iterator[None]:
    """Within: ``action()`` runs once, when the first ``nn.Module`` forward starts (a global
    forward pre-hook, removed on exit). Nothing runs if torch is not imported or no module runs."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    fired = False

    def hook(module: Any, args: Any) -> None:
        nonlocal fired
        if not fired:
            fired = True
            action()

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()
