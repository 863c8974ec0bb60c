"""Sizing several batch sizes at once: ``lower(n)`` (the user's code) in the calling thread,
the framework's sizing in threads, every outcome back in order."""

from __future__ import annotations

import threading

import pytest

from unimem.search.compile import size_all


def test_sizes_are_compiled_at_once_and_come_back_in_order() -> None:
    both = threading.Barrier(2, timeout=10)  # passes only if two sizings run at the same time
    lowered_in: list[str] = []

    def lower(n: int) -> int:
        lowered_in.append(threading.current_thread().name)
        return n

    def size(n: int) -> int:
        both.wait()
        return 10 * n

    done = size_all(lower, size, [3, 1], threads=2)
    assert [d.value for d in done] == [30, 10]
    assert [d.error for d in done] == [None, None]
    assert lowered_in == [threading.current_thread().name] * 2
    assert all(d.seconds >= 0 for d in done)


def test_each_error_comes_back_with_its_size_and_the_others_are_sized() -> None:
    def lower(n: int) -> int:
        if n == 2:
            raise MemoryError("lowering 2")
        return n

    def size(n: int) -> int:
        if n == 3:
            raise ValueError("sizing 3")
        return n

    for threads in (1, 2):
        done = size_all(lower, size, [1, 2, 3, 4], threads=threads)
        assert [d.value for d in done] == [1, None, None, 4]
        assert [type(d.error).__name__ for d in done] == ["NoneType", "MemoryError", "ValueError", "NoneType"]


def test_one_thread_lowers_and_sizes_each_size_before_the_next() -> None:
    events: list[str] = []
    size_all(lambda n: events.append(f"lower {n}") or n, lambda n: events.append(f"size {n}"), [1, 2], threads=1)
    assert events == ["lower 1", "size 1", "lower 2", "size 2"]


@pytest.mark.parametrize("threads", [0, 1, 4])
def test_no_sizes_size_nothing(threads: int) -> None:
    assert size_all(lambda n: n, lambda n: n, [], threads=threads) == []
