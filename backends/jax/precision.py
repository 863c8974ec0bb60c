"""Mixed precision for JAX: pytree casting and a jit-able dynamic loss scaler.

JAX has no autocast and no global dtype policy: a policy is the casts a training
step makes (parameters and inputs to the compute dtype, outputs back to float32)
and the loss scaler. Implemented here with ``jax.tree_util`` and ``jax.numpy`` only
(jmp, the library that used to do this, is unmaintained).

This module is the JAX adapter's ``precision`` topic, imported only once a policy is
asked for JAX: the members of the ``PrecisionTopic`` protocol (``unimem.backends.topics``).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from unimem.backends.jax import _runtime as runtime

from unimem.errors import UnsupportedFeature
from unimem.loss_scaling import LossScaler, NoLossScaling, ScalerConfig

__all__ = [
    "JaxLossScaler",
    "JaxNoLossScaling",
    "cast",
    "check",
    "device",
    "dtype",
    "enable",
    "loss_scaler",
    "precision_state_per_thread",
]

# Any thread may disable a policy: it is the casts a step makes, no state of JAX.
precision_state_per_thread = False


def _jax() -> Any:
    import jax
    import jax.numpy  # noqa: F401  (the methods below read it from sys.modules)

    return jax


def device() -> str:
    """JAX's platform (``"cpu"``, ``"gpu"``) once its backend started; ``"auto"`` before.

    Asking earlier would start the backend, and with it preallocate 75% of the GPU
    before ``configure()`` had its say.
    """
    if not runtime.started():
        return "auto"
    return str(_jax().default_backend())


def dtype(name: str) -> Any:
    _jax()
    return sys.modules["jax.numpy"].dtype(name)


def check(precision: str, compute_dtype: str, device: str) -> None:
    """Nothing to refuse: XLA compiles bfloat16 and float16 for the CPU and every
    CUDA GPU (on GPUs before compute capability 8.0 it computes bf16 through float32)."""
    return None


def cast(tree: Any, name: str) -> Any:
    jax = _jax()
    jnp = sys.modules["jax.numpy"]
    target = jnp.dtype(name)

    def one(leaf: Any) -> Any:
        leaf_dtype = getattr(leaf, "dtype", None)
        if leaf_dtype is None or not jnp.issubdtype(leaf_dtype, jnp.floating) or leaf_dtype == target:
            return leaf
        return jnp.asarray(leaf, dtype=target)

    return jax.tree_util.tree_map(one, tree)


def enable(precision: str, compute_dtype: str, device: str) -> Callable[[], None]:
    """No global state to change: the policy acts through its casts."""

    def restore() -> None:
        return None

    return restore


class JaxLossScaler(LossScaler):
    """Dynamic loss scaling as a JAX pytree: pass it into a jitted step and return it.

    ``step(grads)`` is the functional form: it returns the unscaled gradients, whether
    they are all finite, and the next scaler, leaving this one as it was. Closing over
    a scaler inside ``jit`` would freeze its scale as a constant: pass it in, return
    the new one::

        @jax.jit
        def train_step(params, scaler, batch):
            grads = jax.grad(lambda p: scaler.scale(loss_fn(p, batch)))(params)
            grads, finite, scaler = scaler.step(grads)
            params = jax.tree.map(lambda p, g: jnp.where(finite, p - lr * g, p), params, grads)
            return params, scaler

    The uniform ``unscale`` / ``update`` work too: eagerly like the torch and TF
    scalers (``finite`` is a Python bool, ``update`` changes the object); inside
    ``jit`` ``update`` changes the traced copy, which the step must return.
    """

    def __init__(self, config: ScalerConfig) -> None:
        super().__init__(config, "jax")
        jnp = sys.modules["jax.numpy"]
        self._scale: Any = jnp.asarray(config.initial_scale, dtype=jnp.float32)
        self._good_steps: Any = jnp.asarray(0, dtype=jnp.int32)

    # --- pytree ------------------------------------------------------------------
    def tree_flatten(self) -> tuple[tuple[Any, Any], ScalerConfig]:
        return (self._scale, self._good_steps), self.config

    @classmethod
    def tree_unflatten(cls, config: ScalerConfig, children: tuple[Any, Any]) -> JaxLossScaler:
        scaler = cls.__new__(cls)
        LossScaler.__init__(scaler, config, "jax")
        # JAX also unflattens with placeholders (None, object()): store, never convert.
        scaler._scale, scaler._good_steps = children
        return scaler

    # --- the uniform surface ---------------------------------------------------------
    @property
    def scale_value(self) -> float:
        return float(self._scale)

    @property
    def good_steps(self) -> int:
        return int(self._good_steps)

    def scale(self, loss: Any) -> Any:
        jnp = sys.modules["jax.numpy"]
        # float32 first: an fp16 loss times 2**15 would itself overflow.
        return jnp.asarray(loss, dtype=jnp.float32) * self._scale

    def unscale(self, grads: Any) -> tuple[Any, Any]:
        """Eagerly, one compiled call that reuses (donates) the buffers of ``grads``:
        use the returned gradients, as torch's in-place unscale would leave them."""
        jax = sys.modules["jax"]
        tracer = getattr(getattr(jax, "core", None), "Tracer", None)
        if tracer is not None and not any(isinstance(leaf, tracer) for leaf in jax.tree_util.tree_leaves(grads)):
            unscaled, finite = _unscale_compiled()(grads, self._scale)
            return unscaled, bool(finite)  # the one host sync per step
        # Inside jit (or a JAX without jax.core.Tracer to tell): plain jax.numpy.
        unscaled, finite = _unscale(grads, self._scale)
        try:
            return unscaled, bool(finite)
        except jax.errors.ConcretizationTypeError:  # traced: the boolean stays a traced value
            return unscaled, finite

    def update(self, finite: Any) -> None:
        jnp = sys.modules["jax.numpy"]
        config = self.config
        finite = jnp.asarray(finite, dtype=bool)
        good_steps = self._good_steps + 1
        grow = finite & (good_steps >= config.growth_interval)
        grown = self._scale * jnp.float32(config.growth_factor)
        kept_or_grown = jnp.where(grow & jnp.isfinite(grown), grown, self._scale)
        self._scale = jnp.where(finite, kept_or_grown, self._scale * jnp.float32(config.backoff_factor))
        self._good_steps = jnp.where(finite & ~grow, good_steps, 0).astype(jnp.int32)

    def step(self, grads: Any, *, axis_name: Any = None) -> tuple[Any, Any, JaxLossScaler]:
        """Unscale ``grads`` and return the scaler for the next step (functional: this one
        is left as it was).

        Under gradient accumulation, sum the micro-batches' gradients of
        ``scale(loss)`` first and call it once per optimizer step.

        Args:
            grads: The gradients of ``scale(loss)``, any pytree.
            axis_name: Inside ``shard_map``/``pmap``/``vmap`` with a named axis whose
                members hold different gradients: the axis to agree over (one
                member's overflow skips the step on all). None (default): no
                collective (``jit`` over sharded arrays already reduces globally).

        Returns:
            ``(grads / scale, finite, next_scaler)``: ``finite`` is a Python bool eagerly,
            a traced boolean inside ``jit`` (apply the update with ``jnp.where``).
        """
        jax = sys.modules["jax"]
        jnp = sys.modules["jax.numpy"]
        unscaled, finite = self.unscale(grads)
        if axis_name is not None:  # every member skips the same steps: the minimum over the axis
            finite = jax.lax.pmin(jnp.asarray(finite, dtype=jnp.int32), axis_name).astype(bool)
        following = JaxLossScaler.tree_unflatten(self.config, (self._scale, self._good_steps))
        following.update(finite)
        return unscaled, finite, following

    def wrap(self, optimizer: Any) -> Any:
        """Refused: JAX has no optimizer object to wrap.

        Raises:
            UnsupportedFeature: Always; use ``grads, finite, scaler = scaler.step(grads)``.
        """
        raise _no_wrap()


class JaxNoLossScaling(NoLossScaling):
    """The scaler of bf16 and fp32 in JAX: scale 1, and ``step`` that passes the
    gradients through (a leafless pytree, so it goes through ``jit`` too)."""

    def step(self, grads: Any, *, axis_name: Any = None) -> tuple[Any, bool, JaxNoLossScaling]:
        """``(grads, True, self)``: nothing is scaled, so nothing overflows.

        Args:
            grads: Any pytree of gradients.
            axis_name: Ignored (nothing to agree on).

        Returns:
            ``grads`` untouched, True and this scaler.
        """
        return grads, True, self

    def wrap(self, optimizer: Any) -> Any:
        """Refused as for the fp16 scaler (``step(grads)`` is the JAX way).

        Raises:
            UnsupportedFeature: Always.
        """
        raise _no_wrap()


def _no_wrap() -> UnsupportedFeature:
    return UnsupportedFeature(
        "jax",
        "loss_scaler.wrap",
        "JAX has no optimizer object that scales the loss itself; in the jitted step use "
        "grads, finite, scaler = scaler.step(grads) and apply the update where finite",
    )


def _unscale(grads: Any, scale: Any) -> tuple[Any, Any]:
    """``(grads / scale, all finite)`` in pure jax.numpy: traceable, jit-able."""
    jax = sys.modules["jax"]
    jnp = sys.modules["jax.numpy"]
    inverse = 1.0 / scale

    def floating(leaf: Any) -> bool:
        return bool(jnp.issubdtype(leaf.dtype, jnp.floating))  # not float0/int "gradients"

    unscaled = jax.tree_util.tree_map(lambda g: (g * inverse).astype(g.dtype) if floating(g) else g, grads)
    checks = [jnp.all(jnp.isfinite(g)) for g in jax.tree_util.tree_leaves(unscaled) if floating(g)]
    return unscaled, (jnp.all(jnp.stack(checks)) if checks else jnp.asarray(True))


_compiled: Any = None


def _unscale_compiled() -> Any:
    global _compiled
    if _compiled is None:
        # Donating the scaled gradients lets XLA write the result into their buffers:
        # no second copy of every gradient at the peak.
        _compiled = sys.modules["jax"].jit(_unscale, donate_argnums=0)
    return _compiled


_registered = False
_register_lock = threading.Lock()


def _register_pytree() -> None:
    """Registered on first use: registering at import would need jax at import."""
    global _registered
    with _register_lock:
        if not _registered:
            tree_util = _jax().tree_util
            tree_util.register_pytree_node(JaxLossScaler, JaxLossScaler.tree_flatten, JaxLossScaler.tree_unflatten)
            # The no-op scaler of bf16/fp32 goes into jitted steps too: a leafless pytree.
            tree_util.register_pytree_node(
                JaxNoLossScaling,
                lambda scaler: ((), (scaler.config, scaler.backend)),
                lambda aux, _: JaxNoLossScaling(*aux),
            )
            _registered = True


def loss_scaler(config: ScalerConfig, enabled: bool) -> LossScaler:
    _register_pytree()
    return JaxLossScaler(config) if enabled else JaxNoLossScaling(config, "jax")
