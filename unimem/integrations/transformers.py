"""Hugging Face ``Trainer``: memory figures in its logs, an out-of-memory error explained, and the largest batch
that fits set as the batch the trainer trains with.

Import it yourself (``import unimem`` never imports transformers)::

    from unimem.integrations.transformers import add_memory_callback, find_batch_size, oom_guard

    find_batch_size(trainer)            # the per-device batch train() uses from now on
    add_memory_callback(trainer)        # mem_* figures in every log line, before the loggers see them
    with oom_guard(trainer):            # an out-of-memory error becomes unimem.OutOfMemory, with its report
        trainer.train()

The guide: docs/guides/hugging-face.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import torch
import transformers
from transformers import TrainerCallback

from unimem.diagnose.guard import OOMGuard
from unimem.diagnose.guard import oom_guard as _oom_guard
from unimem.errors import ConfigError
from unimem.integrations.memory_logs import combine, figures
from unimem.integrations.trials import SEARCH_SETTINGS, FitStart, bounded
from unimem.observe.hook import MemoryHook
from unimem.search.batch_size import BatchSizeSearch
from unimem.search.batch_size import find_batch_size as _find_batch_size
from unimem.search.settings import check

__all__ = ["MemoryCallback", "add_memory_callback", "find_batch_size", "oom_guard"]


def _device_index(args: Any) -> int:
    index = getattr(args.device, "index", None)
    return int(index) if index is not None else 0


def _world() -> int:
    distributed = torch.distributed
    return distributed.get_world_size() if distributed.is_available() and distributed.is_initialized() else 1


def _check_trainer(trainer: object) -> transformers.Trainer:
    if not isinstance(trainer, transformers.Trainer):
        raise ConfigError("trainer", f"expected a transformers.Trainer, got {type(trainer).__name__}")
    return trainer


class MemoryCallback(TrainerCallback):
    """Memory figures added to the ``Trainer``'s logs: ``mem_allocated``, ``mem_reserved``, ``mem_peak``,
    ``mem_process``, ``mem_host_rss``, ``mem_host_peak`` (bytes, known figures only).

    ``mem_peak`` and ``mem_host_peak`` are the largest of the steps since the last log line; the others are
    read at the last step's end. Under ``torchrun`` each figure is the largest over the ranks and each rank's
    peak is ``mem_peak_rank{r}``. Add it with ``add_memory_callback(trainer)``, which puts it first: the
    trainer hands one ``logs`` dict to its callbacks in turn, so a logger ahead of this callback (the
    reporting callbacks of ``report_to``, and any passed to ``Trainer(callbacks=...)``) would not see the figures.

    Args:
        max_samples: Steps kept before this process's series is thinned, peaks kept (at least 100, default 20000).

    Attributes:
        hook: The per-step recorder (``unimem.MemoryHook``); ``hook.recording`` is this process's series.
    """

    def __init__(self, *, max_samples: int = 20_000) -> None:
        if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 100:
            raise ConfigError("max_samples", f"expected an int of at least 100, got {max_samples!r}")
        self.max_samples = max_samples
        self.hook: MemoryHook | None = None
        self._pending: dict[str, int] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.hook = MemoryHook("torch", _device_index(args), max_samples=self.max_samples)
        self.hook.step()  # opens the first step's interval
        self._pending = {}

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.hook is None:
            return
        tracked = self.hook.step()
        if tracked is None:
            return
        latest = figures(tracked, self.hook.host_rss())
        for key in ("mem_peak", "mem_host_peak"):  # the largest since the last log line
            if key in latest and key in self._pending:
                latest[key] = max(latest[key], self._pending[key])
        self._pending = latest

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not self._pending or logs is None:
            return
        # Every rank logs at the same steps, so every rank joins the same gather.
        logged = combine(_gather(self._pending)) if _world() > 1 else self._pending
        self._pending = {}
        logs.update(logged)
        # The trainer stored a copy of these logs in its history just before this event: that copy too.
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(logged)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.hook is not None:
            self.hook.close()


def _gather(own: dict[str, int]) -> list[dict[str, int]]:
    rows: list[Any] = [None] * _world()
    torch.distributed.all_gather_object(rows, own)
    return [dict(row) for row in rows]


def add_memory_callback(trainer: Any, *, max_samples: int = 20_000) -> MemoryCallback:
    """Add a ``MemoryCallback`` to ``trainer``, first in line, so every logger sees its figures; return it.

    Raises:
        ConfigError: ``trainer`` is not a ``transformers.Trainer``, or ``max_samples`` is invalid.
    """
    checked = _check_trainer(trainer)
    callback = MemoryCallback(max_samples=max_samples)
    checked.callback_handler.callbacks.insert(0, callback)
    return callback


def oom_guard(trainer: Any, *, top: int = 10) -> OOMGuard:
    """``unimem.oom_guard`` told the trainer's batch size, device and precision: around ``trainer.train()``.

    An out-of-memory error raised inside becomes ``unimem.OutOfMemory`` with its report (``exc.report``),
    the framework's error as its cause; other errors pass through.

    Raises:
        ConfigError: ``trainer`` is not a ``transformers.Trainer``, or ``top`` is invalid.
    """
    checked = _check_trainer(trainer)
    args = checked.args
    return _oom_guard(
        "torch",
        device=_device_index(args),
        batch_size=int(checked._train_batch_size),
        mixed_precision=bool(args.fp16 or args.bf16),
        top=top,
    )


def find_batch_size(
    trainer: Any,
    *,
    start: int | None = None,
    max_size: int | None = None,
    steps_per_trial: int = 2,
    margin: float = 0.05,
    max_trials: int = 20,
    limit: int | str | None = None,
    measure: Any = None,
    time_limit: float | None = None,
    progress: bool | None = None,
    timeout: float = 600.0,
    return_trials: bool = False,
) -> Any:
    """The largest per-device batch that fits, by unimem's search with the trainer's own training step; the
    trainer trains with it from now on.

    Each size tried runs ``steps_per_trial`` optimizer steps as ``train()`` runs them: ``trainer.training_step``
    (its loss, mixed precision and activation checkpointing) on ``gradient_accumulation_steps`` batches of the
    trainer's own training dataloader, the gradients clipped to ``max_grad_norm``, then the optimizer's step
    (the trainer's optimizer, else one made as ``train()`` makes it). Like ``train()``, each starts with no
    gradients and the optimizer's state as ``train()`` finds it, so a size that runs is one the fit can run.
    Sizes above the bound are refused without running. Afterwards the model's
    weights, the optimizer and the random state are as before, and the answer is the trainer's batch size:
    ``args.per_device_train_batch_size`` and the size its training dataloader is built with (the ``Trainer``
    copies that argument when it is made, so setting it alone would change nothing). Under ``torchrun``
    every rank calls it and gets the same answer. Call it before ``trainer.train()``.

    Args:
        trainer: The ``transformers.Trainer``, not yet training.
        start: The first size tried; None (default): ``args.per_device_train_batch_size``.
        max_size: No size above it; None (default): no bound but one rank's share of the training data.
        steps_per_trial: Optimizer steps per size tried (default 2: the optimizer's state is allocated in the
            first, and the second holds it beside the activations).
        margin: The answer is at least ``(1 - margin)`` × the largest size that fits (default 0.05).
        max_trials: The most sizes tried (default 20).
        limit: Bytes (or ``"20GiB"``) a trial's peak may reach; None (default): the device's cap.
        measure: Returns the last trial's peak bytes; None (default): torch's peak figure.
        time_limit: Seconds the whole search may take; None (default): no bound.
        progress: A line per size tried on stderr (rank 0); None (default): when stderr is a terminal.
        timeout: Seconds each rank waits for the others at each agreement (default 600).
        return_trials: True returns the whole search (``unimem.BatchSizeSearch``) instead of the int.

    Returns:
        The answer (also set on the trainer), or the search with ``return_trials=True``.

    Raises:
        ConfigError: An argument is invalid, the trainer has no sized training dataset, or it trains with
            DeepSpeed, FSDP or ``DataParallel`` (several GPUs in one process), whose steps cannot be tried alone.
        OutOfMemory: Even batch size 1 does not fit (with unimem's report).
    """
    checked = _check_trainer(trainer)
    args = checked.args
    first = args.per_device_train_batch_size if start is None else start
    if isinstance(steps_per_trial, bool) or not isinstance(steps_per_trial, int) or steps_per_trial < 1:
        raise ConfigError("steps_per_trial", f"expected an int of 1 or more, got {steps_per_trial!r}")
    if checked.train_dataset is None or not hasattr(checked.train_dataset, "__len__"):
        raise ConfigError("trainer", "the trainer has no training dataset of known length to take batches from")
    if checked.is_deepspeed_enabled or checked.is_fsdp_enabled or args.n_gpu > 1:
        raise ConfigError(
            "trainer",
            "its model is sharded or replicated inside one step (DeepSpeed, FSDP, or DataParallel over several "
            "GPUs of one process), where a size cannot be tried on one device alone; search with one GPU per "
            "process (torchrun), then set per_device_train_batch_size",
        )
    share = max(1, len(checked.train_dataset) // _world())
    bound = share if max_size is None else min(max_size, share)
    first = min(first, bound) if isinstance(first, int) and not isinstance(first, bool) else first
    options: dict[str, Any] = {
        "start": first,
        "backend": "torch",
        "device": _device_index(args),
        "margin": margin,
        "measure": measure,
        "limit": limit,
        "max_trials": max_trials,
        "progress": progress,
        "timeout": timeout,
        "time_limit": time_limit,
    }
    # Every argument, before anything changes; the bound is held by the step (``trials.bounded``).
    check(**options, max_size=bound, baseline=None, return_trials=return_trials)

    model = checked.model
    if model is None:  # a Trainer made with model_init builds its model in train(): nothing to size yet
        raise ConfigError("trainer", "the Trainer has no model yet; pass model= to Trainer, or call train() once first")
    _enable_checkpointing(checked)
    with _restored(checked):
        fit_start = FitStart([checked.optimizer] if checked.optimizer is not None else [], model.parameters())

        def step(size: int) -> None:
            checked._train_batch_size = size
            fit_start.restore()  # the optimizer's state and the gradients are made in the trial, as in train()
            try:
                _train_steps(checked, model, steps_per_trial)
            finally:
                fit_start.restore()

        held = bounded(step, bound, "max_size and one rank's share of the training data")
        search = cast(
            BatchSizeSearch,
            _find_batch_size(held, **options, **SEARCH_SETTINGS, collective=_world() > 1, return_trials=True),
        )
    checked._train_batch_size = search.batch_size
    args.per_device_train_batch_size = search.batch_size
    return search if return_trials else search.batch_size


def _enable_checkpointing(trainer: Any) -> None:
    """Activation checkpointing as ``train()`` turns it on (it does again, to the same effect): it changes the
    memory a step holds, so the trials must run with it."""
    args = trainer.args
    if not (getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", None)):
        return
    options = getattr(args, "activation_checkpointing_kwargs", None) or getattr(
        args, "gradient_checkpointing_kwargs", None
    )
    kwargs = dict(options or {})
    model = trainer.model
    if hasattr(model, "activation_checkpointing_enable"):
        every, offload = kwargs.pop("every_n_layers", 1), kwargs.pop("offload", False)
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=kwargs or None, every_n_layers=every, offload=offload
        )
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)


def _train_steps(trainer: Any, model: Any, steps: int) -> None:
    """``steps`` optimizer steps at the trainer's current batch size, each as ``train()`` makes it: the
    ``gradient_accumulation_steps`` batches taken first, a training step on each (the gradients add up),
    the gradients clipped to ``max_grad_norm``, the optimizer stepped, the gradients set to None."""
    loader = trainer.get_train_dataloader()
    own = trainer.optimizer is None
    optimizer = trainer.create_optimizer() if own else trainer.optimizer
    accumulation = max(1, int(trainer.args.gradient_accumulation_steps))
    clip = float(trainer.args.max_grad_norm or 0.0)
    batches = iter(loader)
    try:
        for _ in range(steps):
            inputs = [batch for batch in (next(batches, None) for _ in range(accumulation)) if batch is not None]
            if not inputs:
                break
            for each in inputs:  # all of them held to the optimizer step, as train() holds them
                trainer.training_step(model, each)
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            model.zero_grad(set_to_none=True)
            del inputs, each
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
        # accelerate tracks the loader it prepared until its iteration ends, which a trial cuts short.
        with contextlib.suppress(AttributeError, ValueError):
            loader.end()
        with contextlib.suppress(AttributeError, ValueError):
            trainer.accelerator._dataloaders.remove(loader)
        model.zero_grad(set_to_none=True)
        if own:
            trainer.optimizer = None


def _to_host(value: Any) -> Any:
    """A copy of ``value`` with every tensor in host memory: a snapshot that takes no device memory."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _to_host(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(item) for item in value)
    return value


@contextlib.contextmanager
def _restored(trainer: Any) -> Iterator[None]:
    """Within: trials may train; afterwards the weights, the optimizer, the random state and the trainer's
    batch size, mode and step bookkeeping are as they were."""
    model = trainer.model
    weights = _to_host(model.state_dict())
    optimizer_state = _to_host(trainer.optimizer.state_dict()) if trainer.optimizer is not None else None
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    training = model.training
    batch_size = trainer._train_batch_size
    missing = object()
    steps_before = getattr(trainer, "current_gradient_accumulation_steps", missing)
    # Set by train() to the batches of each optimizer step; training_step divides the loss by it.
    trainer.current_gradient_accumulation_steps = max(1, int(trainer.args.gradient_accumulation_steps))
    try:
        yield
    finally:
        model.load_state_dict(weights)
        if optimizer_state is not None:
            trainer.optimizer.load_state_dict(optimizer_state)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        model.train(training)
        trainer._train_batch_size = batch_size
        if steps_before is missing:
            del trainer.current_gradient_accumulation_steps
        else:
            trainer.current_gradient_accumulation_steps = steps_before
