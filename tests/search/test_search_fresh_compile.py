"""The JAX search on a pool grown on demand sizes each lowered step in a fresh process.

On a GPU with growth on, a compilation's autotuning takes pool regions that stay for the life of the
process, so the search compiles each size it sizes in a fresh process and loads the kernel choices
here. The CPU has no pool, so these tests say "grown on demand" themselves and check what a user
relies on: every size sized went through a fresh process, the search answers exactly what it answers
compiling here, and where a fresh process cannot compile, the search compiles here instead.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.slow  # fresh interpreters that import JAX and compile several sizes

_SEARCH = r"""
import sys
import jax, jax.numpy as jnp
import unimem
from unimem.backends.jax import search as jax_search, _fresh_compile

D = 256
def loss(w, x):
    return (jnp.tanh(x @ w) @ w.T).sum()
grad = jax.jit(jax.grad(loss))
w = jnp.full((D, D), 0.01, jnp.float32)
need = lambda n: 8 * D * D + 16 * D * n
LIMIT = need(9_000) + 999

def step(n):
    if need(n) > LIMIT:
        jnp.zeros(1 << 58, dtype=jnp.uint8).block_until_ready()  # JAX's own out-of-memory error
    grad(w, jnp.ones((n, D), jnp.float32)).block_until_ready()

def lower(n):
    return grad.lower(w, jax.ShapeDtypeStruct((n, D), jnp.float32))

def search():
    return unimem.find_batch_size(step, start=8, backend="jax", lower=lower, limit=LIMIT, return_trials=True)

here = search().as_dict()
fresh, loaded = [], []
compile_lowered, load_autotuned = jax_search.compile_lowered, jax_search.load_autotuned
def spy_compile(lowered):
    fresh.append(lowered.in_avals[0][1].shape[0])
    return compile_lowered(lowered)
def spy_load(lowered):
    loaded.append(lowered.in_avals[0][1].shape[0])
    return load_autotuned(lowered)
jax_search.compile_lowered, jax_search.load_autotuned = spy_compile, spy_load
jax_search._grows_on_demand = lambda: True
pooled = search().as_dict()
def refuse(lowered):
    raise _fresh_compile.FreshCompileError("no compile entry here")
jax_search.compile_lowered = refuse
fallback = search().as_dict()
emit({"here": here, "pooled": pooled, "fallback": fallback, "fresh": fresh, "loaded": loaded})
"""


def _sizes(search: dict[str, Any]) -> list[int]:
    return [t["batch_size"] for t in search["trials"] + search["confirmations"]]


def test_each_size_is_compiled_in_a_fresh_process_and_the_answer_is_the_same(need: Any, pyjson: Any) -> None:
    need("jax")
    r = pyjson(_SEARCH)
    here, pooled = r["here"], r["pooled"]
    assert pooled["batch_size"] == here["batch_size"] and _sizes(pooled) == _sizes(here), (pooled, here)
    assert [n for n, _ in pooled["predictions"]] == [n for n, _ in here["predictions"]]
    sized = sorted(n for n, _ in pooled["predictions"])
    assert sorted(r["fresh"]) == sized  # every size sized went through a fresh process, once
    assert sorted(r["loaded"]) == sized  # and its kernel choices were loaded here


def test_where_a_fresh_process_cannot_compile_the_search_compiles_here(need: Any, pyjson: Any) -> None:
    need("jax")
    r = pyjson(_SEARCH)
    assert r["fallback"]["batch_size"] == r["here"]["batch_size"]
    assert _sizes(r["fallback"]) == _sizes(r["here"])
