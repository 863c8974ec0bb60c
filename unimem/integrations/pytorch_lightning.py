"""The Lightning callbacks for the older ``pytorch_lightning`` package: the same as
``unimem.integrations.lightning``, joined to ``pytorch_lightning``'s own classes (its Trainer
moves its own ``BatchSizeFinder`` first and checks its own callback types).

    from unimem.integrations.pytorch_lightning import BatchSizeFinder, MemoryCallback
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import BatchSizeFinder as _LightningBatchSizeFinder

from unimem.integrations.lightning_base import BatchSizeFinderMixin, MemoryCallbackMixin

__all__ = ["BatchSizeFinder", "MemoryCallback"]


class MemoryCallback(MemoryCallbackMixin, pl.Callback):
    """``unimem.integrations.lightning.MemoryCallback`` for ``pytorch_lightning``; see there."""

    def __init__(self, *, every: int | None = None, max_samples: int = 20_000, explain_oom: bool = True) -> None:
        pl.Callback.__init__(self)
        MemoryCallbackMixin.__init__(self, every=every, max_samples=max_samples, explain_oom=explain_oom)

    _pl: Any = pl


class BatchSizeFinder(BatchSizeFinderMixin, _LightningBatchSizeFinder):
    """``unimem.integrations.lightning.BatchSizeFinder`` for ``pytorch_lightning``; see there."""

    _pl: Any = pl
