"""Memory savers for JAX: ``jax.checkpoint`` with one of ``jax.checkpoint_policies``.

The JAX adapter's ``remat`` calls this; jax is imported only here. JAX has no global
state to switch, so host offload is a policy of ``jax.checkpoint``, never a context.
Randomness replays by construction: ``jax.random`` draws from explicit keys, and the
recomputation is given the same ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["OFFLOAD_DESTINATION", "OFFLOAD_SOURCE", "remat"]

# Memory kinds of offload_dot_with_no_batch_dims: from the device to the host's pinned memory,
# which GPU devices and the CPU device both offer.
OFFLOAD_SOURCE = "device"
OFFLOAD_DESTINATION = "pinned_host"


def remat(fn: Callable[..., Any], policy: str) -> Callable[..., Any]:
    """``jax.checkpoint(fn, policy=...)`` for ``policy`` (``"full"``, ``"matmuls"`` or ``"offload"``)."""
    import jax

    policies = jax.checkpoint_policies
    if policy == "full":
        chosen = policies.nothing_saveable
    elif policy == "matmuls":
        chosen = policies.dots_saveable
    else:
        chosen = policies.offload_dot_with_no_batch_dims(OFFLOAD_SOURCE, OFFLOAD_DESTINATION)
    wrapped: Callable[..., Any] = jax.checkpoint(fn, policy=chosen)
    return wrapped
