"""Gradient accumulation in TensorFlow: the weighted sum of what a ``GradientTape`` returns.

``TensorFlowAccumulation`` is the TensorFlow adapter's ``accumulation`` topic; tensorflow is
imported only inside it. A tape returns the gradients instead of adding them anywhere, so the
script sums them over the micro-batches and applies the sum once. There is no synchronisation to
skip: a ``tf.distribute`` strategy all-reduces in ``apply_gradients``, which runs once per
optimizer step.
"""

from __future__ import annotations

from typing import Any

from unimem.backends.base import Accumulation

from unimem.errors import ConfigError

__all__ = ["TensorFlowAccumulation"]


class TensorFlowAccumulation(Accumulation):
    """Gradient accumulation in TensorFlow (``AccumulationTopic``): a tape's gradients added with ``tf.nest``."""

    def add_gradients(self, total: Any, grads: Any, weight: float) -> Any:
        """``total + weight * grads`` with ``tf.nest``; ``IndexedSlices`` (embedding gradients) are
        made dense first, since two of them do not add."""
        import tensorflow as tf

        def weighted(g: Any) -> Any:
            if g is None:
                return None
            if isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)
            return g * tf.cast(weight, g.dtype)

        if total is None:
            return tf.nest.map_structure(weighted, grads)
        try:
            tf.nest.assert_same_structure(total, grads)
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                "grads", f"expected the structure of the running sum (total); pass the same one each time ({exc})"
            ) from None

        def add(t: Any, g: Any) -> Any:
            w = weighted(g)
            return t if w is None else w if t is None else t + w

        return tf.nest.map_structure(add, total, grads)
