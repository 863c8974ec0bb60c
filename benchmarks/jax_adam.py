"""optax's Adam where optax is not installed (the CPU machine of the tests): the benchmarks' JAX models
train with optax on the GPU, and with the same update in plain JAX on a CPU without it."""

from __future__ import annotations

from typing import Any


class Adam:
    """optax's ``adam``/``adamw`` where optax is not installed (the CPU machine): the same update in
    plain JAX, and ``apply_updates``/``softmax_cross_entropy_with_integer_labels`` beside it."""

    def __init__(self, rate: float, decay: float) -> None:
        self.rate, self.decay = rate, decay

    def init(self, params: Any) -> Any:
        import jax
        import jax.numpy as jnp

        zeros = jax.tree.map(jnp.zeros_like, params)
        return zeros, zeros, jnp.zeros((), jnp.int32)

    def update(self, grads: Any, state: Any, params: Any) -> tuple[Any, Any]:
        import jax
        import jax.numpy as jnp

        m, v, count = state
        count = count + 1
        m = jax.tree.map(lambda a, g: 0.9 * a + 0.1 * g, m, grads)
        v = jax.tree.map(lambda a, g: 0.999 * a + 0.001 * g * g, v, grads)
        scale_m, scale_v = 1 - 0.9**count, 1 - 0.999**count
        updates = jax.tree.map(
            lambda a, b, p: -self.rate * ((a / scale_m) / (jnp.sqrt(b / scale_v) + 1e-8) + self.decay * p), m, v, params
        )
        return updates, (m, v, count)

    @staticmethod
    def apply_updates(params: Any, updates: Any) -> Any:
        import jax

        return jax.tree.map(lambda p, u: p + u, params, updates)

    @staticmethod
    def softmax_cross_entropy_with_integer_labels(logits: Any, labels: Any) -> Any:
        import jax
        import jax.numpy as jnp

        return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], axis=-1)[..., 0]


def optax_or_none(gpu: bool) -> Any:
    """optax; None on a CPU where it is not installed (train with ``Adam`` there); on a GPU it must be."""
    try:
        import optax
    except ImportError:
        if gpu:
            raise
        return None
    return optax
