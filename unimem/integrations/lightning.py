"""Lightning callbacks (``lightning.pytorch``): memory in the loggers, out-of-memory errors explained, and the
largest batch that fits, on one device or over DDP ranks.

Import it yourself (``import unimem`` never imports Lightning)::

    from unimem.integrations.lightning import BatchSizeFinder, MemoryCallback

    trainer = L.Trainer(callbacks=[MemoryCallback(), BatchSizeFinder()])

For the older ``pytorch_lightning`` package, import the same names from
``unimem.integrations.pytorch_lightning``: a Trainer knows its own package's callback classes.
The guide: docs/guides/lightning.md.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BatchSizeFinder as _LightningBatchSizeFinder

from unimem.integrations.lightning_base import BatchSizeFinderMixin, MemoryCallbackMixin

__all__ = ["BatchSizeFinder", "MemoryCallback"]


class MemoryCallback(MemoryCallbackMixin, pl.Callback):
    """Memory per training batch into the trainer's loggers, and unimem's report on an out-of-memory error.

    Logs ``mem_allocated``, ``mem_reserved``, ``mem_peak`` (the batch's peak), ``mem_process``,
    ``mem_host_rss`` and ``mem_host_peak`` in bytes, known figures only, through every logger of the trainer
    where Lightning logs the loss and at its step: every ``every`` optimizer steps. Over several ranks each
    figure is the largest over the ranks and each rank's peak is ``mem_peak_rank{r}``; every rank keeps its
    own series (``recording``).

    On an out-of-memory error during ``fit`` (any framework's, as ``unimem.is_oom`` reads it) the error
    Lightning re-raises carries unimem's report as a note, also kept in ``report`` (a ``unimem.OOMReport``).

    Args:
        every: Log one optimizer step in so many (the last batch of an accumulation); None (default): the
            trainer's ``log_every_n_steps``, as the loss.
        max_samples: Batches kept before this rank's series is thinned, peaks kept (at least 100, default 20000).
        explain_oom: Add unimem's report to an out-of-memory error (default True).

    Raises:
        ConfigError: An argument is invalid.
    """

    def __init__(self, *, every: int | None = None, max_samples: int = 20_000, explain_oom: bool = True) -> None:
        pl.Callback.__init__(self)
        MemoryCallbackMixin.__init__(self, every=every, max_samples=max_samples, explain_oom=explain_oom)

    _pl: Any = pl


class BatchSizeFinder(BatchSizeFinderMixin, _LightningBatchSizeFinder):
    """Lightning's ``BatchSizeFinder`` with unimem's search: the largest batch that fits, also under DDP.

    Takes Lightning's arguments. At the start of ``fit`` it tries sizes (each a real run of
    ``steps_per_trial`` training steps of the fit's own loop, from the fit's own start: no gradients, the
    optimizer's state as the fit finds it; the checkpoint restored afterwards), sets the answer where Lightning
    does (the ``batch_arg_name`` attribute of the model, its ``hparams`` or the datamodule), and fit goes on
    with it. Under DDP every rank searches together and gets the same answer. Sizes are held to ``max_val``
    and to one rank's share of the training data. As Lightning's finder: run by Lightning's ``Tuner`` in place
    of its own, the fit stops after the search; a batch size both on the model and in its ``hparams`` is warned
    about (both are set).

    Args:
        mode: None (default) or ``"binsearch"``: unimem's answer, within ``margin`` of the largest that fits;
            ``"power"``: that answer rounded down to a power of two. Read in any case, as Lightning reads it.
        steps_per_trial: Training steps per size tried (default 3: the optimizer's state is allocated in the
            first, and the step after it holds it beside the activations).
        init_val: The first size tried (default 2).
        max_trials: The most sizes tried, one refused above the bound unrun included (default 25); 0: none, the
            start size kept, as in Lightning.
        batch_arg_name: The attribute that holds the batch size (default ``"batch_size"``).
        margin: The answer is at least ``(1 - margin)`` × the largest size that fits (default 0.05).
        max_val: No size above it (default 8192); None: no bound but the data.
        limit: Bytes (or ``"20GiB"``) a trial's peak may reach; None (default): the device's cap.
        measure: Returns the last trial's peak bytes; None (default): torch's peak figure.
        time_limit: Seconds the whole search may take; None (default): no bound.
        progress: A line per size tried on stderr (rank 0); None (default): when stderr is a terminal.
        timeout: Seconds each rank waits for the others at each agreement (default 600).

    Attributes:
        optimal_batch_size: The answer, once ``fit`` has searched.
        search: The whole search (``unimem.BatchSizeSearch``: every trial, the notes).

    Raises:
        ConfigError: An argument is invalid; at ``fit``, a strategy other than one device or DDP, dataloaders
            passed to ``fit()``, or no ``batch_arg_name`` attribute.
        OutOfMemory: Even batch size 1 does not fit (with unimem's report).
    """

    _pl: Any = pl
