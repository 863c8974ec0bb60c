"""Every call of the step counted: ``unimem.find_batch_size`` against the batch-size searches
people use, on real models on one GPU, one row per search.

Models (each search in its own fresh process, under its own cap, from a warm-up at ``start``):

- ``torch-mlp``: 8 x (Linear(4096) + ReLU), AdamW, ``configure(backend="torch", limit="16GiB")``;
- ``torch-transformer``: ``nn.TransformerEncoder`` (4 layers, d_model 1024, 16 heads, 4096 wide,
  256 tokens a sample), AdamW, ``limit="8GiB"``;
- ``jax-mlp``: 1024 -> 4 x 4096 -> 1024 MLP trained with optax's AdamW, ``configure(backend="jax",
  growth=True, limit="8GiB")``, searched with ``lower=`` (XLA's compiled peak of each size);
- ``jax-transformer``: 4 pre-LN transformer blocks in plain JAX (the same shapes as torch's),
  optax AdamW, growth on, ``limit="8GiB"``, ``lower=``.

Per row: ``found``, ``true_max``, ``step_calls`` (every call of the step: the search's trials and
its re-runs), ``failed_calls``, ``compile_calls`` (sizes compiled to predict their peak),
``seconds`` (the search's wall time, compilations included), ``same_process_ok`` (ten training
steps at the answer ran in the searching process afterwards). ``true_max`` is the upper end of
a bracket that fresh processes confirm: the answer runs in one, and one above the bracket's
upper end (the search's smallest failure, or the smallest size it compiled above the answer:
XLA predicted its peak past the limit or its largest buffer past the allocator's room)
fails in another (``true_max_confirmed``: both did), then bisected in fresh processes while
wider than 1% and time is left. Shares against it are lower bounds.

Baselines, replayed in code on the same models (accelerate recognises only torch's OOM
messages, and Lightning is not installed on the GPU machine): accelerate's
``find_executable_batch_size`` (from a high start, x0.9 on each OOM) and Lightning's ``power``
and ``binsearch`` scaling (from 2, at most 25 trials, one step per trial), each with a wall
budget; a JAX failure costs seconds, so those that run out of it say so (``gave_up``).

    python benchmarks/bench_search_rows.py --out benchmarks/results/search-gpu-h200.json --machine LABEL
    python benchmarks/bench_search_rows.py --cpu --out /tmp/rows.json   # the logic on the CPU, simulated caps

Without a GPU (``--cpu``) the models are small, each step raises its framework's own
out-of-memory error past a fixed size, and JAX's ``limit=`` is XLA's predicted peak at that size.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchlib  # noqa: E402

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
}
BASELINES = ("accelerate", "lightning-power", "lightning-binsearch")
TARGETS = {"share": 0.95, "step_calls": 6, "jax_failed_calls": 1, "jax_seconds": 60.0}

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


def _jax_mlp(gpu: bool) -> tuple[Any, Callable[..., Any], tuple[int, ...], tuple[int, ...]]:
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

    return params, loss_fn, (d_in,), (d_out,)


def _jax_transformer(gpu: bool) -> tuple[Any, Callable[..., Any], tuple[int, ...], tuple[int, ...]]:
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

    return params, loss_fn, (tokens, d), (tokens, d)


def jax_model(name: str, gpu: bool, cap: int) -> Work:
    import jax
    import jax.numpy as jnp
    import optax

    params, loss_fn, x_shape, y_shape = _jax_mlp(gpu) if name == "jax-mlp" else _jax_transformer(gpu)
    optimizer = optax.adamw(1e-4)
    state = {"params": params, "opt": optimizer.init(params)}

    @jax.jit
    def train(params: Any, opt_state: Any, x: Any, y: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def inputs(n: int) -> tuple[Any, Any]:
        return jnp.ones((n, *x_shape), jnp.float32), jnp.zeros((n, *y_shape), jnp.float32)

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
        x = jax.ShapeDtypeStruct((n, *x_shape), jnp.float32)  # sized without allocating
        y = jax.ShapeDtypeStruct((n, *y_shape), jnp.float32)
        return train.lower(state["params"], state["opt"], x, y)

    return Work(step, lower, (inputs, run), state)


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


def child_search(spec: dict[str, Any], work: Work) -> dict[str, Any]:
    import unimem

    kwargs: dict[str, Any] = {"progress": True}  # a line per trial on stderr, kept on a timeout
    lowered: list[list[Any]] = []
    if spec["framework"] == "jax":
        assert work.lower is not None
        inner_lower = work.lower

        def timed_lower(n: int) -> Any:
            t0 = time.perf_counter()
            out = inner_lower(n)
            lowered.append([n, round(time.perf_counter() - t0, 3)])
            return out

        kwargs["lower"] = timed_lower
        if not spec["gpu"]:  # the CPU keeps no figures: hold the predictions against the simulated cap
            from unimem import registry

            assert work.lower is not None
            kwargs["limit"] = registry.get_backend("jax").search.predict_peak(work.lower(spec["cpu_cap"]))
    counted = Counted(work.step)
    result = unimem.find_batch_size(
        counted, start=spec["start"], backend=spec["framework"], return_trials=True, **kwargs
    )
    calls = list(counted.calls)
    limit = result.limit
    over = [n for n, p in result.predictions if limit is not None and p > limit]
    ends = [] if result.smallest_failure is None else [result.smallest_failure - 1]
    ends += [min(over) - 1] if over else []
    # Every size compiled above the answer was predicted not to fit now (its peak or its largest buffer).
    above = [n for n, _ in result.predictions if result.batch_size and n > result.batch_size]
    ends += [min(above) - 1] if above else []
    t0 = time.perf_counter()
    same = _ten_steps(work.step, result.batch_size)
    return {
        "found": result.batch_size,
        "upper": min(ends) if ends else None,
        "step_calls": len(calls),
        "failed_calls": sum(1 for _, ok, _ in calls if not ok),
        "compile_calls": result.compile_calls,
        "lowered": lowered,  # [size, seconds to lower] per call of lower=; compiling is the search's
        "seconds": result.seconds,
        "same_process_ok": same,
        "ten_steps_seconds": time.perf_counter() - t0,
        "calls": calls,
        "reported": {"step_calls": result.step_calls, "failed_calls": result.failed_calls},
        "trials": [[t.batch_size, t.fits, t.reason, t.peak, t.predicted, t.kept] for t in result.trials],
        "confirmations": [[t.batch_size, t.fits, t.reason] for t in result.confirmations],
        "converged": result.converged,
        "limit": limit,
        # The pool before the search (JAX with growth: what its regions leave to one large buffer).
        "before": None if result.before is None else result.before.as_dict(),
        "notes": list(result.notes),
    }


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


def child(spec: dict[str, Any]) -> dict[str, Any]:
    work = build(spec)
    work.step(spec["start"])  # warm-up at the search's start: state, kernels, handles exist before it
    if spec["kind"] == "probe":
        return {"fits": _fits(work.step, spec["size"])}
    if spec["kind"] == "search":
        return child_search(spec, work)
    return child_baseline(spec, work)


# --- the parent --------------------------------------------------------------------------------------


def run(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    keep = spec.get("kind") == "search"  # its progress lines: each compilation's seconds
    return benchlib.run_child(str(Path(__file__).resolve()), spec, timeout, cpu_only=not spec["gpu"], keep_stderr=keep)


def base_spec(name: str, gpu: bool) -> dict[str, Any]:
    return {"name": name, "gpu": gpu, **MODELS[name]}


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
        if probe.get("fits") is True:
            low = middle
        elif probe.get("fits") is False:
            high = middle
        else:
            break
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


def search_row(name: str, gpu: bool, remaining: float) -> dict[str, Any]:
    spec = MODELS[name]
    # Each search gets at most half of what is left: one slow search must not starve the rest.
    run_out = run({**base_spec(name, gpu), "kind": "search"}, timeout=max(60.0, min(240.0, remaining / 2)))
    row: dict[str, Any] = {"framework": spec["framework"], "model": spec["model"], "method": "unimem"}
    if "error" in run_out:
        return {**row, "error": run_out}
    row.update({k: run_out[k] for k in ("found", "step_calls", "failed_calls", "compile_calls", "seconds")})
    row.update(same_process_ok=run_out["same_process_ok"], detail=run_out)
    return row


def baseline_rows(name: str, gpu: bool, search: dict[str, Any], budget: float) -> list[dict[str, Any]]:
    """The three baselines on one model, at once (their seconds then overlap: ``concurrent``);
    accelerate from the power of two at or above twice the largest size."""
    spec = MODELS[name]
    true_max = search.get("true_max")
    high = 1 << math.ceil(math.log2(2 * (true_max or search["found"])))

    def one(method: str) -> dict[str, Any]:
        base = {**base_spec(name, gpu), "kind": "baseline", "method": method, "high": high, "budget": budget}
        out = run(base, budget + 120)
        row: dict[str, Any] = {"framework": spec["framework"], "model": spec["model"], "method": method}
        if "error" in out:
            return {**row, "error": out}
        row.update({k: out[k] for k in ("found", "step_calls", "failed_calls", "seconds", "same_process_ok")})
        row.update(compile_calls=None, true_max=true_max, gave_up=out["gave_up"], concurrent=True, detail=out)
        row["share"] = out["found"] / true_max if true_max and out["found"] else None
        return row

    with ThreadPoolExecutor(max_workers=len(BASELINES)) as pool:
        return list(pool.map(one, BASELINES))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "results" / "search-gpu-h200.json"))
    parser.add_argument("--machine", default=None)
    parser.add_argument("--cpu", action="store_true", help="small models and simulated caps on the CPU")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for everything; later work skips")
    parser.add_argument("--baseline-budget", type=float, default=45.0, help="wall seconds per baseline search")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(benchlib.RESULT_MARK + json.dumps(child(json.loads(args.child)), default=str), flush=True)
        return 0
    deadline = time.perf_counter() + args.budget
    gpu = not args.cpu and benchlib.gpu_description() is not None
    result = benchlib.header("search_rows", args.machine, sys.argv)
    result.update(mode="gpu" if gpu else "cpu-simulated", targets=TARGETS, rows=[])
    names = [n.strip() for n in args.models.split(",") if n.strip()]

    def save() -> None:
        benchlib.write(result, args.out)

    # 1. unimem's searches, one at a time (their seconds are the point), each in a fresh process.
    searches: dict[str, dict[str, Any]] = {}
    for name in names:
        if deadline - time.perf_counter() < 60:
            result["rows"].append({"model": MODELS[name]["model"], "method": "unimem", "skipped": "budget"})
            continue
        searches[name] = search_row(name, gpu, deadline - time.perf_counter())
        result["rows"].append(searches[name])
        save()
    # 2. the true largest: each bracket confirmed by fresh processes, all models at once.
    done = {n: r for n, r in searches.items() if "found" in r}
    with ThreadPoolExecutor(max_workers=max(1, len(done))) as pool:
        checks = dict(
            zip(done, pool.map(lambda n: confirm(n, gpu, done[n]["detail"], 90, deadline), done), strict=True)
        )
    for name, check in checks.items():
        row = searches[name]
        row.update(true_max=check["true_max"], true_max_confirmed=check["true_max_confirmed"], reference=check)
        row["share"] = row["found"] / check["true_max"] if check["true_max"] else None
    save()
    # 3. the baselines on the same models: two models' three at once (caps well under the device).
    ready = [n for n in names if "found" in searches.get(n, {})]
    for wave in (ready[i : i + 2] for i in range(0, len(ready), 2)):
        if deadline - time.perf_counter() < args.baseline_budget + 60:
            result["baselines_skipped"] = "the budget ran out (--budget)"
            break
        with ThreadPoolExecutor(max_workers=len(wave)) as pool:
            waves = list(pool.map(lambda n: baseline_rows(n, gpu, searches[n], args.baseline_budget), wave))
        result["rows"] += [base for bases in waves for base in bases]
        save()
    result["summary"] = summary(result["rows"])
    save()
    print(json.dumps(result["summary"], indent=1), file=sys.stderr)
    return 0


def summary(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        if "found" not in row:
            lines.append(f"{row.get('model')} {row.get('method')}: {row.get('skipped') or 'error'}")
            continue
        share = row.get("share")
        lines.append(
            f"{row['framework']:<6} {row['method']:<20} found {row['found']} "
            f"({'?' if share is None else f'{share:.1%}'} of {row.get('true_max')}), {row['step_calls']} calls, "
            f"{row['failed_calls']} failed, {row.get('compile_calls')} compiled, {row['seconds']:.1f} s, "
            f"same process {row['same_process_ok']}" + (" (gave up)" if row.get("gave_up") else "")
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
