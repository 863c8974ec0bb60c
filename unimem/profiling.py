"""``profile()``: run the framework's own memory profiler and keep its files.

- torch: the CUDA caching allocator's history (``torch.cuda.memory._record_memory_history``
  with ``max_entries`` bounding it), dumped with ``_dump_snapshot`` to
  ``torch_memory_snapshot.pickle``: open it at https://pytorch.org/memory_viz or with
  ``python -m torch.cuda._memory_viz trace_plot FILE -o trace.html``. CUDA only: torch
  keeps no such history for CPU tensors, so on a machine without CUDA this raises
  ``UnsupportedFeature`` (a profile that silently records nothing would look like
  "no allocations").
- JAX: ``jax.profiler.save_device_memory_profile`` (pprof format: ``pprof -http : FILE``),
  written at the end of the block and at each ``snapshot()``. It is a picture of the
  live buffers at that moment, not a history. Works on the CPU too.
- TensorFlow: ``tf.profiler.experimental.start/stop`` (a TensorBoard trace with the
  memory profile tab; ``tensorboard --logdir PATH``). Works on the CPU.

``path`` is a directory (created); ``paths`` lists the files written.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

from . import registry
from .errors import ConfigError, UnimemError, UnimemWarning, UnsupportedFeature
from .support import Phase
from .tracking import resolve_backend

__all__ = ["DEFAULT_MAX_ENTRIES", "Profile", "profile"]

DEFAULT_MAX_ENTRIES = 100_000  # torch keeps the newest entries: ~tens of MB of pickle at most
TORCH_SNAPSHOT = "torch_memory_snapshot.pickle"
JAX_PROFILE = "jax_memory.prof"


def _files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()


class Profile:
    """An open (or finished) profiler run; ``paths`` are the files it wrote."""

    def __init__(
        self, path: str | os.PathLike[str], backend: str | None = None, *, max_entries: int = DEFAULT_MAX_ENTRIES
    ):
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise ConfigError("path", f"expected a directory path, got {path!r}")
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError("path", f"{self.path} is a file; profile() writes a directory of files")
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ConfigError("max_entries", f"expected a positive int, got {max_entries!r}")
        if backend is not None:
            registry.canonical_name(backend)
        self.max_entries = max_entries
        self._requested = backend
        self.backend: str | None = None
        self.paths: list[Path] = []
        self._open = False
        self._before: set[Path] = set()
        self._snapshots = 0

    # --- lifecycle ---------------------------------------------------------------------
    def _resolve(self) -> str:
        if self.backend is None:
            name, _ = resolve_backend(self._requested)
            if name == "nvml":
                raise UnsupportedFeature(
                    "nvml",
                    "profile",
                    "NVML has no memory profiler; import the framework first or pass backend='torch', 'jax' or 'tf'",
                )
            self.backend = name
        return self.backend

    def start(self) -> Profile:
        if self._open:
            raise UnimemError("this profile is already running")
        name = self._resolve()
        framework = registry.get_backend(name).framework()
        if name == "torch" and not framework.cuda.is_available():
            raise UnsupportedFeature(
                "torch",
                "profile",
                "torch records allocator history for CUDA memory only and sees no CUDA device here; "
                "run on a GPU machine, or profile host memory with a Python profiler (e.g. memray)",
            )
        self.path.mkdir(parents=True, exist_ok=True)
        self._before = _files_under(self.path)
        if name == "torch":
            framework.cuda.memory._record_memory_history(max_entries=self.max_entries)
        elif name == "tensorflow":
            framework.profiler.experimental.start(str(self.path))
        self._open = True
        return self

    def stop(self) -> list[Path]:
        """Stop the profiler and write its files; returns every file this profile wrote."""
        if not self._open:
            raise UnimemError("this profile is not running")
        name = self.backend
        framework: Any = registry.get_backend(str(name)).framework()
        try:
            if name == "torch":
                target = self.path / TORCH_SNAPSHOT
                framework.cuda.memory._dump_snapshot(str(target))
            elif name == "jax":
                self._save_jax(self.path / JAX_PROFILE)
            elif name == "tensorflow":
                framework.profiler.experimental.stop()
        finally:
            if name == "torch":
                framework.cuda.memory._record_memory_history(enabled=None)  # stop recording (and its cost)
            self._open = False
        self.paths = sorted(_files_under(self.path) - self._before)
        return self.paths

    def snapshot(self, label: str | None = None) -> Path:
        """Write the profiler's picture of memory now (torch, JAX); returns the file."""
        name = self._resolve()
        if label is not None and (not isinstance(label, str) or not label or os.sep in label):
            raise ConfigError("label", f"expected a file-name-safe string, got {label!r}")
        self._snapshots += 1
        stem = label or f"snapshot{self._snapshots}-{int(time.time())}"
        self.path.mkdir(parents=True, exist_ok=True)
        if name == "torch":
            if not self._open:
                raise UnimemError("torch's allocator history exists only while the profile runs: call start() first")
            target = self.path / f"torch_{stem}.pickle"
            registry.get_backend("torch").framework().cuda.memory._dump_snapshot(str(target))
        elif name == "jax":
            target = self.path / f"jax_{stem}.prof"
            self._save_jax(target)
        else:
            raise UnsupportedFeature(
                name, "profile.snapshot", "TensorFlow's profiler writes one trace per run; use start()/stop()"
            )
        return target

    def _save_jax(self, target: Path) -> None:
        jax_backend = registry.get_backend("jax")
        if jax_backend.phase() is not Phase.INITIALIZED:
            # Saving would start JAX (and, on a GPU, preallocate 75% of it) to profile nothing.
            warnings.warn(
                "jax: no device memory profile written: JAX has not run anything in this process yet",
                UnimemWarning,
                stacklevel=3,
            )
            return
        sys.modules["jax"].profiler.save_device_memory_profile(str(target))

    def __enter__(self) -> Profile:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def profile(
    path: str | os.PathLike[str], backend: str | None = None, *, max_entries: int = DEFAULT_MAX_ENTRIES
) -> Profile:
    """Run ``backend``'s own memory profiler over a block and write its files under ``path``.

    ``with unimem.profile("prof/") as p: train_step()`` then ``p.paths``. For a
    one-off picture of JAX or torch memory: ``p.snapshot()``. See the module doc for
    the file each framework writes and how to open it.
    """
    return Profile(path, backend, max_entries=max_entries)
