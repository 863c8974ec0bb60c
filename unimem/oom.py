"""Out-of-memory errors of every framework: recognise them, read them, guard a step.

``is_oom(exc)`` imports no framework: a framework's error classes are recognised by
their module and name anywhere in the exception's class hierarchy (a framework that
is not imported cannot have raised one), and the allocators' own messages by phrases
no other error uses.

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
import math
import re
import traceback
import types
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeVar, overload

from . import registry
from .errors import ConfigError, OutOfMemory

__all__ = ["framework_of", "is_oom", "oom_guard", "requested_bytes"]

F = TypeVar("F", bound=Callable[..., Any])

# (module prefix, class name) of each framework's OOM-carrying error classes.
_TORCH_OOM = (("torch", "OutOfMemoryError"),)
_TF_EXHAUSTED = (("tensorflow", "ResourceExhaustedError"),)
_JAX_RUNTIME = (("jax", "JaxRuntimeError"), ("jaxlib", "XlaRuntimeError"), ("jax", "XlaRuntimeError"))

# Allocator messages unique to an out-of-memory failure, whatever the error's type.
_ALLOCATOR_PHRASES = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|DefaultCPUAllocator: can't allocate memory"
    r"|MPS backend out of memory|HIP out of memory|XPU out of memory|CUBLAS_STATUS_ALLOC_FAILED"
    r"|PT_DEVMEM Allocation failed",
)
# What makes a RESOURCE_EXHAUSTED status about memory.
_MEMORY_PHRASES = re.compile(
    r"\bOOM\b|out of memory|ran out of memory|failed to allocate|trying to allocate|allocating",
    re.IGNORECASE,
)
_MAX_CHAIN = 64  # exceptions visited in one chain: a bound against pathological graphs


def _class_is(exc: BaseException, names: tuple[tuple[str, str], ...]) -> bool:
    for cls in type(exc).__mro__:
        module = getattr(cls, "__module__", "") or ""
        for prefix, name in names:
            if cls.__name__ == name and (module == prefix or module.startswith(prefix + ".")):
                return True
    return False


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a broken __str__ must not break the check
        return ""


def _is_oom_itself(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or _class_is(exc, _TORCH_OOM):
        return True
    message = _message(exc)
    if _ALLOCATOR_PHRASES.search(message):
        return True
    if _class_is(exc, _TF_EXHAUSTED):
        return bool(_MEMORY_PHRASES.search(message))
    if _class_is(exc, _JAX_RUNTIME):
        return "RESOURCE_EXHAUSTED" in message and bool(_MEMORY_PHRASES.search(message))
    return False


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

    Never imports a framework. See the module's docstring for what counts.
    """
    return find_oom(exc) is not None


def framework_of(exc: BaseException) -> str | None:
    """The framework whose error class or allocator message ``exc`` is, or None
    (a plain ``MemoryError``, or an error unimem does not know)."""
    if _class_is(exc, _TORCH_OOM) or _ALLOCATOR_PHRASES.search(_message(exc)):
        return "torch"
    for cls in type(exc).__mro__:
        module = getattr(cls, "__module__", "") or ""
        if module.split(".")[0] == "tensorflow":
            return "tensorflow"
        if module.split(".")[0] in ("jax", "jaxlib"):
            return "jax"
        if module.split(".")[0] == "torch":
            return "torch"
    return None


# --- how much was asked for ------------------------------------------------------------

# torch formats sizes with powers of 1024 whatever the spelling ("MB" on MPS, "MiB" on CUDA).
_TORCH_UNITS = {
    "bytes": 1,
    "B": 1,
    "KB": 1 << 10,
    "KiB": 1 << 10,
    "MB": 1 << 20,
    "MiB": 1 << 20,
    "GB": 1 << 30,
    "GiB": 1 << 30,
    "TB": 1 << 40,
    "TiB": 1 << 40,
    "PB": 1 << 50,
    "PiB": 1 << 50,
}
_TORCH_TRIED = re.compile(r"Tried to allocate ([0-9.]+) ?(bytes|[KMGTP]i?B|B)\b")
_TORCH_CPU = re.compile(r"you tried to allocate (\d+) bytes")
_XLA_BYTES = re.compile(r"(?:trying to allocate|allocating) (\d+) bytes|\((\d+)B\)|rounded to (\d+)\)")
# XLA on a GPU prints a rounded size: "Out of memory while trying to allocate 1.00GiB"
# (jaxlib 0.11.2 on an H200, benchmarks/results/sharing-gpu.json).
_XLA_SIZE = re.compile(r"trying to allocate ([0-9.]+) ?([KMGTP]i?B)\b")
_TF_SHAPE = re.compile(r"OOM when allocating tensor with shape\[([0-9,\s]*)\] and type (\w+)")
# Bytes per element of the dtype names TF prints (DataTypeString); 4-bit types round up.
_TF_DTYPE_BYTES: dict[str, float] = {
    "float": 4,
    "double": 8,
    "half": 2,
    "bfloat16": 2,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
    "qint8": 1,
    "quint8": 1,
    "qint16": 2,
    "quint16": 2,
    "qint32": 4,
    "float8_e5m2": 1,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "float8_e4m3b11fnuz": 1,
    "int4": 0.5,
    "uint4": 0.5,
}


def requested_bytes(message: str) -> tuple[int, str] | None:
    """``(bytes, the words they were read from)`` when an OOM message says how much
    was asked for, else None.

    torch: "Tried to allocate 2.00 GiB" (exact to torch's two decimals) or, on the CPU,
    "you tried to allocate N bytes"; JAX/XLA: "while trying to allocate N bytes",
    "allocating N bytes", "(NB)"; TensorFlow: "OOM when allocating tensor with
    shape[64,1024] and type float" (elements × dtype size; unknown dtypes give None).
    """
    if match := _TORCH_CPU.search(message):
        return int(match.group(1)), match.group(0)
    if match := _TORCH_TRIED.search(message):
        return int(float(match.group(1)) * _TORCH_UNITS[match.group(2)]), match.group(0)
    if match := _TF_SHAPE.search(message):
        dims = [part.strip() for part in match.group(1).split(",") if part.strip()]
        size = _TF_DTYPE_BYTES.get(match.group(2))
        if size is None:
            return None
        return math.ceil(math.prod(int(d) for d in dims) * size), match.group(0)
    if match := _XLA_BYTES.search(message):
        number = next(group for group in match.groups() if group is not None)
        return int(number), match.group(0)
    if match := _XLA_SIZE.search(message):  # rounded by XLA to two decimals
        return int(float(match.group(1)) * _TORCH_UNITS[match.group(2)]), match.group(0)
    return None


# --- the guard -------------------------------------------------------------------------------


def clear_frames(exc: BaseException) -> None:
    """Drop the local variables of the finished frames in ``exc``'s tracebacks (and its
    chain's): they hold the failed step's tensors, which would otherwise stay alive as
    long as the exception does. Frames still running are left alone."""
    for current in _chain(exc):
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)


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
        from .oom_report import build_report

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
    Its message is ``str(report)``.

    - ``backend``: the framework the step runs on; default: the one that raised.
    - ``batch_size``: the step's batch size, for an exact "smaller batch × accumulation
      steps" suggestion that keeps the global batch.
    - ``mixed_precision``: say whether it is already on; default: find out where the
      framework tells (Keras's global policy, torch autocast, the live tensors' dtypes).
    - ``top``: how many of the largest live tensors to list.
    - ``keep_frames``: keep the failed step's local variables alive (for a debugger).
      By default they are dropped once the report is made: the traceback would
      otherwise keep the failed step's tensors, and their memory, alive.
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
