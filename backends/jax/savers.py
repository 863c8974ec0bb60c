"""Memory savers for JAX: ``jax.checkpoint`` with one of ``jax.checkpoint_policies``.

``JaxSavers`` is the JAX adapter's ``savers`` topic; jax is imported only inside it, Flax only
where the block is a Flax object (it is imported then). JAX has no global state to switch, so
host offload is a policy of ``jax.checkpoint``, never a context. Randomness replays by
construction: ``jax.random`` draws from explicit keys, and the recomputation is given the same
ones, whatever a policy keeps.

Flax, as its documentation writes it: a linen module class goes through ``nn.remat`` (the class
it returns builds every instance with the saver), an NNX module through ``nnx.remat``. A model
is built from its classes when it runs, so there is no model to change in place: the block's
class is what is saved.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from unimem.backends.base import Savers

from unimem.errors import ConfigError, UnsupportedFeature

__all__ = ["JaxSavers", "OFFLOAD_DESTINATION", "OFFLOAD_SOURCE", "checkpoint_policy"]

# Memory kinds of offload_dot_with_no_batch_dims: from the device to the host's pinned memory,
# which GPU devices and the CPU device both offer.
OFFLOAD_SOURCE = "device"
OFFLOAD_DESTINATION = "pinned_host"
IN_PLACE = (
    "a JAX model is built from its classes when it runs, so there is no model to change in place: save "
    "the block's class where the model is defined (Flax linen: Block = unimem.remat(Block, policy), "
    "nn.remat), or call each block through unimem.remat (Flax NNX modules, functions: jax.checkpoint)"
)


def checkpoint_policy(policy: str) -> Any:
    """The ``jax.checkpoint_policies`` member for ``policy``."""
    import jax

    policies = jax.checkpoint_policies
    if policy == "full":
        return policies.nothing_saveable
    if policy == "matmuls":
        return policies.dots_saveable  # dot_general and conv_general_dilated
    return policies.offload_dot_with_no_batch_dims(OFFLOAD_SOURCE, OFFLOAD_DESTINATION)


def _call(module: Any, *args: Any, **kwargs: Any) -> Any:
    return module(*args, **kwargs)


class JaxSavers(Savers):
    """JAX's memory savers (``SaversTopic``): ``jax.checkpoint`` policies; ``offload()`` refuses (a policy only)."""

    def remat(self, fn: Callable[..., Any], policy: str) -> Callable[..., Any]:
        """``jax.checkpoint(fn, policy=...)``; a Flax linen module class through ``nn.remat``, an NNX
        module through ``nnx.remat``."""
        chosen = checkpoint_policy(policy)
        linen, nnx = sys.modules.get("flax.linen"), sys.modules.get("flax.nnx")
        if linen is not None and isinstance(fn, type) and issubclass(fn, linen.Module):
            lifted: Any = linen.remat(fn, policy=chosen)
            # Named as the class it saves: linen names a submodule after its class ("Block_0"), so
            # the parameters keep their paths and a checkpoint saved without the saver loads with it.
            lifted.__name__, lifted.__qualname__ = fn.__name__, fn.__qualname__
            return lifted
        if linen is not None and isinstance(fn, linen.Module):
            raise ConfigError(
                "fn",
                f"{type(fn).__name__} is a Flax linen module instance, built from its class when the model "
                f"runs: save the class instead, {type(fn).__name__} = unimem.remat({type(fn).__name__}, "
                f"{policy!r}) (Flax's nn.remat), before the model that uses it is defined",
            )
        if nnx is not None and isinstance(fn, nnx.Module):
            saved_call = nnx.remat(_call, policy=chosen)

            def module_call(*args: Any, **kwargs: Any) -> Any:
                return saved_call(fn, *args, **kwargs)

            module_call.__name__ = module_call.__qualname__ = type(fn).__name__
            return module_call
        import jax

        wrapped: Callable[..., Any] = jax.checkpoint(fn, policy=chosen)
        return wrapped

    def remat_model(self, model: Any, policy: str, matches: Callable[[Any], bool]) -> int:
        raise UnsupportedFeature("jax", "remat_model", IN_PLACE)
