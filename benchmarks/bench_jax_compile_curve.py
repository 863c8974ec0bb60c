"""What XLA's compiled program says at each batch size: the curve the JAX batch search reads.

For each model and a ladder of batch sizes, one process per model (configured as the search's rows
are), this compiles the training step and records XLA's memory analysis (arguments, outputs,
temporaries, aliases, peak), whether the compiled program holds rematerialized clones (XLA names
them ``*.remat*``), and the seconds the compilation took; optionally the same with autotuning off
(``xla_gpu_autotune_level=0``), to see what the autotuner costs and whether it moves the figures.

    python benchmarks/bench_jax_compile_curve.py --out curve.json [--budget 500] [--models a,b]

Models: ``jax-mlp`` and ``jax-transformer`` (those of bench_search_rows.py, under an 8 GiB cap,
growth on) and ``flax-mlp`` (Flax linen, 8 x Dense(1024) + ReLU, Adam, the whole device, growth on).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LADDERS = {
    "jax-mlp": [64, 709, 1418, 4096, 16384, 40950, 42001, 62504],
    "jax-transformer": [2, 8, 23, 46, 52, 54],
    "flax-mlp": [8, 1024, 65536, 262144, 524288, 860000, 1048576, 1500000, 2080000],
}
CONFIGURE = {
    "jax-mlp": {"growth": True, "limit": "8GiB"},
    "jax-transformer": {"growth": True, "limit": "8GiB"},
    "flax-mlp": {"growth": True},
}


def _flax_mlp() -> Any:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            for _ in range(8):
                x = nn.relu(nn.Dense(1024)(x))
            return nn.Dense(10)(x)

    model = MLP()
    params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 1024)))
    tx = optax.adam(1e-3)
    opt = tx.init(params)

    @jax.jit
    def train(params: Any, opt: Any, x: Any, y: Any) -> Any:
        def loss_fn(p: Any) -> Any:
            return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    def lower(n: int) -> Any:
        x = jax.ShapeDtypeStruct((n, 1024), jnp.float32)
        y = jax.ShapeDtypeStruct((n,), jnp.int32)
        return train.lower(params, opt, x, y)

    return lower


def _plain(name: str) -> Any:
    import jax
    import jax.numpy as jnp
    import optax

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_search_rows import _jax_mlp, _jax_transformer

    model = (_jax_mlp if name == "jax-mlp" else _jax_transformer)(True)
    params, loss_fn, x_shape, y_shape = model.params, model.loss_fn, model.x_shape, model.y_shape
    optimizer = optax.adamw(1e-4)
    opt = optimizer.init(params)

    @jax.jit
    def train(params: Any, opt_state: Any, x: Any, y: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def lower(n: int) -> Any:
        x = jax.ShapeDtypeStruct((n, *x_shape), jnp.float32)
        y = jax.ShapeDtypeStruct((n, *y_shape), jnp.float32)
        return train.lower(params, opt, x, y)

    return lower


def _analysis(compiled: Any) -> dict[str, Any]:
    a = compiled.memory_analysis()
    text = compiled.as_text() or ""
    return {
        "args": int(a.argument_size_in_bytes),
        "out": int(a.output_size_in_bytes),
        "temp": int(a.temp_size_in_bytes),
        "alias": int(a.alias_size_in_bytes),
        "peak": int(getattr(a, "peak_memory_in_bytes", 0) or 0),
        "remat_names": text.count(".remat"),
        "text_chars": len(text),
    }


def child(name: str, budget: float, out: str, autotune_off: bool) -> None:
    import unimem

    unimem.configure(backend="jax", **CONFIGURE[name])
    lower = _flax_mlp() if name == "flax-mlp" else _plain(name)
    began = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for n in LADDERS[name]:
        if time.perf_counter() - began > budget:
            rows.append({"n": n, "skipped": "budget"})
            break
        row: dict[str, Any] = {"n": n}
        variants = [("off", {"xla_gpu_autotune_level": 0})] if autotune_off else []
        variants.append(("default", None))
        for label, options in variants:
            t0 = time.perf_counter()
            try:
                lowered = lower(n)
                compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
                row[label] = {"seconds": round(time.perf_counter() - t0, 3), **_analysis(compiled)}
            except Exception as exc:  # recorded: a size XLA refused is a point of the curve too
                row[label] = {
                    "seconds": round(time.perf_counter() - t0, 3),
                    "error": f"{type(exc).__name__}: {exc}"[:400],
                }
        stats = unimem.stats(backend="jax")
        row["pool"] = {"reserved": stats.reserved, "allocated": stats.allocated, "limit": stats.limit,
                       "largest_free_block": stats.largest_free_block}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
        Path(out).write_text(json.dumps({"model": name, "configure": CONFIGURE[name], "rows": rows}, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget", type=float, default=500.0, help="seconds for all models")
    parser.add_argument("--models", default=",".join(LADDERS))
    parser.add_argument("--autotune-off", action="store_true", help="also compile each size with autotuning off")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-budget", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.child_budget, args.out, args.autotune_off)
        return 0
    models = args.models.split(",")
    began = time.perf_counter()
    results = []
    for i, name in enumerate(models):
        left = args.budget - (time.perf_counter() - began)
        share = left / (len(models) - i)
        part = f"{args.out}.{name}.json"
        cmd = [sys.executable, __file__, "--child", name, "--child-budget", str(share * 0.8), "--out", part]
        if args.autotune_off:
            cmd.append("--autotune-off")
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(cmd, timeout=share, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        if Path(part).exists():
            results.append(json.loads(Path(part).read_text()))
        Path(args.out).write_text(json.dumps({"benchmark": "jax_compile_curve", "models": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
