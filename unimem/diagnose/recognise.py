"""Recognise out-of-memory errors of every framework, and read what they say.

Shared by ``unimem.diagnose.guard`` (the guard) and ``unimem.diagnose.report`` (the report), so neither
imports the other. Nothing here imports a framework: each installed backend's ``diagnose``
topic recognises its own errors from class names, modules and messages (``recognises_oom``),
and reads the bytes asked for from its own messages (``requested_bytes``). The adapters
are read once.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING

from unimem import registry

if TYPE_CHECKING:
    from unimem.backends.base import Backend

__all__ = ["clear_frames", "error_text", "find_oom", "framework_of", "is_oom", "requested_bytes"]

_MAX_CHAIN = 64  # exceptions visited in one chain: a bound against pathological graphs
_adapters: list[Backend] = []  # every installed backend's adapter, in registry order, once read


def adapters() -> list[Backend]:
    """Every installed backend's adapter, in registry order (read once: ``is_oom`` runs in except
    blocks and search loops, and must stay cheap). A framework that is not installed raised nothing."""
    if not _adapters:
        found = []
        for name in registry.all_backends():  # plug-ins too: their errors are theirs to recognise
            try:
                found.append(registry.get_backend(name))
            except Exception:  # not installed, or an adapter that cannot be loaded: it recognises nothing
                continue
        _adapters[:] = found
    return _adapters


def error_text(exc: BaseException) -> str:
    """``str(exc)``, or ``""`` when the exception's ``__str__`` itself fails."""
    try:
        return str(exc)
    except Exception:  # a broken __str__ must not break the check
        return ""


def _is_oom_itself(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    message = error_text(exc)
    return any(adapter.diagnose.recognises_oom(exc, message) for adapter in adapters())


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and the members of exception groups, each once."""
    seen: set[int] = set()
    pending = [exc]
    while pending and len(seen) < _MAX_CHAIN:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        members = getattr(current, "exceptions", None)  # BaseExceptionGroup (3.11+)
        if isinstance(members, (tuple, list)) and isinstance(current, BaseException):
            pending.extend(m for m in members if isinstance(m, BaseException))
        if current.__cause__ is not None:
            pending.append(current.__cause__)
        if current.__context__ is not None and not current.__suppress_context__:
            pending.append(current.__context__)


def find_oom(exc: object) -> BaseException | None:
    """The out-of-memory error in ``exc``'s chain (``exc`` itself first), or None.

    An interrupt or exit (``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit``) is
    never an OOM, even when it came while an OOM was being handled: it must stop the
    program, not be retried with a smaller batch.
    """
    if not isinstance(exc, Exception):
        return None
    for current in _chain(exc):
        if _is_oom_itself(current):
            return current
    return None


def is_oom(exc: object) -> bool:
    """True when ``exc`` is, or wraps, an out-of-memory error of any framework.

    Never imports a framework. See ``unimem.diagnose.guard``'s docstring for what counts: in short,
    torch's ``OutOfMemoryError`` and its allocators' messages, TensorFlow's
    ``ResourceExhaustedError`` and JAX's runtime errors with status
    ``RESOURCE_EXHAUSTED`` when the message is about memory, CuPy's pool
    ``OutOfMemoryError`` (and CUDA errors whose status is an allocation failure),
    Python's ``MemoryError`` (so ``unimem.OutOfMemory``), and any of these as the
    ``__cause__`` or ``__context__`` of another error or inside an ``ExceptionGroup``.
    An interrupt or exit (``KeyboardInterrupt``, ``SystemExit``) never is one.

    Args:
        exc: Any object, usually the exception caught in an ``except`` block.

    Returns:
        True if ``exc`` or an error in its chain is an out-of-memory error; False
        otherwise (also for anything that is not an ``Exception``).

    Example:
        ```python
        try:
            train_step(batch)
        except Exception as exc:
            if not unimem.is_oom(exc):
                raise
            batch = batch[: len(batch) // 2]
        ```
    """
    return find_oom(exc) is not None


def framework_of(exc: BaseException) -> str | None:
    """The first backend (registry order) that recognises ``exc`` as its out-of-memory
    error or whose module its class comes from; None for a plain ``MemoryError`` or an
    error unimem does not know."""
    message = error_text(exc)
    for adapter in adapters():
        if adapter.diagnose.recognises_oom(exc, message) or adapter.diagnose.owns_error(exc):
            return adapter.name
    return None


def requested_bytes(message: str) -> tuple[int, str] | None:
    """``(bytes, the words they were read from)`` when an OOM message says how much
    was asked for, else None. Each backend reads its own framework's messages; the
    first that reads one answers.

    torch: "Tried to allocate 2.00 GiB" (exact to torch's two decimals) or, on the CPU,
    "you tried to allocate N bytes"; JAX/XLA: "while trying to allocate N bytes",
    "allocating N bytes", "(NB)"; TensorFlow: "OOM when allocating tensor with
    shape[64,1024] and type float" (elements × dtype size; unknown dtypes give None).
    """
    for adapter in adapters():
        found = adapter.diagnose.requested_bytes(message)
        if found is not None:
            return found
    return None


def clear_frames(exc: BaseException) -> None:
    """Drop the local variables of the finished frames in ``exc``'s tracebacks (and its
    chain's): they hold the failed step's tensors, which would otherwise stay alive as
    long as the exception does. Frames still running are left alone."""
    for current in _chain(exc):
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
