"""Out-of-memory errors of every framework: recognise them, read them, guard a step.

``is_oom(exc)`` imports no framework: each backend's adapter recognises its framework's
error classes by their module and name anywhere in the exception's class hierarchy (a
framework that is not imported cannot have raised one), and its allocators' own
messages by phrases no other error uses (``unimem.diagnose.recognise``).

What counts as out of memory:

- ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` is the same class), and
  torch's allocator messages in any error: "CUDA out of memory", "CUDA error: out of
  memory", "DefaultCPUAllocator: can't allocate memory" (torch raises that one as a
  plain ``RuntimeError``), "MPS backend out of memory", "HIP"/"XPU out of memory",
  "CUBLAS_STATUS_ALLOC_FAILED";
- TensorFlow's ``ResourceExhaustedError`` and JAX's ``JaxRuntimeError`` /
  ``XlaRuntimeError`` with status ``RESOURCE_EXHAUSTED``, when the message is about
  memory ("OOM when allocating", "Out of memory", "ran out of memory", "failed to
  allocate"). RESOURCE_EXHAUSTED is a general status (quotas, file systems): one that
  is not about memory is not an OOM, and the word in an error of any other type (an
  RPC error quoting a status) is not one either;
- Python's ``MemoryError`` (and so ``unimem.OutOfMemory``);
- any of these as the ``__cause__`` or ``__context__`` of another error (not past
  ``raise ... from None``), or inside an ``ExceptionGroup``; but never an interrupt or
  exit (``KeyboardInterrupt``, ``SystemExit``), whatever it interrupted.

cuDNN's ``CUDNN_STATUS_NOT_SUPPORTED``, which some batch-size finders treat as an OOM,
is not one: it also means an unsupported configuration, and retrying smaller would
hide that.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

from unimem import registry
from unimem.diagnose.recognise import clear_frames as clear_frames
from unimem.diagnose.recognise import find_oom as find_oom
from unimem.diagnose.recognise import framework_of, is_oom, requested_bytes
from unimem.errors import ConfigError, OutOfMemory

__all__ = ["framework_of", "is_oom", "oom_guard", "requested_bytes"]

F = TypeVar("F", bound=Callable[..., Any])


# --- the guard -------------------------------------------------------------------------------


class OOMGuard(contextlib.ContextDecorator):
    """Context manager and decorator made by ``oom_guard``; see there."""

    def __init__(
        self,
        backend: str | None,
        *,
        device: int,
        batch_size: int | None,
        mixed_precision: bool | None,
        top: int,
        keep_frames: bool,
    ) -> None:
        self.backend = backend
        self.device = device
        self.batch_size = batch_size
        self.mixed_precision = mixed_precision
        self.top = top
        self.keep_frames = keep_frames

    def __enter__(self) -> OOMGuard:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> Literal[False]:
        if exc is None or isinstance(exc, OutOfMemory):
            return False  # no error, or an inner guard already explained it
        oom = find_oom(exc)
        if oom is None:
            return False
        from unimem.diagnose.report import build_report

        report = build_report(
            oom,
            backend=self.backend,
            device=self.device,
            batch_size=self.batch_size,
            mixed_precision=self.mixed_precision,
            top=self.top,
        )
        if not self.keep_frames:
            clear_frames(exc)
        raise OutOfMemory(str(report), report) from exc


def _check_guard_args(
    backend: object, device: object, batch_size: object, mixed_precision: object, top: object, keep_frames: object
) -> None:
    if backend is not None:
        registry.canonical_name(backend)
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ConfigError("device", f"expected a device index (0 or more), got {device!r}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ConfigError("batch_size", f"expected the step's batch size (an int of 1 or more), got {batch_size!r}")
    if mixed_precision is not None and not isinstance(mixed_precision, bool):
        raise ConfigError("mixed_precision", f"expected True, False or None (find out), got {mixed_precision!r}")
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise ConfigError("top", f"expected how many live tensors to list (0 or more), got {top!r}")
    if not isinstance(keep_frames, bool):
        raise ConfigError("keep_frames", f"expected True or False, got {keep_frames!r}")


@overload
def oom_guard(backend: F) -> F: ...


@overload
def oom_guard(
    backend: str | None = None,
    *,
    device: int = 0,
    batch_size: int | None = None,
    mixed_precision: bool | None = None,
    top: int = 10,
    keep_frames: bool = False,
) -> OOMGuard: ...


def oom_guard(
    backend: str | None | F = None,
    *,
    device: int = 0,
    batch_size: int | None = None,
    mixed_precision: bool | None = None,
    top: int = 10,
    keep_frames: bool = False,
) -> OOMGuard | F:
    """Turn any framework's out-of-memory error into ``unimem.OutOfMemory``.

    As a context manager (``with unimem.oom_guard(batch_size=64): step()``) or a
    decorator (``@unimem.oom_guard`` or ``@unimem.oom_guard(batch_size=64)``). Other
    errors pass through untouched. The raised ``OutOfMemory`` has the framework's error
    as ``__cause__`` and a ``report`` (``unimem.OOMReport``): the stats at the failure,
    the bytes asked for when the message says, fragmentation, the largest live
    tensors/arrays, other frameworks' pools in this process, and ranked suggestions.
    Its message is ``str(report)``. An ``OutOfMemory`` raised by an inner guard passes
    through unchanged.

    Args:
        backend: The framework the step runs on (a name or alias); None (default): the
            one that raised. Used bare as ``@unimem.oom_guard``, this is the decorated
            function.
        device: The device index the step runs on (default 0), for the report's figures.
        batch_size: The step's batch size, for an exact "smaller batch × accumulation
            steps" suggestion that keeps the global batch; None (default) if unknown.
        mixed_precision: Say whether it is already on; None (default): find out where
            the framework tells (Keras's global policy, torch autocast, the live tensors'
            dtypes).
        top: How many of the largest live tensors to list (default 10; 0 lists none,
            counts and totals are still given).
        keep_frames: Keep the failed step's local variables alive (for a debugger).
            By default (False) they are dropped once the report is made: the traceback
            would otherwise keep the failed step's tensors, and their memory, alive.

    Returns:
        A guard usable as a context manager and as a decorator; used bare as
        ``@unimem.oom_guard``, the decorated function itself, guarded.

    Raises:
        ConfigError: An argument is invalid (an unknown backend, a device index below 0,
            a batch size below 1, ``top`` below 0, a non-bool flag; or not an int where
            one is expected); raised here, before the step runs.
        OutOfMemory: Inside the guarded block or function, in place of any framework's
            out-of-memory error; ``exc.report`` is the ``OOMReport``.

    Example:
        ```python
        with unimem.oom_guard(batch_size=64):
            train_step(batch)

        @unimem.oom_guard
        def step(batch):
            ...

        try:
            step(batch)
        except unimem.OutOfMemory as exc:
            for suggestion in exc.report.suggestions:
                print(suggestion.action)
        ```
    """
    if callable(backend) and not isinstance(backend, str):
        function = backend
        guard = OOMGuard(None, device=0, batch_size=None, mixed_precision=None, top=10, keep_frames=False)
        return guard(function)
    _check_guard_args(backend, device, batch_size, mixed_precision, top, keep_frames)
    name = registry.canonical_name(backend) if backend is not None else None
    return OOMGuard(
        name,
        device=device,
        batch_size=batch_size,
        mixed_precision=mixed_precision,
        top=top,
        keep_frames=keep_frames,
    )
