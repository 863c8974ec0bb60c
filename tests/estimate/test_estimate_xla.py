"""``unimem.estimate_memory`` for JAX and TensorFlow, in fresh processes with the real frameworks: XLA's
figures of the compiled step, split into its arguments, outputs and temporaries; JAX's step compiled
in a fresh process gives the same figures as in this one; a TensorFlow step XLA does not compile is
refused, naming what is missing."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.slow  # each test imports a framework in a fresh process and compiles several steps

_JAX = r"""
import jax, jax.numpy as jnp
import unimem
from unimem import registry
from unimem.backends.jax._fresh_compile import compile_exported as compile_in_fresh_process
from unimem.backends.jax._fresh_compile import figures

params = {"w1": jnp.full((256, 1024), 0.01), "w2": jnp.full((1024, 256), 0.01)}

@jax.jit
def train(params, x):  # one SGD step: the parameters it returns are new arrays, nothing donated
    loss = lambda p: jnp.mean((jax.nn.relu(x @ p["w1"]) @ p["w2"]) ** 2)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, params, jax.grad(loss)(params))

spec = lambda n: jax.ShapeDtypeStruct((n, 256), jnp.float32)
lower = lambda n: train.lower(params, spec(n))
R = {"params": sum(int(p.nbytes) for p in jax.tree.leaves(params))}
estimate = unimem.estimate_memory(lower, [64, 512], backend="jax", target="8MiB")
R["sizes"] = {str(n): size.as_dict() for n, size in estimate.sizes.items()}
R["largest"], R["above"] = estimate.largest, estimate.above
R["search"] = registry.get_backend("jax").search.predict_peak(lower(512))
R["pair"] = unimem.estimate_memory(lambda n: (train, (params, spec(n))), 512, backend="jax")[512].peak
R["fresh"] = compile_in_fresh_process(train, (params, spec(512)), {})
R["here"] = figures(lower(512).compile())
from unimem.backends.jax._fresh_compile import compile_lowered
R["module_fresh"] = compile_lowered(lower(512))  # the lowered step's StableHLO, compiled there

# An optimizer's state as optax keeps it (a NamedTuple), a model's own container class, and the
# state donated: exported without registering either, the same figures as compiled here.
from typing import NamedTuple
from functools import partial

class Moments(NamedTuple):
    count: jax.Array
    mu: dict

@jax.tree_util.register_pytree_node_class
class Box:
    def __init__(self, inner):
        self.inner = inner
    def tree_flatten(self):
        return (self.inner,), None
    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

@partial(jax.jit, donate_argnums=(0, 1))
def adam_like(box, state, x):
    loss = lambda p: jnp.mean((jax.nn.relu(x @ p["w1"]) @ p["w2"]) ** 2)
    grads = jax.grad(loss)(box.inner)
    mu = jax.tree.map(lambda m, g: 0.9 * m + g, state.mu, grads)
    return Box(jax.tree.map(lambda p, m: p - 1e-3 * m, box.inner, mu)), Moments(state.count + 1, mu)

state = Moments(jnp.zeros((), jnp.int32), jax.tree.map(jnp.zeros_like, params))
R["stateful_fresh"] = compile_in_fresh_process(adam_like, (Box(params), state, spec(512)), {})
R["stateful_here"] = figures(adam_like.lower(Box(params), state, spec(512)).compile())
try:
    unimem.estimate_memory(lower, 8, backend="jax", precision="bf16")
except unimem.ConfigError as exc:
    R["precision_error"] = exc.parameter
emit(R)
"""

_TF = r"""
import os
import tensorflow as tf
import unimem

model = tf.keras.Sequential([tf.keras.layers.Dense(512, activation="relu"), tf.keras.layers.Dense(128)])
model.build((None, 128))
optimizer = tf.keras.optimizers.Adam()
optimizer.build(model.trainable_variables)

@tf.function(jit_compile=True)
def train(x):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(x) ** 2)
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss

@tf.function
def eager_step(x):
    return tf.reduce_mean(model(x) ** 2)

step = lambda n: (train, (tf.TensorSpec((n, 128), tf.float32),))
estimate = unimem.estimate_memory(step, [32, 256], backend="tensorflow")
R = {"sizes": {str(n): size.as_dict() for n, size in estimate.sizes.items()}}
R["variables"] = sum(int(v.numpy().nbytes) for v in model.trainable_variables + list(optimizer.variables))
try:
    unimem.estimate_memory(lambda n: (eager_step, (tf.TensorSpec((n, 128), tf.float32),)), 8, backend="tensorflow")
except unimem.UnsupportedFeature as exc:
    R["refused"] = [exc.backend, exc.feature, str(exc)]
emit(R)
"""


def test_jax_figures_are_xla_s_split_into_arguments_outputs_and_temporaries(need: Any, pyjson: Any) -> None:
    need("jax")
    r = pyjson(_JAX)
    size = r["sizes"]["512"]
    parts = size["parts"]
    assert sum(parts.values()) == size["peak"] == size["required"] == r["search"]
    assert parts["arguments"] == r["params"] + 512 * 256 * 4  # the parameters and the batch
    # New parameters (nothing donated), and the output tuple's table: a pointer per output on the CPU.
    assert parts["outputs"] == r["params"] + 2 * 8
    assert size["reserved"] is None and size["device"] == "cpu"
    assert r["sizes"]["64"]["peak"] < size["peak"]


def test_jax_compiled_in_a_fresh_process_gives_the_figures_of_this_one(need: Any, pyjson: Any) -> None:
    need("jax")
    r = pyjson(_JAX)
    assert r["fresh"] == r["here"]
    assert r["module_fresh"] == r["here"]
    assert r["stateful_fresh"] == r["stateful_here"]  # named-tuple state, a custom container, donation
    assert r["stateful_here"]["alias"] > 0  # the donated state is written over, as training compiles it
    assert r["pair"] == r["sizes"]["512"]["peak"]  # (jitted, args) and the lowered step agree


def test_jax_largest_batch_under_a_target_is_checked_from_both_sides(need: Any, pyjson: Any) -> None:
    need("jax")
    r = pyjson(_JAX)
    largest, above = r["largest"], r["above"]
    assert largest is not None and above is not None
    assert r["sizes"][str(largest)]["fits"] and not r["sizes"][str(above)]["fits"]
    assert above - largest <= max(1, largest // 200)
    assert r["precision_error"] == "precision"


def test_tensorflow_figures_are_xla_s_buffer_assignment(need: Any, pyjson: Any) -> None:
    need("tensorflow")
    r = pyjson(_TF, env={"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"})
    size = r["sizes"]["256"]
    assert sum(size["parts"].values()) == size["peak"]
    # The entry parameters: every variable the step reads (weights, Adam's slots and counters) and the batch.
    assert size["parts"]["arguments"] == r["variables"] + 256 * 128 * 4
    assert r["sizes"]["32"]["peak"] < size["peak"]


def test_a_tensorflow_step_xla_does_not_compile_is_refused(need: Any, pyjson: Any) -> None:
    need("tensorflow")
    r = pyjson(_TF, env={"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"})
    backend, feature, message = r["refused"]
    assert (backend, feature) == ("tensorflow", "estimate")
    assert "jit_compile=True" in message
