"""Dynamic loss scaling with one surface for torch, TensorFlow and JAX.

fp16 has 5 exponent bits: small gradients flush to zero. Multiplying the loss by a
large factor before the backward pass keeps them representable; dividing the
gradients by it afterwards restores their size. When the factor is too large the
gradients overflow: the step is skipped and the factor shrinks. After
``growth_interval`` good steps in a row it grows again. These are the semantics of
``torch.amp.GradScaler`` and Keras' ``LossScaleOptimizer``; every backend here keeps
them exactly, so one training loop serves all three::

    scaler = policy.loss_scaler()
    grads = gradient_of(scaler.scale(loss))
    grads, finite = scaler.unscale(grads)
    if finite:
        apply(grads)
    scaler.update(finite)

Each framework's scaler also offers the step its users expect (``LossScaler.step``,
``LossScaler.wrap``): torch ``scaler.step(optimizer)`` (``torch.amp.GradScaler``),
Keras ``scaler.wrap(optimizer)`` (``LossScaleOptimizer``), JAX ``scaler.step(grads)``
returning the next scaler from a jitted step.

This module is framework-free: the framework-specific scalers live in
``unimem.backends.<framework>.precision`` and subclass ``LossScaler``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from unimem.errors import ConfigError, UnsupportedFeature

__all__ = ["LossScaler", "NoLossScaling", "ScalerConfig", "next_scale"]


@dataclass(frozen=True)
class ScalerConfig:
    """The four numbers of dynamic loss scaling, validated."""

    initial_scale: float = 2.0**15
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    @classmethod
    def build(
        cls, initial_scale: object, growth_factor: object, backoff_factor: object, growth_interval: object
    ) -> ScalerConfig:
        """Check every argument; a bad one is a ``ConfigError`` naming it."""

        def number(name: str, value: object) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(name, f"expected a finite number, got {value!r}")
            return float(value)

        initial = number("initial_scale", initial_scale)
        if initial <= 0:
            raise ConfigError("initial_scale", f"must be more than 0, got {initial_scale!r} (2**15 is usual)")
        growth = number("growth_factor", growth_factor)
        if growth <= 1:
            raise ConfigError("growth_factor", f"must be more than 1, got {growth_factor!r} (2 is usual)")
        backoff = number("backoff_factor", backoff_factor)
        if not 0 < backoff < 1:
            raise ConfigError("backoff_factor", f"must be between 0 and 1, got {backoff_factor!r} (0.5 is usual)")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
            raise ConfigError(
                "growth_interval", f"expected a whole number of steps, 1 or more, got {growth_interval!r}"
            )
        return cls(initial, growth, backoff, growth_interval)


def next_scale(config: ScalerConfig, scale: float, good_steps: int, finite: bool) -> tuple[float, int]:
    """``(scale, good_steps)`` after a step whose gradients were ``finite`` or not.

    The reference the framework scalers follow (torch's ``_amp_update_scale_``):
    an overflow multiplies the scale by ``backoff_factor`` and restarts the count;
    ``growth_interval`` finite steps in a row multiply it by ``growth_factor``
    (unless that would overflow float32) and restart the count.
    """
    if not finite:
        return scale * config.backoff_factor, 0
    good_steps += 1
    if good_steps >= config.growth_interval:
        grown = scale * config.growth_factor
        # float32 is what the scale multiplies; past its max the scale itself would be inf.
        return (grown if grown <= 3.4028234663852886e38 else scale), 0
    return scale, good_steps


class LossScaler(ABC):
    """The uniform loss-scaling surface; ``policy.loss_scaler()`` returns one.

    ``finite`` is a Python ``bool`` when run eagerly. Inside ``jax.jit`` or
    ``tf.function`` it is the framework's boolean scalar (a Python ``if`` cannot
    branch on a traced value there: use ``jnp.where`` / ``lax.cond``, or let
    AutoGraph turn the ``if`` into ``tf.cond``).

    An overflow multiplies the scale by ``backoff_factor`` and skips the step;
    ``growth_interval`` finite steps in a row multiply it by ``growth_factor``. Each
    framework's scaler (in ``unimem.backends.<framework>.precision``) subclasses this
    one and keeps exactly these semantics, so one training loop serves all of them.

    Besides that loop, each scaler offers the step its framework's users expect:
    torch ``step(optimizer)`` then ``update()`` (it wraps ``torch.amp.GradScaler``);
    Keras ``wrap(optimizer)`` (``LossScaleOptimizer``, for ``model.fit``); JAX
    ``step(grads)``, which returns the next scaler for a jitted step to return.

    Gradient accumulation: scale every micro-batch's loss with the same scale, and
    unscale once per optimizer step (one ``unscale``, ``step`` or ``wrap``-ed
    ``apply`` after the last micro-batch), then ``update`` once. Unscaling per
    micro-batch would divide the gradients already summed again.

    Data parallelism: every rank must skip the same steps, so the overflow flag is
    agreed across ranks before a step is skipped or taken. torch: under
    ``torch.distributed`` (initialised before the scaler's first use) ``step`` uses
    ``ShardedGradScaler`` and ``unscale`` all-reduces the flag (max); JAX: ``jit`` over
    sharded arrays reduces globally, and inside ``shard_map``/``pmap`` pass
    ``step(grads, axis_name=...)``; Keras: ``wrap``, whose optimizer checks gradients
    after they are all-reduced.

    Attributes:
        config (ScalerConfig): The four numbers: ``initial_scale``, ``growth_factor``,
            ``backoff_factor``, ``growth_interval``.
        backend (str): The framework the scaler is for.

    Example:
        ```python
        scaler = policy.loss_scaler()
        grads = gradient_of(scaler.scale(loss))
        grads, finite = scaler.unscale(grads)
        if finite:
            apply(grads)
        scaler.update(finite)
        ```
    """

    def __init__(self, config: ScalerConfig, backend: str) -> None:
        self.config = config
        self.backend = backend

    @property
    def enabled(self) -> bool:
        """Whether this scaler scales at all (only under fp16, unless asked)."""
        return True

    @property
    @abstractmethod
    def scale_value(self) -> float:
        """The current loss scale as a Python float."""

    @property
    @abstractmethod
    def good_steps(self) -> int:
        """Finite steps in a row since the scale last changed."""

    @abstractmethod
    def scale(self, loss: Any) -> Any:
        """``loss`` in float32 times the current scale: differentiate this one.

        Args:
            loss: The loss, a scalar tensor or array of the framework.

        Returns:
            The scaled loss, in float32 (``loss`` itself when the scaler is disabled).
        """

    @abstractmethod
    def unscale(self, grads: Any) -> tuple[Any, Any]:
        """``(grads / scale, finite)``; ``grads`` is any nesting of lists, tuples and
        dicts of gradients (``None`` entries pass through).

        Args:
            grads: The gradients of the scaled loss.

        Returns:
            The gradients divided by the scale, in the same structure, and whether all of
            them are finite (a ``bool`` eagerly, the framework's boolean scalar when
            traced). Disabled: ``grads`` untouched and True, without looking at them.
        """

    @abstractmethod
    def update(self, finite: Any) -> None:
        """After the step: shrink the scale if ``finite`` is false, grow it after
        ``growth_interval`` good steps in a row.

        Args:
            finite: What ``unscale`` returned for this step's gradients.
        """

    def step(self, *args: Any, **kwargs: Any) -> Any:
        """The framework's own loss-scaled step, where it has one.

        torch: ``step(optimizer)``, as ``torch.amp.GradScaler.step``: unscales the
        optimizer's gradients in place, once, and calls ``optimizer.step()`` unless one
        is inf or nan; call ``update()`` after it. JAX: ``step(grads)`` returns
        ``(grads / scale, finite, next_scaler)`` and leaves this scaler as it was.

        Args:
            *args: What the framework's step takes (see above).
            **kwargs: What the framework's step takes (see above).

        Returns:
            What the framework's step returns (see above).

        Raises:
            UnsupportedFeature: This framework's scaler has no step of its own (Keras:
                use ``wrap(optimizer)``, or ``scale``/``unscale``/``update``).
        """
        raise UnsupportedFeature(
            self.backend,
            "loss_scaler.step",
            f"{self.backend}'s loss scaler has no step(); use scale, unscale and update in the training loop",
        )

    def wrap(self, optimizer: Any) -> Any:
        """An optimizer that scales the loss itself, where the framework has one.

        Keras: ``keras.optimizers.LossScaleOptimizer`` with this scaler's initial scale
        and growth interval (``model.fit`` then scales, unscales and skips); a disabled
        scaler returns ``optimizer`` itself.

        Args:
            optimizer: The framework's optimizer.

        Returns:
            The wrapping optimizer, or ``optimizer`` when the scaler is disabled.

        Raises:
            UnsupportedFeature: The framework has no such optimizer (torch: use
                ``step(optimizer)``; JAX: ``step(grads)``).
            ConfigError: The framework's optimizer cannot take this scaler's numbers
                (Keras' growth and backoff factors are fixed at 2 and 0.5).
        """
        raise UnsupportedFeature(
            self.backend,
            "loss_scaler.wrap",
            f"{self.backend} has no optimizer that scales the loss itself; use scale, unscale and update",
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(backend={self.backend!r}, scale={self.scale_value:g}, "
            f"good_steps={self.good_steps}, growth_interval={self.config.growth_interval})"
        )


class NoLossScaling(LossScaler):
    """The scaler of bf16 and fp32: scale 1, nothing scaled, no step ever skipped.

    ``unscale`` returns the gradients untouched and ``finite=True`` without looking
    at them (looking would cost a device sync per step for nothing), as
    ``torch.amp.GradScaler(enabled=False)`` does.
    """

    @property
    def enabled(self) -> bool:
        return False

    @property
    def scale_value(self) -> float:
        return 1.0

    @property
    def good_steps(self) -> int:
        return 0

    def scale(self, loss: Any) -> Any:
        return loss

    def unscale(self, grads: Any) -> tuple[Any, bool]:
        return grads, True

    def update(self, finite: Any) -> None:
        return None
