"""TensorFlow under observation: the monitor's counter reader and the profiler trace.

Imports tensorflow only inside functions, and never starts its runtime: listing its
devices before it has run anything would start it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from unimem.backends.base import Observe
from unimem.backends.topics import Counters

from unimem.errors import NoFigures, UnsupportedFeature
from unimem.support import Phase

__all__ = ["TensorFlowObserve", "TensorFlowProfiler"]


class TensorFlowProfiler:
    """``tf.profiler.experimental.start/stop``: a TensorBoard trace with the memory profile tab
    (``tensorboard --logdir PATH``). Works on the CPU; one trace per run, no snapshots."""

    def __init__(self, tf: Any) -> None:
        self._tf = tf

    def start(self, path: Path, max_entries: int) -> None:
        self._tf.profiler.experimental.start(str(path))

    def stop(self, path: Path) -> None:
        self._tf.profiler.experimental.stop()

    def snapshot(self, path: Path, stem: str, running: bool) -> Path:
        raise UnsupportedFeature(
            "tensorflow", "profile.snapshot", "TensorFlow's profiler writes one trace per run; use start()/stop()"
        )


class TensorFlowObserve(Observe):
    """TensorFlow under observation (``ObserveTopic``): ``get_memory_info`` counters and the profiler trace."""

    def counter_reader(self, device: int) -> tuple[Callable[[], Counters] | None, str]:
        """``(allocated, None)`` of GPU ``device`` (TF counts no pool size); ``(None, None)`` until the
        runtime has started, ``NoFigures`` once it is known to have no such GPU."""
        checked: list[bool] = []

        def read() -> Counters:
            if not checked:
                if self.backend.phase() is not Phase.INITIALIZED:
                    return None, None
                import tensorflow as tf

                if device >= len(tf.config.list_logical_devices("GPU")):
                    raise NoFigures("tensorflow sees no GPU here: allocator figures are None")
                checked.append(True)
            snapshot = self.backend.stats(device, nvml=False)
            return snapshot.allocated, snapshot.reserved

        return read, ""

    def profiler(self) -> TensorFlowProfiler:
        """The profiler, importing tensorflow (an explicit request for it)."""
        import tensorflow as tf

        return TensorFlowProfiler(tf)
