"""How a trainer's batch-size finder tries a size, shared by the Lightning and Hugging Face finders.

A trial is a short fit, and its answer holds only as far as the trial is like the fit it serves.

- **It starts where the fit starts** (``FitStart``). A fit begins with no gradients and, unless it
  resumes, an optimizer without state: its first step makes both, inside the pool its own
  activations just left, and its second step meets that pool. A trial that found them made by an
  earlier, smaller trial meets a pool they do not split, and can run a size the fit cannot. So each
  trial starts without them, as the fit does, and leaves none behind: between trials the search
  empties the framework's cache, and the next trial meets the pool a fresh fit meets.
- **The sizes the finder may answer are bounded** (Lightning's ``max_val``, one rank's share of the
  data), but such a bound says nothing of memory. The search is given none: ``bounded`` refuses a
  size above it without running it (``NotTried``, which the search reads as a size that does not
  fit, at no cost), so the search grows from its first size by what the trial's peak allows.
- **The answer is not re-run** (``confirm=False``): it ran from the fit's own start, with the pool
  emptied before it, and a re-run would meet the same.

Framework-free: optimizers and parameters are read by their torch attributes (``state``,
``grad``), so this module imports nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["SEARCH_SETTINGS", "FitStart", "NotTried", "bounded"]

# The search's settings every trainer finder passes with its own (see the module's docstring).
SEARCH_SETTINGS: dict[str, Any] = {"max_size": None, "confirm": False}


class NotTried(MemoryError):
    """A size above the finder's bound, refused without running: to the search, a size that does not fit."""


def bounded(step: Callable[[int], Any], bound: int, what: str) -> Callable[[int], None]:
    """``step``, refusing every size above ``bound`` (``what`` names the bound) with ``NotTried``."""

    def tried(size: int) -> None:
        if size > bound:
            raise NotTried(f"batch size {size} not tried: above {what} ({bound})")
        step(size)

    return tried


class FitStart:
    """What a fit starts from that a trial changes, read before the first trial: the optimizers without
    state, and the parameters when none has a gradient. ``restore()`` puts both back; the state of an
    optimizer that had some (a fit that resumes) is the fit's too, and stays.

    Args:
        optimizers: The optimizers the trials step (torch optimizers: a ``state`` mapping).
        parameters: The parameters they train (each with a ``grad``), repeats allowed.
    """

    def __init__(self, optimizers: Iterable[Any], parameters: Iterable[Any]) -> None:
        self._stateless = [optimizer for optimizer in optimizers if not optimizer.state]
        unique = list({id(p): p for p in parameters}.values())
        self._gradless = unique if all(p.grad is None for p in unique) else []

    def restore(self) -> None:
        """The optimizers without state and the parameters without gradients again, as the fit starts."""
        for optimizer in self._stateless:
            optimizer.state.clear()
        for parameter in self._gradless:
            parameter.grad = None
