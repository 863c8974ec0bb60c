"""Mixed precision: ``unimem.mixed_precision`` and the uniform loss scaler, per framework.

The test process never imports a framework (conftest enforces it): each framework's
checks run once in a fresh interpreter (``_probe``), and each test asserts one part of
what that run recorded. The example script runs as a subprocess per framework and
precision. Devices this machine lacks (a pre-Ampere GPU) are simulated by replacing
the framework's own device query, and say so.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from conftest import REPO, need_framework, run_json, subprocess_env

import unimem
from unimem.errors import ConfigError, UnsupportedFeature
from unimem.loss_scaling import ScalerConfig, next_scale

# Every framework's mixed precision in fresh processes (a TensorFlow run alone is seconds): the slow set.
pytestmark = pytest.mark.slow

FRAMEWORKS = ("torch", "tensorflow", "jax")

# --- what every probe records, in the same shape -----------------------------------------
# dtypes[precision]: the policy's fields and the dtypes seen in a forward/backward pass.
# scaling: a fixed sequence of loss-scaler steps (initial scale 2**10, growth_interval 3):
#   good step, inf injected, nan injected, three good steps; then a genuine fp16 overflow.

_COMMON = r"""
import unimem
from unimem.errors import ConfigError, UnimemError, UnsupportedFeature
R = {"dtypes": {}, "errors": {}}

def error_of(fn):
    try:
        fn()
    except Exception as exc:
        return {"type": type(exc).__name__, "parameter": getattr(exc, "parameter", None), "message": str(exc)}
    return None

def policy_fields(policy):
    return {"compute": policy.compute_dtype, "param": policy.param_dtype, "output": policy.output_dtype,
            "loss_scaling": policy.loss_scaling, "backend": policy.backend, "precision": policy.precision}

def run_sequence(scaler, grads_of, inject, changed_after):
    # grads_of(): fresh scaled gradients; inject(grads, value) -> grads with one entry replaced;
    # changed_after(grads, finite) -> whether the parameters changed after "if finite: apply".
    seq = []
    def step(grads):
        grads, finite = scaler.unscale(grads)
        changed = changed_after(grads, finite)
        scaler.update(finite)
        seq.append({"finite": bool(finite), "changed": changed, "scale": scaler.scale_value,
                    "good_steps": scaler.good_steps})
    step(grads_of())
    step(inject(grads_of(), float("inf")))
    step(inject(grads_of(), float("nan")))
    for _ in range(3):
        step(grads_of())
    return seq
"""

_TORCH = r"""
import torch
def tname(dtype): return str(dtype).removeprefix("torch.")

for precision in ("bf16", "fp16", "fp32"):
    torch.manual_seed(0)
    policy = unimem.mixed_precision(precision, backend="torch")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    with policy:
        hidden = model[0](x)
        out = model(x)
        loss = torch.nn.functional.mse_loss(policy.cast_to_output(out), y)
    loss.backward()
    cast = policy.cast_to_compute({"w": torch.ones(2), "labels": torch.arange(2), "none": None})
    R["dtypes"][precision] = {
        "policy": policy_fields(policy), "device": policy.device,
        "hidden": tname(hidden.dtype), "output": tname(out.dtype), "loss": tname(loss.dtype),
        "params": sorted({tname(p.dtype) for p in model.parameters()}),
        "grads": sorted({tname(p.grad.dtype) for p in model.parameters()}),
        "dtype_objects": [tname(policy.dtype(w)) for w in ("compute", "param", "output")],
        "cast": [tname(cast["w"].dtype), tname(cast["labels"].dtype), cast["none"] is None],
    }

# Loss scaling: the uniform surface over p.grad, with a real optimizer and the loop's "if finite".
torch.manual_seed(0)
policy = unimem.mixed_precision("fp16", backend="torch")
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(4, 8), torch.randn(4, 1)
scaler = policy.loss_scaler(initial_scale=2.0**10, growth_interval=3)
R["scaler_initial"] = [scaler.enabled, scaler.scale_value, scaler.good_steps]

def loss_fn():
    with policy:
        return torch.nn.functional.mse_loss(policy.cast_to_output(model(x)), y)

def grads_of():
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss_fn()).backward()
    return [p.grad for p in model.parameters()]

def inject(grads, value):
    grads[0].view(-1)[0] = value
    return grads

def changed_after(grads, finite):
    before = [p.detach().clone() for p in model.parameters()]
    if finite:
        optimizer.step()
    return any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))

# The scaled loss, and unscaled gradients equal to those of the unscaled loss.
optimizer.zero_grad(set_to_none=True)
plain = loss_fn(); plain.backward()
reference = [p.grad.clone() for p in model.parameters()]
R["scaled_loss_ratio"] = float(scaler.scale(plain.detach())) / float(plain)
unscaled, finite = scaler.unscale(grads_of())
R["unscaled_matches"] = bool(finite) and all(
    torch.allclose(a, b, rtol=1e-3, atol=1e-6) for a, b in zip(unscaled, reference))
R["unscale_in_place"] = all(a is p.grad for a, p in zip(unscaled, model.parameters()))
scaler = policy.loss_scaler(initial_scale=2.0**10, growth_interval=3)
R["sequence"] = run_sequence(scaler, grads_of, inject, changed_after)

# A genuine overflow: 2**40 times the loss flows back through float16 activations.
big = policy.loss_scaler(initial_scale=2.0**40, growth_interval=3)
optimizer.zero_grad(set_to_none=True)
with policy:
    out = model(x)
big.scale(torch.nn.functional.mse_loss(policy.cast_to_output(out), y)).backward()
_, finite = big.unscale([p.grad for p in model.parameters()])
big.update(finite)
R["natural_overflow"] = {"activation_dtype": tname(out.dtype), "finite": finite, "scale": big.scale_value}

# bf16 / fp32: a no-op scaler.
noop = unimem.mixed_precision("bf16", backend="torch").loss_scaler()
grads = [torch.ones(2)]
same, finite = noop.unscale(grads)
noop.update(False)
R["noop"] = {"enabled": noop.enabled, "scale": noop.scale_value, "identity": same is grads,
             "finite": finite, "scaled": float(noop.scale(torch.tensor(3.0)))}

# Enabling and disabling restores the autocast state that was there before.
def state(): return [torch.is_autocast_enabled("cpu"), tname(torch.get_autocast_dtype("cpu"))]
bf16 = unimem.mixed_precision("bf16", backend="torch")
fp16 = unimem.mixed_precision("fp16", backend="torch")
fp32 = unimem.mixed_precision("fp32", backend="torch")
restore = {"before": state()}
bf16.enable(); restore["enabled"] = state(); restore["active"] = bf16.active
bf16.disable(); restore["disabled"] = state(); restore["inactive"] = not bf16.active
with torch.autocast("cpu", dtype=torch.float16):
    restore["outer"] = state()
    with fp32:
        restore["fp32_inside_outer"] = state()
    restore["after_fp32"] = state()
    with bf16:
        restore["bf16_inside_outer"] = state()
    restore["after_bf16"] = state()
restore["end"] = state()
bf16.enable(); fp16.enable()
restore["nested"] = state()
restore["out_of_order"] = error_of(bf16.disable)
from unimem.training.precision import enabled_backends
import threading
restore["enabled_backends"] = enabled_backends()
other = {}
worker = threading.Thread(target=lambda: other.update(error=error_of(fp16.disable)))
worker.start(); worker.join()
restore["other_thread"] = other["error"]
fp16.disable(); restore["after_inner"] = state()
bf16.disable(); restore["after_outer"] = state()
restore["enabled_backends_after"] = enabled_backends()
R["restore"] = restore

# The Keras-only optimizer wrapper is refused with the way forward.
R["errors"]["wrap_optimizer"] = error_of(lambda: fp16.wrap_optimizer(optimizer))
R["errors"]["scaler_args"] = error_of(lambda: fp16.loss_scaler(growth_factor=0.5))
R["errors"]["which"] = error_of(lambda: fp16.dtype("weights"))

# backend=None takes the framework in use.
R["default_backend"] = unimem.mixed_precision("bf16").backend

# Devices this CPU is not, simulated through torch's own queries:
# a GPU without bfloat16 (pre-Ampere), and a torch whose CPU autocast refuses float16.
import warnings
real = (torch.cuda.is_available, torch.cuda.is_initialized, torch.cuda.is_bf16_supported)
torch.cuda.is_available = lambda: True
torch.cuda.is_initialized = lambda: True
torch.cuda.is_bf16_supported = lambda *a, **k: False
R["errors"]["bf16_old_gpu"] = error_of(lambda: unimem.mixed_precision("bf16", backend="torch"))
R["fp16_old_gpu_device"] = unimem.mixed_precision("fp16", backend="torch").device
torch.cuda.is_available, torch.cuda.is_initialized, torch.cuda.is_bf16_supported = real

class OldAutocast(torch.autocast):
    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        if dtype == torch.float16:  # what torch < 2.4 did on the CPU
            warnings.warn("In CPU autocast, but the target dtype is not supported. Disabling autocast.")
            self._enabled = False
real_autocast, torch.autocast = torch.autocast, OldAutocast
R["errors"]["fp16_old_cpu_autocast"] = error_of(lambda: unimem.mixed_precision("fp16", backend="torch"))
torch.autocast = real_autocast
emit(R)
"""

_TENSORFLOW = r"""
import keras
import tensorflow as tf
def tname(dtype): return tf.dtypes.as_dtype(dtype).name

for precision in ("bf16", "fp16", "fp32"):
    keras.utils.set_random_seed(0)
    policy = unimem.mixed_precision(precision, backend="tensorflow")
    x, y = tf.random.normal((4, 8)), tf.random.normal((4, 1))
    with policy:  # Keras layers take the global policy when built
        first = keras.layers.Dense(8, activation="relu")
        model = keras.Sequential([keras.Input((8,)), first, keras.layers.Dense(1)])
        global_policy = keras.mixed_precision.global_policy().name
    with tf.GradientTape() as tape:
        hidden = first(x)
        out = model(x)
        loss = tf.reduce_mean(tf.square(policy.cast_to_output(out) - y))
    grads = tape.gradient(loss, model.trainable_variables)
    cast = policy.cast_to_compute({"w": tf.ones(2), "labels": tf.range(2), "none": None})
    R["dtypes"][precision] = {
        "policy": policy_fields(policy), "device": policy.device, "keras_policy": global_policy,
        "hidden": tname(hidden.dtype), "output": tname(out.dtype), "loss": tname(loss.dtype),
        "params": sorted({tname(v.dtype) for v in model.trainable_variables}),
        "grads": sorted({tname(g.dtype) for g in grads}),
        "dtype_objects": [tname(policy.dtype(w)) for w in ("compute", "param", "output")],
        "cast": [tname(cast["w"].dtype), tname(cast["labels"].dtype), cast["none"] is None],
    }

keras.utils.set_random_seed(0)
policy = unimem.mixed_precision("fp16", backend="tensorflow")
with policy:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
optimizer = keras.optimizers.SGD(0.01)
optimizer.build(model.trainable_variables)
x, y = tf.random.normal((4, 8)), tf.random.normal((4, 1))
scaler = policy.loss_scaler(initial_scale=2.0**10, growth_interval=3)
R["scaler_initial"] = [scaler.enabled, scaler.scale_value, scaler.good_steps]

def loss_fn():
    return tf.reduce_mean(tf.square(policy.cast_to_output(model(x)) - y))

def grads_of():
    with tf.GradientTape() as tape:
        scaled = scaler.scale(loss_fn())
    return tape.gradient(scaled, model.trainable_variables)

def inject(grads, value):
    first = grads[0].numpy().copy(); first.flat[0] = value
    return [tf.constant(first)] + list(grads[1:])

def changed_after(grads, finite):
    before = [v.numpy().copy() for v in model.trainable_variables]
    if finite:
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return any((a != v.numpy()).any() for a, v in zip(before, model.trainable_variables))

with tf.GradientTape() as tape:
    plain = loss_fn()
reference = tape.gradient(plain, model.trainable_variables)
R["scaled_loss_ratio"] = float(scaler.scale(plain)) / float(plain)
unscaled, finite = scaler.unscale(grads_of())
R["unscaled_matches"] = finite is True and all(
    bool(tf.reduce_all(tf.abs(a - b) <= 1e-6 + 1e-3 * tf.abs(b))) for a, b in zip(unscaled, reference))
R["sequence"] = run_sequence(scaler, grads_of, inject, changed_after)

# The same sequence inside a tf.function: finite is a tensor, the scale a tf.Variable.
scaler = policy.loss_scaler(initial_scale=2.0**10, growth_interval=3)
@tf.function
def graph_step(grads):
    grads, finite = scaler.unscale(grads)
    scaler.update(finite)
    return finite
graph = []
poisoned = [grads_of(), inject(grads_of(), float("inf")), inject(grads_of(), float("nan"))]
for grads in poisoned + [grads_of() for _ in range(3)]:
    finite = graph_step(grads)
    graph.append({"finite": bool(finite.numpy()), "tensor": tf.is_tensor(finite), "scale": scaler.scale_value,
                  "good_steps": scaler.good_steps})
R["graph_sequence"] = graph

big = policy.loss_scaler(initial_scale=2.0**40, growth_interval=3)
with tf.GradientTape() as tape:
    out = model(x)
    scaled = big.scale(tf.reduce_mean(tf.square(policy.cast_to_output(out) - y)))
_, finite = big.unscale(tape.gradient(scaled, model.trainable_variables))
big.update(finite)
R["natural_overflow"] = {"activation_dtype": tname(out.dtype), "finite": finite, "scale": big.scale_value}

noop = unimem.mixed_precision("bf16", backend="tensorflow").loss_scaler()
grads = [tf.ones(2)]
same, finite = noop.unscale(grads)
noop.update(False)
R["noop"] = {"enabled": noop.enabled, "scale": noop.scale_value, "identity": same is grads,
             "finite": finite, "scaled": float(noop.scale(tf.constant(3.0)))}

# Restoring the Keras global policy that was there before, whatever it was.
def state(): return keras.mixed_precision.global_policy().name
bf16 = unimem.mixed_precision("bf16", backend="tensorflow")
fp16 = unimem.mixed_precision("fp16", backend="tensorflow")
fp32 = unimem.mixed_precision("fp32", backend="tensorflow")
restore = {"before": state()}
bf16.enable(); restore["enabled"] = state(); restore["active"] = bf16.active
bf16.disable(); restore["disabled"] = state(); restore["inactive"] = not bf16.active
keras.mixed_precision.set_global_policy("mixed_float16")
restore["outer"] = state()
with fp32:
    restore["fp32_inside_outer"] = state()
restore["after_fp32"] = state()
with bf16:
    restore["bf16_inside_outer"] = state()
restore["after_bf16"] = state()
keras.mixed_precision.set_global_policy("float32")
restore["end"] = state()
bf16.enable(); fp16.enable()
restore["nested"] = state()
restore["out_of_order"] = error_of(bf16.disable)
fp16.disable(); restore["after_inner"] = state()
bf16.disable(); restore["after_outer"] = state()
R["restore"] = restore

# Keras' own loss scaling for model.fit: LossScaleOptimizer under fp16 only.
wrapped = fp16.wrap_optimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**12, growth_interval=7)
R["wrap"] = {"fp16": type(wrapped).__name__, "initial_scale": float(wrapped.initial_scale),
             "growth_steps": int(wrapped.dynamic_growth_steps)}
plain_sgd = keras.optimizers.SGD(0.01)
R["wrap"]["bf16_is_same"] = bf16.wrap_optimizer(plain_sgd) is plain_sgd
with fp16:
    fit_model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    fit_model.compile(optimizer=fp16.wrap_optimizer(keras.optimizers.Adam(0.01)), loss="mse")
    history = fit_model.fit(tf.random.normal((64, 8)), tf.random.normal((64, 1)), epochs=3, batch_size=16, verbose=0)
R["wrap"]["fit_losses_finite"] = all(l == l and abs(l) != float("inf") for l in history.history["loss"])
R["wrap"]["fit_output_dtype"] = tname(fit_model.layers[0].compute_dtype)

R["errors"]["scaler_args"] = error_of(lambda: fp16.loss_scaler(growth_interval=0))
# TF imports JAX too (TF Lite), but only TF has run: backend=None means TF, as in stats().
R["default_backend"] = unimem.mixed_precision("bf16").backend

# A GPU before compute capability 8.0, simulated through TensorFlow's device queries.
class FakeGPU:
    name = "/physical_device:GPU:0"; device_type = "GPU"
real = (tf.config.list_physical_devices, tf.config.experimental.get_device_details)
tf.config.list_physical_devices = lambda kind=None: [FakeGPU()] if kind == "GPU" else real[0](kind)
tf.config.experimental.get_device_details = lambda device: {"compute_capability": (7, 0)}
R["errors"]["bf16_old_gpu"] = error_of(lambda: unimem.mixed_precision("bf16", backend="tensorflow"))
R["fp16_old_gpu_device"] = unimem.mixed_precision("fp16", backend="tensorflow").device
tf.config.list_physical_devices, tf.config.experimental.get_device_details = real
emit(R)
"""

_JAX = r"""
import jax
import jax.numpy as jnp
def tname(dtype): return jnp.dtype(dtype).name

def init(key):
    k1, k2 = jax.random.split(key)
    return [(jax.random.normal(k1, (8, 8)) / 3, jnp.zeros(8)), (jax.random.normal(k2, (8, 1)) / 3, jnp.zeros(1))]

def forward(policy, params, x, record=None):
    params = policy.cast_to_compute(params)
    (w1, b1), (w2, b2) = params
    hidden = jax.nn.relu(policy.cast_to_compute(x) @ w1 + b1)
    out = hidden @ w2 + b2
    if record is not None:
        record.update(hidden=tname(hidden.dtype), output=tname(out.dtype))
    return policy.cast_to_output(out)

x, y = jax.random.normal(jax.random.PRNGKey(1), (4, 8)), jax.random.normal(jax.random.PRNGKey(2), (4, 1))
for precision in ("bf16", "fp16", "fp32"):
    policy = unimem.mixed_precision(precision, backend="jax")
    params = init(jax.random.PRNGKey(0))
    seen = {}
    def loss_fn(p):
        return jnp.mean(jnp.square(forward(policy, p, x, seen) - y))
    loss, grads = jax.value_and_grad(loss_fn)(params)
    cast = policy.cast_to_compute({"w": jnp.ones(2), "labels": jnp.arange(2), "none": None})
    R["dtypes"][precision] = {
        "policy": policy_fields(policy), "device": policy.device, **seen, "loss": tname(loss.dtype),
        "params": sorted({tname(p.dtype) for p in jax.tree_util.tree_leaves(params)}),
        "grads": sorted({tname(g.dtype) for g in jax.tree_util.tree_leaves(grads)}),
        "dtype_objects": [tname(policy.dtype(w)) for w in ("compute", "param", "output")],
        "cast": [tname(cast["w"].dtype), tname(cast["labels"].dtype), cast["none"] is None],
    }
    with policy:
        R["dtypes"][precision]["active_in_with"] = policy.active

policy = unimem.mixed_precision("fp16", backend="jax")
state = {"params": init(jax.random.PRNGKey(0))}
scaler = policy.loss_scaler(initial_scale=2.0**10, growth_interval=3)
R["scaler_initial"] = [scaler.enabled, scaler.scale_value, scaler.good_steps]

def loss_of(p):
    return jnp.mean(jnp.square(forward(policy, p, x) - y))

def grads_of():
    return jax.grad(lambda p: scaler.scale(loss_of(p)))(state["params"])

def inject(grads, value):
    (w1, b1), rest = grads[0], grads[1]
    return [(w1.at[0, 0].set(value), b1), rest]

def differ(a, b):
    return any(bool((x != y).any()) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))

def changed_after(grads, finite):
    before = state["params"]
    if finite:
        state["params"] = jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, before, grads)
    return differ(before, state["params"])

plain, reference = jax.value_and_grad(loss_of)(state["params"])
R["scaled_loss_ratio"] = float(scaler.scale(plain)) / float(plain)
unscaled, finite = scaler.unscale(grads_of())
R["unscaled_matches"] = finite is True and all(
    bool(jnp.allclose(a, b, rtol=1e-3, atol=1e-6))
    for a, b in zip(jax.tree_util.tree_leaves(unscaled), jax.tree_util.tree_leaves(reference)))
R["sequence"] = run_sequence(scaler, grads_of, inject, changed_after)

# The same sequence inside jax.jit: the scaler goes in as an argument and comes back out.
@jax.jit
def jit_step(params, scaler, poison):
    grads = jax.grad(lambda p: scaler.scale(loss_of(p)))(params)
    (w1, b1), rest = grads[0], grads[1]
    grads = [(w1.at[0, 0].add(poison), b1), rest]
    grads, finite = scaler.unscale(grads)
    params = jax.tree_util.tree_map(lambda p, g: jnp.where(finite, p - 0.01 * g, p), params, grads)
    scaler.update(finite)
    return params, scaler, finite

params = init(jax.random.PRNGKey(0))
scaler = policy.loss_scaler(initial_scale=2.0**10, growth_interval=3)
jitted = []
for poison in [0.0, float("inf"), float("nan"), 0.0, 0.0, 0.0]:
    new_params, scaler, finite = jit_step(params, scaler, poison)
    changed = differ(params, new_params)
    params = new_params
    jitted.append({"finite": bool(finite), "changed": changed, "scale": scaler.scale_value,
                   "good_steps": scaler.good_steps})
R["jit_sequence"] = jitted
R["jit_scaler_type"] = type(scaler).__name__

big = policy.loss_scaler(initial_scale=2.0**40, growth_interval=3)
seen = {}
grads = jax.grad(lambda p: big.scale(jnp.mean(jnp.square(forward(policy, p, x, seen) - y))))(state["params"])
_, finite = big.unscale(grads)
big.update(finite)
R["natural_overflow"] = {"activation_dtype": seen["hidden"], "finite": finite, "scale": big.scale_value}

noop = unimem.mixed_precision("bf16", backend="jax").loss_scaler()
grads = [jnp.ones(2)]
same, finite = noop.unscale(grads)
noop.update(False)
R["noop"] = {"enabled": noop.enabled, "scale": noop.scale_value, "identity": same is grads,
             "finite": finite, "scaled": float(noop.scale(jnp.asarray(3.0)))}
# The no-op scaler goes through jax.jit too (a pytree without leaves).
R["noop_jit"] = float(jax.jit(lambda s, l: s.scale(l))(noop, jnp.asarray(3.0)))

R["restore"] = {"active": policy.enable().active}
policy.disable()
R["restore"]["inactive"] = not policy.active
# No per-thread state in JAX: another thread may turn the policy off.
import threading
from unimem.training.precision import enabled_backends
policy.enable()
other = {"enabled_backends": enabled_backends()}
worker = threading.Thread(target=lambda: other.update(error=error_of(policy.disable)))
worker.start(); worker.join()
other["inactive"] = not policy.active
other["enabled_backends_after"] = enabled_backends()
R["other_thread"] = other
R["errors"]["wrap_optimizer"] = error_of(lambda: policy.wrap_optimizer(object()))
R["errors"]["scaler_args"] = error_of(lambda: policy.loss_scaler(initial_scale=float("inf")))
R["default_backend"] = unimem.mixed_precision("bf16").backend
emit(R)
"""

_PROBES = {"torch": _TORCH, "tensorflow": _TENSORFLOW, "jax": _JAX}

# --- each framework's own loss-scaled step, and policies that nest ------------------------
# Second probes: the framework's own step (torch scaler.step, Keras scaler.wrap, JAX
# scaler.step in jit), gradient accumulation, and nesting policies in every order.

_NESTING = r"""
from unimem.training.precision import enabled_backends

def nesting(make, state):
    # make(precision) -> policy; state() -> what the framework has in force now.
    a, b = make("bf16"), make("fp16")
    n = {"before": state()}
    a.enable()
    with a:
        n["enable_then_with_inside"] = state()
    n["enable_then_with_after"] = [state(), a.active]
    a.disable()
    n["enable_then_with_disabled"] = [state(), a.active]
    with a:
        a.enable()
    n["with_then_enable_after"] = [state(), a.active]
    a.disable()
    n["with_then_enable_disabled"] = [state(), a.active]
    with a:
        with a:
            pass
        n["same_twice_after_inner"] = [state(), a.active]
    n["same_twice_after_outer"] = [state(), a.active]
    with a:
        with b:
            n["a_in_b_inside"] = state()
        n["a_in_b_after_inner"] = state()
    n["a_in_b_after_outer"] = state()
    with b:
        with a:
            n["b_in_a_inside"] = state()
        n["b_in_a_after_inner"] = state()
    n["b_in_a_after_outer"] = state()
    a.enable()
    with b:
        n["with_b_in_enabled_a_inside"] = state()
    n["with_b_in_enabled_a_after"] = [state(), a.active, b.active]
    a.disable()
    with a:
        with b:
            with a:
                n["aba_inside"] = state()
            n["aba_after_inner"] = state()
        n["aba_after_middle"] = state()
    n["aba_after_outer"] = state()
    # Refused, changing nothing: b's block ends while a, enabled inside it, is still on.
    try:
        with b:
            a.enable()
    except UnimemError as exc:
        n["refused"] = {"message": str(exc), "state": state(), "a": a.active, "b": b.active}
    a.disable()
    b.__exit__(None, None, None)  # the block the refusal left open
    n["end"] = [state(), a.active, b.active, enabled_backends()]
    return n
"""

_TORCH_STEP = r"""
import threading
import torch
def tname(dtype): return str(dtype).removeprefix("torch.")
def state(): return [torch.is_autocast_enabled("cpu"), tname(torch.get_autocast_dtype("cpu"))]

policy = unimem.mixed_precision("fp16", backend="torch")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
xs, ys = torch.randn(3, 4, 8), torch.randn(3, 4, 1)

def loss_of(i):
    with policy:
        out = model(xs[i])
    return torch.nn.functional.mse_loss(policy.cast_to_output(out), ys[i])

def reference(micro):
    # The gradients of the mean loss over `micro` micro-batches, never scaled.
    opt.zero_grad(set_to_none=True)
    for i in range(micro):
        (loss_of(i) / micro).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    opt.zero_grad(set_to_none=True)
    return grads

def close(a, b): return all(torch.allclose(x, y, rtol=1e-3, atol=1e-6) for x, y in zip(a, b))
def params(): return [p.detach().clone() for p in model.parameters()]
def grads(): return [p.grad.clone() for p in model.parameters()]
def sgd(before, ref): return [p - 0.01 * g for p, g in zip(before, ref)]
def changed(before): return any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))

# GradScaler's loop: after step(opt), p.grad holds the unscaled gradients the update used.
scaler = policy.loss_scaler(initial_scale=2.0**10, growth_interval=3)
ref, before = reference(1), params()
scaler.scale(loss_of(0)).backward()
scaler.step(opt)
scaler.update()
R["one_step"] = {"grad_unscaled": close(grads(), ref), "update_used_unscaled": close(params(), sgd(before, ref)),
                 "grad_scaler": type(scaler.grad_scaler).__name__,
                 "is_gradscaler": isinstance(scaler.grad_scaler, torch.amp.GradScaler),
                 "scale": scaler.scale_value, "good_steps": scaler.good_steps}

# good, inf, nan, then three good steps: skipped steps leave the parameters bit for bit.
scaler = policy.loss_scaler(initial_scale=2.0**10, growth_interval=3)
sequence = []
for poison in [None, float("inf"), float("nan"), None, None, None]:
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss_of(0)).backward()
    if poison is not None:
        with torch.no_grad():
            model[0].weight.grad.view(-1)[0] = poison
    before = params()
    scaler.step(opt)
    scaler.update()
    sequence.append({"changed": changed(before), "scale": scaler.scale_value, "good_steps": scaler.good_steps})
R["step_sequence"] = sequence

# Gradient accumulation: three micro-batches at one scale, unscaled once by step(opt).
scaler = policy.loss_scaler(initial_scale=2.0**10)
ref, before = reference(3), params()
scales = []
for i in range(3):
    scaler.scale(loss_of(i) / 3).backward()
    scales.append(scaler.scale_value)
summed = grads()
scaler.step(opt)
scaler.update()
R["accumulation"] = {"scales": scales, "summed_is_scaled": close([g / 1024 for g in summed], ref),
                     "unscaled_once": close(grads(), ref), "update": close(params(), sgd(before, ref))}
# The uniform loop under accumulation: one unscale after the last micro-batch.
scaler = policy.loss_scaler(initial_scale=2.0**10)
ref = reference(3)
for i in range(3):
    scaler.scale(loss_of(i) / 3).backward()
unscaled, finite = scaler.unscale([p.grad for p in model.parameters()])
R["accumulation_uniform"] = {"finite": finite, "matches": close(unscaled, ref), "in_p_grad": close(grads(), ref)}
scaler.update(finite)

# unscale_(opt) to clip, then step(opt) does not unscale again.
scaler = policy.loss_scaler(initial_scale=2.0**10)
ref = reference(1)
scaler.scale(loss_of(0)).backward()
scaler.unscale_(opt)
after_unscale = close(grads(), ref)
torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e9)
scaler.step(opt)
R["unscale_then_step"] = {"after_unscale_": after_unscale, "not_again": close(grads(), ref)}
scaler.update()

# Mixing the two loops within a step is refused, and the refusal changes nothing.
scaler = policy.loss_scaler(initial_scale=2.0**10)
opt.zero_grad(set_to_none=True)
scaler.scale(loss_of(0)).backward()
_, finite = scaler.unscale([p.grad for p in model.parameters()])
kept_grads, kept_params = grads(), params()
misuse = {"step_after_unscale": error_of(lambda: scaler.step(opt)),
          "unscale_twice": error_of(lambda: scaler.unscale([p.grad for p in model.parameters()])),
          "update_without_finite": error_of(lambda: scaler.update())}
misuse["unchanged"] = all(torch.equal(a, b) for a, b in zip(kept_grads, grads())) and not changed(kept_params)
misuse["scale_unchanged"] = scaler.scale_value
scaler.update(finite)
opt.zero_grad(set_to_none=True)
scaler.scale(loss_of(0)).backward()
scaler.step(opt)
misuse["update_with_finite_after_step"] = error_of(lambda: scaler.update(True))
misuse["unscale_after_step"] = error_of(lambda: scaler.unscale([p.grad for p in model.parameters()]))
scaler.update()
R["misuse"] = misuse

# bf16: the same loop, nothing scaled, step(opt) is optimizer.step().
noop = unimem.mixed_precision("bf16", backend="torch").loss_scaler()
opt.zero_grad(set_to_none=True)
noop.scale(loss_of(0)).backward()
before = params()
noop.step(opt)
noop.update()
R["bf16_step"] = {"enabled": noop.enabled, "changed": changed(before), "scale": noop.scale_value}
R["wrap"] = error_of(lambda: scaler.wrap(opt))

R["nesting"] = nesting(lambda precision: unimem.mixed_precision(precision, backend="torch"), state)

# Autocast state is per thread: two threads inside `with policy:` at once each have it on.
bf16 = unimem.mixed_precision("bf16", backend="torch")
barrier, seen = threading.Barrier(2), {}
def worker(name):
    with bf16:
        barrier.wait()
        seen[name] = state()
        barrier.wait()
    seen[name + " after"] = state()
threads = [threading.Thread(target=worker, args=(name,)) for name in ("one", "two")]
for t in threads: t.start()
for t in threads: t.join()
R["threads"] = {**seen, "main": state(), "active": bf16.active}
emit(R)
"""

_TENSORFLOW_STEP = r"""
import keras
import numpy as np
import tensorflow as tf
def state(): return keras.mixed_precision.global_policy().name

fp16 = unimem.mixed_precision("fp16", backend="tensorflow")
scaler = fp16.loss_scaler(initial_scale=2.0**12, growth_interval=7)
opt = scaler.wrap(keras.optimizers.SGD(0.01))
R["wrap"] = {"type": type(opt).__name__, "initial_scale": float(opt.initial_scale),
             "growth_steps": int(opt.dynamic_growth_steps)}
keras.utils.set_random_seed(0)
with fp16:  # layers take the policy when they are built
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
R["layer_policy"] = model.layers[0].dtype_policy.name
R["after_build"] = state()
x, y = tf.random.normal((4, 8)), tf.random.normal((4, 1))
opt.build(model.trainable_variables)
def wrapped_step(poison):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(fp16.cast_to_output(model(x)) - y))
        scaled = opt.scale_loss(loss)
    grads = tape.gradient(scaled, model.trainable_variables)
    grads = [grads[0] + poison] + list(grads[1:])
    before = [v.numpy().copy() for v in model.trainable_variables]
    opt.apply(grads, model.trainable_variables)
    changed = any((a != v.numpy()).any() for a, v in zip(before, model.trainable_variables))
    return {"changed": bool(changed), "scale": float(opt.dynamic_scale.numpy())}
R["wrapped_steps"] = [wrapped_step(0.0), wrapped_step(float("inf"))]

bf16_opt = keras.optimizers.SGD(0.01)
R["bf16_wrap_is_same"] = unimem.mixed_precision("bf16", backend="tensorflow").loss_scaler().wrap(bf16_opt) is bf16_opt
R["bad_factor"] = error_of(lambda: fp16.loss_scaler(growth_factor=4.0).wrap(keras.optimizers.SGD(0.01)))
R["step"] = error_of(lambda: scaler.step(opt))
R["nesting"] = nesting(lambda precision: unimem.mixed_precision(precision, backend="tensorflow"), state)
emit(R)
"""

_JAX_STEP = r"""
import jax
import jax.numpy as jnp
policy = unimem.mixed_precision("fp16", backend="jax")
k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(0), 4)
params = {"w1": jax.random.normal(k1, (8, 8)) / 3, "w2": jax.random.normal(k2, (8, 1)) / 3}
x, y = jax.random.normal(k3, (4, 8)), jax.random.normal(k4, (4, 1))

def loss_of(p, x, y):
    p, x = policy.cast_to_compute((p, x))
    return jnp.mean(jnp.square(policy.cast_to_output(jax.nn.relu(x @ p["w1"]) @ p["w2"]) - y))

def close(a, b):
    return all(bool(jnp.allclose(u, v, rtol=1e-3, atol=1e-6))
               for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))

def differ(a, b):
    return any(bool((u != v).any()) for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))

@jax.jit
def train_step(params, scaler, poison):
    grads = jax.grad(lambda p: scaler.scale(loss_of(p, x, y)))(params)
    grads = {**grads, "w1": grads["w1"].at[0, 0].add(poison)}
    grads, finite, scaler = scaler.step(grads)
    params = jax.tree_util.tree_map(lambda p, g: jnp.where(finite, p - 0.01 * g, p), params, grads)
    return params, scaler, finite

scaler = policy.loss_scaler(initial_scale=2.0**10, growth_interval=3)
current, sequence = params, []
for poison in [0.0, float("inf"), float("nan"), 0.0, 0.0, 0.0]:
    new, scaler, finite = train_step(current, scaler, poison)
    sequence.append({"finite": bool(finite), "changed": differ(current, new), "scale": scaler.scale_value,
                     "good_steps": scaler.good_steps})
    current = new
R["jit_sequence"] = sequence
R["jit_scaler_type"] = type(scaler).__name__

# Eagerly: the unscaled gradients, a Python bool, and a new scaler; the old one is as it was.
first = policy.loss_scaler(initial_scale=2.0**10, growth_interval=3)
ref = jax.grad(loss_of)(params, x, y)
unscaled, finite, following = first.step(jax.grad(lambda p: first.scale(loss_of(p, x, y)))(params))
R["eager"] = {"finite": finite, "finite_type": type(finite).__name__, "matches": close(unscaled, ref),
              "old": [first.scale_value, first.good_steps], "new": [following.scale_value, following.good_steps]}

# Gradient accumulation: sum the micro-batches' scaled gradients, one step for them all.
halves = [(x[:2], y[:2]), (x[2:], y[2:])]
ref = jax.grad(lambda p: sum(loss_of(p, a, b) for a, b in halves) / 2)(params)
summed = None
for a, b in halves:
    g = jax.grad(lambda p: first.scale(loss_of(p, a, b) / 2))(params)
    summed = g if summed is None else jax.tree_util.tree_map(jnp.add, summed, g)
unscaled, finite, _ = first.step(summed)
R["accumulation"] = {"finite": finite, "matches": close(unscaled, ref)}

# Members of a named axis holding different gradients agree when given the axis.
two = {"g": jnp.array([[1.0, 2.0], [jnp.inf, 1.0]])}
alone = jax.vmap(lambda g: first.step(g)[1])(two)
agreed = jax.vmap(lambda g: first.step(g, axis_name="ranks"), axis_name="ranks", out_axes=(0, 0, None))(two)
R["agree"] = {"alone": [bool(v) for v in alone], "agreed": [bool(v) for v in agreed[1]],
              "scale": agreed[2].scale_value}

noop = unimem.mixed_precision("bf16", backend="jax").loss_scaler()
grads = {"a": jnp.ones(2)}
same, finite, itself = noop.step(grads)
R["noop"] = {"same": same is grads, "finite": finite, "itself": itself is noop,
             "jit": float(jax.jit(lambda s, g: s.step(g)[0]["a"].sum())(noop, {"a": jnp.ones(2)}))}
R["wrap"] = error_of(lambda: first.wrap(object()))

# No global state to see in JAX: the flags nest the same way.
bf16 = unimem.mixed_precision("bf16", backend="jax")
bf16.enable()
with bf16:
    pass
R["nesting"] = {"after_with": bf16.active}
bf16.disable()
R["nesting"]["after_disable"] = bf16.active
emit(R)
"""

_STEP_PROBES = {"torch": _TORCH_STEP, "tensorflow": _TENSORFLOW_STEP, "jax": _JAX_STEP}
# Every probe and example run is a separate interpreter; they run side by side (at most
# one per CPU, two at least), started together the first time a test needs one of them.
_jobs: dict[tuple[str, ...], Future[Any]] = {}
EXAMPLE_ARGS = ["--epochs", "2", "--samples", "1024", "--batch-size", "64"]


def _run_probe(framework: str) -> dict[str, Any]:
    return dict(run_json(_COMMON + _PROBES[framework], timeout=300))


def _run_step_probe(framework: str) -> dict[str, Any]:
    return dict(run_json(_COMMON + _NESTING + _STEP_PROBES[framework], timeout=300))


def _run_example(framework: str, precision: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(REPO / "examples" / "train.py"), "--backend", framework, "--precision", precision]
    return subprocess.run(
        cmd + EXAMPLE_ARGS, env=subprocess_env(), capture_output=True, text=True, timeout=300, cwd=str(REPO)
    )


_KERAS_ON_JAX = """
import unimem
try:
    unimem.mixed_precision("bf16", backend="tensorflow")
    emit(None)
except unimem.ConfigError as exc:
    emit({"parameter": exc.parameter, "message": str(exc)})
"""


def _run_keras_on_jax() -> Any:
    return run_json(_KERAS_ON_JAX, env={"KERAS_BACKEND": "jax"})


def _job(*key: str) -> Any:
    """The result of probe ``(framework,)``, step probe ``(framework, "step")`` or example
    ``(framework, precision)``."""
    need_framework(key[0])
    if not _jobs:
        pool = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1))
        present = [fw for fw in FRAMEWORKS if importlib.util.find_spec(fw) is not None]
        for fw in present:
            _jobs[(fw,)] = pool.submit(_run_probe, fw)
            _jobs[(fw, "step")] = pool.submit(_run_step_probe, fw)
        if "tensorflow" in present and "jax" in present:
            _jobs[("tensorflow", "keras-on-jax")] = pool.submit(_run_keras_on_jax)
        for fw in present:
            for precision in ("bf16", "fp16", "fp32"):
                _jobs[(fw, precision)] = pool.submit(_run_example, fw, precision)
        pool.shutdown(wait=False)
    return _jobs[key].result()


def _probe(framework: str) -> dict[str, Any]:
    """What the framework's probe recorded (it runs once; a failure fails every test using it)."""
    try:
        return dict(_job(framework))
    except pytest.fail.Exception as exc:
        pytest.fail(f"the {framework} probe failed:\n{exc}", pytrace=False)


NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


# --- compute dtype vs parameter dtype ---------------------------------------------------


@pytest.mark.parametrize(
    "framework",
    [
        pytest.param("torch", marks=pytest.mark.covers("torch:precision.bf16", "torch:precision.fp16")),
        pytest.param("tensorflow", marks=pytest.mark.covers("tensorflow:precision.bf16", "tensorflow:precision.fp16")),
        pytest.param("jax", marks=pytest.mark.covers("jax:precision.bf16", "jax:precision.fp16")),
    ],
)
@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_computation_runs_in_compute_dtype_and_params_stay_float32(framework: str, precision: str) -> None:
    seen = _probe(framework)["dtypes"][precision]
    compute = NAMES[precision]
    assert seen["policy"] == {
        "compute": compute,
        "param": "float32",
        "output": "float32",
        "loss_scaling": precision == "fp16",
        "backend": framework,
        "precision": precision,
    }
    assert seen["hidden"] == compute, "a hidden layer's activations"
    assert seen["output"] == compute, "the model's output, before cast_to_output"
    assert seen["loss"] == "float32", "the loss, computed from cast_to_output(output)"
    assert seen["params"] == ["float32"]
    assert seen["grads"] == ["float32"]
    assert seen["dtype_objects"] == [compute, "float32", "float32"]
    assert seen["cast"] == [compute, "int32" if framework != "torch" else "int64", True], "labels are not cast"


def test_devices_reported() -> None:
    """CPU here: torch autocasts on 'cpu', TF sees no GPU, JAX reports its platform once started."""
    assert _probe("torch")["dtypes"]["bf16"]["device"] == "cpu"
    assert _probe("tensorflow")["dtypes"]["bf16"]["device"] == "cpu"
    assert _probe("jax")["dtypes"]["bf16"]["device"] in {"auto", "cpu"}


def test_tensorflow_policy_sets_the_keras_global_policy() -> None:
    dtypes = _probe("tensorflow")["dtypes"]
    assert [dtypes[p]["keras_policy"] for p in ("bf16", "fp16", "fp32")] == [
        "mixed_bfloat16",
        "mixed_float16",
        "float32",
    ]


# --- loss scaling ------------------------------------------------------------------------

# initial 2**10, growth_interval 3: good, inf, nan, good, good, good (grows on the third).
EXPECTED_SEQUENCE = [
    {"finite": True, "changed": True, "scale": 1024.0, "good_steps": 1},
    {"finite": False, "changed": False, "scale": 512.0, "good_steps": 0},
    {"finite": False, "changed": False, "scale": 256.0, "good_steps": 0},
    {"finite": True, "changed": True, "scale": 256.0, "good_steps": 1},
    {"finite": True, "changed": True, "scale": 256.0, "good_steps": 2},
    {"finite": True, "changed": True, "scale": 512.0, "good_steps": 0},
]


@pytest.mark.parametrize(
    "framework",
    [
        pytest.param("torch", marks=pytest.mark.covers("torch:precision.loss_scaling")),
        pytest.param("tensorflow", marks=pytest.mark.covers("tensorflow:precision.loss_scaling")),
        pytest.param("jax", marks=pytest.mark.covers("jax:precision.loss_scaling")),
    ],
)
def test_fp16_overflow_skips_the_step_lowers_the_scale_then_grows_it(framework: str) -> None:
    probe = _probe(framework)
    assert probe["scaler_initial"] == [True, 1024.0, 0]
    assert probe["sequence"] == EXPECTED_SEQUENCE


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_scale_multiplies_the_loss_and_unscale_restores_the_gradients(framework: str) -> None:
    probe = _probe(framework)
    assert probe["scaled_loss_ratio"] == pytest.approx(1024.0, rel=1e-6)
    assert probe["unscaled_matches"] is True


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_genuine_fp16_overflow_is_caught(framework: str) -> None:
    """2**40 times the loss, flowing back through float16 activations, overflows them."""
    overflow = _probe(framework)["natural_overflow"]
    assert overflow == {"activation_dtype": "float16", "finite": False, "scale": 2.0**39}


def test_torch_unscale_is_in_place_like_gradscaler() -> None:
    assert _probe("torch")["unscale_in_place"] is True


def test_tensorflow_scaler_works_inside_tf_function() -> None:
    graph = _probe("tensorflow")["graph_sequence"]
    assert all(step["tensor"] for step in graph), "inside tf.function, finite is a tensor"
    assert [{k: s[k] for k in ("finite", "scale", "good_steps")} for s in graph] == [
        {k: s[k] for k in ("finite", "scale", "good_steps")} for s in EXPECTED_SEQUENCE
    ]


def test_jax_scaler_is_a_pytree_through_jit() -> None:
    probe = _probe("jax")
    assert probe["jit_scaler_type"] == "JaxLossScaler"
    assert probe["jit_sequence"] == EXPECTED_SEQUENCE
    assert probe["noop_jit"] == 3.0


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bf16_scaler_is_a_no_op_with_scale_one(framework: str) -> None:
    assert _probe(framework)["noop"] == {
        "enabled": False,
        "scale": 1.0,
        "identity": True,
        "finite": True,
        "scaled": 3.0,
    }


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bad_scaler_arguments_are_config_errors(framework: str) -> None:
    error = _probe(framework)["errors"]["scaler_args"]
    assert error["type"] == "ConfigError"
    assert error["parameter"] in {"growth_factor", "growth_interval", "initial_scale"}


# --- on, off, and what was there before ---------------------------------------------------


@pytest.mark.covers("torch:precision.bf16")
def test_torch_disable_restores_the_previous_autocast_state() -> None:
    r = _probe("torch")["restore"]
    assert r["before"] == [False, "bfloat16"]  # off (CPU autocast's default dtype)
    assert r["enabled"] == [True, "bfloat16"] and r["active"] is True
    assert r["disabled"] == [False, "bfloat16"] and r["inactive"] is True
    assert r["outer"] == [True, "float16"]
    assert r["fp32_inside_outer"][0] is False, "fp32 turns an outer autocast off"
    assert r["after_fp32"] == [True, "float16"]
    assert r["bf16_inside_outer"] == [True, "bfloat16"]
    assert r["after_bf16"] == [True, "float16"]
    assert r["end"] == [False, "bfloat16"]
    assert r["nested"] == [True, "float16"]
    assert r["out_of_order"]["type"] == "UnimemError" and "disable that one first" in r["out_of_order"]["message"]
    assert r["after_inner"] == [True, "bfloat16"]
    assert r["after_outer"] == [False, "bfloat16"]


def test_torch_policy_is_disabled_only_by_the_thread_that_enabled_it() -> None:
    """Autocast state is per thread (the backend's ``precision_state_per_thread``)."""
    r = _probe("torch")["restore"]
    assert r["other_thread"]["type"] == "UnimemError" and "thread" in r["other_thread"]["message"]
    assert r["after_inner"] == [True, "bfloat16"], "the refused disable changed nothing"


def test_enabled_backends_lists_frameworks_with_a_policy_on() -> None:
    from unimem.training.precision import enabled_backends

    assert enabled_backends() == []
    torch_restore = _probe("torch")["restore"]
    assert torch_restore["enabled_backends"] == ["torch"]
    assert torch_restore["enabled_backends_after"] == []
    other = _probe("jax")["other_thread"]
    assert other["enabled_backends"] == ["jax"] and other["enabled_backends_after"] == []


@pytest.mark.covers("tensorflow:precision.bf16", "tensorflow:precision.fp16")
def test_tensorflow_disable_restores_the_previous_keras_policy() -> None:
    r = _probe("tensorflow")["restore"]
    assert r["before"] == "float32"
    assert r["enabled"] == "mixed_bfloat16" and r["active"] is True
    assert r["disabled"] == "float32" and r["inactive"] is True
    assert r["outer"] == "mixed_float16"
    assert r["fp32_inside_outer"] == "float32"
    assert r["after_fp32"] == "mixed_float16"
    assert r["bf16_inside_outer"] == "mixed_bfloat16"
    assert r["after_bf16"] == "mixed_float16"
    assert r["nested"] == "mixed_float16"
    assert r["out_of_order"]["type"] == "UnimemError"
    assert r["after_inner"] == "mixed_bfloat16"
    assert r["after_outer"] == "float32"


def test_jax_policy_has_no_global_state_to_restore() -> None:
    probe = _probe("jax")
    assert probe["restore"] == {"active": True, "inactive": True}
    assert probe["other_thread"]["error"] is None and probe["other_thread"]["inactive"] is True
    assert probe["dtypes"]["bf16"]["active_in_with"] is True


@pytest.mark.covers("tensorflow:precision.loss_scaling")
def test_tensorflow_wrap_optimizer_is_keras_loss_scale_optimizer_under_fp16() -> None:
    wrap = _probe("tensorflow")["wrap"]
    assert wrap["fp16"] == "LossScaleOptimizer"
    assert (wrap["initial_scale"], wrap["growth_steps"]) == (4096.0, 7)
    assert wrap["bf16_is_same"] is True
    assert wrap["fit_losses_finite"] is True and wrap["fit_output_dtype"] == "float16"


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_wrap_optimizer_elsewhere_points_to_loss_scaler(framework: str) -> None:
    error = _probe(framework)["errors"]["wrap_optimizer"]
    assert error["type"] == "UnsupportedFeature" and "loss_scaler()" in error["message"]


def test_backend_none_takes_the_framework_in_use() -> None:
    assert _probe("torch")["default_backend"] == "torch"
    assert _probe("jax")["default_backend"] == "jax"
    # Importing TensorFlow imports JAX as well, but only TF started: the started one is meant.
    # (Two frameworks both configured stay a ConfigError: tests/test_config.py.)
    assert _probe("tensorflow")["default_backend"] == "tensorflow"


# --- each framework's own loss-scaled step --------------------------------------------------


def _steps(framework: str) -> dict[str, Any]:
    """What the framework's step probe recorded (it runs once)."""
    try:
        return dict(_job(framework, "step"))
    except pytest.fail.Exception as exc:
        pytest.fail(f"the {framework} step probe failed:\n{exc}", pytrace=False)


def _without_finite(sequence: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in step.items() if k != "finite"} for step in sequence]


@pytest.mark.covers("torch:precision.loss_scaling")
def test_torch_step_wraps_gradscaler_and_leaves_unscaled_grads_in_p_grad() -> None:
    one = _steps("torch")["one_step"]
    assert one["grad_scaler"] == "GradScaler" and one["is_gradscaler"] is True, "single process: plain GradScaler"
    assert one["grad_unscaled"] is True, "after scaler.step(opt), p.grad is divided by the scale"
    assert one["update_used_unscaled"] is True, "SGD moved the parameters by lr * the unscaled gradient"
    assert (one["scale"], one["good_steps"]) == (1024.0, 1)


@pytest.mark.covers("torch:precision.loss_scaling")
def test_torch_step_skips_on_inf_and_nan_halves_the_scale_then_grows_it() -> None:
    assert _steps("torch")["step_sequence"] == _without_finite(EXPECTED_SEQUENCE)


def test_torch_gradient_accumulation_unscales_once_per_optimizer_step() -> None:
    probe = _steps("torch")
    accumulation = probe["accumulation"]
    assert accumulation["scales"] == [1024.0] * 3, "every micro-batch is scaled by the same scale"
    assert accumulation["summed_is_scaled"] is True, "the summed gradients stay scaled until the step"
    assert accumulation["unscaled_once"] is True and accumulation["update"] is True
    assert probe["accumulation_uniform"] == {"finite": True, "matches": True, "in_p_grad": True}


def test_torch_unscale_for_clipping_then_step_does_not_unscale_again() -> None:
    assert _steps("torch")["unscale_then_step"] == {"after_unscale_": True, "not_again": True}


def test_torch_mixing_the_two_loops_in_one_step_is_refused_and_changes_nothing() -> None:
    misuse = _steps("torch")["misuse"]
    for key in ("step_after_unscale", "unscale_twice", "unscale_after_step"):
        assert misuse[key]["type"] == "UnimemError" and "twice" in misuse[key]["message"], key
    assert misuse["update_without_finite"]["type"] == "UnimemError"
    assert "update(finite)" in misuse["update_without_finite"]["message"]
    assert misuse["unchanged"] is True and misuse["scale_unchanged"] == 1024.0
    assert misuse["update_with_finite_after_step"]["type"] == "UnimemError"
    assert "without arguments" in misuse["update_with_finite_after_step"]["message"]


def test_torch_bf16_step_is_optimizer_step() -> None:
    probe = _steps("torch")
    assert probe["bf16_step"] == {"enabled": False, "changed": True, "scale": 1.0}
    assert probe["wrap"]["type"] == "UnsupportedFeature" and "scaler.step(optimizer)" in probe["wrap"]["message"]


@pytest.mark.covers("tensorflow:precision.loss_scaling")
def test_keras_wrap_gives_loss_scale_optimizer_that_skips_on_inf() -> None:
    probe = _steps("tensorflow")
    assert probe["wrap"] == {"type": "LossScaleOptimizer", "initial_scale": 4096.0, "growth_steps": 7}
    assert probe["wrapped_steps"] == [{"changed": True, "scale": 4096.0}, {"changed": False, "scale": 2048.0}]
    assert probe["bf16_wrap_is_same"] is True
    assert probe["bad_factor"]["type"] == "ConfigError" and probe["bad_factor"]["parameter"] == "growth_factor"
    assert probe["step"]["type"] == "UnsupportedFeature" and "scaler.wrap(optimizer)" in probe["step"]["message"]


def test_keras_layers_built_under_the_policy_keep_it() -> None:
    probe = _steps("tensorflow")
    assert probe["layer_policy"] == "mixed_float16" and probe["after_build"] == "float32"


@pytest.mark.covers("jax:precision.loss_scaling")
def test_jax_step_returns_the_next_scaler_from_a_jitted_step() -> None:
    probe = _steps("jax")
    assert probe["jit_sequence"] == EXPECTED_SEQUENCE
    assert probe["jit_scaler_type"] == "JaxLossScaler"
    eager = probe["eager"]
    assert eager["finite"] is True and eager["finite_type"] == "bool" and eager["matches"] is True
    assert eager["old"] == [1024.0, 0], "step() leaves the scaler it was called on as it was"
    assert eager["new"] == [1024.0, 1]


def test_jax_gradient_accumulation_unscales_the_sum_once() -> None:
    assert _steps("jax")["accumulation"] == {"finite": True, "matches": True}


def test_jax_step_agrees_on_overflow_across_a_named_axis() -> None:
    agree = _steps("jax")["agree"]
    assert agree["alone"] == [True, False], "without axis_name each member decides alone"
    assert agree["agreed"] == [False, False], "with it one member's overflow skips the step on all"
    assert agree["scale"] == 512.0


def test_jax_bf16_step_passes_gradients_through() -> None:
    probe = _steps("jax")
    assert probe["noop"] == {"same": True, "finite": True, "itself": True, "jit": 2.0}
    assert probe["wrap"]["type"] == "UnsupportedFeature" and "scaler.step(grads)" in probe["wrap"]["message"]


# --- policies nest ---------------------------------------------------------------------------

# What each framework has in force with no policy, bf16 ("a") and fp16 ("b").
STATES = {
    "torch": {"off": [False, "bfloat16"], "a": [True, "bfloat16"], "b": [True, "float16"]},
    "tensorflow": {"off": "float32", "a": "mixed_bfloat16", "b": "mixed_float16"},
}


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_with_inside_enable_keeps_the_policy_on(framework: str) -> None:
    n, on = _steps(framework)["nesting"], STATES[framework]
    assert n["before"] == on["off"]
    assert n["enable_then_with_inside"] == on["a"]
    assert n["enable_then_with_after"] == [on["a"], True], "the with block did not switch enable() off"
    assert n["enable_then_with_disabled"] == [on["off"], False]
    assert n["with_then_enable_after"] == [on["a"], True], "enable() inside the block keeps it on after"
    assert n["with_then_enable_disabled"] == [on["off"], False]
    assert n["same_twice_after_inner"] == [on["a"], True]
    assert n["same_twice_after_outer"] == [on["off"], False]


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_a_policy_inside_another_restores_the_outer_one_in_both_orders(framework: str) -> None:
    n, on = _steps(framework)["nesting"], STATES[framework]
    assert [n["a_in_b_inside"], n["a_in_b_after_inner"], n["a_in_b_after_outer"]] == [on["b"], on["a"], on["off"]]
    assert [n["b_in_a_inside"], n["b_in_a_after_inner"], n["b_in_a_after_outer"]] == [on["a"], on["b"], on["off"]]
    assert n["with_b_in_enabled_a_inside"] == on["b"]
    assert n["with_b_in_enabled_a_after"] == [on["a"], True, False]
    assert [n["aba_inside"], n["aba_after_inner"], n["aba_after_middle"], n["aba_after_outer"]] == [
        on["a"],
        on["b"],
        on["a"],
        on["off"],
    ], "the same policy re-entered inside another is put back in force"


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_ending_an_outer_policy_before_an_inner_one_is_refused(framework: str) -> None:
    n, on = _steps(framework)["nesting"], STATES[framework]
    refused = n["refused"]
    assert "disable that one first" in refused["message"]
    assert refused["state"] == on["a"] and refused["a"] is True and refused["b"] is True, "nothing changed"
    assert n["end"] == [on["off"], False, False, []]


def test_torch_policy_in_two_threads_at_once_is_on_in_each() -> None:
    threads = _steps("torch")["threads"]
    on, off = STATES["torch"]["a"], STATES["torch"]["off"]
    assert threads["one"] == on and threads["two"] == on, "autocast state is per thread"
    assert threads["one after"] == off and threads["two after"] == off and threads["main"] == off
    assert threads["active"] is False


def test_jax_with_inside_enable_keeps_the_policy_on() -> None:
    assert _steps("jax")["nesting"] == {"after_with": True, "after_disable": False}


# --- precisions a device cannot run ---------------------------------------------------------


def test_torch_bf16_on_a_gpu_without_bf16_is_refused() -> None:
    """Simulated: torch.cuda reports a GPU whose is_bf16_supported() is False."""
    probe = _probe("torch")
    error = probe["errors"]["bf16_old_gpu"]
    assert error["type"] == "ConfigError" and error["parameter"] == "precision"
    assert "is_bf16_supported" in error["message"] and "fp16" in error["message"]
    assert probe["fp16_old_gpu_device"] == "cuda"


def test_torch_fp16_where_cpu_autocast_refuses_it_is_refused() -> None:
    """Simulated: an autocast that warns and disables itself for float16, as torch < 2.4 did."""
    error = _probe("torch")["errors"]["fp16_old_cpu_autocast"]
    assert error["type"] == "ConfigError" and error["parameter"] == "precision"
    assert "not supported" in error["message"]


def test_tensorflow_bf16_on_a_pre_ampere_gpu_is_refused() -> None:
    """Simulated: TensorFlow lists a GPU of compute capability 7.0."""
    probe = _probe("tensorflow")
    error = probe["errors"]["bf16_old_gpu"]
    assert error["type"] == "ConfigError" and error["parameter"] == "precision"
    assert "7.0" in error["message"]
    assert probe["fp16_old_gpu_device"] == "gpu"


def test_tensorflow_policy_refused_when_keras_runs_on_another_backend() -> None:
    """KERAS_BACKEND=jax: a Keras dtype policy set for TensorFlow would reach JAX layers instead."""
    need_framework("jax")
    result = _job("tensorflow", "keras-on-jax")
    assert result is not None and result["parameter"] == "backend"
    assert "KERAS_BACKEND=tensorflow" in result["message"]


# --- bad input: no framework needed, nothing imported (conftest fails a test that imports one) ---


@pytest.mark.parametrize("precision", ["fp8", "half-ish", None, 16, "", "bf32", 16.0, ["bf16"]])
@pytest.mark.parametrize("backend", ["torch", "tensorflow", "jax", None])
def test_bad_precision_is_a_config_error_before_anything_is_imported(precision: Any, backend: Any) -> None:
    with pytest.raises(ConfigError) as info:
        unimem.mixed_precision(precision, backend=backend)
    assert info.value.parameter == "precision"
    assert "bf16" in str(info.value)


@pytest.mark.parametrize("alias, name", [("BF16", "bf16"), ("bfloat16", "bf16"), ("float16", "fp16"), ("fp32", "fp32")])
def test_precision_spellings(alias: str, name: str) -> None:
    from unimem.training.precision import _parse_precision

    assert _parse_precision(alias).name == name


def test_no_framework_in_use_is_a_config_error_naming_backend() -> None:
    with pytest.raises(ConfigError) as info:
        unimem.mixed_precision("bf16")
    assert info.value.parameter == "backend"
    assert "backend='torch'" in str(info.value)


def test_unknown_backend_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        unimem.mixed_precision("bf16", backend="mxnet")
    assert info.value.parameter == "backend"


@pytest.mark.covers("nvml:precision.bf16", "nvml:precision.fp16", "nvml:precision.loss_scaling")
@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_nvml_has_no_precision(precision: str) -> None:
    with pytest.raises(UnsupportedFeature) as info:
        unimem.mixed_precision(precision, backend="nvml")
    assert info.value.backend == "nvml"
    for feature in ("precision.bf16", "precision.fp16", "precision.loss_scaling"):
        assert not unimem.capabilities("nvml")[feature].supported


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        ({"initial_scale": 0}, "initial_scale"),
        ({"initial_scale": -1.0}, "initial_scale"),
        ({"initial_scale": float("nan")}, "initial_scale"),
        ({"initial_scale": True}, "initial_scale"),
        ({"growth_factor": 1.0}, "growth_factor"),
        ({"backoff_factor": 1.0}, "backoff_factor"),
        ({"backoff_factor": 0}, "backoff_factor"),
        ({"growth_interval": 0}, "growth_interval"),
        ({"growth_interval": 2.5}, "growth_interval"),
    ],
)
def test_scaler_config_validation(kwargs: dict[str, Any], parameter: str) -> None:
    args = {"initial_scale": 2.0**15, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000, **kwargs}
    with pytest.raises(ConfigError) as info:
        ScalerConfig.build(**args)
    assert info.value.parameter == parameter


def test_next_scale_reference_semantics() -> None:
    """The rule every framework's scaler follows (torch's _amp_update_scale_)."""
    config = ScalerConfig.build(1024.0, 2.0, 0.5, 3)
    state = (1024.0, 0)
    trace = []
    for finite in [True, False, False, True, True, True, True]:
        state = next_scale(config, *state, finite)
        trace.append(state)
    assert trace == [(1024.0, 1), (512.0, 0), (256.0, 0), (256.0, 1), (256.0, 2), (512.0, 0), (512.0, 1)]
    # Growing never makes the scale itself overflow float32.
    top = ScalerConfig.build(3e38, 2.0, 0.5, 1)
    assert next_scale(top, 3e38, 0, True) == (3e38, 0)
    assert math.isfinite(next_scale(top, 3e38, 0, True)[0])


def test_every_backend_has_the_precision_rows() -> None:
    for backend in ("torch", "tensorflow", "jax", "nvml"):
        caps = unimem.capabilities(backend)
        for feature in ("precision.bf16", "precision.fp16", "precision.loss_scaling"):
            assert feature in caps, (backend, feature)
    for backend in FRAMEWORKS:
        assert all(unimem.capabilities(backend)[f].supported for f in ("precision.bf16", "precision.fp16"))


# --- the example trains in every framework and precision --------------------------------------


def _example(framework: str, precision: str) -> dict[str, Any]:
    proc = _job(framework, precision)
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or len(results) != 1:
        pytest.fail(f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}", pytrace=False)
    epochs = [line for line in proc.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 2 and all("loss" in line and "allocated" in line for line in epochs), proc.stdout
    return dict(json.loads(results[0][len("RESULT ") :]))


@pytest.mark.parametrize(
    "framework",
    [
        pytest.param(
            "torch",
            marks=pytest.mark.covers("torch:precision.bf16", "torch:precision.fp16", "torch:precision.loss_scaling"),
        ),
        pytest.param(
            "tensorflow",
            marks=pytest.mark.covers(
                "tensorflow:precision.bf16", "tensorflow:precision.fp16", "tensorflow:precision.loss_scaling"
            ),
        ),
        pytest.param(
            "jax", marks=pytest.mark.covers("jax:precision.bf16", "jax:precision.fp16", "jax:precision.loss_scaling")
        ),
    ],
)
@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_example_script_lowers_the_loss(framework: str, precision: str) -> None:
    result = _example(framework, precision)
    assert (result["backend"], result["precision"]) == (framework, precision)
    assert result["compute_dtype"] == NAMES[precision]
    assert math.isfinite(result["final_loss"])
    # A lower loss than it started with, by a clear margin (the first loss is about 1).
    assert result["final_loss"] < 0.7 * result["first_loss"], result
    for epoch in result["epochs"]:
        if precision == "fp16":  # dynamic: a power of two, 2**15 unless a step overflowed
            assert epoch["scale"] > 0 and math.log2(epoch["scale"]).is_integer()
        else:
            assert epoch["scale"] == 1.0 and epoch["skipped"] == 0
    # On the CPU no framework tracks device memory: the figures are None, never 0.
    stats = result["epochs"][-1]["stats"]
    assert stats["backend"] == framework
    assert all(stats[name] is None for name in ("allocated", "peak_allocated", "process_used"))
