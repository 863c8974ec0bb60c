"""A batch search with ``lower=``: each size's peak predicted from the compiled step, before it
runs (what the runs say about the predictions: ``unimem.search.scale``; compiling several sizes
at once: ``unimem.search.compile``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unimem import registry
from unimem.diagnose.guard import clear_frames, find_oom
from unimem.errors import ConfigError
from unimem.search.attempt import mark, tell_ranks
from unimem.search.compile import size_all
from unimem.search.ranks import worst
from unimem.search.scale import OVER, Scale
from unimem.search.state import Run

__all__ = ["first_size", "new_scale", "predicted_peak"]

# Compilations of ``lower(n)`` allowed per call of the step the search may make (``max_trials``).
_COMPILES_PER_TRIAL = 2
# Sizes compiled at once where the framework sizes them in threads: a placed size and the one
# that closes its bracket (two took 1.3 times one compilation's time on an H200).
_COMPILE_WIDTH = 2


def new_scale(run: Run) -> Scale:
    """The predicted scale of a search with ``lower=``, sizes compiled through ``lower``."""
    many = _predictor(run)
    return Scale(lambda n: many([n])[0], _COMPILES_PER_TRIAL * run.settings.max_trials, many)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _size_lowered(run: Run, lowered: Any) -> tuple[int, int | None] | None:
    """The predicted peak and largest single buffer of what ``lower(n)`` returned: an int is
    taken as the peak's bytes, a pair of ints as both; else the search's framework sizes it,
    then each one imported (``adapter.search.predict_peak``, ``predict_largest_buffer``)."""
    pair = isinstance(lowered, tuple) and len(lowered) == 2 and all(map(_whole, lowered))
    if _whole(lowered) or pair:
        peak, largest = (lowered, None) if _whole(lowered) else lowered
        if peak < 0 or (largest is not None and not 0 <= largest <= peak):
            raise ConfigError(
                "lower",
                f"lower() returned {lowered!r}: a peak in bytes is at least 0, and a (peak, largest buffer) "
                "pair holds a largest buffer between 0 and the peak",
            )
        return peak, largest
    adapters = [run.adapter] if run.adapter is not None else []
    adapters += [registry.get_backend(name) for name in registry.imported_frameworks()]
    for adapter in dict.fromkeys(adapters):
        value = adapter.search.predict_peak(lowered)
        if value is not None:
            if run.scale is not None and adapter.search.predicts_concurrently:
                run.scale.width = _COMPILE_WIDTH
            return value, adapter.search.predict_largest_buffer(lowered)
    return None


def _predictor(run: Run) -> Callable[[list[int]], list[tuple[int, int | None] | None]]:
    """``sizes -> predicted (peak, largest buffer)`` through ``lower=``, compiled at once where
    the scale's rounds are wider than one (``unimem.search.compile``); a lowering that itself runs out
    of memory predicts ``OVER`` (the size does not fit), any other error stops the search."""
    lower = run.settings.lower
    assert lower is not None

    def predict(sizes: list[int]) -> list[tuple[int, int | None] | None]:
        threads = 1 if run.scale is None else run.scale.width
        results: list[tuple[int, int | None] | None] = []
        for size, done in zip(sizes, size_all(lower, lambda x: _size_lowered(run, x), sizes, threads), strict=True):
            value, largest = (None, None) if done.value is None else done.value
            if done.error is not None:
                if find_oom(done.error) is None:
                    mark(done.error, size, f"unimem.find_batch_size: lower({size}) raised this")
                    tell_ranks(run.ranks, "compilation", size, done.error)
                    raise done.error
                clear_frames(done.error)  # the lowering's frames may hold arrays of that size
                value, largest = OVER, None
            if run.ranks is not None:
                # The largest over ranks, so every rank places the same sizes (None: one cannot size it).
                message = {"kind": "compilation", "size": size, "predicted": value, "largest": largest}
                answers = run.ranks.exchange(message)
                value = worst([p["predicted"] for p in answers.values()])
                largest = worst([p["largest"] for p in answers.values()])
            room = None if run.scale is None else run.scale.room
            run.progress.compiled(size, value, done.seconds, largest, room)
            results.append(None if value is None else (value, largest))
        return results

    return predict


def predicted_peak(run: Run, size: int) -> int | None:
    """The predicted peak of a size about to run, while the predictions are used."""
    if run.scale is None or not run.scale.trusted:
        return None
    value = run.scale.peak(size)
    if value is None:
        run.scale.distrust = (
            f"no prediction for batch size {size} (compilations spent, or the framework could not size what "
            "lower() returned): searched on the measured peaks from there"
        )
    return value


def first_size(run: Run) -> int:
    """The first size to run: ``start``, halved while predicted above the limit. What ``lower``
    returns for it must be something the framework can size: else a ``ConfigError`` before any run."""
    size = run.settings.start
    if run.scale is None:
        return size
    predicted = run.scale.peak(size)
    if predicted is None:
        raise ConfigError(
            "lower",
            f"lower({size}) returned nothing the framework in use can size: return the step lowered for that "
            "size (jax: jax.jit(step).lower(...)), or its predicted peak bytes as an int",
        )
    while size > 1 and run.limit is not None and predicted is not None and predicted > run.limit:
        size //= 2
        predicted = run.scale.peak(size)
    return size
