"""Sizing several batch sizes of a step at once, for the batch search's predictions.

``lower(n)`` is the user's code: it runs in the calling thread, one size after another.
What it returns is then sized by the framework (``adapter.search.predict_peak`` compiles it), in
threads where the framework allows (``adapter.search.predicts_concurrently``): XLA compiles with the
interpreter released, so two sizes compiled at once take about the time of one and a third
(docs/measurements.md, "What a compilation costs"). No framework is imported here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

__all__ = ["Sized", "size_all"]

T = TypeVar("T")


@dataclass
class Sized(Generic[T]):
    """One size's outcome: what ``size`` returned, or the error lowering or sizing raised, and
    the seconds both took (in threads, each its own)."""

    value: T | None
    error: BaseException | None
    seconds: float


def _timed(work: Callable[[], T], began: float) -> Sized[T]:
    try:
        value = work()
    except Exception as exc:  # handed back: the caller decides which errors stop the search
        return Sized(None, exc, time.perf_counter() - began)
    return Sized(value, None, time.perf_counter() - began)


def size_all(lower: Callable[[int], Any], size: Callable[[Any], T], sizes: list[int], threads: int) -> list[Sized[T]]:
    """``size(lower(n))`` for each of ``sizes``, in order. With ``threads`` above 1, every ``lower(n)``
    first, here, then the sizing in that many threads at once (one size too: this thread then waits
    where Ctrl-C reaches it at once, not inside a compilation); else each size lowered and sized
    before the next is lowered."""
    if threads <= 1 or not sizes:
        out: list[Sized[T]] = []
        for n in sizes:
            began = time.perf_counter()
            step: Sized[Any] = _timed(partial(lower, n), began)
            out.append(step if step.error is not None else _timed(partial(size, step.value), began))
        return out
    from concurrent.futures import ThreadPoolExecutor  # 3 ms to import: paid only by searches that use it

    began = time.perf_counter()
    steps: list[Sized[Any]] = [_timed(partial(lower, n), began) for n in sizes]
    pool = ThreadPoolExecutor(max_workers=min(threads, len(sizes)), thread_name_prefix="unimem-compile")
    try:
        futures = [None if s.error is not None else pool.submit(_timed, partial(size, s.value), began) for s in steps]
        done = [
            Sized(None, s.error, s.seconds) if future is None else future.result()
            for s, future in zip(steps, futures, strict=True)
        ]
    except BaseException:
        # Ctrl-C: the interrupt goes up at once; a compilation under way ends on its own (nothing can
        # stop one), and none not yet begun starts.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return done
