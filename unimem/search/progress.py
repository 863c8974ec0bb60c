"""What ``find_batch_size`` shows while it runs, and what it attaches to an interrupt.

One line per call of the step (and per compilation, with ``lower=``) on stderr, through
``rich``, only where a person watches: a terminal, unless ``progress=`` says otherwise. Where
stderr is no terminal (a pipe, a log file) each line stays one line, however long. A
JAX failure can take half a minute, and a search that prints nothing looks hung.
"""

from __future__ import annotations

import sys
from typing import Any

from unimem.sizes import format_bytes

__all__ = ["Progress", "interrupted"]


class Progress:
    """Writes the search's lines to stderr when ``enabled`` (None: when stderr is a terminal)."""

    def __init__(self, enabled: bool | None) -> None:
        self.enabled = _is_terminal() if enabled is None else enabled
        self._console: Any = None

    def _print(self, text: str) -> None:
        if not self.enabled:
            return
        if self._console is None:
            from rich.console import Console

            console = Console(stderr=True, highlight=False)
            # A pipe or a log file has no width: rich would wrap at 80 columns, so one line
            # per call would come out as two. On a terminal rich fits its width.
            console.soft_wrap = not console.is_terminal
            self._console = console
        self._console.print(text, markup=False)

    def call(
        self, size: int, fits: bool, peak: int | None, seconds: float, reason: str, calls: int, budget: int
    ) -> None:
        """One call of the step: which of the budget, the size, whether it fit, its peak and time."""
        shown = f"peak {format_bytes(peak)}" if peak is not None else "peak ?"
        outcome = "fits" if fits else "OOM "
        self._print(
            f"find_batch_size  call {calls}/{budget}  {size:>9}  {outcome}  {shown:<16} {seconds:7.2f} s  ({reason})"
        )

    def compiled(
        self, size: int, predicted: int | None, seconds: float, largest: int | None = None, room: int | None = None
    ) -> None:
        """One compilation of ``lower(size)``: the peak it predicts, and its largest buffer
        against the largest the allocator can hand out, where both are known."""
        shown = "cannot be predicted" if predicted is None else f"predicted {format_bytes(predicted)}"
        pieces = (
            ""
            if largest is None or room is None
            else f"  largest buffer {format_bytes(largest)} of {format_bytes(room)}"
        )
        self._print(f"find_batch_size  compiled  {size:>9}  {shown:<22} {seconds:7.2f} s{pieces}")


def _is_terminal() -> bool:
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


def interrupted(exc: BaseException, best: int | None, calls: int) -> None:
    """Attach the largest size that ran so far to an interrupt of the search, which re-raises it:
    ``exc.unimem_best_size`` (None when none ran), and a note saying so on Python 3.11+."""
    exc.unimem_best_size = best  # type: ignore[attr-defined]
    found = f"the largest batch size that ran: {best}" if best else "no batch size ran yet"
    if hasattr(exc, "add_note"):
        exc.add_note(f"unimem.find_batch_size was interrupted after {calls} call(s) of the step; {found}")
