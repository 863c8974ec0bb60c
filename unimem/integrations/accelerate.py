"""accelerate's ``find_executable_batch_size``, with each next size placed from the failure's figures.

Switching is the import line: ``from unimem.integrations.accelerate import find_executable_batch_size``
in place of ``from accelerate.utils import find_executable_batch_size``. The signature and the
behaviour are accelerate's: the decorated function takes the batch size as its first argument, runs
at the size found and its result is returned; the size is kept across calls; passing a batch size
yourself is a ``TypeError``; only the errors accelerate's ``should_reduce_batch_size`` accepts
(out of memory) are retried, and size 0 is a ``RuntimeError``. Two things differ:

- The next size after an out-of-memory error is read from it: the bytes in use when it failed and
  the bytes it asked for (from torch's figures, else from its message) against what the process
  could hold say how far the size must come down. It is never above accelerate's next size, and
  never below the largest size those figures allow: it stops no later than accelerate, at a size
  no smaller.
- A failure leaves nothing behind: the failed call's frames are cleared and the cache is emptied
  after leaving the ``except`` block (a retry inside it runs beside the failed call's tensors).

Importing this module imports accelerate and torch. The rule, step by step:
docs/guides/accelerate.md#how-the-next-size-is-chosen.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from collections.abc import Callable
from typing import Any

from accelerate.utils.memory import clear_device_cache, should_reduce_batch_size

from unimem.diagnose.recognise import clear_frames, error_text, requested_bytes
from unimem.errors import ConfigError
from unimem.integrations.descent import ACCELERATE_FACTOR, Attempt, message_figures, next_size

__all__ = ["Attempt", "ExecutableBatchSize", "find_executable_batch_size"]

_GPU = re.compile(r"GPU (\d+) has a total capacity")


def _torch() -> Any:
    return sys.modules.get("torch")


def _device(message: str = "") -> int:
    """The CUDA device the message names, else the current one (0 where CUDA has not started)."""
    if match := _GPU.search(message):
        return int(match.group(1))
    torch = _torch()
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    return 0


def _allocated(device: int) -> int | None:
    """Bytes in live tensors on the device; None before CUDA starts (torch keeps no figures on the CPU)."""
    torch = _torch()
    if torch is None or not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    return int(torch.cuda.memory_allocated(device))


def _reset_peak(device: int) -> None:
    torch = _torch()
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats(device)


def _failure(exc: BaseException, size: int, baseline: int | None) -> Attempt:
    """The figures of an out-of-memory error, read before its frames are cleared (its tensors still count)."""
    message = error_text(exc)
    first = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
    asked = requested_bytes(message)
    device = _device(message)
    in_use: int | None = None
    capacity: int | None = None
    peak: int | None = None
    torch = _torch()
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        in_use = int(torch.cuda.memory_allocated(device))
        peak = int(torch.cuda.max_memory_allocated(device))
        import unimem

        snapshot = unimem.stats("torch", device)
        bounds = [snapshot.limit]
        if snapshot.reserved is not None and snapshot.device_free is not None:
            bounds.append(snapshot.reserved + snapshot.device_free)
        capacity = min((b for b in bounds if b is not None), default=None)
    stated_in_use, stated_capacity = message_figures(message)
    in_use = stated_in_use if in_use is None else in_use
    capacity = stated_capacity if capacity is None else capacity
    needed = None
    if in_use is not None and asked is not None:
        needed = max(in_use + asked[0], peak or 0)
    return Attempt(size, first[:300], needed, capacity, baseline)


class ExecutableBatchSize:
    """The decorated function (made by ``find_executable_batch_size``): call it without the batch size.

    Attributes:
        batch_size: The size the next call starts at: the last that ran, once one has.
        attempts: Every call of the function so far, in order (``Attempt``: size, error, figures).
    """

    def __init__(
        self, function: Callable[..., Any], starting_batch_size: int, reduce_batch_size_fn: Callable[[], int] | None
    ) -> None:
        self.function = function
        self.batch_size = starting_batch_size
        self.reduce_batch_size_fn = reduce_batch_size_fn
        self.attempts: list[Attempt] = []
        functools.update_wrapper(self, function)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        clear_device_cache(garbage_collection=True)
        params = list(inspect.signature(self.function).parameters.keys())
        # accelerate's guard against passing the batch size, word for word: the decorator passes it.
        if len(params) < (len(args) + 1):
            arg_str = ", ".join([f"{arg}={value}" for arg, value in zip(params[1:], args[1:], strict=False)])
            raise TypeError(
                f"Batch size was passed into `{self.function.__name__}` as the first argument when called."
                f"Remove this as the decorator already does so: `{self.function.__name__}({arg_str})`"
            )
        accelerate_size = self.batch_size  # where accelerate's own descent would be, to stay at or below it
        while True:
            if self.batch_size == 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            size = self.batch_size
            device = _device()
            baseline = _allocated(device)
            _reset_peak(device)
            try:
                result = self.function(size, *args, **kwargs)
            except Exception as exc:
                if not should_reduce_batch_size(exc):
                    raise
                failed = _failure(exc, size, baseline)
                clear_frames(exc)  # the failed call's tensors go with its frames, before the next call
            else:
                self.attempts.append(Attempt(size))
                return result
            # Out of the except block: the exception and its traceback are gone, so the cache can empty.
            self.attempts.append(failed)
            clear_device_cache(garbage_collection=True)
            accelerate_size = int(accelerate_size * ACCELERATE_FACTOR)
            if self.reduce_batch_size_fn is not None:
                self.batch_size = self.reduce_batch_size_fn()
            else:
                self.batch_size = next_size(failed, accelerate_size)


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Any:
    """Run ``function`` at the largest batch size that fits, from ``starting_batch_size`` down; accelerate's API.

    ``function`` takes the batch size as its first argument and is called without it; after an out-of-memory
    error it runs again at a smaller size, placed from the error's figures (see the module's docstring), and
    the result of the call that ran is returned.

    Args:
        function: The function to run (a whole training loop); None: a decorator.
        starting_batch_size: The first size tried (default 128); later calls start where the last one ran.
        reduce_batch_size_fn: Returns the next size after a failure, replacing unimem's rule (as in accelerate).

    Returns:
        An ``ExecutableBatchSize`` wrapping ``function`` (its ``batch_size`` and ``attempts`` say what ran).

    Raises:
        ConfigError: ``starting_batch_size`` is not an int of 1 or more, or a function is not callable.
        TypeError: The wrapped function was called with a batch size (the decorator passes it).
        RuntimeError: Size 0 was reached ("No executable batch size found, reached zero.").

    Example:
        ```python
        @find_executable_batch_size(starting_batch_size=128)
        def train(batch_size, model, optimizer):
            ...

        train(model, optimizer)
        ```
    """
    if isinstance(starting_batch_size, bool) or not isinstance(starting_batch_size, int) or starting_batch_size < 1:
        raise ConfigError("starting_batch_size", f"expected an int of 1 or more, got {starting_batch_size!r}")
    if reduce_batch_size_fn is not None and not callable(reduce_batch_size_fn):
        raise ConfigError(
            "reduce_batch_size_fn", f"expected a function returning the next size, got {reduce_batch_size_fn!r}"
        )
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    if not callable(function):
        raise ConfigError("function", f"expected the function to run (batch_size first), got {function!r}")
    return ExecutableBatchSize(function, starting_batch_size, reduce_batch_size_fn)
