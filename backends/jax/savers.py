"""Memory savers for JAX: ``jax.checkpoint`` with one of ``jax.checkpoint_policies``.

``JaxSavers`` is the JAX adapter's ``savers`` topic; jax is imported only inside it. JAX has
no global state to switch, so host offload is a policy of ``jax.checkpoint``, never a context.
Randomness replays by construction: ``jax.random`` draws from explicit keys, and the
recomputation is given the same ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unimem.backends.base import Savers

__all__ = ["JaxSavers", "OFFLOAD_DESTINATION", "OFFLOAD_SOURCE"]

# Memory kinds of offload_dot_with_no_batch_dims: from the device to the host's pinned memory,
# which GPU devices and the CPU device both offer.
OFFLOAD_SOURCE = "device"
OFFLOAD_DESTINATION = "pinned_host"


class JaxSavers(Savers):
    """JAX's memory savers (``SaversTopic``): ``jax.checkpoint`` policies; ``offload()`` refuses (a policy only)."""

    def remat(self, fn: Callable[..., Any], policy: str) -> Callable[..., Any]:
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
