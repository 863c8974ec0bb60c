"""Dynamic loss scaling with one surface for every framework: the rule, the numbers, the interface.

This module is framework-free: each framework's scaler lives in ``unimem.backends.<framework>.precision``
and subclasses ``LossScaler``, keeping ``next_scale``'s semantics (those of ``torch.amp.GradScaler``).
Why and how the scale moves, and each framework's loop: docs/guides/mixed-precision.md#the-loss-scale.
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

    One loop serves every framework (below); each also has its own step: torch ``step(optimizer)``, Keras
    ``wrap(optimizer)``, JAX ``step(grads)``. Traced code, gradient accumulation and data parallelism:
    [Mixed precision](../guides/mixed-precision.md#one-loop-for-all-three).

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
        """The framework's own loss-scaled step, where it has one (torch, JAX).

        torch: ``step(optimizer)`` unscales ``p.grad`` in place once and steps unless a gradient is inf or nan;
        call ``update()`` after it. JAX: ``step(grads)`` returns ``(grads / scale, finite, next_scaler)``.

        Args:
            *args: torch: the optimizer; JAX: the gradients.
            **kwargs: JAX: ``axis_name=`` to agree on ``finite`` over a ``shard_map``/``pmap`` axis.

        Returns:
            torch: what ``optimizer.step()`` returned (None when skipped); JAX: the triple above.

        Raises:
            UnsupportedFeature: This framework's scaler has no step (Keras: use ``wrap(optimizer)``).
        """
        raise UnsupportedFeature(
            self.backend,
            "loss_scaler.step",
            f"{self.backend}'s loss scaler has no step(); use scale, unscale and update in the training loop",
        )

    def wrap(self, optimizer: Any) -> Any:
        """An optimizer that scales the loss itself, where the framework has one (Keras: ``LossScaleOptimizer``).

        Args:
            optimizer: The framework's optimizer.

        Returns:
            The wrapping optimizer (``model.fit`` then scales, unscales and skips), or ``optimizer`` when disabled.

        Raises:
            UnsupportedFeature: The framework has none (torch: use ``step(optimizer)``; JAX: ``step(grads)``).
            ConfigError: The scaler's growth or backoff factor is not Keras's fixed 2 or 0.5.
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
    """The scaler of bf16 and fp32: scale 1, nothing scaled, no step skipped, no gradient looked at."""

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
