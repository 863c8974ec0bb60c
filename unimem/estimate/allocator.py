"""A model of PyTorch's CUDA caching allocator (its native allocator, default settings, one stream).

It replays a step's allocations and frees, in order and by size, and says what the allocator
would hold: the bytes in use (``allocated``: whole blocks, as ``max_memory_allocated`` counts them)
and the bytes taken from the device (``reserved``, as ``max_memory_reserved``). Pure arithmetic:
no framework, no device.

The rules, as the allocator applies them:

- a request is rounded up to a multiple of 512 bytes (512 at least);
- requests of at most 1 MiB come from the small pool, larger ones from the large pool;
- a request is served by the smallest free block of its pool that holds it, the lowest address
  first among blocks of one size;
- with none, a segment is taken from the device: 2 MiB for the small pool, 20 MiB for a large
  request under 10 MiB, else the request rounded up to 2 MiB;
- a block larger than the request is split when the rest is at least 512 bytes (small pool) or
  more than 1 MiB (large pool); otherwise the whole block is handed out and counted as allocated;
- a freed block merges with the free blocks beside it in its segment;
- segments go back to the device only when it runs out: then every segment with nothing in use
  is given back and the request tried once more (what ``limit`` models); nothing else frees them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

__all__ = [
    "KIB",
    "LARGE_SEGMENT",
    "MIB",
    "MIN_BLOCK",
    "MIN_LARGE_ALLOC",
    "ROUND_LARGE",
    "SMALL_SEGMENT",
    "SMALL_SIZE",
    "CachingAllocator",
    "OutOfDeviceMemory",
    "round_request",
    "segment_size",
]

KIB = 1024
MIB = 1024 * KIB
MIN_BLOCK = 512  # every request is rounded up to a multiple of this
SMALL_SIZE = 1 * MIB  # requests up to this come from the small pool
SMALL_SEGMENT = 2 * MIB  # the small pool's segments
LARGE_SEGMENT = 20 * MIB  # the segment a large request under MIN_LARGE_ALLOC gets
MIN_LARGE_ALLOC = 10 * MIB  # from here a segment is the request rounded up to ROUND_LARGE
ROUND_LARGE = 2 * MIB


class OutOfDeviceMemory(Exception):
    """The modelled device has no room for a segment even after the cache was given back."""

    def __init__(self, requested: int, reserved: int, limit: int) -> None:
        super().__init__(f"a {requested}-byte segment does not fit: {reserved} of {limit} bytes reserved")
        self.requested = requested
        self.reserved = reserved
        self.limit = limit


def round_request(nbytes: int) -> int:
    """The block size a request of ``nbytes`` is given: a multiple of 512, at least 512."""
    return MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    """The segment taken from the device for a rounded request of ``size`` no free block holds."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False)
class _Block:
    address: int
    size: int
    small: bool
    segment: int
    allocated: bool = False
    requested: int = 0
    prev: _Block | None = field(default=None, repr=False)
    next: _Block | None = field(default=None, repr=False)

    @property
    def key(self) -> tuple[int, int]:
        return (self.size, self.address)


class _Pool:
    """The free blocks of one pool, ordered by (size, address): the allocator's best-fit order."""

    def __init__(self) -> None:
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[tuple[int, int], _Block] = {}

    def add(self, block: _Block) -> None:
        bisect.insort(self.keys, block.key)
        self.blocks[block.key] = block

    def remove(self, block: _Block) -> None:
        key = block.key
        del self.keys[bisect.bisect_left(self.keys, key)]
        del self.blocks[key]

    def best_fit(self, size: int) -> _Block | None:
        index = bisect.bisect_left(self.keys, (size, -1))
        return self.blocks[self.keys[index]] if index < len(self.keys) else None


class CachingAllocator:
    """The allocator's state over a replay: blocks in use, free blocks per pool, segments.

    ``malloc(key, nbytes)`` and ``free(key)`` replay one event each; ``allocated`` and ``reserved``
    are the current bytes, ``peak_allocated`` and ``peak_reserved`` their highest since
    ``reset_peaks()``. With ``limit`` (bytes the allocator may reserve), a segment past it first
    gives back every segment with nothing in use, then raises ``OutOfDeviceMemory``.

    Example:
        ```python
        model = CachingAllocator()
        model.malloc("a", 3000)     # 3072 bytes of a new 2 MiB segment
        model.free("a")             # kept in the cache: reserved stays 2 MiB
        ```
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.small = _Pool()
        self.large = _Pool()
        self.live: dict[object, _Block] = {}
        self.segments: dict[int, _Block] = {}  # segment id -> its first block
        self.segment_sizes: dict[int, int] = {}
        self.allocated = 0
        self.requested = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.released = 0  # segments given back because the device ran out
        self._next_address = 0
        self._next_segment = 0

    def reset_peaks(self) -> None:
        """Restart both peaks at the current figures (``torch.cuda.reset_peak_memory_stats``)."""
        self.peak_allocated = self.allocated
        self.peak_reserved = self.reserved

    def malloc(self, key: object, nbytes: int) -> int:
        """Hand out a block for a request of ``nbytes`` under ``key``; returns the block's size."""
        if key in self.live:
            raise ValueError(f"{key!r} is already allocated")
        size = round_request(nbytes)
        pool = self.small if size <= SMALL_SIZE else self.large
        block = pool.best_fit(size)
        if block is None:
            block = self._new_segment(size, pool is self.small)
        else:
            pool.remove(block)
        remaining = block.size - size
        if remaining >= MIN_BLOCK if block.small else remaining > SMALL_SIZE:
            rest = _Block(block.address + size, remaining, block.small, block.segment, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.add(rest)
        block.allocated = True
        block.requested = nbytes
        self.live[key] = block
        self.allocated += block.size
        self.requested += nbytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block.size

    def free(self, key: object) -> None:
        """Give back the block ``key`` holds; it merges with free neighbours in its segment."""
        block = self.live.pop(key)
        block.allocated = False
        self.allocated -= block.size
        self.requested -= block.requested
        block.requested = 0
        pool = self.small if block.small else self.large
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                pool.remove(neighbour)
                self._merge(block, neighbour)
        pool.add(block)

    def block_size(self, key: object) -> int:
        """The size of the block ``key`` holds now."""
        return self.live[key].size

    def largest_free_block(self) -> int:
        """The largest block in the cache, either pool (0 when the cache is empty)."""
        sizes = [pool.keys[-1][0] for pool in (self.small, self.large) if pool.keys]
        return max(sizes, default=0)

    def _merge(self, block: _Block, other: _Block) -> None:
        if other is block.prev:
            block.address = other.address
            block.prev = other.prev
            if other.prev is not None:
                other.prev.next = block
            else:
                self.segments[block.segment] = block
        else:
            block.next = other.next
            if other.next is not None:
                other.next.prev = block
        block.size += other.size

    def _new_segment(self, size: int, small: bool) -> _Block:
        wanted = segment_size(size)
        if self.limit is not None and self.reserved + wanted > self.limit:
            self._release_cached()
            if self.reserved + wanted > self.limit:
                raise OutOfDeviceMemory(wanted, self.reserved, self.limit)
        segment = self._next_segment
        self._next_segment += 1
        block = _Block(self._next_address, wanted, small, segment)
        self._next_address += wanted
        self.segments[segment] = block
        self.segment_sizes[segment] = wanted
        self.reserved += wanted
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def _release_cached(self) -> None:
        """Give every segment with nothing in use back to the device (the allocator's last resort)."""
        for segment, first in list(self.segments.items()):
            if not first.allocated and first.next is None and first.prev is None:
                (self.small if first.small else self.large).remove(first)
                del self.segments[segment]
                self.reserved -= self.segment_sizes.pop(segment)
                self.released += 1
