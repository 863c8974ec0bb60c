"""The model of torch's CUDA caching allocator against cases computed by hand from its rules, and a
trace's replay: the parts of a peak add up to it. Pure arithmetic: no framework."""

from __future__ import annotations

import pytest

from unimem.estimate.allocator import MIB, CachingAllocator, OutOfDeviceMemory, round_request, segment_size
from unimem.estimate.trace import replay
from unimem.step_estimates import Trace


@pytest.mark.parametrize(
    ("nbytes", "block"), [(1, 512), (511, 512), (512, 512), (513, 1024), (3000, 3072), (MIB + 1, MIB + 512)]
)
def test_requests_are_rounded_up_to_512_bytes(nbytes: int, block: int) -> None:
    assert round_request(nbytes) == block


@pytest.mark.parametrize(
    ("size", "segment"),
    [(512, 2 * MIB), (MIB, 2 * MIB), (MIB + 512, 20 * MIB), (10 * MIB - 512, 20 * MIB), (10 * MIB, 10 * MIB),
     (11 * MIB, 12 * MIB), (21 * MIB + 512, 22 * MIB)],
)  # fmt: skip
def test_segments_small_2mib_medium_20mib_large_rounded_to_2mib(size: int, segment: int) -> None:
    assert segment_size(size) == segment


def test_small_requests_share_one_2mib_segment() -> None:
    model = CachingAllocator()
    assert model.malloc("a", 3000) == 3072
    assert model.malloc("b", 1000) == 1024
    assert (model.allocated, model.reserved) == (4096, 2 * MIB)
    model.malloc("c", MIB)  # the small pool's largest request, from what is left of the segment
    assert model.reserved == 2 * MIB
    model.malloc("d", MIB)  # no room left: a second segment
    assert model.reserved == 4 * MIB


def test_the_pools_do_not_serve_each_other() -> None:
    model = CachingAllocator()
    model.malloc("small", 1000)
    model.free("small")  # a free 2 MiB segment in the small pool
    model.malloc("large", MIB + 1)  # a large request: a 20 MiB segment of its own
    assert model.reserved == 22 * MIB


def test_a_medium_request_splits_a_20mib_segment_and_the_rest_serves_the_next() -> None:
    model = CachingAllocator()
    model.malloc("a", 5 * MIB)
    model.malloc("b", 5 * MIB)
    assert (model.allocated, model.reserved) == (10 * MIB, 20 * MIB)


def test_a_large_block_is_not_split_for_a_rest_of_1mib_or_less() -> None:
    model = CachingAllocator()
    assert model.malloc("a", 11 * MIB) == 12 * MIB  # segment 12 MiB, rest 1 MiB: handed out whole
    assert model.allocated == 12 * MIB
    model.free("a")
    assert model.malloc("b", 10 * MIB + 1) == 10 * MIB + 512  # rest 2 MiB - 512 B > 1 MiB: split
    model.free("b")
    assert model.malloc("c", 19 * MIB + MIB // 2) == 20 * MIB  # a 20 MiB segment, rest 0.5 MiB: whole


def test_the_smallest_free_block_that_holds_the_request_serves_it() -> None:
    model = CachingAllocator()
    model.malloc("big", 50 * MIB)
    model.malloc("mid", 30 * MIB)
    model.free("big")
    model.free("mid")
    model.malloc("x", 25 * MIB)  # from the 30 MiB block, not the 50 MiB one
    model.malloc("y", 45 * MIB)  # the 50 MiB block is still whole
    assert model.reserved == 80 * MIB
    assert model.largest_free_block() == 5 * MIB  # 50 - 45 and 30 - 25, both 5 MiB


def test_among_blocks_of_one_size_the_lowest_address_serves() -> None:
    model = CachingAllocator()
    for key in ("first", "second"):
        model.malloc(key, 30 * MIB)
    model.free("second")
    model.free("first")
    model.malloc("x", 30 * MIB)
    assert model.live["x"].address == 0


def test_freed_neighbours_merge_within_their_segment() -> None:
    model = CachingAllocator()
    for key in ("a", "b", "c"):
        model.malloc(key, 6 * MIB)  # one 20 MiB segment: 6 + 6 + 6, 2 MiB free at its end
    model.free("a")
    model.free("b")  # merges with a: one free 12 MiB block
    model.malloc("d", 10 * MIB)  # fits the merged block: no new segment
    assert model.reserved == 20 * MIB
    model.free("c")
    model.free("d")
    assert model.largest_free_block() == 20 * MIB  # the whole segment again


def test_blocks_of_different_segments_do_not_merge() -> None:
    model = CachingAllocator()
    model.malloc("a", 10 * MIB)
    model.malloc("b", 10 * MIB)  # a segment of its own, next in address
    model.free("a")
    model.free("b")
    assert model.largest_free_block() == 10 * MIB
    model.malloc("c", 20 * MIB)
    assert model.reserved == 40 * MIB


def test_peaks_follow_reset() -> None:
    model = CachingAllocator()
    model.malloc("a", 30 * MIB)
    model.free("a")
    model.reset_peaks()
    assert (model.peak_allocated, model.peak_reserved) == (0, 30 * MIB)
    model.malloc("b", 10 * MIB)
    assert model.peak_allocated == 10 * MIB


def test_under_a_limit_the_cache_is_given_back_before_running_out() -> None:
    model = CachingAllocator(limit=50 * MIB)
    model.malloc("a", 30 * MIB)
    model.free("a")  # 30 MiB cached
    model.malloc("b", 40 * MIB)  # 30 + 40 > 50: the cached segment goes back first
    assert (model.reserved, model.released) == (40 * MIB, 1)
    with pytest.raises(OutOfDeviceMemory):
        model.malloc("c", 20 * MIB)  # 40 in use: nothing to give back
    assert model.reserved == 40 * MIB


def test_a_block_in_use_twice_is_refused() -> None:
    model = CachingAllocator()
    model.malloc("a", 100)
    with pytest.raises(ValueError, match="already allocated"):
        model.malloc("a", 100)


def _trace() -> Trace:
    """Parameters, a first step (an activation, a temporary, a gradient, optimizer state) and a second."""
    trace = Trace(categories={1: "parameters", 2: "workspace"})
    trace.events += [(1, 40 * MIB), (2, 32 * MIB)]
    for step, base in enumerate((10, 20)):
        if step == 1:
            trace.window = len(trace.events)
        act, tmp, grad, opt = base, base + 1, base + 2, base + 3
        trace.categories |= {act: "activations", tmp: "temporaries", grad: "gradients", opt: "optimizer"}
        trace.events += [(act, 25 * MIB + 100), (tmp, 3 * MIB), (tmp, 0), (grad, 40 * MIB), (act, 0)]
        if step == 0:
            trace.events += [(opt, 80 * MIB)]
        trace.events += [(grad, 0)]
    return trace


def test_a_replay_parts_add_up_to_its_peak_and_reserved() -> None:
    replayed = replay(_trace())
    parts = replayed.parts
    assert sum(parts.values()) == replayed.peak
    assert replayed.peak + replayed.cache == replayed.reserved
    assert parts["parameters"] == 40 * MIB and parts["workspace"] == 32 * MIB and parts["optimizer"] == 80 * MIB
    assert parts["activations"] == 25 * MIB + 100 and parts["gradients"] == 40 * MIB
    assert parts["rounding"] == 512 - 100 + (26 * MIB - (25 * MIB + 512))  # 25 MiB + 100 B holds a 26 MiB block


def test_host_memory_is_replayed_in_exact_bytes() -> None:
    trace = _trace()
    trace.caching = False
    replayed = replay(trace)
    assert replayed.reserved is None and replayed.cache == 0 and replayed.required == replayed.peak
    assert replayed.peak == (40 + 32 + 80 + 25 + 40) * MIB + 100
    assert sum(replayed.parts.values()) == replayed.peak


def test_the_least_memory_a_step_runs_in_lies_between_its_peak_and_reserved() -> None:
    trace = _trace()
    replayed = replay(trace)
    assert replayed.reserved is not None
    assert replayed.peak <= replayed.required <= replayed.reserved
    assert replayed.required % (2 * MIB) == 0
    assert not _runs_out(trace, replayed.required)
    assert _runs_out(trace, replayed.required - 2 * MIB)


def _runs_out(trace: Trace, limit: int) -> bool:
    model = CachingAllocator(limit)
    try:
        for key, nbytes in trace.events:
            model.malloc(key, nbytes) if nbytes else model.free(key)
    except OutOfDeviceMemory:
        return True
    return False
