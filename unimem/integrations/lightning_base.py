"""The Lightning callbacks' logic, for either Lightning package (``lightning.pytorch`` or ``pytorch_lightning``).

The two packages ship separate copies of the same classes, and a Trainer knows its own package's
callbacks (it moves its own ``BatchSizeFinder`` first, for one). So the logic lives here, as
mixins that import no Lightning; ``unimem.integrations.lightning`` and
``unimem.integrations.pytorch_lightning`` each join them to their package's classes, and the
mixins reach the package through the class attribute ``_pl``.

How the finder tries a size: it saves a checkpoint, then each call of the step sets the batch size
attribute (``lightning_setattr``, as Lightning's finder), rebuilds the dataloaders and runs the fit
loop for ``steps_per_trial`` steps without loggers, callbacks or validation, from the fit's own start
(no gradients, the optimizers' state as the fit finds it: ``unimem.integrations.trials``); afterwards
it restores the checkpoint, empties the cache the checkpoint was read into, and sets the answer. Over
DDP ranks the sizes are agreed through ``find_batch_size``'s store, and each trial makes no collective:
the DDP module runs under ``no_sync()`` and the strategy's own collectives (the dataloader barrier,
the per-batch SIGTERM broadcast, ``sync_dist`` logging) stay local, so one rank's out-of-memory error
cannot leave the others waiting in one.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

from unimem.diagnose.recognise import find_oom
from unimem.errors import ConfigError
from unimem.integrations.memory_logs import FIGURES, combine, figures
from unimem.integrations.trials import SEARCH_SETTINGS, FitStart, bounded
from unimem.observe.hook import MemoryHook
from unimem.search.batch_size import BatchSizeSearch, find_batch_size
from unimem.search.settings import check

__all__ = ["BatchSizeFinderMixin", "MemoryCallbackMixin", "device_index"]

_MODES = ("power", "binsearch")


def device_index(trainer: Any) -> int:
    """The index of the device the trainer's strategy runs this rank on (0 for the CPU)."""
    index = getattr(trainer.strategy.root_device, "index", None)
    return int(index) if index is not None else 0


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``; on Python 3.10, the ``__notes__`` list it would add to (PEP 678)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        return
    with contextlib.suppress(AttributeError, TypeError):
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]


class _Package:
    """Reaches the Lightning package a callback class was joined to (``_pl``)."""

    _pl: Any

    def _module(self, name: str) -> Any:
        """``name``, a submodule of this class's Lightning package (``"utilities.parsing"``)."""
        return importlib.import_module(f"{self._pl.__name__}.{name}")


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(name, f"expected an int of {minimum} or more, got {value!r}")


class MemoryCallbackMixin(_Package):
    """Memory per training batch into the trainer's loggers, and an out-of-memory error explained.

    Joined to a Lightning ``Callback`` in ``unimem.integrations.lightning``; its docstring is the user's.
    """

    def __init__(self, *, every: int | None = None, max_samples: int = 20_000, explain_oom: bool = True) -> None:
        if every is not None:
            _check_int("every", every, 1)
        if not isinstance(explain_oom, bool):
            raise ConfigError("explain_oom", f"expected True or False, got {explain_oom!r}")
        _check_int("max_samples", max_samples, 100)
        self.every = every
        self.max_samples = max_samples
        self.explain_oom = explain_oom
        self.hook: MemoryHook | None = None
        self.report: Any = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.hook = MemoryHook("torch", device_index(trainer), max_samples=self.max_samples)
        self.hook.step()  # opens the first batch's interval

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.hook is None:
            return
        tracked = self.hook.step()
        # The step Lightning logs this batch's metrics at (the loss's): the optimizer steps before this one.
        step = int(trainer.fit_loop.epoch_loop._batches_that_stepped)
        # Decided from counters every rank shares, so every rank joins the same gathers.
        if tracked is None or not self._logs_now(trainer, pl_module, step):
            return
        logged = self._over_ranks(trainer, pl_module, figures(tracked, self.hook.host_rss()))
        if trainer.is_global_zero and logged:
            for logger in trainer.loggers:
                logger.log_metrics(logged, step=step)

    def _logs_now(self, trainer: Any, pl_module: Any, step: int) -> bool:
        """Lightning's rule for the loss: never inside a gradient accumulation, and at every ``every``-th
        (default: ``log_every_n_steps``-th) step counted from 1; 0 never."""
        if pl_module.automatic_optimization and trainer.fit_loop._should_accumulate():
            return False
        every = self.every if self.every is not None else int(trainer.log_every_n_steps)
        return every > 0 and (step + 1) % every == 0

    def _over_ranks(self, trainer: Any, pl_module: Any, own: dict[str, int]) -> dict[str, int]:
        """One rank: its figures. Several: gathered, then combined (``memory_logs.combine``)."""
        if trainer.world_size <= 1:
            return own
        import torch

        # A fixed row per rank (-1: unknown), gathered through the strategy like any logged tensor.
        row = torch.tensor([own.get(key, -1) for key in FIGURES], dtype=torch.int64, device=pl_module.device)
        rows = trainer.strategy.all_gather(row).reshape(trainer.world_size, len(FIGURES)).tolist()
        return combine([{key: int(v) for key, v in zip(FIGURES, r, strict=True) if v >= 0} for r in rows])

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.hook is not None:
            self.hook.mark(f"epoch {trainer.current_epoch + 1}")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.hook is not None:
            self.hook.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """An out-of-memory error gets unimem's report as a note (it shows under the traceback) and in ``report``.

        Lightning re-raises the error itself after every callback's ``on_exception``, so the report rides on it.
        """
        oom = find_oom(exception) if self.explain_oom else None
        if oom is None:
            return
        from unimem.diagnose.report import build_report

        parsing = self._module("utilities.parsing")
        batch_size = None
        if pl_module is not None and parsing.lightning_hasattr(pl_module, "batch_size"):
            value = parsing.lightning_getattr(pl_module, "batch_size")
            batch_size = value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
        self.report = build_report(
            oom,
            backend="torch",
            device=device_index(trainer),
            batch_size=batch_size,
            mixed_precision="16" in str(trainer.precision),
        )
        _add_note(exception, f"unimem: {self.report}")

    @property
    def recording(self) -> Any:
        """This rank's per-batch memory as a ``unimem.Recording`` (None before training starts)."""
        return self.hook.recording if self.hook is not None else None


class BatchSizeFinderMixin(_Package):
    """The largest batch that fits, by unimem's search, set on the model or datamodule; single device or DDP.

    Joined to a Lightning ``BatchSizeFinder`` in ``unimem.integrations.lightning``; its docstring is the user's.
    """

    def __init__(
        self,
        mode: str | None = None,
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
        margin: float = 0.05,
        max_val: int | None = 8192,
        *,
        limit: int | str | None = None,
        measure: Any = None,
        time_limit: float | None = None,
        progress: bool | None = None,
        timeout: float = 600.0,
    ) -> None:
        # Lightning reads the mode case-blind (``mode.lower()``).
        if mode is not None and (not isinstance(mode, str) or mode.lower() not in _MODES):
            raise ConfigError(
                "mode",
                f"expected None (unimem's answer), 'binsearch' (the same) or 'power' (rounded down to a power "
                f"of two), in any case, got {mode!r}",
            )
        _check_int("steps_per_trial", steps_per_trial, 1)
        _check_int("init_val", init_val, 1)
        _check_int("max_trials", max_trials, 0)  # 0, as in Lightning: no trial, the start size kept
        if max_val is not None:
            _check_int("max_val", max_val, init_val)
        check(
            start=init_val,
            backend="torch",
            device=0,
            max_size=max_val,
            margin=margin,
            measure=measure,
            limit=limit,
            baseline=None,
            max_trials=max(1, max_trials),
            return_trials=True,
            progress=progress,
            timeout=timeout,
            time_limit=time_limit,
        )
        if not isinstance(batch_arg_name, str) or not batch_arg_name:
            raise ConfigError(
                "batch_arg_name", f"expected the name of the batch size attribute, got {batch_arg_name!r}"
            )
        self._rounding = mode.lower() if mode is not None else None
        self._steps_per_trial = steps_per_trial
        self._init_val = init_val
        self._max_trials = max_trials
        self._batch_arg_name = batch_arg_name
        self._margin = margin
        self._largest_size = max_val
        self._early_exit = False  # Lightning's Tuner sets it: the fit stops after the search
        self._options: dict[str, Any] = {
            "limit": limit,
            "measure": measure,
            "time_limit": time_limit,
            "progress": progress,
            "timeout": timeout,
        }
        self.optimal_batch_size: int | None = init_val
        self.search: BatchSizeSearch | None = None

    # Lightning's finder refuses distributed strategies; this one agrees over DDP ranks.
    def setup(self, trainer: Any, pl_module: Any, stage: str | None = None) -> None:
        if stage not in (None, "fit"):
            return
        self._check_strategy(trainer)
        if not trainer.fit_loop._data_source.is_module():
            raise ConfigError(
                "train_dataloaders",
                "the batch size finder cannot resize dataloaders passed to fit(); build them in the "
                "LightningModule's or LightningDataModule's train_dataloader() from its batch size attribute",
            )
        name = self._batch_arg_name
        if not self._module("utilities.parsing").lightning_hasattr(pl_module, name):
            raise ConfigError(
                "batch_arg_name",
                f"{name!r} is not an attribute of the model, its hparams or the datamodule; "
                "add it (the dataloaders must read it) or name the attribute that holds the batch size",
            )
        # Lightning's finder warns here too: two holders of one size, and the dataloaders read only one.
        if hasattr(pl_module, name) and hasattr(pl_module, "hparams") and name in pl_module.hparams:
            self._module("utilities.rank_zero").rank_zero_warn(
                f"Field `model.{name}` and `model.hparams.{name}` are mutually exclusive! The batch size finder "
                "sets both to the size it finds. If this is not the intended behavior, please remove either one."
            )

    def _check_strategy(self, trainer: Any) -> None:
        strategies = self._module("strategies")
        strategy = trainer.strategy
        if isinstance(strategy, strategies.SingleDeviceStrategy):
            return
        if isinstance(strategy, strategies.DDPStrategy) and not isinstance(strategy, strategies.DeepSpeedStrategy):
            return
        raise ConfigError(
            "strategy",
            f"the batch size finder runs on one device or under DDP, not {type(strategy).__name__}: its model "
            "communicates inside the forward and backward passes, where one rank's out-of-memory error leaves the "
            "others waiting; find the size with strategy='ddp' (the same per-rank batch), then set it",
        )

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.scale_batch_size(trainer, pl_module)

    # A search per fit; evaluation and prediction keep the size fit found (Lightning's finder searches them too).
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        return

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        return

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        return

    def scale_batch_size(self, trainer: Any, pl_module: Any) -> None:
        """Search, and set the answer on the model or datamodule and in ``optimal_batch_size`` (not under
        ``fast_dev_run``; with ``max_trials=0`` the start size, untried, as Lightning's finder). Under Lightning's
        ``Tuner`` (``_early_exit``) the fit then stops, as it does after Lightning's finder."""
        rank_zero = self._module("utilities.rank_zero")
        if trainer.fast_dev_run:
            rank_zero.rank_zero_warn("Skipping the batch size finder: fast_dev_run is on.")
        elif self._max_trials == 0:
            answer = min(self._init_val, self._largest(trainer))
            self._module("utilities.parsing").lightning_setattr(pl_module, self._batch_arg_name, answer)
            self._module("tuner.batch_size_scaling")._reset_dataloaders(trainer)  # built at the old size
            self.optimal_batch_size = answer
            rank_zero.rank_zero_info(f"unimem's batch size finder: max_trials=0, so the start size {answer}, untried")
        else:
            self.optimal_batch_size = answer = self._search(trainer, pl_module)
            trials = len(self.search.trials) if self.search is not None else 0
            rank_zero.rank_zero_info(f"unimem's batch size finder: {answer} in {trials} trial(s)")
        if self._early_exit:
            raise self._module("utilities.exceptions")._TunerExitException()

    def _search(self, trainer: Any, pl_module: Any) -> int:
        """The search itself, between a checkpoint saved and restored; the answer, set on the model or datamodule."""
        scaling = self._module("tuner.batch_size_scaling")
        parsing = self._module("utilities.parsing")
        # One path for every rank: rank 0 writes it, every rank reads it back.
        path = trainer.strategy.broadcast(
            os.path.join(trainer.default_root_dir, f".scale_batch_size_{uuid.uuid4().hex}.ckpt")
        )
        trainer.save_checkpoint(path)
        params = getattr(scaling, "__scale_batch_dump_params")(trainer)
        getattr(scaling, "__scale_batch_reset_params")(trainer, self._steps_per_trial)
        trainer.limit_val_batches = 0  # a trial is training steps: evaluation holds no gradients
        if trainer.progress_bar_callback:
            trainer.progress_bar_callback.disable()

        fit_start = FitStart(trainer.optimizers, _trained_parameters(trainer, pl_module))

        def step(size: int) -> None:
            parsing.lightning_setattr(pl_module, self._batch_arg_name, size)
            scaling._reset_dataloaders(trainer)
            scaling._reset_progress(trainer)
            fit_start.restore()  # the optimizer's state and the gradients are made in the trial, as in the fit
            try:
                with _local_collectives(trainer):
                    scaling._try_loop_run(trainer, params)
            finally:
                fit_start.restore()  # nothing of this trial's stays for the next one, or for the fit

        try:
            distributed = trainer.world_size > 1
            largest = self._largest(trainer)
            self.search = find_batch_size(
                bounded(step, largest, "max_val and one rank's share of the training data"),
                start=min(self._init_val, largest),
                backend="torch",
                device=device_index(trainer),
                margin=self._margin,
                max_trials=self._max_trials,
                return_trials=True,
                model=trainer.strategy.model if distributed else None,
                collective=distributed,
                **SEARCH_SETTINGS,
                **self._options,
            )
            answer = self.search.batch_size
            if self._rounding == "power":
                answer = 1 << (answer.bit_length() - 1)
            parsing.lightning_setattr(pl_module, self._batch_arg_name, answer)
        finally:
            getattr(scaling, "__scale_batch_restore_params")(trainer, params)
            if trainer._results is not None:
                trainer._results.clear()  # keys logged in trials hold the local reduce; fit logs them afresh
            if trainer.progress_bar_callback:
                trainer.progress_bar_callback.enable()
            trainer._checkpoint_connector.restore(path)
            trainer.strategy.remove_checkpoint(path)
            _empty_cache(trainer)  # the checkpoint was read onto the device: the fit starts from an empty pool
        return answer

    def _largest(self, trainer: Any) -> int:
        """``max_val``, and no more than one rank's share of the training data: a larger batch would come short."""
        bound = self._largest_size
        loop = trainer.fit_loop
        loop.setup_data()
        with contextlib.suppress(NotImplementedError, AttributeError, TypeError):  # iterable datasets have no length
            share = loop._combined_loader._dataset_length() // max(1, trainer.world_size)
            bound = share if bound is None else min(bound, share)
        return max(1, bound) if bound is not None else 1 << 62


def _trained_parameters(trainer: Any, pl_module: Any) -> list[Any]:
    """The module's parameters and every one its optimizers step."""
    stepped = [p for optimizer in trainer.optimizers for group in optimizer.param_groups for p in group["params"]]
    return [*pl_module.parameters(), *stepped]


def _empty_cache(trainer: Any) -> None:
    """The caching allocator's unused memory given back, on a CUDA device."""
    if getattr(trainer.strategy.root_device, "type", None) == "cuda":
        import torch

        torch.cuda.empty_cache()


# This rank's answers to the strategy's collectives. Module-level functions: Lightning stores the
# reduce function with each logged key and refuses a key logged again with another one.
def _no_barrier(*args: Any, **kwargs: Any) -> None:
    return None


def _own_object(obj: Any, src: int = 0) -> Any:
    return obj


def _own_tensor(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    return tensor


def _own_decision(decision: bool, all: bool = True) -> bool:
    return decision


@contextlib.contextmanager
def _local_collectives(trainer: Any) -> Iterator[None]:
    """Within: the strategy's collectives answer for this rank alone, restored afterwards.

    A trial's outcome is agreed through the search's store; a collective inside the trial would
    leave the other ranks waiting when this rank's trial stops at an out-of-memory error.
    """
    strategy = trainer.strategy
    local = {
        "barrier": _no_barrier,
        "broadcast": _own_object,
        "reduce": _own_tensor,
        "reduce_boolean_decision": _own_decision,
    }
    targets: list[tuple[Any, str, Any]] = [(strategy, name, replacement) for name, replacement in local.items()]
    epoch_loop = trainer.fit_loop.epoch_loop
    if hasattr(epoch_loop, "_broadcast_sigterm_tensor"):
        targets.append((epoch_loop, "_broadcast_sigterm_tensor", _no_barrier))
    missing = object()
    saved = [(obj, name, obj.__dict__.get(name, missing)) for obj, name, _ in targets]
    for obj, name, replacement in targets:
        setattr(obj, name, replacement)
    try:
        yield
    finally:
        for obj, name, before in saved:
            if before is missing:
                delattr(obj, name)
            else:
                setattr(obj, name, before)
