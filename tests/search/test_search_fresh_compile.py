"""The JAX search on a pool grown on demand sizes each lowered step in a fresh process.

On a GPU with growth on, a compilation's autotuning takes pool regions that stay for the life of the
process, so the search compiles each size it sizes in a fresh process, into JAX's persistent
compilation cache, and loads the executable here: nothing compiles here, neither the sizing nor the
step's own calls, nor training's first step after the search. The CPU has no pool, so these tests say
"grown on demand" themselves and check what a user relies on: every size sized was compiled once, in
a fresh process, and none here; the search answers exactly what it answers compiling here; where the
cache cannot serve, a fresh process still compiles and its kernel choices are loaded here; where no
fresh process can compile, the search compiles here.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.slow  # fresh interpreters that import JAX and compile several sizes

_SEARCH = r"""
import os, sys, tempfile, threading
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp()  # unimem's caches start empty, away from the home
import jax, jax.numpy as jnp
from jax import monitoring
import unimem
from unimem import registry
from unimem.backends.jax import search as jax_search, _fresh_compile

# Compilations of the step here, as JAX reports them; one that loaded from the persistent cache is not one.
compiled_here, loaded_here, hit = [], [], threading.local()
def on_event(event, **_):
    if event == "/jax/compilation_cache/cache_hits":
        hit.on = True
def on_duration(event, seconds, **kw):
    if event == "/jax/core/compile/backend_compile_duration" and kw.get("fun_name") == "jit(loss)":
        (loaded_here if getattr(hit, "on", False) else compiled_here).append(seconds)
        hit.on = False
monitoring.register_event_listener(on_event)
monitoring.register_event_duration_secs_listener(on_duration)

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
jax.clear_caches()
started, asked = [], []
init = _fresh_compile._Compiler.__init__
def spy_start(self):
    started.append(1)
    init(self)
_fresh_compile._Compiler.__init__ = spy_start
run_child = _fresh_compile._run_child
def spy_run(kind, donated, blob, **extra):
    asked.append(kind)
    return run_child(kind, donated, blob, **extra)
_fresh_compile._run_child = spy_run
jax_search._grows_on_demand = lambda: True
compiled_here.clear(); loaded_here.clear(); fresh_before = len(_fresh_compile.fresh_compilations)
pooled = search().as_dict()
cached = {"compiled_here": list(compiled_here), "fresh": _fresh_compile.fresh_compilations[fresh_before:],
          "asked": list(asked), "started": len(started), "idle_after": len(_fresh_compile._idle),
          "advice": registry.get_backend("jax").search.fresh_process_advice,
          "directory": jax.config.jax_compilation_cache_dir}
compiled_here.clear(); loaded_here.clear()
step(pooled["batch_size"])  # training's first step after the search, which dropped the compiled steps
cached["after"] = {"compiled_here": list(compiled_here), "loaded_here": len(loaded_here)}

# Where the cache cannot serve (the user turned it off), the kernel choices are loaded instead.
jax.config.update("jax_enable_compilation_cache", False)
jax_search._through_cache.clear()
loaded = []
load_autotuned = jax_search.load_autotuned
def spy_load(lowered):
    loaded.append(lowered.in_avals[0][1].shape[0])
    return load_autotuned(lowered)
jax_search.load_autotuned = spy_load
asked.clear()
no_cache = search().as_dict()
no_cache_asked, no_cache_advice = list(asked), registry.get_backend("jax").search.fresh_process_advice
def refuse(*args, **kwargs):
    raise _fresh_compile.FreshCompileError("no compile entry here")
jax_search.compile_lowered = jax_search.compile_through_cache = refuse
fallback = search().as_dict()
emit({"here": here, "pooled": pooled, "cached": cached, "no_cache": no_cache, "no_cache_asked": no_cache_asked,
      "loaded": loaded, "no_cache_advice": no_cache_advice, "fallback": fallback})
"""


def _sizes(search: dict[str, Any]) -> list[int]:
    return [t["batch_size"] for t in search["trials"] + search["confirmations"]]


def test_each_size_is_compiled_once_in_a_fresh_process_and_none_here(need: Any, pyjson: Any) -> None:
    need("jax")
    r = pyjson(_SEARCH)
    here, pooled, cached = r["here"], r["pooled"], r["cached"]
    assert pooled["batch_size"] == here["batch_size"] and _sizes(pooled) == _sizes(here), (pooled, here)
    assert [n for n, _ in pooled["predictions"]] == [n for n, _ in here["predictions"]]
    sized = len(pooled["predictions"])
    # Every size sized was compiled once, in a fresh process, into the persistent cache ...
    assert cached["asked"] == ["cached"] * sized and len(cached["fresh"]) == sized, cached
    # ... and nothing compiled here: not the sizing, not the step's own calls in the trials.
    assert cached["compiled_here"] == [], cached
    # One process serves the sizes compiled one after another; a round of two may start a second.
    assert 1 <= cached["started"] <= 2 < sized, (cached["started"], sized)
    assert cached["idle_after"] == 0  # and left when the search ended: each holds a context on the device
    # Training's first step after the search loads the answer's executable: no compilation here.
    assert cached["after"] == {"compiled_here": [], "loaded_here": 1}, cached["after"]
    # A fresh process is told where the executables are; the notes say where the answer's step is.
    assert f'JAX_COMPILATION_CACHE_DIR="{cached["directory"]}"' in cached["advice"], cached["advice"]
    said = [note for note in pooled["notes"] if "persistent compilation cache" in note]
    assert len(said) == 1 and f'JAX_COMPILATION_CACHE_DIR="{cached["directory"]}"' in said[0], pooled["notes"]
    assert not any("persistent compilation cache" in note for note in here["notes"]), here["notes"]


def test_without_the_persistent_cache_the_kernel_choices_are_loaded_instead(need: Any, pyjson: Any) -> None:
    need("jax")
    r = pyjson(_SEARCH)
    assert r["no_cache"]["batch_size"] == r["here"]["batch_size"]
    sized = sorted(n for n, _ in r["no_cache"]["predictions"])
    assert r["no_cache_asked"] == ["module"] * len(sized) and sorted(r["loaded"]) == sized, r
    assert "XLA_FLAGS=" in r["no_cache_advice"], r["no_cache_advice"]
    assert not any("persistent compilation cache" in note for note in r["no_cache"]["notes"]), r["no_cache"]


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


_CALL = r"""
import os, tempfile, threading
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp()
import jax, jax.numpy as jnp, numpy as np
from jax import monitoring
from unimem.backends.jax import _fresh_compile

compiled_here, loaded_here, hit = [], [], threading.local()
def on_event(event, **_):
    if event == "/jax/compilation_cache/cache_hits":
        hit.on = True
def on_duration(event, seconds, **kw):
    if event == "/jax/core/compile/backend_compile_duration" and kw.get("fun_name") in ("jit(train)", "jit(noisy)"):
        (loaded_here if getattr(hit, "on", False) else compiled_here).append(kw["fun_name"])
    if event == "/jax/core/compile/backend_compile_duration":
        hit.on = False
monitoring.register_event_listener(on_event)
monitoring.register_event_duration_secs_listener(on_duration)

@jax.jit
def train(w, x):
    return w - 0.1 * jax.grad(lambda w: jnp.tanh(x @ w).sum())(w)
w = jnp.ones((128, 128), jnp.float32)
def step(n):  # the user's step: makes its batch, then trains
    return train(w, jnp.ones((n, 128), jnp.float32)).block_until_ready()
expected = np.asarray(step(8))  # compiled here, as JAX does
compiled_here.clear()
with _fresh_compile.compiled_during_call() as served:
    inside = np.asarray(step(4096))
recorded, directory = served
figures = {"inside": list(compiled_here), "loaded": len(loaded_here), "recorded": recorded,
           "same": bool(np.allclose(inside, step(4096))), "directory": directory}
# A program the fresh process cannot compile (a host callback) is compiled here, and the step goes on.
@jax.jit
def noisy(x):
    jax.debug.callback(lambda v: None, x.sum())
    return x * 2
with _fresh_compile.compiled_during_call() as served:
    doubled = float(noisy(jnp.ones(3)).sum())
figures["callback"] = {"value": doubled, "compiled_here": compiled_here[-1:]}
compiled_here.clear()
step(2048)  # outside: compiled here as JAX does
figures["outside"] = len(compiled_here)
# A program that cannot fit is refused before it runs, with JAX's own out-of-memory error.
from unimem.diagnose.recognise import find_oom
def refuse(found, device):
    return f"RESOURCE_EXHAUSTED: Out of memory while trying to allocate {found['temp']} bytes (sized: not run)"
_fresh_compile.cannot_run = refuse
with _fresh_compile.compiled_during_call() as served:
    try:
        step(1024)
        figures["refused"] = None
    except Exception as exc:
        figures["refused"] = {"oom": find_oom(exc) is not None, "text": str(exc),
                              "jax_error": isinstance(exc, jax.errors.JaxRuntimeError),
                              "recorded": [list(p) for p in served[0]]}
executable = train.lower(w, jnp.ones((8, 128))).compile().runtime_executable()
figures["remat_read"] = _fresh_compile._executable_figures(executable, "cpu")["rematerialized"]
emit(figures)
"""


def test_a_call_sized_as_it_runs_compiles_nothing_here_and_reads_its_figures(need: Any, pyjson: Any) -> None:
    # Without lower=, the search on a pool grown on demand runs each call inside compiled_during_call:
    # what the call compiles is compiled in a fresh process and loaded here, and its figures read.
    need("jax")
    r = pyjson(_CALL)
    assert r["inside"] == [] and r["loaded"] >= 1, r  # the step's program loaded, not compiled here
    programs = r["recorded"]  # the batch's own small programs, and the step
    peak, arguments, rematerialized, refused = max(programs)
    assert peak >= 4096 * 128 * 4 + 128 * 128 * 4 and arguments >= 4096 * 128 * 4, programs
    assert rematerialized is False and refused is False
    assert r["same"], "the loaded program computes what JAX's own does"
    assert r["callback"] == {"value": 6.0, "compiled_here": ["jit(noisy)"]}, r["callback"]
    assert r["outside"] == 1  # outside the context nothing changes
    assert r["remat_read"] is False  # read from the executable's text, not unknown
    refused = r["refused"]
    assert refused["oom"] and refused["jax_error"] and "not run" in refused["text"], refused
    assert refused["recorded"][0][3] is True  # the first program the call compiled, refused: nothing ran
