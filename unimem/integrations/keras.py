"""A Keras 3 callback that records memory per batch and per epoch, whatever Keras runs on.

Import it yourself (``import unimem`` never imports Keras): ``from unimem.integrations.keras import
MemoryCallback``. The keys it adds to the logs, and what per-batch recording costs:
docs/guides/observing-memory.md#per-step-memoryhook-and-the-keras-callback.

Keras's progress bar prints every number in the logs with four decimals, so the figures go there
in MiB, the unit in the key (``mem_host_rss_mib: 675.45``), not in bytes (``708263936.0000``);
the exact bytes stay in ``MemoryCallback.epochs`` and ``recording``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import keras

from unimem.errors import ConfigError
from unimem.integrations.memory_logs import figures as _figures
from unimem.observe.hook import MemoryHook
from unimem.observe.track import Tracked

__all__ = ["MemoryCallback", "keras_backend"]

# Keras backend name -> unimem backend name (the frameworks Keras 3 runs on whose allocator unimem knows).
_KERAS_TO_UNIMEM = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}


def _in_mib(figures: dict[str, int]) -> dict[str, float]:
    """Byte figures as Keras logs them: in MiB, to the hundredth, the unit in the key (``mem_peak_mib``)."""
    return {f"{key}_mib": round(value / 2**20, 2) for key, value in figures.items()}


def keras_backend() -> str:
    """The unimem backend for the framework Keras runs on."""
    name = str(keras.backend.backend())
    if name not in _KERAS_TO_UNIMEM:
        raise ConfigError(
            "backend", f"Keras runs on {name!r}, which has no GPU allocator unimem knows; use tensorflow, jax or torch"
        )
    return _KERAS_TO_UNIMEM[name]


class MemoryCallback(keras.callbacks.Callback):
    """Memory per batch and per epoch into Keras's logs in MiB (``mem_peak_mib``, ``mem_host_rss_mib``, ...),
    known figures only; the bytes are in ``epochs`` and ``recording``.

    Args:
        device: The device index, as the framework counts devices (default 0).
        per_batch: True (default): figures per batch and per epoch; False: per epoch only, Keras stays asynchronous.
        every: Record one batch in so many (default 1).
        max_samples: Samples kept before the series is decimated, peaks kept (at least 100, default 20000).

    Raises:
        ConfigError: An argument is invalid, or Keras runs on a framework unimem has no allocator for.
    """

    def __init__(self, device: int = 0, *, per_batch: bool = True, every: int = 1, max_samples: int = 20_000) -> None:
        super().__init__()
        if not isinstance(per_batch, bool):
            raise ConfigError("per_batch", f"expected True or False, got {per_batch!r}")
        self.backend = keras_backend()
        self.device = device
        self.per_batch = per_batch
        # Keras dispatches batch callbacks from a thread pool unless one needs the batch's
        # end; reading memory "at the end of the batch" does, so say which we are.
        self.async_safe = not per_batch
        self.hook = MemoryHook(self.backend, device, every=every, max_samples=max_samples)
        self.epochs: list[dict[str, Any]] = []
        self._epoch: Tracked | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.hook.step()  # opens the first interval (a batch, or an epoch with per_batch=False)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.per_batch:
            return
        tracked = self.hook.step()
        if tracked is not None and logs is not None:
            logs.update(_in_mib(_figures(tracked, self.hook.host_rss())))

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = Tracked(self.backend, self.device).__enter__()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        tracked = self._epoch
        if tracked is None:
            return
        tracked.close()
        self._epoch = None
        figures = _figures(tracked, self.hook.host_rss())
        self.epochs.append(
            {
                "epoch": epoch,
                "peak": tracked.peak,
                "peak_exact": tracked.peak_exact,
                "delta": tracked.delta,
                "duration": tracked.duration,
                "allocated": tracked.end.allocated if tracked.end else None,
                "host_rss": figures.get("mem_host_rss"),
                "host_peak": tracked.host_peak,
                "host_delta": tracked.host_delta,
                "note": tracked.note,
            }
        )
        if not self.per_batch:
            self.hook.step()
        self.hook.mark(f"epoch {epoch + 1}")
        if logs is not None:
            logs.update(_in_mib(figures))

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.hook.close()

    @property
    def recording(self) -> Any:
        return self.hook.recording

    def plot(self, path: str | os.PathLike[str], **kwargs: Any) -> Path:
        """A PNG of the per-batch timeline with a mark per epoch."""
        return self.hook.plot(path, **kwargs)
