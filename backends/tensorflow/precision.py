"""Mixed precision for TensorFlow/Keras: the Keras global dtype policy and loss scaling.

This module is the TensorFlow adapter's ``precision`` topic, imported only once a policy
is asked for TensorFlow: the members of the ``PrecisionTopic`` protocol
(``unimem.backends.topics``), plus ``wrap_optimizer`` (Keras' ``LossScaleOptimizer`` scales
inside ``model.fit``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from unimem.errors import ConfigError, UnsupportedFeature
from unimem.loss_scaling import LossScaler, NoLossScaling, ScalerConfig
from unimem.trees import map_leaves, tree_leaves

__all__ = [
    "TensorFlowLossScaler",
    "TensorFlowNoLossScaling",
    "cast",
    "check",
    "device",
    "dtype",
    "enable",
    "loss_scaler",
    "precision_state_per_thread",
    "wrap_optimizer",
]

# Any thread may disable a policy: Keras keeps one global policy for every thread.
precision_state_per_thread = False

KERAS_POLICIES = {"bf16": "mixed_bfloat16", "fp16": "mixed_float16", "fp32": "float32"}


def _tf() -> Any:
    import tensorflow as tf

    return tf


def _keras() -> Any:
    import keras

    return keras


def device() -> str:
    """``"gpu"`` when TensorFlow sees one (listing does not start its runtime), else ``"cpu"``."""
    return "gpu" if _tf().config.list_physical_devices("GPU") else "cpu"


def dtype(name: str) -> Any:
    return _tf().dtypes.as_dtype(name)


def check(precision: str, compute_dtype: str, device: str) -> None:
    """``ConfigError`` if Keras cannot take the policy here (wrong Keras backend, or
    bf16 on a GPU older than compute capability 8.0)."""
    keras = _keras()
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ConfigError(
            "backend",
            f"Keras runs on its {backend!r} backend in this process, so a TensorFlow policy would not reach "
            "it; set KERAS_BACKEND=tensorflow before importing keras, or pass backend='jax'/'torch'",
        )
    if precision != "bf16" or device != "gpu":
        return
    tf = _tf()
    for gpu in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        if capability is not None and tuple(capability) < (8, 0):
            raise ConfigError(
                "precision",
                f"{gpu.name} has compute capability {capability[0]}.{capability[1]}; bfloat16 needs 8.0 "
                "or later; use 'fp16'",
            )


def cast(tree: Any, name: str) -> Any:
    tf = _tf()
    target = tf.dtypes.as_dtype(name)

    def one(leaf: Any) -> Any:
        leaf_dtype = getattr(leaf, "dtype", None)
        if leaf_dtype is None:
            return leaf
        try:
            floating = tf.dtypes.as_dtype(leaf_dtype).is_floating
        except TypeError:  # a dtype TF does not know: not ours to cast
            return leaf
        return tf.cast(leaf, target) if floating and tf.dtypes.as_dtype(leaf_dtype) != target else leaf

    return map_leaves(one, tree)


def enable(precision: str, compute_dtype: str, device: str) -> Callable[[], None]:
    """Set the Keras global dtype policy; return the way back to the one before.

    Layers take the global policy when they are built: build the model after enabling.
    """
    keras = _keras()
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(KERAS_POLICIES[precision])

    def restore() -> None:
        keras.mixed_precision.set_global_policy(previous)

    return restore


class TensorFlowLossScaler(LossScaler):
    """Dynamic loss scaling for a ``tf.GradientTape`` loop, eager or in ``tf.function``.

    The scale and the good-step count are ``tf.Variable``s and every update is made
    of TF ops, so the same object works inside a ``tf.function``.
    """

    def __init__(self, config: ScalerConfig) -> None:
        super().__init__(config, "tensorflow")
        tf = _tf()
        self._scale = tf.Variable(config.initial_scale, dtype=tf.float32, trainable=False, name="unimem_loss_scale")
        self._good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="unimem_good_steps")

    @property
    def scale_value(self) -> float:
        return float(self._scale.numpy())

    @property
    def good_steps(self) -> int:
        return int(self._good_steps.numpy())

    def scale(self, loss: Any) -> Any:
        tf = sys.modules["tensorflow"]
        # float32 first: an fp16 loss times 2**15 would itself overflow.
        return tf.cast(loss, tf.float32) * self._scale

    def unscale(self, grads: Any) -> tuple[Any, Any]:
        tf = sys.modules["tensorflow"]
        inverse = 1.0 / self._scale

        def one(grad: Any) -> Any:
            if isinstance(grad, tf.IndexedSlices):  # embedding gradients
                values = grad.values * tf.cast(inverse, grad.values.dtype)
                return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
            return grad * tf.cast(inverse, grad.dtype)

        unscaled = map_leaves(one, grads)
        checks = [
            tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
            for g in tree_leaves(unscaled)
        ]
        finite = tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)
        if tf.executing_eagerly():
            return unscaled, bool(finite.numpy())
        return unscaled, finite

    def update(self, finite: Any) -> None:
        tf = sys.modules["tensorflow"]
        config = self.config
        finite = tf.convert_to_tensor(finite, dtype=tf.bool)
        good_steps = self._good_steps + 1
        grow = tf.logical_and(finite, good_steps >= config.growth_interval)
        grown = self._scale * config.growth_factor
        kept_or_grown = tf.where(tf.logical_and(grow, tf.math.is_finite(grown)), grown, self._scale)
        self._scale.assign(tf.where(finite, kept_or_grown, self._scale * config.backoff_factor))
        self._good_steps.assign(tf.where(tf.logical_and(finite, tf.logical_not(grow)), good_steps, 0))

    def wrap(self, optimizer: Any) -> Any:
        """``keras.optimizers.LossScaleOptimizer(optimizer)`` with this scaler's initial
        scale and growth interval: ``model.fit`` then scales the loss, unscales the
        gradients and skips steps that overflow (in a custom loop, differentiate
        ``opt.scale_loss(loss)`` and call ``opt.apply(grads)``). It keeps its own scale;
        this scaler's state is not shared with it.

        Args:
            optimizer: A Keras optimizer.

        Returns:
            The ``LossScaleOptimizer``.

        Raises:
            ConfigError: The scaler's ``growth_factor`` or ``backoff_factor`` is not 2 or
                0.5, which Keras fixes.
        """
        return wrap_optimizer(optimizer, self.config)

    def step(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: Keras' loss-scaled step is its optimizer's.

        Raises:
            UnsupportedFeature: Always; use ``wrap(optimizer)``, or ``scale``/``unscale``/
                ``update`` in a ``tf.GradientTape`` loop.
        """
        raise _no_step()


class TensorFlowNoLossScaling(NoLossScaling):
    """The scaler of bf16 and fp32 in TensorFlow: scale 1; ``wrap`` returns the optimizer."""

    def wrap(self, optimizer: Any) -> Any:
        """``optimizer`` itself: nothing to scale.

        Args:
            optimizer: A Keras optimizer.

        Returns:
            ``optimizer``, unchanged.
        """
        return optimizer

    def step(self, *args: Any, **kwargs: Any) -> Any:
        """Refused as for the fp16 scaler.

        Raises:
            UnsupportedFeature: Always; use ``wrap(optimizer)``.
        """
        raise _no_step()


def _no_step() -> UnsupportedFeature:
    return UnsupportedFeature(
        "tensorflow",
        "loss_scaler.step",
        "Keras' loss-scaled step is its optimizer's: use scaler.wrap(optimizer) (LossScaleOptimizer), "
        "or scale, unscale and update in a tf.GradientTape loop",
    )


def loss_scaler(config: ScalerConfig, enabled: bool) -> LossScaler:
    return TensorFlowLossScaler(config) if enabled else TensorFlowNoLossScaling(config, "tensorflow")


def wrap_optimizer(optimizer: Any, config: ScalerConfig) -> Any:
    """``keras.optimizers.LossScaleOptimizer``: fixed factors 2 and 0.5, so only the
    initial scale and the growth interval are passed (other factors are refused)."""
    for parameter, value, fixed in (
        ("growth_factor", config.growth_factor, 2.0),
        ("backoff_factor", config.backoff_factor, 0.5),
    ):
        if value != fixed:
            raise ConfigError(
                parameter,
                f"Keras' LossScaleOptimizer fixes it at {fixed:g}, got {value!r}; pass {fixed:g}, or use "
                "scale, unscale and update in a tf.GradientTape loop",
            )
    keras = _keras()
    return keras.optimizers.LossScaleOptimizer(
        optimizer, initial_scale=config.initial_scale, dynamic_growth_steps=config.growth_interval
    )
