"""One call of the user's step in a batch search: an out-of-memory error comes back as a line of
text with its frames cleared; any other error is marked with the batch size it came at (and
posted to the other ranks) before it propagates."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from unimem.diagnose.guard import clear_frames, find_oom
from unimem.diagnose.recognise import error_text
from unimem.search.framework import step_error_note

if TYPE_CHECKING:
    from unimem.search.framework import Framework
    from unimem.search.ranks import Ranks

__all__ = ["attempt", "mark", "tell_ranks"]


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``; on Python 3.10, the ``__notes__`` list it would add to (PEP 678)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        return
    with contextlib.suppress(AttributeError, TypeError):  # an exception type that takes no attributes
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]


def mark(exc: BaseException, size: int, note: str) -> None:
    """Say at which batch size ``exc`` stopped the search: a note, and ``exc.unimem_batch_size``."""
    with contextlib.suppress(AttributeError, TypeError):
        exc.unimem_batch_size = size  # type: ignore[attr-defined]
    _add_note(exc, note)


def tell_ranks(over: Ranks | None, kind: str, size: int, exc: BaseException) -> None:
    """Before this rank's own error propagates, post it as its answer to this round, so the
    other ranks stop at once instead of waiting out their timeout."""
    if over is not None:
        text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        with contextlib.suppress(Exception):  # the store may have gone: this rank's own error matters more
            over.post({"kind": kind, "size": size, "raised": text[:500]})


def attempt(
    step: Callable[[int], Any],
    size: int,
    after_oom: bool,
    framework: Framework | None,
    over: Ranks | None = None,
    kind: str = "trial",
) -> tuple[str | None, BaseException | None]:
    """Run ``step(size)``. Returns ``(None, None)`` when it fit; on an out-of-memory
    error, its first line and, for a final report only, the error with its frames cleared.
    ``after_oom``: an earlier trial failed, so a step that donates its state has lost it.
    Over ranks, any other error is posted to them (``kind``: the round) before it propagates."""
    try:
        step(size)
    except Exception as exc:
        oom = find_oom(exc)
        if oom is None:
            mark(exc, size, f"unimem.find_batch_size: the step raised this at batch size {size}")
            note = step_error_note(framework, exc, after_oom)
            if note is not None:
                _add_note(exc, note)  # the framework's own message may name no cause
            tell_ranks(over, kind, size, exc)
            raise
        text = error_text(oom).strip().splitlines()
        # The frames hold the failed step's tensors: drop their locals here, so that
        # nothing but this line of text outlives the except block.
        clear_frames(exc)
        return (text[0][:300] if text else type(oom).__name__), (exc if size == 1 else None)
    return None, None
