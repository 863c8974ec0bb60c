"""Every call of the step counted: ``unimem.find_batch_size`` against the batch-size searches
people use, on real models on one GPU, one row per search.

Models (each search in its own fresh process, under its own cap, from a warm-up at ``start``):

- ``torch-mlp``: 8 x (Linear(4096) + ReLU), AdamW, ``configure(backend="torch", limit="16GiB")``;
- ``torch-transformer``: ``nn.TransformerEncoder`` (4 layers, d_model 1024, 16 heads, 4096 wide,
  256 tokens a sample), AdamW, ``limit="8GiB"``;
- ``jax-mlp``: 1024 -> 4 x 4096 -> 1024 MLP trained with optax's AdamW, ``configure(backend="jax",
  growth=True, limit="8GiB")``, searched with ``lower=`` (XLA's compiled peak of each size);
- ``jax-transformer``: 4 pre-LN transformer blocks in plain JAX (the same shapes as torch's),
  optax AdamW, growth on, ``limit="8GiB"``, ``lower=``;
- ``flax-mlp``: Flax linen, 8 x Dense(1024) + ReLU and Dense(10), optax Adam, softmax cross-entropy,
  the whole GPU with growth on (no cap), searched with ``lower=`` and without it (two rows).

Per row: ``found``, ``true_max``, ``step_calls`` (every call of the step: the search's trials and
its re-runs), ``failed_calls``, ``compile_calls``, ``seconds`` (the search's wall time, compilations
included), ``same_process_ok`` (ten training steps at the answer ran in the searching process
afterwards). ``true_max`` is the upper end of a bracket that fresh processes confirm: the answer
runs in one, and one above the bracket's upper end fails in another (``true_max_confirmed``:
both did), then bisected in fresh processes while wider than 1% and time is left. Shares
against it are lower bounds.

JAX rows also record: ``lower`` (searched with ``lower=`` or not); ``compile_calls`` as every
compilation of the training step the user pays for during the search: in the searching process
(counted by JAX's own compile events: the search's and the step's own where the search's did not
serve it; a load from the persistent compilation cache is ``cache_loads``, not a compilation) and
in the fresh processes that compiled for it (``fresh_compile_seconds``); the search's own count is
``search_compile_calls``; each search starts with empty caches of its own;
``compile_seconds_at_answer``, one compilation at the answer's size, alone, in a fresh process
after the search; ``in_process_5_percent``, the probe at ``ceil(answer x 1.05)`` in the searching
process after the search (compiled first, then
run: ``[size, ran, rematerialized, seconds]``); ``largest_in_process``, the largest size that runs
at full speed in the searching process after the search (from that probe on, bisected there
within ``--in-process-budget`` seconds: each probe compiled first, a size XLA rematerialized
counted as not running at full speed, then run; every probe in ``in_process_calls``) and
``share_in_process``, the answer's share of it once the probes bracket it within 1% (else None,
and ``share_in_process_at_most``, the share of the largest probe that ran); ``fresh``, fresh
processes' runs at the answer, at ``ceil(answer x 1.05)`` (``fresh_5_percent``) and, while time
is left, above it (grown by 1/0.95 until a size does not run, then bisected).

``best_seen`` (JAX rows): the largest size seen running at full speed in any process of this run
on that model and configuration -- both searches' calls that ran (with and without ``lower=``),
the answer's ten steps, the in-process probes, the fresh probes and the baselines' calls -- and
never below ``search_rows_judge.SEEN_ON_H200`` on an H200 (sizes an earlier run saw running, the
result's ``best_seen_floors``: what fits in a growing pool depends on its history, so one run can
miss a size that runs). The rows of one model share it (computed once all of them ran);
``share_best_seen`` is ``found / best_seen``, and ``targets_met`` holds the row against
``search_rows_judge.TARGETS`` (the summary prints both).

Baselines, replayed in code on the same models (accelerate recognises only torch's OOM
messages; both are replayed so that they call the very step unimem's search calls): accelerate's
``find_executable_batch_size`` (from a high start, x0.9 on each OOM) and Lightning's ``power``
and ``binsearch`` scaling (from 2, at most 25 trials, one step per trial), each with a wall
budget; a JAX failure costs seconds, so those that run out of it say so (``gave_up``). Two capped
models' baselines run at once (``concurrent``); the whole-GPU model's run alone, one after another.

    python benchmarks/bench_search_rows.py --out benchmarks/results/search-gpu-h200.json --machine LABEL
    python benchmarks/bench_search_rows.py --models flax-mlp,jax-mlp,jax-transformer --no-baselines --out rows.json
    python benchmarks/bench_search_rows.py --models flax-mlp --lower both --merge --out rows.json  # into rows.json
    python benchmarks/bench_search_rows.py --cpu --out /tmp/rows.json   # the logic on the CPU, simulated caps

``--merge`` keeps the rows of other models already in ``--out`` (this run's models' rows replace theirs).

Without a GPU (``--cpu``) the models are small, each step raises its framework's own
out-of-memory error past a fixed size, and JAX's ``limit=`` is XLA's predicted peak at that size
(where Flax is not installed, ``flax-mlp`` is the same MLP in plain JAX, and says so).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchlib  # noqa: E402
import search_rows_judge as judge  # noqa: E402
from jax_adam import Adam, optax_or_none  # noqa: E402

# Torch first: its failures cost milliseconds, JAX's seconds; the order the budget is spent in.
MODELS: dict[str, dict[str, Any]] = {
    "torch-mlp": {
        "framework": "torch",
        "model": "8 x (Linear(4096) + ReLU), AdamW, float32",
        "configure": {"limit": "16GiB"},
        "start": 64,
        "cpu_cap": 700,
    },
    "torch-transformer": {
        "framework": "torch",
        "model": "nn.TransformerEncoder (4 layers, d 1024, 16 heads, 4096 wide, 256 tokens), AdamW, float32",
        "configure": {"limit": "8GiB"},
        "start": 2,
        "cpu_cap": 40,
    },
    "jax-mlp": {
        "framework": "jax",
        "model": "MLP 1024 -> 4 x 4096 -> 1024, optax.adamw, float32",
        "configure": {"growth": True, "limit": "8GiB"},
        "start": 64,
        "cpu_cap": 900,
    },
    "jax-transformer": {
        "framework": "jax",
        "model": "4 pre-LN transformer blocks (d 1024, 16 heads, MLP 4096, 256 tokens), optax.adamw, float32",
        "configure": {"growth": True, "limit": "8GiB"},
        "start": 2,
        "cpu_cap": 40,
    },
    "flax-mlp": {
        "framework": "jax",
        "model": "Flax linen MLP: 8 x Dense(1024) + ReLU, Dense(10), optax.adam, float32, whole GPU",
        "configure": {"growth": True},
        "start": 8,
        "cpu_cap": 3000,
        "lower": (True, False),
    },
}
BASELINES = ("accelerate", "lightning-power", "lightning-binsearch")
# A failed probe of a large JAX step takes 16-21 s (the whole-GPU Flax MLP): each is allowed this long.
PROBE_SECONDS = 180.0

# --- the models (built in a child process) -----------------------------------------------------


class Work:
    """``step(n)``: one training step at batch ``n``; ``lower(n)``: that step lowered, or None;
    ``parts``: for JAX, ``(inputs(n), run(x, y))``, the step in its two halves (to look at the
    pool between them); ``state``: for JAX, the step's ``{"params", "opt"}`` (to run a compiled
    step on them)."""

    def __init__(
        self,
        step: Callable[[int], None],
        lower: Callable[[int], Any] | None = None,
        parts: tuple[Callable[[int], Any], Callable[..., None]] | None = None,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.step = step
        self.lower = lower
        self.parts = parts
        self.state = state
        self.implementation = "torch"


def _torch_boom() -> None:
    import torch

    torch.empty(1 << 58, dtype=torch.uint8)  # torch's own out-of-memory error on the CPU


def _jax_boom() -> None:
    import jax.numpy as jnp

    jnp.zeros(1 << 58, dtype=jnp.uint8).block_until_ready()  # XLA's own RESOURCE_EXHAUSTED


def torch_model(name: str, gpu: bool, cap: int) -> Work:
    import torch

    device = "cuda" if gpu else "cpu"
    if name == "torch-mlp":
        width = 4096 if gpu else 256
        layers: list[Any] = []
        for _ in range(8):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        model: Any = torch.nn.Sequential(*layers).to(device)
        shape: tuple[int, ...] = (width,)
    else:
        d, heads, wide, depth, tokens = (1024, 16, 4096, 4, 256) if gpu else (64, 4, 128, 2, 16)
        layer = torch.nn.TransformerEncoderLayer(d, heads, wide, dropout=0.0, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, depth, enable_nested_tensor=False).to(device)
        shape = (tokens, d)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(n: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        x = torch.randn(n, *shape, device=device)
        if not gpu and n > cap:
            _torch_boom()
        loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        if gpu:
            torch.cuda.synchronize()  # an OOM inside an asynchronous kernel surfaces here

    return Work(step)


class JaxModel:
    """A JAX model for ``jax_model``: its parameters, ``loss_fn(params, x, y)``, the shapes of one
    sample's input and label, the label's dtype, its optimizer, and how it is written."""

    def __init__(
        self,
        params: Any,
        loss_fn: Callable[..., Any],
        x_shape: tuple[int, ...],
        y_shape: tuple[int, ...],
        y_dtype: str = "float32",
        optimizer: str = "adamw",
        implementation: str = "jax",
    ) -> None:
        self.params, self.loss_fn = params, loss_fn
        self.x_shape, self.y_shape, self.y_dtype = x_shape, y_shape, y_dtype
        self.optimizer, self.implementation = optimizer, implementation


def _jax_mlp(gpu: bool) -> JaxModel:
    import jax
    import jax.numpy as jnp

    d_in, hidden, depth, d_out = (1024, 4096, 4, 1024) if gpu else (64, 128, 2, 64)
    sizes = [d_in] + [hidden] * depth + [d_out]
    keys = jax.random.split(jax.random.PRNGKey(0), len(sizes))
    params = [
        (jax.random.normal(k, (a, b)) / math.sqrt(a), jnp.zeros(b))
        for k, a, b in zip(keys, sizes[:-1], sizes[1:], strict=False)
    ]

    def loss_fn(params: Any, x: Any, y: Any) -> Any:
        for w, b in params[:-1]:
            x = jax.nn.relu(x @ w + b)
        w, b = params[-1]
        return jnp.mean((x @ w + b - y) ** 2)

    return JaxModel(params, loss_fn, (d_in,), (d_out,))


def _jax_transformer(gpu: bool) -> JaxModel:
    import jax
    import jax.numpy as jnp

    d, heads, wide, depth, tokens = (1024, 16, 4096, 4, 256) if gpu else (64, 4, 128, 2, 16)
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 6 * depth))

    def dense(a: int, b: int) -> Any:
        return jax.random.normal(next(keys), (a, b)) / math.sqrt(a)

    params = [
        {"wq": dense(d, d), "wk": dense(d, d), "wv": dense(d, d), "wo": dense(d, d), "w1": dense(d, wide),
         "w2": dense(wide, d), "g1": jnp.ones(d), "g2": jnp.ones(d)}
        for _ in range(depth)
    ]  # fmt: skip

    def norm(x: Any, g: Any) -> Any:
        mean = x.mean(-1, keepdims=True)
        return g * (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)

    def block(p: Any, x: Any) -> Any:
        b, s, _ = x.shape
        h = norm(x, p["g1"])
        q, k, v = ((h @ p[w]).reshape(b, s, heads, d // heads) for w in ("wq", "wk", "wv"))
        att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // heads), axis=-1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, d) @ p["wo"]
        return x + jax.nn.gelu(norm(x, p["g2"]) @ p["w1"]) @ p["w2"]

    def loss_fn(params: Any, x: Any, y: Any) -> Any:
        for p in params:
            x = block(p, x)
        return jnp.mean((x - y) ** 2)

    return JaxModel(params, loss_fn, (tokens, d), (tokens, d))


def _flax_mlp(gpu: bool) -> JaxModel:
    """Flax linen: 8 x Dense(1024) + ReLU, Dense(10), softmax cross-entropy on integer labels. Where
    Flax is not installed (the CPU machine), the same layers in plain JAX, and it says so."""
    import jax
    import jax.numpy as jnp

    width, depth, classes = (1024, 8, 10) if gpu else (64, 3, 10)
    losses = optax_or_none(gpu) or Adam
    try:
        import flax.linen as nn
    except ImportError:
        if gpu:
            raise  # the GPU row is Flax's, or none
        keys = jax.random.split(jax.random.PRNGKey(0), depth + 1)
        shapes = [(width, width)] * depth + [(width, classes)]
        params: Any = [
            (jax.random.normal(k, s) / math.sqrt(s[0]), jnp.zeros(s[1])) for k, s in zip(keys, shapes, strict=True)
        ]

        def apply(params: Any, x: Any) -> Any:
            for w, b in params[:-1]:
                x = jax.nn.relu(x @ w + b)
            return x @ params[-1][0] + params[-1][1]

        implementation = "plain JAX (Flax is not installed here)"
    else:

        class MLP(nn.Module):
            @nn.compact
            def __call__(self, x: Any) -> Any:
                for _ in range(depth):
                    x = nn.relu(nn.Dense(width)(x))
                return nn.Dense(classes)(x)

        model = MLP()
        params, apply, implementation = model.init(jax.random.PRNGKey(0), jnp.ones((1, width))), model.apply, "flax"

    def loss_fn(params: Any, x: Any, y: Any) -> Any:
        return losses.softmax_cross_entropy_with_integer_labels(apply(params, x), y).mean()

    return JaxModel(params, loss_fn, (width,), (), "int32", "adam", implementation)


JAX_MODELS = {"jax-mlp": _jax_mlp, "jax-transformer": _jax_transformer, "flax-mlp": _flax_mlp}


def jax_model(name: str, gpu: bool, cap: int) -> Work:
    import jax
    import jax.numpy as jnp

    spec = JAX_MODELS[name](gpu)
    params, loss_fn = spec.params, spec.loss_fn
    optax: Any = optax_or_none(gpu)
    if optax is None:
        optimizer: Any = Adam(1e-3, 0.0) if spec.optimizer == "adam" else Adam(1e-4, 1e-4)
        optax, spec.implementation = Adam, spec.implementation + ", Adam in plain JAX (optax is not installed here)"
    else:
        optimizer = optax.adam(1e-3) if spec.optimizer == "adam" else optax.adamw(1e-4)
    state = {"params": params, "opt": optimizer.init(params)}

    @jax.jit
    def train(params: Any, opt_state: Any, x: Any, y: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def inputs(n: int) -> tuple[Any, Any]:
        return jnp.ones((n, *spec.x_shape), jnp.float32), jnp.zeros((n, *spec.y_shape), spec.y_dtype)

    def run(x: Any, y: Any) -> None:
        new_params, new_opt, loss = train(state["params"], state["opt"], x, y)
        loss.block_until_ready()
        state["params"], state["opt"] = new_params, new_opt  # the search's step donates nothing

    def step(n: int) -> None:
        x, y = inputs(n)
        if not gpu and n > cap:
            _jax_boom()
        run(x, y)

    def lower(n: int) -> Any:
        x = jax.ShapeDtypeStruct((n, *spec.x_shape), jnp.float32)  # sized without allocating
        y = jax.ShapeDtypeStruct((n, *spec.y_shape), spec.y_dtype)
        return train.lower(state["params"], state["opt"], x, y)

    work = Work(step, lower, (inputs, run), state)
    work.implementation = spec.implementation
    return work


def build(spec: dict[str, Any]) -> Work:
    import unimem

    gpu = spec["gpu"]
    if gpu:
        unimem.configure(backend=spec["framework"], **spec["configure"])
    if spec["framework"] == "torch":
        return torch_model(spec["name"], gpu, spec["cpu_cap"])
    return jax_model(spec["name"], gpu, spec["cpu_cap"])


# --- what a child does ---------------------------------------------------------------------------


class Counted:
    """The step with every call counted (size, fit or not, seconds), by the step itself."""

    def __init__(self, step: Callable[[int], None]) -> None:
        self.inner = step
        self.calls: list[list[Any]] = []

    def __call__(self, n: int) -> None:
        t0, ok = time.perf_counter(), False
        try:
            self.inner(n)
            ok = True
        finally:
            self.calls.append([n, ok, round(time.perf_counter() - t0, 3)])


def _fits(step: Callable[[int], None], n: int) -> bool:
    import unimem

    try:
        step(n)
        return True
    except Exception as exc:
        if not unimem.is_oom(exc):
            raise
        return False


def _ten_steps(step: Callable[[int], None], n: int | None) -> bool | None:
    """Ten training steps at ``n`` in this process: whether all ran (None: no size to run)."""
    if not n:
        return None
    return all(_fits(step, n) for _ in range(10))


class Compiles:
    """Every compilation of the training step (``jit(train)``) JAX makes in this process from now on,
    with its seconds, as JAX's own compile events report them: the search's and the step's own alike.
    JAX reports a load from its persistent compilation cache with the same event, after a cache hit in
    the same thread: such a load is counted apart (``loads``), not as a compilation. What fresh
    processes compiled for this one is ``fresh()``."""

    def __init__(self) -> None:
        import jax
        from unimem.backends.jax import _fresh_compile

        self.seconds: list[float] = []
        self.loads: list[float] = []
        self._hit = threading.local()
        self._fresh = _fresh_compile.fresh_compilations
        self._fresh_before = len(self._fresh)
        jax.monitoring.register_event_listener(self._on_event)
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)

    def _on_event(self, event: str, **kwargs: Any) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self._hit.on = True

    def _on_duration(self, event: str, duration: float, **kwargs: Any) -> None:
        if event == "/jax/core/compile/backend_compile_duration" and kwargs.get("fun_name") == "jit(train)":
            (self.loads if getattr(self._hit, "on", False) else self.seconds).append(round(duration, 3))
        if event == "/jax/core/compile/backend_compile_duration":
            self._hit.on = False

    def fresh(self) -> list[float]:
        """The seconds of each compilation fresh processes made for this one since it started counting."""
        return list(self._fresh[self._fresh_before :])


def _full_speed(work: Work, n: int) -> tuple[bool, bool | None]:
    """Whether size ``n`` runs at full speed in this process: compiled first (the run reuses it), a
    program XLA rematerialized does not; then run. Returns (runs, rematerialized: None unknown)."""
    from unimem import registry

    remat = None
    if work.lower is not None:
        try:
            remat = registry.get_backend("jax").search.predict_rematerialized(work.lower(n))
        except Exception as exc:
            import unimem

            if not unimem.is_oom(exc):
                raise
            return False, None
        if remat:
            return False, True
    return _fits(work.step, n), remat


def next_probe(low: int, high: int | None) -> int | None:
    """The next size to probe for the largest that runs, from ``low`` (it ran) below ``high`` (it did
    not; None: nothing known to fail): 1/0.95 times ``low`` while nothing bounds it, else the middle;
    None once the bracket is within 1%."""
    if high is not None and high - low <= max(1, low // 100):
        return None
    return math.ceil(low / 0.95) if high is None else (low + high) // 2


def in_process_share(found: int, high: int | None, probes: list[list[Any]]) -> dict[str, Any]:
    """What the probes made in the searching process after the search say (each ``[size, ran,
    rematerialized, seconds]``, in order, from ``found``, which ran, below ``high``, which did not):
    the largest size that ran, the smallest that did not, whether they bracket the largest that runs
    within 1%, and the answer's share of it: to 1% once bracketed, else at most the share of the
    largest probe that ran (None without a probe: the answer alone says nothing of what runs above it)."""
    low = found
    for size, ran, *_ in probes:
        if ran:
            low = max(low, size)
        else:
            high = size if high is None else min(high, size)
    bisected = high is not None and next_probe(low, high) is None
    return {
        "largest": low,
        "above": high,
        "calls": len(probes),
        "bisected": bisected,
        "share": found / low if bisected else None,
        "share_at_most": found / low if probes else None,
    }


def probe_above(found: int) -> int:
    """The size 5% above an answer, ``ceil(found x 1.05)`` in integers (no float rounding up a
    whole number): where the answer is checked for room left above it."""
    return max(found + 1, -(-found * 105 // 100))


def _largest_in_process(work: Work, low: int, high: int | None, until: float) -> dict[str, Any]:
    """The largest size that runs at full speed in this process from ``low`` (which ran) up,
    below ``high`` (known not to, or None): first ``probe_above(low)``, whatever the time, then
    probed one after another (each compiles, then runs, ``next_probe``) while ``until`` (a
    ``perf_counter`` time) has not passed. Every probe changes the pool the next one sees."""
    probes: list[list[Any]] = []
    found, bound = low, high
    size: int | None = probe_above(low)
    while size is not None:
        t0 = time.perf_counter()
        runs, remat = _full_speed(work, size)
        probes.append([size, runs, remat, round(time.perf_counter() - t0, 2)])
        low, high = (max(low, size), high) if runs else (low, size if high is None else min(high, size))
        size = next_probe(low, high) if time.perf_counter() < until else None
    return {**in_process_share(found, bound, probes), "probes": probes}


def child_search(spec: dict[str, Any], work: Work) -> dict[str, Any]:
    import unimem
    from unimem.search.findings import slower

    kwargs: dict[str, Any] = {"progress": True}  # a line per trial on stderr, kept on a timeout
    lowered: list[list[Any]] = []
    jax = spec["framework"] == "jax"
    searched_with_lower = jax and spec.get("lower", True)
    if searched_with_lower:
        assert work.lower is not None
        inner_lower = work.lower

        def timed_lower(n: int) -> Any:
            t0 = time.perf_counter()
            out = inner_lower(n)
            lowered.append([n, round(time.perf_counter() - t0, 3)])
            return out

        kwargs["lower"] = timed_lower
    if jax and not spec["gpu"]:  # the CPU keeps no figures: hold the sizes against the simulated cap
        from unimem import registry

        assert work.lower is not None
        kwargs["limit"] = registry.get_backend("jax").search.predict_peak(work.lower(spec["cpu_cap"]))
    counted = Counted(work.step)
    if jax and not spec["gpu"] and not searched_with_lower:
        kwargs["measure"] = _cpu_peaks(work, counted)
    compiles = Compiles() if jax else None
    result = unimem.find_batch_size(
        counted, start=spec["start"], backend=spec["framework"], return_trials=True, **kwargs
    )
    calls = list(counted.calls)
    # Every compilation the user paid for: in this process, and in the fresh processes that compiled for it.
    here = None if compiles is None else list(compiles.seconds)
    fresh = None if compiles is None else compiles.fresh()
    paid = None if here is None or fresh is None else here + fresh
    loads = None if compiles is None else len(compiles.loads)
    limit = result.limit
    over = [n for n, p in result.predictions if limit is not None and p > limit]
    ends = [] if result.smallest_failure is None else [result.smallest_failure - 1]
    ends += [min(over) - 1] if over else []
    # Every size compiled above the answer was predicted not to fit now (its peak or its largest buffer).
    above = [n for n, _ in result.predictions if result.batch_size and n > result.batch_size]
    ends += [min(above) - 1] if above else []
    t0 = time.perf_counter()
    same = _ten_steps(work.step, result.batch_size)
    row = {
        "found": result.batch_size,
        "upper": min(ends) if ends else None,
        "step_calls": len(calls),
        "failed_calls": sum(1 for _, ok, _ in calls if not ok),
        "compile_calls": result.compile_calls if paid is None else len(paid),
        "search_compile_calls": result.compile_calls,
        "compile_seconds": here,  # each compilation of the step in this process, in order
        "fresh_compile_seconds": fresh,  # each one a fresh process made for this one
        "cache_loads": loads,  # the step loaded from the persistent compilation cache instead
        "lowered": lowered,  # [size, seconds to lower] per call of lower=; compiling is the search's
        "seconds": result.seconds,
        "same_process_ok": same,
        "ten_steps_seconds": time.perf_counter() - t0,
        "ten_steps_compile_calls": None if compiles is None or here is None else len(compiles.seconds) - len(here),
        "ten_steps_cache_loads": None if compiles is None or loads is None else len(compiles.loads) - loads,
        "calls": calls,
        # Calls that ran a program the compiler rematerialized: not at the size's full speed.
        "rematerialized": sorted({t.batch_size for t in result.trials if slower(t)}),
        "reported": {"step_calls": result.step_calls, "failed_calls": result.failed_calls},
        "trials": [[t.batch_size, t.fits, t.reason, t.peak, t.predicted, t.kept] for t in result.trials],
        "confirmations": [[t.batch_size, t.fits, t.reason] for t in result.confirmations],
        "converged": result.converged,
        "limit": limit,
        # The pool before the search (JAX with growth: what its regions leave to one large buffer).
        "before": None if result.before is None else result.before.as_dict(),
        "notes": list(result.notes),
        "predictions": [list(p) for p in result.predictions],
        "implementation": work.implementation,
    }
    if jax and result.batch_size:
        # After the search, in the process that searched: the largest size that runs at full speed.
        bound = None if result.smallest_failure is None else result.smallest_failure
        until = time.perf_counter() + spec.get("in_process_seconds", 240.0)
        row["in_process"] = _largest_in_process(work, result.batch_size, bound, until)
        row["in_process_5_percent"] = row["in_process"]["probes"][0]
        row["answer_rematerialized"] = _full_speed(work, result.batch_size)[1] if work.lower is not None else None
    return row


def _cpu_peaks(work: Work, counted: Counted) -> Callable[[], int | None]:
    """``measure=`` for a search without ``lower=`` on the CPU, which keeps no device figures: the
    peak XLA predicts for the size the last call ran, so that the search has peaks to place from."""
    from unimem import registry

    lower = work.lower
    assert lower is not None
    return lambda: (
        registry.get_backend("jax").search.predict_peak(lower(counted.calls[-1][0])) if counted.calls else None
    )


def child_baseline(spec: dict[str, Any], work: Work) -> dict[str, Any]:
    counted = Counted(work.step)
    deadline = time.perf_counter() + spec["budget"]
    method = spec["method"]
    t0 = time.perf_counter()
    if method == "accelerate":
        found, gave_up = accelerate(counted, spec["high"], spec["framework"], deadline)
    else:
        found, gave_up = lightning(counted, method.split("-", 1)[1], spec["framework"], deadline)
    seconds = time.perf_counter() - t0
    calls = list(counted.calls)
    same = None if gave_up or time.perf_counter() > deadline + 60 else _ten_steps(work.step, found)
    return {
        "found": found,
        "gave_up": gave_up,
        "step_calls": len(calls),
        "failed_calls": sum(1 for _, ok, _ in calls if not ok),
        "seconds": seconds,
        "same_process_ok": same,
        "calls": calls,
        "start": spec.get("high") if method == "accelerate" else 2,
    }


def _clear(framework: str) -> None:
    """accelerate's clear_device_cache(garbage_collection=True) / Lightning's garbage_collection_cuda()."""
    import gc

    gc.collect()
    if framework == "torch":
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def accelerate(step: Callable[[int], None], start: int, framework: str, deadline: float) -> tuple[int | None, bool]:
    """accelerate.utils.find_executable_batch_size: try, and on an OOM clear inside ``except`` and x0.9."""
    import unimem

    size = start
    _clear(framework)
    while size > 0:
        if time.perf_counter() > deadline:
            return None, True
        try:
            step(size)
            return size, False
        except Exception as exc:
            if not unimem.is_oom(exc):
                raise
            _clear(framework)
            size = int(size * 0.9)
    return None, False


def lightning(
    step: Callable[[int], None], mode: str, framework: str, deadline: float, init: int = 2, max_trials: int = 25
) -> tuple[int | None, bool]:
    """lightning.pytorch.tuner.batch_size_scaling: _run_power_scaling (double until an OOM, then
    halve once) / _run_binary_scaling (double until an OOM, then bisect to a unit), one step per
    trial. Returns the size it ends with, and whether the wall budget cut it short."""
    import unimem

    size, low, high, count, ran = init, 1, None, 0, False
    for trial in range(10 * max_trials):
        if time.perf_counter() > deadline:
            return (low if ran else None), True
        if mode == "power" and trial >= max_trials:
            break
        _clear(framework)
        try:
            step(size)
        except Exception as exc:
            if not unimem.is_oom(exc):
                raise
            _clear(framework)
            if mode == "power":
                size = max(1, size // 2)
                if ran:
                    break
                continue
            high = size
            size = (high + low) // 2
            if high - low <= 1:
                break
            continue
        ran, low = True, size
        if mode == "power":
            size *= 2
            continue
        count += 1
        if count > max_trials:
            break
        if high:
            if high - low <= 1:
                break
            size = (high + low) // 2
        else:
            size *= 2
    _clear(framework)
    return size, False


def child_probe(spec: dict[str, Any], work: Work) -> dict[str, Any]:
    """One size in a fresh process: for JAX compiled first, alone (its seconds: the compilation the
    answer costs), its rematerialization read; then run (the run reuses the compilation)."""
    size = spec["size"]
    if spec["framework"] != "jax":
        return {"fits": _fits(work.step, size)}
    t0 = time.perf_counter()
    runs, remat = _full_speed(work, size)
    return {"fits": runs, "rematerialized": remat, "seconds": round(time.perf_counter() - t0, 2)}


def _compile_seconds(work: Work, size: int) -> float | None:
    """One compilation of the step at ``size``, alone, in seconds (nothing cached at that size yet)."""
    if work.lower is None:
        return None
    t0 = time.perf_counter()
    work.lower(size).compile()
    return round(time.perf_counter() - t0, 3)


def child(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["kind"] == "search" and spec["framework"] == "jax":
        # unimem's caches (compiled steps, kernel choices) start empty: each search pays its own compilations.
        os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
        os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="unimem-bench-cache-")
    work = build(spec)
    work.step(spec["start"])  # warm-up at the search's start: state, kernels, handles exist before it
    if spec["kind"] == "probe":
        timed = _compile_seconds(work, spec["size"]) if spec.get("compile_seconds") else None
        return {**child_probe(spec, work), "compile_seconds": timed}
    if spec["kind"] == "search":
        return child_search(spec, work)
    return child_baseline(spec, work)


# --- the parent --------------------------------------------------------------------------------------


def run(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    keep = spec.get("kind") == "search"  # its progress lines: each compilation's seconds
    return benchlib.run_child(str(Path(__file__).resolve()), spec, timeout, cpu_only=not spec["gpu"], keep_stderr=keep)


def base_spec(name: str, gpu: bool) -> dict[str, Any]:
    return {"name": name, "gpu": gpu, **MODELS[name]}


def _narrow(low: int, high: int | None, size: int, fits: bool | None) -> tuple[int, int | None] | None:
    """The bracket [low, high) after a probe of ``size`` that ran or not; None when the probe said
    neither (it timed out or erred): the bracket stops there."""
    if fits is None:
        return None
    return (size, high) if fits else (low, size)


def confirm(name: str, gpu: bool, search: dict[str, Any], timeout: float, until: float) -> dict[str, Any]:
    """The bracket [found, upper] checked in fresh processes (in parallel, each under its own cap),
    then, while it is wider than 1% and time is left (``until``), bisected with one fresh process
    a probe: ``true_max`` is one under the smallest size that failed fresh."""
    found, upper = search["found"], search.get("upper")
    sizes = [found] + ([upper + 1] if upper is not None else [])
    with ThreadPoolExecutor(max_workers=len(sizes)) as pool:
        probes = list(pool.map(lambda n: run({**base_spec(name, gpu), "kind": "probe", "size": n}, timeout), sizes))
    fits = probes[0].get("fits")
    fails = None if upper is None else probes[1].get("fits") is False
    bisected: list[list[Any]] = []
    low, high = found, None if upper is None else upper + 1
    while fits and fails and high is not None and high - low > max(1, low // 100):
        if time.perf_counter() + timeout > until:
            break
        middle = (low + high) // 2
        probe = run({**base_spec(name, gpu), "kind": "probe", "size": middle}, timeout)
        bisected.append([middle, probe.get("fits")])
        narrowed = _narrow(low, high, middle, probe.get("fits"))
        if narrowed is None:
            break
        low, high = narrowed
    return {
        "true_max": high - 1 if fits and fails and high is not None else None,
        "true_max_confirmed": bool(fits and fails),
        "bracket": [found, upper],
        "fresh_bracket": [low, None if high is None else high - 1],
        "bisected": bisected,
        "answer_fits_fresh": fits,
        "above_bracket_fails_fresh": fails,
        "probe_errors": [p for p in probes if "error" in p] or None,
    }


def confirm_jax(name: str, gpu: bool, search: dict[str, Any], until: float) -> dict[str, Any]:
    """A JAX answer in fresh processes, one at a time (the whole-GPU model takes the device):
    the answer, compiled alone first (``compile_seconds_at_answer``), then run; then one run at
    ``probe_above(answer)`` (``five_percent``), whatever the time, whose failure (or
    rematerialization) confirms the answer is within 5% of the largest that runs fresh; then,
    while time is left (``until``), bisected between them, or grown past it by 1/0.95 until a
    size does not run and bisected there (``next_probe``)."""
    found = search["found"]
    probes: list[list[Any]] = []

    def probe(size: int, timed: bool = False) -> dict[str, Any]:
        spec = {**base_spec(name, gpu), "kind": "probe", "size": size, "compile_seconds": timed}
        out = run(spec, PROBE_SECONDS)
        if not timed:
            probes.append([size, out.get("fits"), out.get("rematerialized"), out.get("error")])
        return out

    at_answer = probe(found, timed=True)
    size: int | None = probe_above(found)
    low, high = found, None
    while size is not None:
        narrowed = _narrow(low, high, size, probe(size).get("fits"))
        if narrowed is None or not at_answer.get("fits"):
            break
        low, high = narrowed
        size = next_probe(low, high) if time.perf_counter() + PROBE_SECONDS < until else None
    return {
        "true_max": None if high is None else high - 1,
        "true_max_confirmed": bool(at_answer.get("fits")) and high is not None,
        "largest_that_ran_fresh": low if at_answer.get("fits") else None,
        "answer_fits_fresh": at_answer.get("fits"),
        "compile_seconds_at_answer": at_answer.get("compile_seconds"),
        "within_5_percent": bool(at_answer.get("fits")) and high is not None and high <= math.ceil(found / 0.95),
        "five_percent": probes[0],  # [size, ran, rematerialized, error]
        "probes": probes,
        "probe_errors": [p for p in [at_answer] if "error" in p] or None,
    }


def search_row(
    name: str, gpu: bool, remaining: float, lower: bool | None = None, in_process: float = 240.0
) -> dict[str, Any]:
    spec = MODELS[name]
    jax = spec["framework"] == "jax"
    # Each search gets at most half of what is left: one slow search must not starve the rest. A JAX
    # search then bisects the largest size that runs in its own process for ``in_process`` seconds
    # more (a probe under way runs to its end: PROBE_SECONDS at most).
    allowed = max(60.0, min(240.0 + (240.0 if jax else 0.0), remaining / 2))
    extra = in_process + 2 * PROBE_SECONDS if jax else 0.0  # the probe 5% above the answer, then the last
    child_spec = {**base_spec(name, gpu), "kind": "search", "lower": lower, "in_process_seconds": in_process}
    run_out = run(child_spec, timeout=allowed + extra)
    row: dict[str, Any] = {"framework": spec["framework"], "name": name, "model": spec["model"], "method": "unimem"}
    if jax:
        row["lower"] = lower
    if "error" in run_out:
        return {**row, "error": run_out}
    row.update({k: run_out[k] for k in ("found", "step_calls", "failed_calls", "compile_calls", "seconds")})
    row.update(same_process_ok=run_out["same_process_ok"], detail=run_out)
    if jax and run_out.get("in_process"):
        bisected = run_out["in_process"]
        row.update(
            largest_in_process=bisected["largest"],
            share_in_process=bisected["share"],
            share_in_process_at_most=bisected["share_at_most"],
            in_process_bisected=bisected["bisected"],
            in_process_calls=bisected["probes"],  # [size, ran, rematerialized, seconds] each
            in_process_5_percent=bisected["probes"][0],
        )
    return row


def baseline_rows(name: str, gpu: bool, search: dict[str, Any], budget: float) -> list[dict[str, Any]]:
    """The three baselines on one model, at once (their seconds then overlap: ``concurrent``), or
    one after another on a model that takes the whole device; accelerate from the power of two at
    or above twice the largest size."""
    spec = MODELS[name]
    true_max = search.get("true_max")
    high = 1 << math.ceil(math.log2(2 * (true_max or search["found"])))

    def one(method: str) -> dict[str, Any]:
        base = {**base_spec(name, gpu), "kind": "baseline", "method": method, "high": high, "budget": budget}
        out = run(base, budget + 120)
        row: dict[str, Any] = {"framework": spec["framework"], "name": name, "model": spec["model"], "method": method}
        if "error" in out:
            return {**row, "error": out}
        row.update({k: out[k] for k in ("found", "step_calls", "failed_calls", "seconds", "same_process_ok")})
        row.update(compile_calls=None, true_max=true_max, gave_up=out["gave_up"], detail=out)
        row["concurrent"] = not _whole_device(name)
        row["share"] = out["found"] / true_max if true_max and out["found"] else None
        return row

    with ThreadPoolExecutor(max_workers=1 if _whole_device(name) else len(BASELINES)) as pool:
        return list(pool.map(one, BASELINES))


def _variants(name: str, wanted: str) -> list[bool | None]:
    """The searches of one model: torch's one; JAX's with ``lower=`` and, where the model has the
    row, without (``--lower yes|no|both`` picks; ``model``: as the model lists them)."""
    spec = MODELS[name]
    if spec["framework"] != "jax":
        return [None]
    listed = list(spec.get("lower", (True,)))
    chosen = {"model": listed, "both": [True, False], "yes": [True], "no": [False]}[wanted]
    return [v for v in listed if v in chosen] or chosen


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "results" / "search-gpu-h200.json"))
    parser.add_argument("--machine", default=None)
    parser.add_argument("--cpu", action="store_true", help="small models and simulated caps on the CPU")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--lower", choices=("model", "both", "yes", "no"), default="model",
                        help="JAX searches with lower= (yes), without (no), both, or as each model lists")  # fmt: skip
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for everything; later work skips")
    parser.add_argument("--baseline-budget", type=float, default=45.0, help="wall seconds per baseline search")
    parser.add_argument("--in-process-budget", type=float, default=240.0,
                        help="seconds each JAX search may spend after it, past the probe 5%% above its answer, "
                        "bisecting the largest size that runs in its own process (0: that probe only)")  # fmt: skip
    parser.add_argument("--no-baselines", action="store_true", help="unimem's rows only")
    parser.add_argument("--merge", action="store_true", help="keep the other models' rows already in --out")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.child is not None:
        print(benchlib.RESULT_MARK + json.dumps(child(json.loads(args.child)), default=str), flush=True)
        return 0
    deadline = time.perf_counter() + args.budget
    device = None if args.cpu else benchlib.gpu_description()
    gpu = device is not None
    seen_before = judge.floors(device["name"]) if device else {}
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    result = benchlib.header("search_rows", args.machine, sys.argv)
    result.update(mode="gpu" if gpu else "cpu-simulated", targets=judge.TARGETS, best_seen_floors=seen_before)
    earlier = benchlib.earlier(args.out) if args.merge else None
    models = {MODELS[n]["model"] for n in names}
    kept = [] if earlier is None else [r for r in earlier.get("rows", []) if r.get("model") not in models]
    benchlib.add_source(result, earlier, ", ".join(names))
    ours: list[dict[str, Any]] = []  # this run's rows, judged together

    def save() -> None:  # as rows arrive: a run stopped early keeps its rows, judged as far as they go
        judge.apply_best_seen(ours, seen_before)
        result["rows"] = kept + ours
        result["summary"] = judge.summary(result["rows"])
        benchlib.write(result, args.out)

    # 1. unimem's searches, one at a time (their seconds are the point), each in a fresh process.
    searches: dict[tuple[str, bool | None], dict[str, Any]] = {}
    for name in names:
        for lower in _variants(name, args.lower):
            if deadline - time.perf_counter() < 60:
                ours.append({"name": name, "model": MODELS[name]["model"], "method": "unimem", "skipped": "budget"})
            else:
                searches[name, lower] = search_row(
                    name, gpu, deadline - time.perf_counter(), lower, args.in_process_budget
                )
                ours.append(searches[name, lower])
            save()
    done = {key: r for key, r in searches.items() if "found" in r}
    confirm_all(done, gpu, deadline, save)
    # 3. the baselines on the same models: two capped models' three at once (caps well under the
    # device); a model on the whole device alone, its three one after another.
    ready = [] if args.no_baselines else [n for n in names if any(k[0] == n for k in done)]
    for wave in _waves(ready):
        if deadline - time.perf_counter() < args.baseline_budget * (3 if _whole_device(wave[0]) else 1) + 60:
            result["baselines_skipped"] = "the budget ran out (--budget)"
            break
        first = [next(r for k, r in done.items() if k[0] == n) for n in wave]
        with ThreadPoolExecutor(max_workers=len(wave)) as pool:
            waves = list(pool.map(lambda n, r: baseline_rows(n, gpu, r, args.baseline_budget), wave, first))
        ours += [base for bases in waves for base in bases]
        save()
    save()
    print("\n".join(result["summary"]), file=sys.stderr)
    return 0


def confirm_all(
    done: dict[tuple[str, bool | None], dict[str, Any]], gpu: bool, deadline: float, save: Callable[[], None]
) -> None:
    """2. The true largest. torch: each bracket confirmed by fresh processes, all models at once;
    JAX: fresh processes one at a time (a whole-GPU model takes the device), each search its share."""
    torch_done = {key: r for key, r in done.items() if r["framework"] == "torch"}
    with ThreadPoolExecutor(max_workers=max(1, len(torch_done))) as pool:
        checks = dict(
            zip(
                torch_done,
                pool.map(lambda key: confirm(key[0], gpu, torch_done[key]["detail"], 90, deadline), torch_done),
                strict=True,
            )
        )
    for key, check in checks.items():
        row = done[key]
        row.update(true_max=check["true_max"], true_max_confirmed=check["true_max_confirmed"], reference=check)
        row["share"] = row["found"] / check["true_max"] if check["true_max"] else None
        row["targets_met"] = judge.torch_targets(row)
    save()
    jax_done = [key for key, r in done.items() if r["framework"] == "jax"]
    for i, key in enumerate(jax_done):
        row = done[key]
        share = (deadline - time.perf_counter()) / (len(jax_done) - i)
        check = confirm_jax(key[0], gpu, row, time.perf_counter() + share)
        row.update(true_max=check["true_max"], true_max_confirmed=check["true_max_confirmed"], fresh=check)
        row.update(compile_seconds_at_answer=check["compile_seconds_at_answer"], fresh_5_percent=check["five_percent"])
        fresh = check["largest_that_ran_fresh"]
        row["share_fresh"] = row["found"] / check["true_max"] if check["true_max"] else None
        row["share_fresh_at_least"] = row["found"] / fresh if fresh else None
        row["share"] = row["share_fresh"]
        save()


def _whole_device(name: str) -> bool:
    """Whether a model runs without a cap (its searches take the whole device)."""
    return "limit" not in MODELS[name]["configure"]


def _waves(names: list[str]) -> list[list[str]]:
    """The models whose baselines run at once: two capped ones a wave; one on the whole device alone."""
    capped = [n for n in names if not _whole_device(n)]
    return [capped[i : i + 2] for i in range(0, len(capped), 2)] + [[n] for n in names if _whole_device(n)]


if __name__ == "__main__":
    sys.exit(main())
