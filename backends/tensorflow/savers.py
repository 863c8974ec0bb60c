"""Memory savers for TensorFlow: ``tf.recompute_grad`` with dropout that replays.

``TensorFlowSavers`` is the TensorFlow adapter's ``savers`` topic; tensorflow and keras are
imported only inside it.

``tf.recompute_grad`` (and ``keras.RematScope``, built on it) calls ``fn`` again in the
backward pass, and every Keras random layer draws its next seed from a state variable:
the recomputation draws a new dropout mask, and the gradients are those of a mask the
forward pass never used. Here each call reads the seed-generator states of the Keras
layers ``fn`` reaches before it runs, and the recomputation runs from those states and
then puts back the ones it found, so the mask replays and the states advance once per
call, as without recomputation.

What cannot be replayed (``tf.random.uniform``, ``tf.nn.dropout`` without a seed, a
``tf.random.Generator``, a seed generator of a layer ``fn`` does not reach) is caught by
comparing the recomputed output with the forward's: a difference larger than rounding is
an error in the backward pass, never silently wrong gradients.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

from unimem.backends.base import Savers

from unimem.errors import ConfigError, UnsupportedFeature

__all__ = [
    "MISMATCH",
    "TOLERANCE",
    "RecomputedCall",
    "TensorFlowSavers",
    "layers_reached",
    "seed_states",
]  # and RematLayer, built on first use

# The name Keras gives every SeedGenerator's state variable.
SEED_STATE = "seed_generator_state"
# Relative difference (to the output's largest finite magnitude) the recomputation may show:
# rounding of reordered reductions, never a different dropout mask (which differs by O(1)).
TOLERANCE = {2: 5e-2, 4: 1e-3, 8: 1e-3}  # by the dtype's size in bytes
MISMATCH = (
    "the recomputation gave a different output from the forward pass, so its gradients would be wrong: "
    "fn draws random numbers unimem cannot replay (tf.random.uniform, tf.nn.dropout without a seed, a "
    "tf.random.Generator, or a Keras layer fn does not reach). Use keras.layers.Dropout in a layer fn "
    "reaches (pass the layer or model as fn, or close over it), or stateless ops with a seed "
    "(tf.random.stateless_uniform); or drop the recomputation of this block"
)


def _candidates(fn: Any) -> Iterator[Any]:
    """Objects ``fn`` reaches one step away: itself, a bound method's owner, a partial's parts,
    its closure cells and the globals its code names (and the items of lists, tuples, dicts there)."""
    found: list[Any] = [fn, getattr(fn, "__self__", None)]
    code_fn = fn
    if isinstance(fn, functools.partial):
        found += [fn.func, *fn.args, *fn.keywords.values()]
        code_fn = fn.func
    for cell in getattr(code_fn, "__closure__", None) or ():
        try:
            found.append(cell.cell_contents)
        except ValueError:  # a cell not yet filled
            continue
    code = getattr(code_fn, "__code__", None)
    names = getattr(code_fn, "__globals__", {})
    if code is not None:
        found += [names.get(name) for name in code.co_names]
    for item in found:
        yield item
        if isinstance(item, (list, tuple)):
            yield from item
        elif isinstance(item, dict):
            yield from item.values()


def layers_reached(fn: Any) -> list[Any]:
    """The Keras layers (models included) ``fn`` reaches one step away; none without Keras."""
    try:
        import keras
    except ImportError:  # TensorFlow alone: no Keras layer, no seed generator to replay
        return []

    layers: list[Any] = []
    for item in _candidates(fn):
        if isinstance(item, keras.Layer) and all(item is not layer for layer in layers):
            layers.append(item)
    return layers


def seed_states(fn: Any) -> list[Any]:
    """The seed-generator state variables of the layers ``fn`` reaches, each once."""
    states: list[Any] = []
    for layer in layers_reached(fn):
        for variable in layer.variables:
            if variable.name == SEED_STATE and all(variable is not known for known in states):
                states.append(variable)
    return states


def _agrees(tf: Any, first: Any, again: Any) -> Any:
    """A boolean tensor: every floating output of the recomputation is within rounding of the forward's."""
    checks = []
    for a, b in zip(tf.nest.flatten(first), tf.nest.flatten(again), strict=True):
        if not (tf.is_tensor(a) and a.dtype.is_floating):
            continue
        a32, b32 = tf.cast(a, tf.float32), tf.cast(b, tf.float32)
        both_nan = tf.math.logical_and(tf.math.is_nan(a32), tf.math.is_nan(b32))
        diff = tf.where(tf.math.logical_or(tf.equal(a32, b32), both_nan), 0.0, tf.abs(a32 - b32))
        scale = tf.reduce_max(tf.where(tf.math.is_finite(a32), tf.abs(a32), 0.0))
        checks.append(tf.reduce_max(diff) <= TOLERANCE.get(a.dtype.size, 1e-3) * scale)
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def _replay_call(tf: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One call of ``fn`` under ``tf.recompute_grad``, its recomputation replaying the seed states."""
    states = seed_states(fn)
    before = [tf.identity(state.value) for state in states]
    forward: list[Any] = []

    def replaying(*inputs: Any) -> Any:
        if not forward:  # the forward pass: states advance as they would without recomputation
            forward.append(fn(*inputs, **kwargs))
            return forward[0]
        found = [tf.identity(state.value) for state in states]
        for state, value in zip(states, before, strict=True):
            state.assign(value)
        again = fn(*inputs, **kwargs)
        for state, value in zip(states, found, strict=True):
            state.assign(value)
        agrees = _agrees(tf, forward[0], again)
        if tf.executing_eagerly():
            if not bool(agrees):
                raise UnsupportedFeature("tensorflow", "remat.full", MISMATCH)
            return again
        with tf.control_dependencies([tf.debugging.Assert(agrees, [f"tensorflow: remat.full: {MISMATCH}"])]):
            return tf.nest.map_structure(tf.identity, again)

    return tf.recompute_grad(replaying)(*args)


class RecomputedCall:
    """A Keras layer's ``call``, run under ``tf.recompute_grad`` with its dropout replayed: what
    ``remat_model`` puts on each layer it saves (the layer object, its weights and its place in
    the model stay as they were)."""

    def __init__(self, call: Callable[..., Any]) -> None:
        self.call = call  # the layer's own bound call
        functools.update_wrapper(self, call, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        return _replay_call(tf, self.call, args, kwargs)


def _layer_class() -> type:
    """``RematLayer``, built once: a Keras layer that runs the layer it wraps recomputed."""
    import keras
    import tensorflow as tf

    class RematLayer(keras.layers.Wrapper):
        """``layer`` recomputed in the backward pass, its dropout replayed; its weights are the layer's."""

        def __init__(self, layer: Any, policy: str = "full", **kwargs: Any) -> None:
            super().__init__(layer, **kwargs)
            self.policy = policy

        def build(self, input_shape: Any = None) -> None:
            self.built = True  # the wrapped layer builds itself on its first call, as unwrapped

        def call(self, inputs: Any, *args: Any, training: Any = None, **kwargs: Any) -> Any:
            if training is not None:  # passed on: the recomputation runs outside Keras's call context
                kwargs["training"] = training
            return _replay_call(tf, self.layer, (inputs, *args), kwargs)

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "policy": self.policy}

    RematLayer.__module__ = __name__
    RematLayer.__qualname__ = "RematLayer"
    return keras.saving.register_keras_serializable(package="unimem")(RematLayer)


def __getattr__(name: str) -> Any:
    # RematLayer is importable by name (Keras deserialisation) and built on first use.
    if name == "RematLayer":
        globals()["RematLayer"] = cls = _layer_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _children(layer: Any) -> list[Any]:
    """A Keras layer's direct sublayers."""
    return list(layer._flatten_layers(include_self=False, recursive=False))


class TensorFlowSavers(Savers):
    """TensorFlow's memory savers (``SaversTopic``): ``tf.recompute_grad``, Keras dropout replayed (``full`` only)."""

    def remat(self, fn: Callable[..., Any], policy: str) -> Callable[..., Any]:
        """``fn`` recomputed in the backward pass, its Keras dropout masks replayed (``policy`` ``"full"``; the
        others raise ``UnsupportedFeature`` with their row's note). A Keras layer comes back as a Keras layer
        (``RematLayer``).

        Positional arguments are the tensors gradients flow to; keyword arguments (``training=True``)
        are passed through unchanged.
        """
        if policy != "full":
            return super().remat(fn, policy)
        keras = sys.modules.get("keras")
        if keras is not None and isinstance(fn, keras.layers.Layer):
            cls: Any = globals()["RematLayer"] if "RematLayer" in globals() else __getattr__("RematLayer")
            layer: Callable[..., Any] = cls(fn.layer if isinstance(fn, cls) else fn, policy)
            return layer
        import tensorflow as tf

        def recomputed(*args: Any, **kwargs: Any) -> Any:
            return _replay_call(tf, fn, args, kwargs)

        return functools.update_wrapper(recomputed, fn, updated=())  # fn's name, not its attributes

    def remat_model(self, model: Any, policy: str, matches: Callable[[Any], bool]) -> int:
        """Every sublayer of ``model`` that ``matches``: its ``call`` replaced by a ``RecomputedCall``."""
        keras = sys.modules.get("keras")
        if keras is None or not isinstance(model, keras.layers.Layer):
            raise ConfigError("model", f"expected a Keras layer or model, got {type(model).__name__}")
        if policy != "full":
            raise self._refusal(policy)
        done: dict[int, Any] = {}

        def visit(parent: Any) -> None:
            for layer in _children(parent):
                if id(layer) in done:
                    continue
                if matches(layer):
                    if not isinstance(layer.__dict__.get("call"), RecomputedCall):
                        layer.call = RecomputedCall(layer.call)
                    done[id(layer)] = layer
                else:
                    visit(layer)

        visit(model)
        return len(done)
