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

``path`` is a directory (created); ``paths`` lists the files written. Each profiler is
its backend's (``adapter.observe.profiler()``); this module drives it and knows no framework.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from unimem import registry
from unimem.errors import ConfigError, UnimemError

if TYPE_CHECKING:
    from unimem.backends.base import Profiler

__all__ = ["DEFAULT_MAX_ENTRIES", "Profile", "profile"]

DEFAULT_MAX_ENTRIES = 100_000  # torch keeps the newest entries: ~tens of MB of pickle at most


def _files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()


class Profile:
    """An open (or finished) profiler run; ``paths`` are the files it wrote.

    Made by ``unimem.profile()``, which takes the same arguments and documents them.

    Args:
        path: A directory (created) the profiler's files go under.
        backend: A framework name or alias, or None for the action rule.
        max_entries: torch only: the most allocator events kept.

    Attributes:
        path (Path): The directory the files go under.
        backend (str | None): The framework profiled, set at ``start()`` (or the first
            ``snapshot()``).
        max_entries (int): torch only: the most allocator events kept.
        paths (list[Path]): The files this profile wrote, set by ``stop()``.

    Raises:
        ConfigError: ``path`` is empty or an existing file, ``max_entries`` is not a
            positive int, or ``backend`` is unknown.
    """

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
        self._profiler: Profiler | None = None

    # --- lifecycle ---------------------------------------------------------------------
    def _resolve(self) -> Profiler:
        """The backend's profiler, found once. Profiling is an action: it must know its framework
        before anything has run. ``UnsupportedFeature`` where that backend has none usable here."""
        if self._profiler is None:
            name = registry.resolve(self._requested, "action") or registry.FRAMEWORK_FREE
            self._profiler = registry.get_backend(name).observe.profiler()
            self.backend = name
        return self._profiler

    def start(self) -> Profile:
        """Start the framework's profiler (what entering ``with`` does).

        Returns:
            The profile itself.

        Raises:
            UnimemError: This profile is already running.
            ConfigError: With ``backend=None``, no framework or several are configured
                or imported: pass ``backend=``.
            UnsupportedFeature: The backend has no memory profiler usable here.
            BackendUnavailable: The framework is not installed.
        """
        if self._open:
            raise UnimemError("this profile is already running")
        profiler = self._resolve()  # refuses before anything is created
        self.path.mkdir(parents=True, exist_ok=True)
        self._before = _files_under(self.path)
        profiler.start(self.path, self.max_entries)
        self._open = True
        return self

    def stop(self) -> list[Path]:
        """Stop the profiler and write its files; returns every file this profile wrote.

        Returns:
            The files written under ``path`` since ``start()``, sorted (also kept as
            ``paths``).

        Raises:
            UnimemError: This profile is not running.
        """
        if not self._open or self._profiler is None:
            raise UnimemError("this profile is not running")
        try:
            self._profiler.stop(self.path)
        finally:
            self._open = False
        self.paths = sorted(_files_under(self.path) - self._before)
        return self.paths

    def snapshot(self, label: str | None = None) -> Path:
        """Write the profiler's picture of memory now (torch, JAX); returns the file.

        JAX: inside the block or outside it; torch: only while the profile runs (its
        allocator history exists only then); TensorFlow takes no snapshot.

        Args:
            label: The file's stem, safe as a file name; None (default):
                ``snapshot<N>-<unix time>``.

        Returns:
            The file written under ``path``.

        Raises:
            ConfigError: ``label`` is empty, not a string, or holds a path separator; or,
                with ``backend=None``, no framework or several are configured or imported.
            UnsupportedFeature: The backend has no memory profiler usable here, or takes
                no snapshot.
            UnimemError: torch, and the profile is not running: call ``start()`` first.
            BackendUnavailable: The framework is not installed.
        """
        profiler = self._resolve()
        if label is not None and (not isinstance(label, str) or not label or os.sep in label):
            raise ConfigError("label", f"expected a file-name-safe string, got {label!r}")
        self._snapshots += 1
        stem = label or f"snapshot{self._snapshots}-{int(time.time())}"
        self.path.mkdir(parents=True, exist_ok=True)
        return profiler.snapshot(self.path, stem, self._open)

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
    the file each framework writes and how to open it:

    - torch: the CUDA caching allocator's history, ``torch_memory_snapshot.pickle``
      (open it at https://pytorch.org/memory_viz). CUDA only.
    - JAX: ``jax.profiler.save_device_memory_profile`` (pprof format), written at the end
      of the block and at each ``snapshot()``: the live buffers at that moment.
    - TensorFlow: a TensorBoard trace with the memory profile tab.

    Args:
        path: A directory (created) the profiler's files go under.
        backend: A framework name or alias, or None (default): the framework named to
            ``configure()``, else the one imported (profiling is an action: it must know
            its framework before anything has run).
        max_entries: torch only: the most allocator events kept (the newest; default
            100000).

    Returns:
        The profile, not yet started: use it with ``with``, or ``start()``/``stop()``.

    Raises:
        ConfigError: ``path`` is empty or an existing file, ``max_entries`` is not a
            positive int, or ``backend`` is unknown (raised here); with ``backend=None``,
            no framework or several are configured or imported (raised at ``start()``).
        UnsupportedFeature: At ``start()``, the backend has no memory profiler usable
            here (torch without CUDA; CuPy; NVML).
        BackendUnavailable: At ``start()``, the framework is not installed.

    Example:
        ```python
        with unimem.profile("prof/", backend="jax") as p:
            train_step()
            p.snapshot("after-step")
        print(p.paths)
        ```
    """
    return Profile(path, backend, max_entries=max_entries)
