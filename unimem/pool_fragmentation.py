"""Fragmentation of a framework's memory pool: free bytes a large request cannot use.

``stats()`` must stay cheap, so figures that cost a walk over the allocator's blocks
(torch's ``memory_snapshot()``) are read here, on request, by a backend method
``fragmentation(device)`` that answers a dict (or None where the framework exposes
nothing): ``free_in_pool`` (bytes the pool holds that no tensor uses),
``largest_free_block`` and ``free_blocks`` (how many pieces), each an int or None.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from unimem import registry
from unimem.config import check_device
from unimem.memory_stats import MemoryStats
from unimem.sizes import format_bytes

__all__ = ["Fragmentation", "fragmentation", "with_fragmentation"]


@dataclass(frozen=True)
class Fragmentation:
    """Free space inside one backend's pool on one device; unknown figures are None.

    ``share`` is the part of the pool's free bytes the largest free block cannot
    serve: 0 when the free space is one block (or there is none), near 1 when it is
    in pieces too small for a large request. ``str()`` reads as one line.

    Attributes:
        backend (str): The backend whose pool this is.
        device (int): The device index.
        free_in_pool (int | None): Bytes the pool holds that no tensor uses.
        largest_free_block (int | None): The largest contiguous free block, in bytes.
        free_blocks (int | None): How many free pieces the pool holds.
        source (str | None): The call the figures come from; None when there are none.
    """

    backend: str
    device: int
    free_in_pool: int | None = None
    largest_free_block: int | None = None
    free_blocks: int | None = None
    source: str | None = None  # the call the figures come from; None when there are none

    @property
    def share(self) -> float | None:
        """Part of the pool's free bytes the largest free block cannot serve, in [0, 1].

        None when the free bytes or the largest block are unknown.
        """
        if self.free_in_pool is None or self.largest_free_block is None:
            return None
        if self.free_in_pool <= 0:
            return 0.0
        return max(0.0, min(1.0, 1.0 - self.largest_free_block / self.free_in_pool))

    def as_dict(self) -> dict[str, Any]:
        """Every field plus ``share``, JSON-ready (unknown figures are None)."""
        data = dataclasses.asdict(self)
        data["share"] = self.share
        return data

    def __str__(self) -> str:
        if self.share is None:
            return f"{self.backend} device {self.device}: fragmentation unknown ({self.source or 'not exposed'})"
        pieces = "" if self.free_blocks is None else f" in {self.free_blocks} blocks"
        return (
            f"{self.backend} device {self.device}: {self.share:.1%} fragmented; "
            f"{format_bytes(self.free_in_pool)} free in the pool{pieces}, "
            f"largest block {format_bytes(self.largest_free_block)}"
        )


def read(name: str, device: int) -> Fragmentation:
    """``name``'s figures on ``device``, from its adapter (the base answers None: unknown).
    The source is the call its capability table names for fragmentation."""
    figures = registry.get_backend(name).fragmentation(device)
    if not figures:
        return Fragmentation(name, device)
    support = registry.capability_table(name).get("fragmentation")
    return Fragmentation(
        name,
        device,
        free_in_pool=figures.get("free_in_pool"),
        largest_free_block=figures.get("largest_free_block"),
        free_blocks=figures.get("free_blocks"),
        source=support.api if support is not None and support.api else None,
    )


def fragmentation(backend: str | None = None, device: int = 0) -> Fragmentation:
    """How fragmented ``backend``'s pool on ``device`` is, from what the framework exposes.

    torch: a walk over ``torch.cuda.memory_snapshot()`` (milliseconds for thousands of
    blocks, which is why ``stats()`` does not do it); JAX: XLA's own figures;
    TensorFlow and NVML: unknown (every figure None). Before the framework started its
    device runtime every figure is None. ``backend=None`` picks like ``stats()``.
    ``capabilities(backend)["fragmentation"]`` says what each backend exposes.

    Args:
        backend: A backend name or alias, or None (default) for the query rule of
            ``stats()`` (with no framework configured or started: the framework-free
            view, every figure None).
        device: The device index (default 0).

    Returns:
        The pool's free bytes, largest free block and number of free blocks (each None
        where unknown), and ``share``, the part of the free bytes the largest block
        cannot serve.

    Raises:
        ConfigError: ``device`` is not an index of 0 or more, ``backend`` is unknown, or,
            with ``backend=None``, two frameworks are candidates: pass ``backend=``.
        BackendUnavailable: The named backend's framework is not installed.

    Example:
        ```python
        frag = unimem.fragmentation("torch")
        print(frag)  # "torch device 0: ...% fragmented; ... free in the pool ..., largest block ..."
        print(frag.share, frag.largest_free_block)  # None where unknown
        ```
    """
    device = check_device(device)
    name = registry.resolve(backend, "query")
    if name is None:  # the framework-free view has no pool: every figure is unknown
        return Fragmentation(registry.FRAMEWORK_FREE, device)
    return read(name, device)


def with_fragmentation(snapshot: MemoryStats) -> MemoryStats:
    """``snapshot`` with ``largest_free_block`` filled in where ``stats()`` leaves it None
    and the backend can tell (torch, through its memory snapshot)."""
    if snapshot.largest_free_block is not None or not registry.is_framework(snapshot.backend):
        return snapshot
    found = read(snapshot.backend, snapshot.device)
    if found.largest_free_block is None:
        return snapshot
    return dataclasses.replace(snapshot, largest_free_block=found.largest_free_block)
