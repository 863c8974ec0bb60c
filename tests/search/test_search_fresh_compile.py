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
fresh, loaded, started = [], [], []
init = _fresh_compile._Compiler.__init__
def spy_start(self):
    started.append(1)
    init(self)
_fresh_compile._Compiler.__init__ = spy_start
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
idle_after = len(_fresh_compile._idle)
def refuse(lowered):
    raise _fresh_compile.FreshCompileError("no compile entry here")
jax_search.compile_lowered = refuse
fallback = search().as_dict()
emit({"here": here, "pooled": pooled, "fallback": fallback, "fresh": fresh, "loaded": loaded,
      "started": len(started), "idle_after": idle_after})
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
    # One process serves the sizes compiled one after another; a round of two may start a second.
    assert 1 <= r["started"] <= 2 < len(sized), (r["started"], sized)
    assert r["idle_after"] == 0  # and left when the search ended: each holds a context on the device


def test_where_a_fresh_process_cannot_compile_the_search_compiles_here(need: Any, pyjson: Any) -> None:
    need("jax")
    r = pyjson(_SEARCH)
    assert r["fallback"]["batch_size"] == r["here"]["batch_size"]
    assert _sizes(r["fallback"]) == _sizes(r["here"])


_SERVE = r"""
import subprocess, sys, time
from unimem.backends.jax import _fresh_compile
# An idle compiling process leaves by itself, its input still open.
idle = subprocess.Popen([sys.executable, "-c", "from unimem.backends.jax._fresh_compile import serve; serve(0.5)"],
                        stdin=subprocess.PIPE)
began = time.monotonic()
code = idle.wait(timeout=120)
idle_seconds = time.monotonic() - began
# A request it cannot compile is answered with the error, and that process is not kept.
try:
    _fresh_compile._run_child("module", [], b"not a module")
    refused = None
except _fresh_compile.FreshCompileError as exc:
    refused = str(exc)
kept_after_error = len(_fresh_compile._idle)
# Closing ends the idle ones.
import jax, jax.numpy as jnp
lowered = jax.jit(lambda x: (x @ x.T).sum()).lower(jax.ShapeDtypeStruct((64, 64), jnp.float32))
first = _fresh_compile.compile_lowered(lowered)
second = _fresh_compile.compile_lowered(lowered)
process = _fresh_compile._idle[0].process
kept = len(_fresh_compile._idle)
_fresh_compile.close_compilers()
emit({"code": code, "idle_seconds": idle_seconds, "refused": refused, "kept_after_error": kept_after_error,
      "same": first == second, "kept": kept, "closed": process.wait(timeout=30)})
"""


def test_a_compiling_process_is_reused_leaves_when_idle_and_is_dropped_after_an_error(need: Any, pyjson: Any) -> None:
    need("jax")
    r = pyjson(_SERVE)
    assert r["code"] == 0 and r["idle_seconds"] < 60, r  # left after its idle time, not at the timeout
    assert r["refused"] and r["kept_after_error"] == 0, r  # the error said, the process not kept
    assert r["same"] and r["kept"] == 1 and r["closed"] == 0, r  # two compilations, one process, closed on request
