"""One training script for PyTorch, TensorFlow and JAX: the same MLP, the same loop.

Every memory and precision call goes through unimem; only building the model and
taking gradients is framework code (each framework spells autodiff its own way)::

    python examples/train.py --backend torch --precision bf16
    python examples/train.py --backend tensorflow --precision fp16 --epochs 5
    python examples/train.py --backend jax --precision fp32 --batch-size 128
    python examples/train.py --backend torch --batch-size 48 --target-batch 100 --remat

``--target-batch N`` makes every optimizer step see N samples in micro-batches of at most
``--batch-size`` (``unimem.plan_accumulation``; 100 in micro-batches of 48 is 34 + 33 + 33),
each micro-batch's loss weighted by its share (``unimem.accumulate``), the loss scaler
unscaling and updating once per optimizer step. ``--remat`` recomputes every hidden layer in
the backward pass (``unimem.remat``) instead of keeping its activations.

The task is a synthetic regression (a random two-layer network's output, scaled to
unit variance, so the first loss is about 1). Each epoch prints the mean loss, the
steps skipped by loss scaling, the loss scale and ``unimem.stats()``. The last line,
``RESULT {...}``, is JSON for scripts (the tests and the benchmark read it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

import unimem

BACKENDS = ("torch", "tensorflow", "jax")
PRECISIONS = ("bf16", "fp16", "fp32")


def make_data(samples: int, features: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets of a smooth nonlinear regression, as float32 numpy arrays."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features)).astype(np.float32)
    hidden = rng.standard_normal((features, 32)) / np.sqrt(features)
    head = rng.standard_normal((32, 1)) / np.sqrt(32)
    y = np.tanh(x @ hidden) @ head
    y = (y - y.mean()) / y.std()
    return x, y.astype(np.float32)


# --- the framework code: an MLP, its gradients, and Adam --------------------------------
# Each trainer has the same three methods; the loop below is the same for all three.


class TorchTrainer:
    def __init__(
        self, policy: unimem.Policy, features: int, width: int, depth: int, lr: float, seed: int, remat: bool
    ) -> None:
        import torch

        torch.manual_seed(seed)
        self.torch = torch
        self.policy = policy
        self.device = torch.device(policy.device)
        blocks: list[Any] = []
        size = features
        for _ in range(depth):
            blocks.append(torch.nn.Sequential(torch.nn.Linear(size, width, device=self.device), torch.nn.ReLU()))
            size = width
        self.head = torch.nn.Linear(size, 1, device=self.device)
        self.model = torch.nn.Sequential(*blocks, self.head)  # parameters in policy.param_dtype (float32)
        # With --remat each hidden layer keeps only its input for the backward pass.
        self.blocks = [unimem.remat(block, "full", backend="torch") if remat else block for block in blocks]
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)

    def batch(self, x: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
        return self.torch.from_numpy(x).to(self.device), self.torch.from_numpy(y).to(self.device)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def loss_and_grads(self, scaler: unimem.LossScaler, x: Any, y: Any, weight: float) -> tuple[Any, Any]:
        h = x
        for block in self.blocks:  # runs in policy.compute_dtype: the policy's autocast is on
            h = block(h)
        loss = self.torch.nn.functional.mse_loss(self.policy.cast_to_output(self.head(h)), y)
        scaler.scale(loss * weight).backward()  # adds into p.grad: torch accumulates by itself
        return loss.detach(), [p.grad for p in self.model.parameters()]

    def add(self, total: Any, grads: Any) -> Any:
        return grads  # p.grad already holds the sum

    def apply(self, grads: Any) -> None:
        self.optimizer.step()  # reads p.grad, which scaler.unscale() divided in place


class TensorFlowTrainer:
    def __init__(
        self, policy: unimem.Policy, features: int, width: int, depth: int, lr: float, seed: int, remat: bool
    ) -> None:
        import keras
        import tensorflow as tf

        keras.utils.set_random_seed(seed)
        self.tf = tf
        self.policy = policy
        # Built while the policy is on: Keras layers take the global dtype policy at creation.
        self.model = keras.Sequential(
            [keras.Input((features,))]
            + [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
            + [keras.layers.Dense(1)]
        )
        layers = self.model.layers
        # With --remat each hidden layer keeps only its input for the backward pass.
        self.blocks = [unimem.remat(layer, "full", backend="tensorflow") if remat else layer for layer in layers[:-1]]
        self.head = layers[-1]
        self.optimizer = keras.optimizers.Adam(learning_rate=lr)
        # One graph per scaler object; the scaler's scale is a tf.Variable, read afresh every call.
        self._loss_and_grads = tf.function(self._loss_and_grads_fn)
        self._apply = tf.function(self._apply_fn)

    def batch(self, x: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
        return self.tf.constant(x), self.tf.constant(y)

    def zero_grad(self) -> None:
        pass  # the tape returns gradients; the loop sums them

    def loss_and_grads(self, scaler: unimem.LossScaler, x: Any, y: Any, weight: float) -> tuple[Any, Any]:
        # A tensor, not a float: each new Python float would trace the function again.
        return self._loss_and_grads(scaler, x, y, self.tf.constant(weight, self.tf.float32))

    def add(self, total: Any, grads: Any) -> Any:
        return unimem.accumulate_grads(total, grads, backend="tensorflow")

    def apply(self, grads: Any) -> None:
        self._apply(grads)

    def _loss_and_grads_fn(self, scaler: unimem.LossScaler, x: Any, y: Any, weight: Any) -> tuple[Any, Any]:
        tf = self.tf
        with tf.GradientTape() as tape:
            h = x
            for block in self.blocks:  # compute dtype; the variables stay float32
                h = block(h, training=True)
            out = self.head(h, training=True)
            loss = tf.reduce_mean(tf.square(self.policy.cast_to_output(out) - y))
            scaled = scaler.scale(loss * weight)
        return loss, tape.gradient(scaled, self.model.trainable_variables)

    def _apply_fn(self, grads: Any) -> None:
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))


class JaxTrainer:
    """Plain JAX: the parameters are a list of (w, b); Adam is written out (no optax)."""

    def __init__(
        self, policy: unimem.Policy, features: int, width: int, depth: int, lr: float, seed: int, remat: bool
    ) -> None:
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp = jax, jnp
        self.policy = policy

        def hidden(h: Any, w: Any, b: Any) -> Any:
            return jax.nn.relu(h @ w + b)

        # With --remat each hidden layer keeps only its input for the backward pass.
        self.hidden = unimem.remat(hidden, "full", backend="jax") if remat else hidden
        keys = jax.random.split(jax.random.PRNGKey(seed), depth + 1)
        sizes = [features] + [width] * depth + [1]
        self.params = [
            (
                jax.random.uniform(k, (n_in, n_out), jnp.float32, -1.0, 1.0) / np.sqrt(n_in),  # torch's default init
                jnp.zeros((n_out,), jnp.float32),
            )
            for k, n_in, n_out in zip(keys, sizes[:-1], sizes[1:], strict=True)
        ]
        zeros = jax.tree_util.tree_map(jnp.zeros_like, self.params)
        self.adam = (jnp.zeros((), jnp.int32), zeros, jax.tree_util.tree_map(jnp.zeros_like, self.params))
        self.lr = lr
        self._loss_and_grads = jax.jit(self._loss_and_grads_fn)
        # The old parameters and Adam state are dead after the update: XLA writes the new ones into them.
        self._apply = jax.jit(self._adam_fn, donate_argnums=(0, 1))

    def _forward(self, params: Any, x: Any) -> Any:
        params = self.policy.cast_to_compute(params)  # float32 params -> compute dtype copies
        h = self.policy.cast_to_compute(x)
        for w, b in params[:-1]:
            h = self.hidden(h, w, b)
        w, b = params[-1]
        return self.policy.cast_to_output(h @ w + b)

    def _loss_and_grads_fn(
        self, params: Any, scaler: unimem.LossScaler, x: Any, y: Any, weight: Any
    ) -> tuple[Any, Any]:
        # The scaler is an argument, not a closure: closed over, its scale would be frozen into the trace.
        def scaled_loss(p: Any) -> tuple[Any, Any]:
            loss = self.jnp.mean(self.jnp.square(self._forward(p, x) - y))
            return scaler.scale(loss * weight), loss

        (_, loss), grads = self.jax.value_and_grad(scaled_loss, has_aux=True)(params)
        return loss, grads

    def _adam_fn(self, params: Any, adam: Any, grads: Any) -> tuple[Any, Any]:
        jnp, tree = self.jnp, self.jax.tree_util
        beta1, beta2, eps = 0.9, 0.999, 1e-8
        step, m, v = adam
        step = step + 1
        m = tree.tree_map(lambda m, g: beta1 * m + (1 - beta1) * g, m, grads)
        v = tree.tree_map(lambda v, g: beta2 * v + (1 - beta2) * g * g, v, grads)
        rate = self.lr * jnp.sqrt(1 - beta2**step) / (1 - beta1**step)
        params = tree.tree_map(lambda p, m, v: p - rate * m / (jnp.sqrt(v) + eps), params, m, v)
        return params, (step, m, v)

    def batch(self, x: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
        return self.jnp.asarray(x), self.jnp.asarray(y)

    def zero_grad(self) -> None:
        pass  # jax.grad returns gradients; the loop sums them

    def loss_and_grads(self, scaler: unimem.LossScaler, x: Any, y: Any, weight: float) -> tuple[Any, Any]:
        return self._loss_and_grads(self.params, scaler, x, y, weight)  # a traced argument: one compilation

    def add(self, total: Any, grads: Any) -> Any:
        return unimem.accumulate_grads(total, grads, backend="jax")

    def apply(self, grads: Any) -> None:
        self.params, self.adam = self._apply(self.params, self.adam, grads)


TRAINERS = {"torch": TorchTrainer, "tensorflow": TensorFlowTrainer, "jax": JaxTrainer}


# --- the same for every framework -------------------------------------------------------


def train_step(
    trainer: Any, scaler: unimem.LossScaler, plan: unimem.AccumulationPlan, x: np.ndarray, y: np.ndarray
) -> tuple[float, bool]:
    """One optimizer step over ``plan``'s micro-batches of ``x, y``, with dynamic loss scaling:
    ``(mean loss over the global batch, whether the update was applied)``."""
    trainer.zero_grad()
    total, loss_sum = None, 0.0
    for mb in unimem.accumulate(plan):  # each loss weighted by its share of the global batch
        loss, grads = trainer.loss_and_grads(scaler, *trainer.batch(x[mb.slice], y[mb.slice]), mb.weight)
        total = trainer.add(total, grads)
        loss_sum += float(loss) * mb.size
    grads, finite = scaler.unscale(total)  # once per optimizer step: the sum is unscaled once
    if finite:  # an overflow (fp16 only) skips the update; the scaler then lowers the scale
        trainer.apply(grads)
    scaler.update(finite)
    return loss_sum / plan.global_batch, bool(finite)


def _fmt(value: int | None) -> str:
    return unimem.format_bytes(value) if value is not None else "n/a"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, required=True)
    parser.add_argument("--precision", choices=PRECISIONS, default="bf16")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="the largest micro-batch")
    parser.add_argument(
        "--target-batch", type=int, default=None, help="samples per optimizer step (default: --batch-size)"
    )
    parser.add_argument("--remat", action="store_true", help="recompute the hidden layers in the backward pass")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--depth", type=int, default=2, help="hidden layers")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--growth-interval", type=int, default=2000, help="loss scaling: good steps before growing")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    target = args.batch_size if args.target_batch is None else args.target_batch
    if args.epochs < 1 or args.batch_size < 1 or target < 1 or args.samples < target:
        parser.error("need --epochs >= 1, --batch-size >= 1 and --samples >= --target-batch >= 1")
    plan = unimem.plan_accumulation(target, micro_batch=args.batch_size)

    # Memory first, before the framework starts: allocate on demand, no preallocation.
    unimem.configure(args.backend, growth=True)
    policy = unimem.mixed_precision(args.precision, backend=args.backend)
    scaler = policy.loss_scaler(growth_interval=args.growth_interval)
    print(policy)

    x, y = make_data(args.samples, args.features, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    steps = args.samples // target  # whole global batches only: the same micro-batch shapes every step
    epochs: list[dict[str, Any]] = []
    first_loss: float | None = None
    started = time.perf_counter()
    with policy:  # on for the model's creation (Keras) and every step (torch autocast)
        trainer = TRAINERS[args.backend](policy, args.features, args.width, args.depth, args.lr, args.seed, args.remat)
        for epoch in range(args.epochs):
            order = rng.permutation(args.samples)
            losses, skipped = [], 0
            for step in range(steps):
                index = order[step * target : (step + 1) * target]
                loss, applied = train_step(trainer, scaler, plan, x[index], y[index])
                losses.append(loss)
                skipped += not applied
                if first_loss is None:
                    first_loss = float(loss)
            mean = float(np.mean(losses))
            # backend= named: importing TensorFlow imports JAX too, so "the one in use" is ambiguous.
            memory = unimem.stats(args.backend)
            epochs.append({"loss": mean, "skipped": skipped, "scale": scaler.scale_value, "stats": memory.as_dict()})
            print(
                f"epoch {epoch + 1}/{args.epochs}  loss {mean:.4f}  skipped {skipped}/{steps}  "
                f"scale {scaler.scale_value:g}  |  allocated {_fmt(memory.allocated)}  "
                f"peak {_fmt(memory.peak_allocated)}  reserved {_fmt(memory.reserved)}  "
                f"process {_fmt(memory.process_used)}",
                flush=True,
            )
    result = {
        "backend": args.backend,
        "precision": args.precision,
        "device": policy.device,
        "compute_dtype": policy.compute_dtype,
        "accumulation": {"global_batch": plan.global_batch, "steps": plan.steps, "sizes": list(plan.sizes())},
        "remat": args.remat,
        "first_loss": first_loss,
        "final_loss": epochs[-1]["loss"],
        "epochs": epochs,
        "seconds": round(time.perf_counter() - started, 3),
    }
    print("RESULT " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
