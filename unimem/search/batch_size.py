"""``find_batch_size``: the largest batch that fits, in few trials, leaving no memory behind.

How it chooses each size, and why: docs/explanation/batch-search.md. The search's parts, each
in its own module here: ``settings`` (the arguments), ``result`` (``Trial``,
``BatchSizeSearch``), ``state`` (what a search knows and reads), ``policy`` (the next size),
``predictions`` (``lower=``), ``attempt`` (one call of the step), ``agreement`` (over ranks)
and ``runner`` (the trials, from the first to the conclusion).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, overload

from unimem.errors import ConfigError
from unimem.search.result import BatchSizeSearch, Trial
from unimem.search.runner import run_search
from unimem.search.settings import DEFAULT_TIMEOUT, Settings, check

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
    lower: Callable[[int], Any] | None = ...,
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
    lower: Callable[[int], Any] | None = ...,
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
    lower: Callable[[int], Any] | None = ...,
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
    lower: Callable[[int], Any] | None = None,
    progress: bool | None = None,
    model: Any = None,
    target_global_batch: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    collective: bool | None = None,
    time_limit: float | None = None,
) -> int | BatchSizeSearch | Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The largest batch size for which ``step(batch_size)`` runs without running out of memory.

    Afterwards the process holds no more memory than before: the failed trials' references are
    dropped and ``clear_cache`` runs. Memory figures make it fast: each trial's peak, fitted
    linearly, predicts the size that reaches ``limit``; with ``baseline``, one trial already gives
    a size that surely fits. Every call of ``step`` counts against ``max_trials``, and the search
    always ends: a failure refutes what said it would fit, and a bracket two trials did not halve
    is bisected.

    On a host without device figures (no GPU: the frameworks keep none on the CPU) and without
    ``limit=`` or ``measure=``, a size that does not fit is no error the search can catch: the
    kernel kills the process. There the search holds the sizes to the host's memory: each trial's
    peak is the process's resident peak, and the limit is what the process held at the start plus
    80% of the host's available memory (its memory cgroup's room where less; shared by the ranks
    of one host), read once at the start and said in ``notes``. A trial whose resident peak passes
    it counts as one that did not fit, and no size grows more than 8 times past the largest that
    ran. Where even the host's figures cannot be read, the search doubles from ``start`` until a
    failure and then bisects.

    JAX: each failed trial costs about 10 s and keeps the step's outputs in use for good
    (XLA; measured, held against the cap, and named in ``notes``); when failures cost far more
    than runs, the search approaches from below. A step that donates its state
    (``donate_argnums``) loses it at the first failure: search with one that does not.
    ``lower=`` (below) lets it run only sizes predicted to fit.

    Under a distributed runtime with several ranks (``torch.distributed`` initialised, or
    ``jax.distributed``), the search is a collective: call it on every rank with the same
    arguments. Each trial's outcome is agreed through the runtime's key-value store (never
    through the step's own process group): a size fits only if it fit on every rank (one
    rank's out-of-memory error is every rank's failure), peaks and times are the largest over
    ranks and limits the smallest, so every rank tries the same sizes and returns the same
    answer. The step must then make no collective of its own, or one rank's failure leaves
    the others blocked in it: run the trial's forward and backward without gradient
    synchronisation (DDP's ``no_sync()``; ``model=ddp_model`` does it for you), and no
    all-reduce of the loss. A model whose forward itself communicates (FSDP, tensor-parallel
    parameters) cannot be searched this way (``model=`` refuses it); for JAX the step must be
    process-local (no computation spanning processes). Progress lines print on rank 0 only.

    Args:
        step: Runs one training step at the given batch size and lets the framework's
            out-of-memory error propagate (any framework: see ``unimem.is_oom``); other errors
            stop the search and propagate. None (default): return a decorator:
            ``@find_batch_size(start=8)`` over ``def step(batch_size, *args)`` gives a function
            of ``*args`` that runs the search and returns its answer (also kept as ``.last_search``).
        start: The first size to try, an int of 1 or more (required); halved until one fits.
        backend: The framework whose figures are read; None (default): the one configured, else
            the one imported, else the one the first trial imports.
        device: The device index (default 0).
        max_size: Bounds the answer from above (at least ``start``); None (default): no bound.
        margin: The answer is a size that ran, at least ``(1 - margin)`` × the largest that fits
            and never above it; a share in [0, 1) (default 0.05); ``margin=0`` searches to the
            exact size.
        measure: Called after each trial that fit, returns that trial's peak bytes; None
            (default): ``stats().peak_allocated`` after ``reset_peak()``.
        limit: Bytes (or a size such as ``"20GiB"``) a trial's peak may reach. Default: the
            framework's cap from ``stats().limit``; for torch no more than its pool plus the
            device's free bytes, less the pool's own overhead. On a host without device figures,
            the host's limit (above), against the process's resident peak.
        baseline: The bytes in use before the search that every peak includes (default:
            ``stats().allocated`` before the search; None with ``measure=`` unless given).
        max_trials: The most calls of ``step`` (default 20), counting every one: the trials and
            ``confirm``'s re-runs. When they run out, the answer is the largest size that ran.
        return_trials: True returns a ``BatchSizeSearch`` with every trial (size, fit or not,
            peak, seconds, why it was tried) instead of the int.
        confirm: Near the limit what fits depends on the pool's history: a size that ran may fail
            after a later trial's out-of-memory error (torch's split cached segments; JAX's pool
            after an OOM, which then fits about half as much: docs/measurements.md). With True
            (default) the answer is re-run once after the search when a trial failed after it
            ran; if that fails, one size lower by ``margin`` is tried and returned if it runs
            (then, for torch, one call at ``start`` lets go of the large blocks the step's kept
            state sat in); if neither runs, the answer is returned with ``confirmed=False``.
            These calls count against ``max_trials``, which keeps one for them once a trial failed.
        lower: ``lower(n)`` returns the step lowered for batch size ``n`` without running it, so
            the framework can predict its peak (``Backend.predict_peak``) and its largest single
            buffer, or that peak in bytes as an int, or the pair ``(peak, largest buffer)`` in
            bytes (any framework). None (default): no prediction (torch and TensorFlow have
            none to give: their search starts from a small real trial). See "What ``lower=``
            takes" below.
        progress: A line per call of ``step`` (and per compilation) on stderr: size, fit or
            out of memory, peak, seconds. None (default): when stderr is a terminal. Over ranks,
            rank 0 alone prints (the outcome agreed by all).
        model: The module ``step`` trains, for a search over ranks: each trial runs inside the
            context its framework gives so that it makes no collective (torch: every
            ``DistributedDataParallel`` in it under ``no_sync()``, with buffer broadcasting off).
            A model that communicates inside its forward (FSDP, ``DTensor`` parameters) is a
            ``ConfigError``. None (default): the step itself makes no collective.
        target_global_batch: Samples per optimizer step over all ranks. The result's ``plan``
            (``return_trials=True``; the int alone otherwise) is then
            ``plan_accumulation(target_global_batch, answer, world_size)``: the micro-batches
            each rank runs and accumulates. No size above ``ceil(target / world_size)`` is tried
            (no micro-batch would be larger), so the answer is at most that. An int of at least
            the world size; None (default): no plan.
        timeout: Seconds each rank waits for the others at each agreement, from its own
            arrival (default 600): a rank that does not answer by then is named in a
            ``ClusterError`` on the ranks that did. Raise it when one trial can take longer.
        collective: None (default): agree over ranks whenever a distributed runtime with
            several ranks is initialised (with a warning when a launcher started several
            but none is: each rank then searches alone). True: a ``ClusterError`` unless such a
            runtime is initialised. False: this process searches alone (one rank searching
            for all of them, say).
        time_limit: Seconds the whole search may take (a bound of its own: ``timeout`` is only
            how long ranks wait for each other). Checked after each call of the step, never
            inside one: once it has passed, no further call starts (nor ``confirm``'s re-run),
            and the answer is the largest size that ran, with ``converged=False``,
            ``time_limit_passed=True``, a note and a warning saying so. A call under way runs
            to its end, so the search can pass the bound by one call (and, with ``lower=``, the
            compilations placing it). Over ranks the longest any rank has searched counts, so
            every rank stops after the same call. None (default): no bound.

    Returns:
        The answer (``int``), the same on every rank; a ``BatchSizeSearch`` with
        ``return_trials=True`` (with ``plan`` under ``target_global_batch=``); a decorator
        without ``step``.

    Raises:
        ConfigError: Bad arguments, before any trial runs (``exc.parameter`` names it); also
            ``limit=`` without any figure to hold it against (no framework, no ``measure=``), and
            several frameworks in use with ``backend=None``: pass ``backend=``.
        OutOfMemory: Even batch size 1 does not fit (``exc.report`` explains it), or no size fit
            in ``max_trials`` trials (or before ``time_limit`` passed): start lower or raise them.
        Exception: The step's own error (not out of memory), re-raised as it came, with the
            batch size it was raised at as ``exc.unimem_batch_size`` and in a note
            (``exc.__notes__``, printed with the traceback on Python 3.11+).
        ClusterError: Over ranks: a rank did not answer within ``timeout`` (the message names
            it), another rank's step raised an error that is not out of memory (every rank
            stops at once, naming it), or the ranks are not at the same point of the search.
            Ranks that passed different arguments get a ``ConfigError`` naming the parameter.
        KeyboardInterrupt: Ctrl-C during the search, re-raised with the largest size that ran so
            far as ``exc.unimem_best_size`` (None when none ran) and, on Python 3.11+, a note
            saying so.

    Warns:
        UnimemWarning: ``max_trials`` ran out, or ``time_limit`` passed, before the answer was
            within ``margin``; or the answer did not run again (``confirmed=False``): start a
            fresh process with it.

    Example:
        ```python
        size = unimem.find_batch_size(lambda n: train_step(make_batch(n)), start=8, backend="torch")

        # On every rank of a DDP job: the same answer everywhere, and the accumulation to 1024.
        def trial(n):
            ddp(make_batch(n)).sum().backward()  # runs under ddp.no_sync(): model=ddp
            ddp.zero_grad(set_to_none=True)

        found = unimem.find_batch_size(trial, start=8, model=ddp, target_global_batch=1024, return_trials=True)
        for micro in found.plan.sizes(rank): ...
        ```

    What ``lower=`` takes: a callable of the batch size returning what the framework compiles
    and sizes without running it. For JAX, the jitted step lowered with the arguments it is
    called with, the batch given as shapes so that nothing is allocated, e.g.
    ``lambda n: train.lower(params, opt_state, jax.ShapeDtypeStruct((n, 1024), jnp.float32))``
    where ``step(n)`` calls ``train(params, opt_state, batch_of(n))`` (a ``jax.stages.Traced``,
    ``Lowered`` or ``Compiled`` all do). The peak is XLA's ``memory_analysis()``: its
    ``peak_memory_in_bytes`` on a GPU, arguments + outputs + temporaries - aliased on the CPU,
    where XLA's own field leaves the temporaries out; its largest buffer is the temporaries (one
    buffer) or the largest argument or output. The step runs the executable the prediction
    compiled (JAX caches it), so a size run costs no second compilation, provided the batch's
    shapes are given without a sharding, as above. Each size is compiled once, at most
    ``2 × max_trials`` of them (``compile_calls``); a lowering that runs out of memory means the
    size does not fit; one the framework cannot size is a ``ConfigError`` naming ``lower``
    before any call of ``step``. With ``lower=``, ``limit=`` needs no other figure; on a
    host without device figures and without ``limit=``, the predictions are held against the
    host's limit (above), beside the process's resident peaks. The predictions are held
    against the measured peaks where there are some, and set aside (with a note) when the runs
    contradict them.
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
