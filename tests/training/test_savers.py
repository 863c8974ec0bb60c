"""Memory savers: ``unimem.remat`` and ``unimem.offload`` in torch, JAX and TensorFlow.

The test process never imports a framework (conftest enforces it): each framework's
checks run once in a fresh interpreter (``_run``), on a small model with dropout, and
each test asserts one part of what that run recorded. A saver must leave the gradients
as they are without it (dropout replayed), and must really do what it says: recompute
(the block runs again, or its matrix products do), or keep saved tensors elsewhere.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import SAVERS_PRELUDE, need_framework, run_json

import unimem
from unimem import registry
from unimem.errors import ConfigError, UnsupportedFeature
from unimem.support import FEATURES, Level
from unimem.training.savers import POLICIES

# Every framework's savers in fresh processes, the runs shared by the module's tests: the slow set.
pytestmark = pytest.mark.slow

_COMMON = SAVERS_PRELUDE

_TORCH = r"""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(32, 8))
x = torch.randn(4, 16, requires_grad=True)
runs = [0]

def block(x):
    runs[0] += 1
    return model(x)

class CountMatmuls(TorchDispatchMode):
    # The matrix products that run, forward and backward (a saved one is not run again).
    def __init__(self):
        super().__init__()
        self.n = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
            self.n += 1
        return func(*args, **(kwargs or {}))

def grads(f, seed=123):
    torch.manual_seed(seed)
    model.zero_grad(); x.grad = None; runs[0] = 0
    with CountMatmuls() as count:
        f(x).pow(2).sum().backward()
    return [p.grad.clone() for p in model.parameters()] + [x.grad.clone()], runs[0], count.n

def diff(a, b): return max(float((p - q).abs().max()) for p, q in zip(a, b))

plain, plain_runs, plain_mm = grads(block)
R["dropout_active"] = diff(plain, grads(block, seed=7)[0]) > 0
R["plain"] = {"runs": plain_runs, "matmuls": plain_mm}
for policy in ("full", "matmuls", "offload"):
    g, n, mm = grads(unimem.remat(block, policy, backend="torch"))
    R[policy] = {"diff": diff(plain, g), "runs": n, "matmuls": mm}

def in_context(x):
    with unimem.offload(backend="torch"):
        return block(x)
g, n, mm = grads(in_context)
R["context"] = {"diff": diff(plain, g), "runs": n, "matmuls": mm}

# Offloaded: save_on_cpu's hooks take what autograd saves (an outer hook then sees nothing;
# on a CPU-only machine the host copy is the tensor itself, so its address cannot tell).
a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
def product(a, b): return a * b

def packed_outside(f):
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):
        f()
    return len(seen)

def in_context():
    with unimem.offload(backend="torch"):
        return product(a, b)

R["saved_outside"] = {"plain": packed_outside(lambda: product(a, b)),
                      "remat": packed_outside(lambda: unimem.remat(product, "offload", backend="torch")(a, b)),
                      "context": packed_outside(in_context)}
R["wrapped_name"] = unimem.remat(product, backend="torch").__name__
R["module"] = diff(plain, grads(unimem.remat(model, "matmuls", backend="torch"))[0])
"""

_JAX = r"""
import jax, jax.numpy as jnp

def block(w, x, key):
    h = jnp.tanh(x @ w[0])
    keep = jax.random.bernoulli(key, 0.5, h.shape)  # dropout
    return jnp.tanh(jnp.where(keep, h / 0.5, 0.0) @ w[1])

def loss(f):
    return lambda w, x, key: jnp.sum(f(w, x, key) ** 2)

w = [jax.random.normal(jax.random.PRNGKey(0), (8, 16)), jax.random.normal(jax.random.PRNGKey(2), (16, 4))]
x = jax.random.normal(jax.random.PRNGKey(1), (5, 8))
key = jax.random.PRNGKey(3)
plain = jax.grad(loss(block))(w, x, key)

def diff(a, b): return max(float(jnp.max(jnp.abs(p - q))) for p, q in zip(a, b))

def program(f): return str(jax.make_jaxpr(jax.grad(loss(f)))(w, x, key))

R["dropout_active"] = diff(plain, jax.grad(loss(block))(w, x, jax.random.PRNGKey(4))) > 0
R["plain"] = {"matmuls": program(block).count("dot_general")}
for policy in ("full", "matmuls", "offload"):
    f = unimem.remat(block, policy, backend="jax")
    text = program(f)
    R[policy] = {"diff": diff(plain, jax.grad(loss(f))(w, x, key)),
                 "diff_jit": diff(plain, jax.jit(jax.grad(loss(f)))(w, x, key)),
                 "matmuls": text.count("dot_general"), "to_host": "MemorySpace.Host" in text}
R["context"] = error_of(lambda: unimem.offload(backend="jax"))
"""

_TENSORFLOW = r"""
import tensorflow as tf, keras

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.layers.Dense(32, activation="relu"), keras.layers.Dropout(0.5), keras.layers.Dense(8)])
model.build((None, 16))
x = tf.random.normal((4, 16))
states = [v for v in model.variables if v.name == "seed_generator_state"]
start = [v.numpy() for v in states]
runs = [0]

def forward(x):
    runs[0] += 1
    return model(x, training=True)

def grads(f):
    for v, s in zip(states, start):
        v.assign(s)
    runs[0] = 0
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(f(x) ** 2)
    return tape.gradient(y, model.trainable_variables)

def diff(a, b): return max(float(tf.reduce_max(tf.abs(p - q))) for p, q in zip(a, b))
def seeds(): return [v.numpy().tolist() for v in states]

plain = grads(forward)
plain_seeds = seeds()
R["native_differs"] = diff(plain, grads(tf.recompute_grad(forward))) > 0  # why unimem replays
g = grads(unimem.remat(forward, backend="tensorflow"))
R["eager"] = {"diff": diff(plain, g), "runs": runs[0], "seeds_once": seeds() == plain_seeds}
layer = unimem.remat(model, backend="tensorflow")  # a layer itself, its call's keyword passed through

@tf.function
def in_graph():
    return grads(lambda x: layer(x, training=True))

g = in_graph()
R["graph"] = {"diff": diff(plain, g), "seeds_once": seeds() == plain_seeds}

# Randomness unimem cannot replay: an error in the backward pass, not wrong gradients.
w = tf.Variable(tf.random.normal((16, 8)))
stateful = unimem.remat(lambda x: tf.nn.dropout(x @ w, 0.5), backend="tensorflow")

def backward():
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(stateful(x) ** 2)
    return tape.gradient(y, [w])

R["unreplayable_eager"] = error_of(backward)
R["unreplayable_graph"] = error_of(tf.function(backward))
for policy in ("matmuls", "offload"):
    R[policy] = error_of(lambda: unimem.remat(forward, policy, backend="tensorflow"))
R["context"] = error_of(lambda: unimem.offload(backend="tensorflow"))
"""

_SCRIPTS = {"torch": _TORCH, "jax": _JAX, "tensorflow": _TENSORFLOW}
_RUNS: dict[str, Any] = {}


def _run(framework: str) -> Any:
    """The framework's script, run once in a fresh interpreter."""
    need_framework(framework)
    if framework not in _RUNS:
        _RUNS[framework] = run_json(_COMMON + _SCRIPTS[framework] + "\nemit(R)\n", timeout=240)
    return _RUNS[framework]


# --- bad input: refused before any framework is touched ------------------------------


@pytest.mark.parametrize("policy", ["nope", "", None, 3])
def test_an_unknown_policy_is_a_config_error_naming_policy(policy):
    with pytest.raises(ConfigError) as info:
        unimem.remat(lambda x: x, policy, backend="torch")
    assert info.value.parameter == "policy"
    assert "'full'" in str(info.value) and "'matmuls'" in str(info.value) and "'offload'" in str(info.value)


@pytest.mark.parametrize("fn", [None, 3, "model"])
def test_a_block_that_is_not_callable_is_a_config_error_naming_fn(fn):
    with pytest.raises(ConfigError) as info:
        unimem.remat(fn, backend="torch")
    assert info.value.parameter == "fn"


def test_an_unknown_backend_is_a_config_error_naming_backend():
    with pytest.raises(ConfigError) as info:
        unimem.remat(lambda x: x, backend="nope")
    assert info.value.parameter == "backend"
    with pytest.raises(ConfigError) as info:
        unimem.offload(backend="nope")
    assert info.value.parameter == "backend"


def test_the_policy_is_read_case_blind():
    # Refused only later, by the backend: the name itself was accepted.
    with pytest.raises(UnsupportedFeature) as info:
        unimem.remat(lambda x: x, " FULL ", backend="nvml")
    assert info.value.feature == "remat.full"


@pytest.mark.parametrize("backend", ["nvml", "cupy"])
def test_a_backend_without_autodiff_refuses_every_saver_naming_the_feature(backend):
    if backend == "cupy":
        need_framework(backend)
    for policy in POLICIES:
        with pytest.raises(UnsupportedFeature) as info:
            unimem.remat(lambda x: x, policy, backend=backend)
        assert (info.value.backend, info.value.feature) == (backend, f"remat.{policy}")
        assert info.value.args[0].endswith(registry.capability_table(backend)[f"remat.{policy}"].note)
    with pytest.raises(UnsupportedFeature) as info:
        unimem.offload(backend=backend)
    assert info.value.feature == "offload"


def test_every_backend_has_a_row_for_every_policy():
    assert {f"remat.{policy}" for policy in POLICIES} <= set(FEATURES)
    for name in registry.BACKENDS:
        table = registry.capability_table(name)
        for policy in POLICIES:
            support = table[f"remat.{policy}"]
            assert support.supported or support.note, (name, policy)
    tf = registry.capability_table("tensorflow")
    assert tf["remat.full"].supported
    assert not tf["remat.matmuls"].supported and not tf["remat.offload"].supported
    for name in ("torch", "jax"):
        assert all(registry.capability_table(name)[f"remat.{p}"].level is Level.NATIVE for p in POLICIES)


# --- torch ----------------------------------------------------------------------------


def test_torch_model_has_active_dropout():
    assert _run("torch")["dropout_active"]  # else equal gradients would prove nothing


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param("full", marks=pytest.mark.covers("torch:remat.full")),
        pytest.param("matmuls", marks=pytest.mark.covers("torch:remat.matmuls")),
        pytest.param("offload", marks=pytest.mark.covers("torch:remat.offload")),
        pytest.param("context", marks=pytest.mark.covers("torch:remat.offload")),
    ],
)
def test_torch_gradients_equal_those_without_the_saver(policy):
    assert _run("torch")[policy]["diff"] == 0.0  # CPU, same kernels, same mask: bit for bit


@pytest.mark.covers("torch:remat.full")
def test_torch_full_recomputes_the_block_and_its_matmuls():
    run = _run("torch")
    assert run["plain"]["runs"] == 1
    assert run["full"]["runs"] == 2
    assert run["full"]["matmuls"] > run["plain"]["matmuls"]  # as many as the backward needs (early stop)


@pytest.mark.covers("torch:remat.matmuls")
def test_torch_matmuls_reruns_the_block_but_not_its_matmuls():
    run = _run("torch")
    assert run["matmuls"]["runs"] == 2
    assert run["matmuls"]["matmuls"] == run["plain"]["matmuls"]


@pytest.mark.covers("torch:remat.offload")
def test_torch_offload_recomputes_nothing_and_keeps_copies():
    run = _run("torch")
    assert run["offload"]["runs"] == run["context"]["runs"] == 1
    assert run["offload"]["matmuls"] == run["plain"]["matmuls"]
    assert run["saved_outside"] == {"plain": 2, "remat": 0, "context": 0}


def test_torch_takes_a_module_itself():
    assert _run("torch")["module"] == 0.0


def test_torch_wrapper_keeps_the_blocks_name():
    assert _run("torch")["wrapped_name"] == "product"


# --- JAX ------------------------------------------------------------------------------


def test_jax_model_has_active_dropout():
    assert _run("jax")["dropout_active"]


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param("full", marks=pytest.mark.covers("jax:remat.full")),
        pytest.param("matmuls", marks=pytest.mark.covers("jax:remat.matmuls")),
        pytest.param("offload", marks=pytest.mark.covers("jax:remat.offload")),
    ],
)
def test_jax_gradients_equal_those_without_the_saver(policy):
    run = _run("jax")[policy]
    assert run["diff"] < 1e-5 and run["diff_jit"] < 1e-5  # float32; jit may fuse differently


@pytest.mark.covers("jax:remat.full", "jax:remat.matmuls", "jax:remat.offload")
def test_jax_policies_recompute_and_offload_what_they_say():
    run = _run("jax")
    assert run["full"]["matmuls"] == run["plain"]["matmuls"] + 2  # the two forward dots again
    assert run["matmuls"]["matmuls"] == run["plain"]["matmuls"]
    assert run["offload"]["matmuls"] == run["plain"]["matmuls"]
    assert run["offload"]["to_host"] and not run["full"]["to_host"] and not run["matmuls"]["to_host"]


def test_jax_has_no_offload_context_and_says_to_use_the_policy():
    error = _run("jax")["context"]
    assert error["type"] == "UnsupportedFeature" and error["feature"] == "offload"
    assert "policy='offload'" in error["message"]


# --- TensorFlow -----------------------------------------------------------------------


def test_tensorflow_native_recomputation_draws_a_new_mask():
    assert _run("tensorflow")["native_differs"]  # the flaw unimem's wrapper fixes


@pytest.mark.covers("tensorflow:remat.full")
def test_tensorflow_full_replays_dropout_in_eager_mode():
    run = _run("tensorflow")["eager"]
    assert run["diff"] == 0.0
    assert run["runs"] == 2  # the block did run again
    assert run["seeds_once"]  # the seed states advanced once, as without recomputation


@pytest.mark.covers("tensorflow:remat.full")
def test_tensorflow_full_replays_dropout_in_a_tf_function():
    run = _run("tensorflow")["graph"]
    assert run["diff"] == 0.0
    assert run["seeds_once"]


def test_tensorflow_randomness_it_cannot_replay_fails_the_backward_pass():
    run = _run("tensorflow")
    eager, graph = run["unreplayable_eager"], run["unreplayable_graph"]
    assert eager["type"] == "UnsupportedFeature" and eager["feature"] == "remat.full"
    assert "tf.random.stateless_uniform" in eager["message"]
    assert graph is not None and graph["type"] == "InvalidArgumentError" and "remat.full" in graph["message"]


@pytest.mark.parametrize("policy", ["matmuls", "offload"])
def test_tensorflow_refuses_matmuls_and_offload_naming_the_alternative(policy):
    error = _run("tensorflow")[policy]
    assert error["type"] == "UnsupportedFeature" and error["feature"] == f"remat.{policy}"
    assert "remat(fn, 'full')" in error["message"]


def test_tensorflow_has_no_offload_context():
    error = _run("tensorflow")["context"]
    assert error["type"] == "UnsupportedFeature" and error["feature"] == "offload"
    assert "remat(fn, 'full')" in error["message"]
