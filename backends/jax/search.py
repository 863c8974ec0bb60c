"""What ``find_batch_size`` says about a JAX step's "Array has been deleted" after an
out-of-memory error. Imports nothing of JAX."""

from __future__ import annotations

__all__ = ["explain_step_error"]

# A failed call deletes the arrays it was given to donate; JAX's own message names no cause.
_DONATED = (
    "unimem.find_batch_size: an earlier trial ran out of memory, and a JAX call that fails deletes "
    "the arrays it was given to donate (donate_argnums). Search with a step that does not donate "
    "(or passes copies), then donate in training with the size found"
)


def explain_step_error(exc: BaseException, after_oom: bool) -> str | None:
    """The cause of JAX's "Array has been deleted" raised by a step after an earlier trial's
    out-of-memory error (the step donated its state, which the failed call deleted); else None."""
    return _DONATED if after_oom and "has been deleted" in str(exc) else None
