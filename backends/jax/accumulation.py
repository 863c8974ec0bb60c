"""Gradient accumulation in JAX: the weighted sum of the pytrees ``jax.grad`` returns.

``JaxAccumulation`` is the JAX adapter's ``accumulation`` topic; jax is imported only inside
it. ``jax.grad`` is pure: the script sums the micro-batches' gradients and applies the sum
once. There is no synchronisation to skip: under ``jit`` over sharded arrays, or ``pmean`` in
``shard_map``, the reduction happens where the script asks.
"""

from __future__ import annotations

from typing import Any

from unimem.backends.base import Accumulation

from unimem.errors import ConfigError

__all__ = ["JaxAccumulation"]


class JaxAccumulation(Accumulation):
    """Gradient accumulation in JAX (``AccumulationTopic``): pytrees added with ``jax.tree_util``; no ``no_sync``."""

    def add_gradients(self, total: Any, grads: Any, weight: float) -> Any:
        """``total + weight * grads`` with ``jax.tree_util`` (any pytree; None is an empty subtree).
        Traceable: inside ``jit`` it adds tracers."""
        import jax

        if total is None:
            return jax.tree_util.tree_map(lambda g: g * weight, grads)
        if str(jax.tree_util.tree_structure(total)) != str(jax.tree_util.tree_structure(grads)):
            raise ConfigError("grads", "expected the structure of the running sum (total); pass the same one each time")
        return jax.tree_util.tree_map(lambda t, g: t + g * weight, total, grads)
