"""A step's allocations in order, as an adapter recorded them, and what they add up to.

An adapter that runs the step without its memory (torch under fake tensors) records every
allocation and free, by size and in order, and says which part of the breakdown each allocation
is. ``replay`` plays them through the device's allocator (``unimem.estimate.allocator`` for
CUDA; exact bytes for host memory) and reads the peak of the measured step and what was in use
at that moment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unimem.estimate.allocator import ROUND_LARGE, CachingAllocator, OutOfDeviceMemory
from unimem.step_estimates import ALLOCATED_PARTS, Trace

__all__ = ["Replayed", "replay"]


@dataclass(frozen=True)
class Replayed:
    """What a trace adds up to.

    Attributes:
        peak (int): The measured step's peak of bytes in use (whole blocks under the caching allocator).
        reserved (int | None): The measured step's peak of bytes reserved from the device; None for host memory.
        parts (dict[str, int]): The allocated peak by part (``PARTS``'s first seven), adding up to ``peak``.
        cache (int): ``reserved - peak`` (0 without a caching allocator).
        required (int): The least memory the step runs in: the allocator's smallest limit under which it does
            not run out, giving its cache back where it must (``peak`` without a caching allocator).
    """

    peak: int
    reserved: int | None
    parts: dict[str, int]
    cache: int
    required: int


def _run(trace: Trace, limit: int | None, stop: int | None = None) -> tuple[CachingAllocator, int, bool]:
    """Replay ``trace`` (up to event ``stop``) through the caching allocator's model; returns the model,
    the index of the event at the window's allocated peak, and whether the device ran out."""
    model = CachingAllocator(limit)
    peak_at, peak = trace.window, -1
    for index, (key, nbytes) in enumerate(trace.events[:stop]):
        if index == trace.window:
            model.reset_peaks()
            peak = model.allocated
            peak_at = index
        try:
            if nbytes:
                model.malloc(key, nbytes)
            else:
                model.free(key)
        except OutOfDeviceMemory:
            return model, peak_at, True
        if index >= trace.window and model.allocated > peak:
            peak, peak_at = model.allocated, index + 1
    return model, peak_at, False


def _host_peak(trace: Trace) -> tuple[dict[int, int], int]:
    """Exact bytes: the allocations live at the window's peak, and the peak."""
    live: dict[int, int] = {}
    best: dict[int, int] = {}
    total, peak = 0, -1
    for index, (key, nbytes) in enumerate(trace.events):
        if index == trace.window:
            peak, best = total, dict(live)
        if nbytes:
            live[key] = nbytes
            total += nbytes
        else:
            total -= live.pop(key)
        if index >= trace.window and total > peak:
            peak, best = total, dict(live)
    if trace.window >= len(trace.events):
        peak, best = total, dict(live)
    return best, peak


def _by_part(trace: Trace, sizes: dict[Any, int]) -> dict[str, int]:
    parts = dict.fromkeys(ALLOCATED_PARTS, 0)
    for key, nbytes in sizes.items():
        parts[trace.categories.get(key, "temporaries")] += nbytes
    return parts


def _least_limit(trace: Trace, peak: int, reserved: int) -> int:
    """The smallest limit (a whole number of 2 MiB, as every segment is) under which the replay does not
    run out, between the allocated peak and the reserved peak; found by bisection."""
    unit = ROUND_LARGE
    low, high = -(-peak // unit) - 1, -(-reserved // unit)  # low runs out (or is below the peak); high does not
    while high - low > 1:
        middle = (low + high) // 2
        if _run(trace, middle * unit)[2]:
            low = middle
        else:
            high = middle
    return high * unit


def replay(trace: Trace) -> Replayed:
    """The measured step's peak, its reserved peak and its parts, and the least memory it runs in.

    Args:
        trace: The recorded allocations.

    Returns:
        The replay's figures.
    """
    if not trace.caching:
        live, peak = _host_peak(trace)
        return Replayed(peak, None, _by_part(trace, live), 0, peak)
    model, peak_at, _ = _run(trace, None)
    reserved, peak = model.peak_reserved, model.peak_allocated
    at_peak, _, _ = _run(trace, None, peak_at)
    requested = {key: block.requested for key, block in at_peak.live.items()}
    parts = _by_part(trace, requested)
    parts["rounding"] = at_peak.allocated - sum(requested.values())
    return Replayed(peak, reserved, parts, reserved - peak, _least_limit(trace, peak, reserved))
