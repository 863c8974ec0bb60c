"""``find_batch_size``: the largest batch that fits, in few trials, leaving no memory behind.

How it chooses each size, and why: docs/explanation/batch-search.md. The search's parts, each
in its own module here: ``settings`` (the arguments), ``result`` (``Trial``,
``BatchSizeSearch``), ``framework`` (the one that asks the adapter), ``limit`` (the limit and
its one check), ``state`` (what a search knows and reads), ``opening`` (before the first trial),
``findings`` (what the trials showed), ``policy`` and ``regimes`` (the next size),
``predictions`` (``lower=``), ``attempt`` (one call of the step), ``agreement`` (over ranks)
and ``runner`` (the trials, from the first to the conclusion).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, overload

from unimem.errors import ConfigError
from unimem.search.result import BatchSizeSearch, Trial
from unimem.search.runner import run_search
from unimem.search.settings import DEFAULT_TIMEOUT, Settings, check

if TYPE_CHECKING:
    from unimem.estimate.result import MemoryEstimate

__all__ = ["BatchSizeSearch", "Trial", "find_batch_size"]


@overload
def find_batch_size(
    step: Callable[[int], Any],
    *,
    start: int,
    backend: str | None = ...,
    device: int = ...,
    max_size: int | None = ...,
    margin: float = ...,
    measure: Callable[[], int | None] | None = ...,
    limit: int | str | None = ...,
    baseline: int | str | None = ...,
    max_trials: int = ...,
    return_trials: Literal[False] = ...,
    confirm: bool = ...,
    lower: Callable[[int], Any] | MemoryEstimate | None = ...,
    progress: bool | None = ...,
    model: Any = ...,
    target_global_batch: int | None = ...,
    timeout: float = ...,
    collective: bool | None = ...,
    time_limit: float | None = ...,
) -> int: ...


@overload
def find_batch_size(
    step: Callable[[int], Any],
    *,
    start: int,
    backend: str | None = ...,
    device: int = ...,
    max_size: int | None = ...,
    margin: float = ...,
    measure: Callable[[], int | None] | None = ...,
    limit: int | str | None = ...,
    baseline: int | str | None = ...,
    max_trials: int = ...,
    return_trials: Literal[True],
    confirm: bool = ...,
    lower: Callable[[int], Any] | MemoryEstimate | None = ...,
    progress: bool | None = ...,
    model: Any = ...,
    target_global_batch: int | None = ...,
    timeout: float = ...,
    collective: bool | None = ...,
    time_limit: float | None = ...,
) -> BatchSizeSearch: ...


@overload
def find_batch_size(
    step: None = ...,
    *,
    start: int,
    backend: str | None = ...,
    device: int = ...,
    max_size: int | None = ...,
    margin: float = ...,
    measure: Callable[[], int | None] | None = ...,
    limit: int | str | None = ...,
    baseline: int | str | None = ...,
    max_trials: int = ...,
    return_trials: bool = ...,
    confirm: bool = ...,
    lower: Callable[[int], Any] | MemoryEstimate | None = ...,
    progress: bool | None = ...,
    model: Any = ...,
    target_global_batch: int | None = ...,
    timeout: float = ...,
    collective: bool | None = ...,
    time_limit: float | None = ...,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def find_batch_size(
    step: Callable[[int], Any] | None = None,
    *,
    start: int,
    backend: str | None = None,
    device: int = 0,
    max_size: int | None = None,
    margin: float = 0.05,
    measure: Callable[[], int | None] | None = None,
    limit: int | str | None = None,
    baseline: int | str | None = None,
    max_trials: int = 20,
    return_trials: bool = False,
    confirm: bool = True,
    lower: Callable[[int], Any] | MemoryEstimate | None = None,
    progress: bool | None = None,
    model: Any = None,
    target_global_batch: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    collective: bool | None = None,
    time_limit: float | None = None,
) -> int | BatchSizeSearch | Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The largest batch size for which ``step(batch_size)`` runs without running out of memory.

    Each call of ``step`` is a real trial whose peak places the next; afterwards the process holds
    no more memory than before. How each size is chosen, and what happens on a host without a GPU,
    with JAX, over ranks and with ``lower=``: [How the batch search works](../explanation/batch-search.md);
    how to use it: [the guide](../guides/out-of-memory.md#the-largest-batch-that-fits).

    Args:
        step: Runs one training step at the given size, letting out-of-memory errors propagate; None: a decorator.
        start: The first size to try (an int of 1 or more); halved until one fits.
        backend: The framework read; None (default): the step's (a framework object), else configured, else imported;
            ``"nvml"``: a step of no framework (its peaks from ``measure=``, else a GPU-less host's memory).
        device: The device index (default 0).
        max_size: An upper bound on the answer (at least ``start``); None (default): no bound.
        margin: The answer is at least ``(1 - margin)`` × the largest size that fits, never above it (default 0.05).
        measure: Returns the last trial's peak bytes; None (default): ``stats().peak_allocated`` after ``reset_peak()``.
        limit: Bytes (or ``"20GiB"``) a trial's peak may reach (on a host: its resident peak); None (default): the
            framework's cap, else the host's.
        baseline: Bytes in use before the search; None (default): ``stats().allocated`` then (none with ``measure=``).
        max_trials: The most calls of ``step``, re-runs included (default 20); the answer is then the largest that ran.
        return_trials: True returns a ``BatchSizeSearch`` (every trial, the notes) instead of the int.
        confirm: Re-run the answer once a later trial failed, one size lower if it no longer runs (default True).
        lower: ``lower(n)`` returns the step lowered for size ``n``, or its peak bytes: only sizes predicted to fit run;
            or an estimate (``unimem.estimate_memory``'s): torch's first call is then at the largest size predicted to
            fit, and a second at it confirms it.
        progress: A line per call of ``step`` on stderr (rank 0 only); None (default): when stderr is a terminal.
        model: Over ranks, the module the step trains: each trial runs without its collectives (DDP's ``no_sync()``).
        target_global_batch: Samples per optimizer step over all ranks: the result's ``plan`` meets it with the answer.
        timeout: Seconds each rank waits for the others at each agreement (default 600).
        collective: None (default): agree over ranks where a distributed runtime runs; True: must; False: alone.
        time_limit: Seconds the whole search may take, checked after each call of ``step``; None (default): no bound.

    Returns:
        The answer, the same on every rank; a ``BatchSizeSearch`` with ``return_trials=True``; a decorator
        without ``step``.

    Raises:
        ConfigError: A bad argument, before any trial (``exc.parameter`` names it): ``limit=`` with no peak to hold,
            no framework (or several) and no ``backend=``.
        OutOfMemory: Even batch size 1 does not fit (``exc.report`` says why), or none fit in the calls or time given.
        ClusterError: Over ranks: a rank did not answer within ``timeout``, or another rank's step raised; or the
            environment says there are several ranks but no distributed runtime runs (``collective=False``: alone).
        SearchError: The peaks did not grow with the batch size (before a size that could not fit at a byte a sample),
            or the answer failed its re-check while the memory in use grew (a leak) and no size ran again.
        Exception: The step's own error (not out of memory), as it came, with its size as ``exc.unimem_batch_size``.
        KeyboardInterrupt: Ctrl-C, with the largest size that ran so far as ``exc.unimem_best_size``.

    Warns:
        UnimemWarning: The calls or the time ran out before the answer was within ``margin``, it did not run again,
            or only one size lower ran again after the step leaked.

    Example:
        ```python
        size = unimem.find_batch_size(lambda n: train_step(make_batch(n)), start=8, backend="torch")
        ```
    """
    settings = check(
        start,
        backend,
        device,
        max_size,
        margin,
        measure,
        limit,
        baseline,
        max_trials,
        return_trials,
        confirm,
        lower,
        progress,
        model,
        target_global_batch,
        timeout,
        collective,
        time_limit,
    )
    if step is None:
        return _decorator(settings)
    if not callable(step):
        raise ConfigError("step", f"expected a callable step(batch_size), got {step!r}")
    result = run_search(step, settings)
    return result if settings.return_trials else result.batch_size


def _decorator(settings: Settings) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    import functools

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(function):
            raise ConfigError("step", f"expected a callable step(batch_size, ...), got {function!r}")

        @functools.wraps(function)
        def search(*args: Any, **kwargs: Any) -> int | BatchSizeSearch:
            result = run_search(lambda size: function(size, *args, **kwargs), settings)
            search.last_search = result  # type: ignore[attr-defined]
            return result if settings.return_trials else result.batch_size

        search.last_search = None  # type: ignore[attr-defined]
        return search

    return decorate
