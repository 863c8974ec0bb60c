"""Where does a JAX process grow outside XLA's pool during find_batch_size? (GPU only)

A JAX process can grow outside its preallocated pool during a search (NVML's figure for
the process rises, and ``jax.clear_caches()`` does not bring it back), and by how much may
depend on whether the step draws its batch from a constant key or takes the key as an
argument. This runs the GPU test's model and search (tests/gpu/test_diagnosis.py, JAX) with
NVML read after every trial, for the test's step (``--variant constant-key``: the batch
drawn inside the jitted step from a constant key) or one taking the key as an argument
(``--variant key-argument``).

    python benchmarks/scripts/jax_search_process_growth.py --variant constant-key > out.json
"""

from __future__ import annotations

import argparse
import functools
import gc
import json

import unimem

parser = argparse.ArgumentParser()
parser.add_argument("--variant", choices=("constant-key", "key-argument"), required=True)
variant = parser.parse_args().variant

unimem.configure(backend="jax", fraction=0.02)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

sizes = [1024, 2048, 2048, 1024]
keys = jax.random.split(jax.random.PRNGKey(0), len(sizes))
params = [
    (jax.random.normal(k, (a, b)) / a**0.5, jnp.zeros(b)) for k, a, b in zip(keys, sizes[:-1], sizes[1:], strict=False)
]


def loss_fn(params, x):  # type: ignore[no-untyped-def]
    h = x
    for w, b in params[:-1]:
        h = jax.nn.relu(h @ w + b)
    w, b = params[-1]
    return jnp.mean((h @ w + b - x) ** 2)


@functools.partial(jax.jit, static_argnums=(2,))
def train(params, key, n):  # type: ignore[no-untyped-def]
    key = jax.random.PRNGKey(1) if variant == "constant-key" else key
    x = jax.random.normal(key, (n, 1024))
    loss, grads = jax.value_and_grad(loss_fn)(params, x)
    return jax.tree_util.tree_map(lambda p, g: p - 1e-4 * g, params, grads), loss


state = {"params": params}
key = jax.random.PRNGKey(1)
readings: list[dict[str, object]] = []


def process_used() -> int | None:
    return unimem.stats("jax").process_used


def step(n: int) -> None:
    try:
        new, loss = train(state["params"], key, n)
        loss.block_until_ready()
        state["params"] = new
    finally:
        readings.append({"n": n, "process_used": process_used(), "in_use": unimem.stats("jax").allocated})


step(1)
gc.collect()
before = process_used()
search = unimem.find_batch_size(step, start=32, return_trials=True)
after = process_used()
jax.clear_caches()
gc.collect()
print(
    json.dumps(
        {
            "variant": variant,
            "before": before,
            "after": after,
            "after_clear_caches": process_used(),
            "ratio": None if not before or not after else after / before,
            "readings": readings,
            "search": search.as_dict(),
        },
        indent=1,
        default=str,
    )
)
