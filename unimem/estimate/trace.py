"""A step's allocations in order, as an adapter recorded them, and what they add up to.

An adapter that runs the step without its memory (torch under fake tensors) records every
allocation and free, by size and in order, and says which part of the breakdown each allocation
is. ``replay`` plays them through the device's allocator (``unimem.estimate.allocator`` for
CUDA; exact bytes for host memory) and reads the peak of the measured step and what was in use
at that moment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from unimem.estimate.allocator import CachingAllocator, OutOfDeviceMemory

__all__ = ["PARTS", "Replayed", "Trace", "replay"]

# The parts of a peak, in the order a breakdown lists them; each allocation is one of the first six.
PARTS: dict[str, str] = {
    "parameters": "the model's parameters and buffers",
    "gradients": "gradients the backward pass leaves on the parameters",
    "optimizer": "the optimizer's state (moments, step counts)",
    "activations": "what the forward pass keeps for the backward pass (and the step's inputs)",
    "temporaries": "intermediate results freed within the pass that made them",
    "workspace": "buffers libraries keep for their kernels (cuBLAS workspaces)",
    "rounding": "the allocator's rounding: whole blocks handed out for smaller requests",
    "cache": "free blocks the allocator keeps reserved at its peak (reserved less allocated)",
}
ALLOCATED_PARTS = tuple(PARTS)[:7]  # the parts of the allocated peak


@dataclass
class Trace:
    """Allocations and frees in the order the step made them.

    Attributes:
        events (list[tuple[int, int]]): ``(allocation id, bytes)``: bytes above 0 allocate, 0 frees
            the allocation with that id.
        categories (dict[int, str]): The part of the breakdown each allocation id is (a key of ``PARTS``).
        window (int): Index of the first event of the measured step (its peak is the one predicted).
        caching (bool): Replay through the CUDA caching allocator's model; False: exact bytes (host memory).
    """

    events: list[tuple[int, int]] = field(default_factory=list)
    categories: dict[int, str] = field(default_factory=dict)
    window: int = 0
    caching: bool = True


@dataclass(frozen=True)
class Replayed:
    """What a trace adds up to.

    Attributes:
        peak (int): The measured step's peak of bytes in use (whole blocks under the caching allocator).
        reserved (int | None): The measured step's peak of bytes reserved from the device; None for host memory.
        parts (dict[str, int]): The allocated peak by part (``PARTS``'s first seven), adding up to ``peak``.
        cache (int): ``reserved - peak`` (0 without a caching allocator).
        oom (bool): Under ``limit``, the device ran out even after the allocator gave its cache back.
        released (int): Under ``limit``, how many times the allocator gave cached segments back to fit.
    """

    peak: int
    reserved: int | None
    parts: dict[str, int]
    cache: int
    oom: bool = False
    released: int = 0


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


def replay(trace: Trace, limit: int | None = None) -> Replayed:
    """The peak of the measured step, its reserved peak and its parts; with ``limit`` (bytes the
    allocator may reserve), whether the step runs out there.

    Args:
        trace: The recorded allocations.
        limit: Bytes the allocator may take from the device; None: no limit.

    Returns:
        The replay's figures. Under a limit the step's own figures are those without one (a run
        that gave its cache back reaches the same allocated peak); ``oom`` and ``released`` say
        what the limit changed.
    """
    if not trace.caching:
        live, peak = _host_peak(trace)
        oom = limit is not None and peak > limit
        return Replayed(peak, None, _by_part(trace, live), 0, oom)
    model, peak_at, _ = _run(trace, None)
    reserved, peak = model.peak_reserved, model.peak_allocated
    at_peak, _, _ = _run(trace, None, peak_at)
    requested = {key: block.requested for key, block in at_peak.live.items()}
    parts = _by_part(trace, requested)
    parts["rounding"] = at_peak.allocated - sum(requested.values())
    oom, released = False, 0
    if limit is not None:
        limited, _, oom = _run(trace, limit)
        released = limited.released
    return Replayed(peak, reserved, parts, reserved - peak, oom, released)
