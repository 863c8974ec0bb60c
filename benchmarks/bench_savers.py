"""The memory savers on GPT-2 small, in torch and JAX: what each one costs and buys, one row per mode.

The model is written here, the same in both frameworks: GPT-2 small (12 pre-LN blocks, width 768,
12 heads, vocabulary 50257, 1024 tokens, learned positions, GELU MLP 4x wide, tied embedding),
float32; attention is torch's ``scaled_dot_product_attention`` and ``jax.nn.dot_product_attention``
(causal). The LM head and the cross-entropy loss run outside the blocks; each block runs under
the mode's saver:

- ``none``: no saver;
- ``full``: ``unimem.remat(block, "full")`` (keep the block's input only);
- ``matmuls``: ``unimem.remat(block, "matmuls")`` (keep the matrix products and attention);
- ``offload``: ``unimem.remat(block, "offload")`` (saved activations on the host).

Per row, at one batch size (each measurement in a fresh process): ``peak_bytes`` (the device peak
of one training step, ``unimem.track``), ``host_peak_bytes`` (the process's resident peak in that
step, ``track().host_peak``), ``ms_per_sample`` (median of the timed steps after warm-up, over
the batch), and ``largest_batch`` (``unimem.find_batch_size`` in another fresh process; JAX with
``lower=``, XLA's compiled peak of each size). Every row that was to be searched has
``largest_batch`` and ``search``: ``"finished"``, or why there is no answer -- the search ran past
its time (with the compilations and sizes that ran before it was stopped: ``search_seen``), or
it was not started because the budget no longer held its time (a search is started only with
all of it: one cut short answers nothing).

A search is given ``--search-seconds``, by default ``SEARCH_SECONDS`` for its framework: JAX's
GPT-2 compiles each size it tries, tens of seconds a compilation and up to ten of them a search
(docs/measurements.md has the figures).

    python benchmarks/bench_savers.py --out benchmarks/results/savers-gpu-h200.json --machine LABEL [--limit 40GiB]
    python benchmarks/bench_savers.py --frameworks jax --modes matmuls --parts search --limit 40GiB --merge \
        --out benchmarks/results/savers-gpu-h200.json   # one JAX search, into the rows already there
    python benchmarks/bench_savers.py --cpu --out /tmp/savers.json   # a tiny model on the CPU

``--merge`` updates the rows already in ``--out`` (the same framework, mode and cap) with this run's
figures and keeps the others. ``--jobs 2`` runs two modes at once, each in its own process under
its own ``--limit`` (the caps must fit the device together); their rows say ``concurrent``, since
their seconds overlap.

Without a GPU (``--cpu``) the model is tiny, there is no device peak (None), and the largest batch
is searched against a simulated cap: each step raises its framework's own out-of-memory error past
a fixed size, so only the logic is checked.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchlib  # noqa: E402
from jax_adam import Adam, optax_or_none  # noqa: E402

FRAMEWORKS = ("torch", "jax")
MODES = ("none", "full", "matmuls", "offload")
# GPT-2 small on the GPU; on the CPU a model small enough for seconds per row.
GPT2 = {"layers": 12, "width": 768, "heads": 12, "vocab": 50257, "seq": 1024}
TINY = {"layers": 2, "width": 64, "heads": 4, "vocab": 512, "seq": 64}
GPU_BATCH, CPU_BATCH = 8, 2
CPU_CAP = 12  # the simulated largest batch on the CPU
WARMUP, TIMED = 2, 5
# Seconds one search is given (a fresh process: start, warm-up, search). JAX compiles every size it
# tries, GPT-2 for tens of seconds each, up to ten a search: a JAX search is given ten long ones.
SEARCH_SECONDS = {"torch": 120.0, "jax": 420.0}


def _torch_boom() -> None:
    import torch

    torch.empty(1 << 58, dtype=torch.uint8)  # torch's own out-of-memory error on the CPU


def _jax_boom() -> None:
    import jax.numpy as jnp

    jnp.zeros(1 << 58, dtype=jnp.uint8).block_until_ready()  # XLA's own RESOURCE_EXHAUSTED


# --- GPT-2 in torch -------------------------------------------------------------------------------


def torch_model(cfg: dict[str, int], mode: str, gpu: bool) -> tuple[Callable[[int], None], None]:
    """``(step(n), None)``: one AdamW step of GPT-2 on a batch of ``n`` sequences."""
    import torch
    import torch.nn.functional as F

    import unimem

    device = "cuda" if gpu else "cpu"
    torch.manual_seed(0)
    d, heads, seq, vocab = cfg["width"], cfg["heads"], cfg["seq"], cfg["vocab"]

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = torch.nn.Embedding(vocab, d), torch.nn.Embedding(seq, d)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.ln = torch.nn.LayerNorm(d)
            self.run = [b if mode == "none" else unimem.remat(b, mode, backend="torch") for b in self.blocks]

        def forward(self, idx: Any, targets: Any) -> Any:
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in self.run:
                x = block(x)
            logits = self.ln(x) @ self.wte.weight.T  # the LM head and the loss: outside the blocks
            return F.cross_entropy(logits.view(-1, vocab), targets.view(-1))

    model = GPT().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(n: int) -> None:
        if not gpu and n > CPU_CAP:
            _torch_boom()
        idx = torch.randint(0, vocab, (n, seq), device=device)
        loss = model(idx, torch.roll(idx, -1, 1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss)  # waits for the device

    return step, None


# --- GPT-2 in JAX ---------------------------------------------------------------------------------


def jax_model(cfg: dict[str, int], mode: str, gpu: bool) -> tuple[Callable[[int], None], Callable[[int], Any]]:
    """``(step(n), lower(n))``: one AdamW step (optax's, or ``Adam`` on a CPU without optax) of GPT-2,
    and its lowering for a size."""
    import jax
    import jax.numpy as jnp

    import unimem

    optax: Any = optax_or_none(gpu) or Adam  # on a CPU without optax: its AdamW in plain JAX
    d, heads, seq, vocab, layers = cfg["width"], cfg["heads"], cfg["seq"], cfg["vocab"], cfg["layers"]
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 4 * layers + 2))

    def dense(a: int, b: int) -> Any:
        return {"w": jax.random.normal(next(keys), (a, b)) * 0.02, "b": jnp.zeros(b)}

    def norm() -> Any:
        return {"g": jnp.ones(d), "b": jnp.zeros(d)}

    params = {
        "wte": jax.random.normal(next(keys), (vocab, d)) * 0.02,
        "wpe": jax.random.normal(next(keys), (seq, d)) * 0.01,
        "ln": norm(),
        "blocks": [
            {
                "ln1": norm(),
                "ln2": norm(),
                "qkv": dense(d, 3 * d),
                "proj": dense(d, d),
                "fc": dense(d, 4 * d),
                "out": dense(4 * d, d),
            }
            for _ in range(layers)
        ],
    }

    def layer_norm(x: Any, p: Any) -> Any:
        mu = x.mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * p["g"] + p["b"]

    def linear(x: Any, p: Any) -> Any:
        return x @ p["w"] + p["b"]

    def block(x: Any, p: Any) -> Any:
        b, t, _ = x.shape
        q, k, v = jnp.split(linear(layer_norm(x, p["ln1"]), p["qkv"]), 3, axis=-1)
        q, k, v = (z.reshape(b, t, heads, d // heads) for z in (q, k, v))  # BTNH, as the op takes
        a = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, d)
        x = x + linear(a, p["proj"])
        return x + linear(jax.nn.gelu(linear(layer_norm(x, p["ln2"]), p["fc"]), approximate=True), p["out"])

    run = block if mode == "none" else unimem.remat(block, mode, backend="jax")

    def loss_fn(params: Any, idx: Any) -> Any:
        x = params["wte"][idx] + params["wpe"][: idx.shape[1]]
        for p in params["blocks"]:
            x = run(x, p)
        logits = layer_norm(x, params["ln"]) @ params["wte"].T  # the LM head and the loss: outside the blocks
        targets = jnp.roll(idx, -1, axis=1)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    optimizer = optax.adamw(1e-4) if optax is not Adam else Adam(1e-4, 1e-4)
    state = {"params": params, "opt": optimizer.init(params)}

    @jax.jit
    def train(params: Any, opt_state: Any, idx: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, idx)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def step(n: int) -> None:
        if not gpu and n > CPU_CAP:
            _jax_boom()
        idx = jax.random.randint(jax.random.PRNGKey(n), (n, seq), 0, vocab)
        new_params, new_opt, loss = train(state["params"], state["opt"], idx)
        loss.block_until_ready()
        state["params"], state["opt"] = new_params, new_opt

    def lower(n: int) -> Any:
        return train.lower(state["params"], state["opt"], jax.ShapeDtypeStruct((n, seq), jnp.int32))

    return step, lower


# --- one measurement, in a child process ----------------------------------------------------------


def child_measure(spec: dict[str, Any], step: Callable[[int], None]) -> dict[str, Any]:
    """Peaks of one step and the median time of ``TIMED`` steps after ``WARMUP``, at ``spec["batch"]``."""
    import unimem

    n = spec["batch"]
    for _ in range(WARMUP):
        step(n)
    with unimem.track(backend=spec["framework"]) as tracked:
        step(n)
    times = []
    for _ in range(TIMED):
        t0 = time.perf_counter()
        step(n)
        times.append(time.perf_counter() - t0)
    return {
        "peak_bytes": tracked.peak,
        "peak_exact": tracked.peak_exact,
        "host_peak_bytes": tracked.host_peak,
        "ms_per_sample": statistics.median(times) * 1e3 / n,
        "note": tracked.note,
    }


def child_search(spec: dict[str, Any], step: Callable[[int], None], lower: Any) -> dict[str, Any]:
    """The largest batch ``find_batch_size`` finds for this mode."""
    import unimem

    kwargs: dict[str, Any] = {"progress": True}  # a line per trial on stderr, kept on a timeout
    if lower is not None:
        kwargs["lower"] = lower
        if not spec["gpu"]:  # the CPU keeps no figures: hold the predictions against the simulated cap
            from unimem import registry

            kwargs["limit"] = registry.get_backend("jax").search.predict_peak(lower(CPU_CAP))
    step(spec["start"])  # warm-up: state, kernels and handles exist before the search
    result = unimem.find_batch_size(step, start=spec["start"], backend=spec["framework"], return_trials=True, **kwargs)
    return {
        "largest_batch": result.batch_size,
        "search_seconds": result.seconds,
        "step_calls": result.step_calls,
        "failed_calls": result.failed_calls,
        "compile_calls": result.compile_calls,
        "trials": [[t.batch_size, t.fits, t.reason, t.peak, t.predicted] for t in result.trials],
        "notes": list(result.notes),
    }


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import unimem

    if spec["gpu"]:
        unimem.configure(backend=spec["framework"], growth=True, limit=spec["limit"], strict=False)
    build = torch_model if spec["framework"] == "torch" else jax_model
    step, lower = build(spec["cfg"], spec["mode"], spec["gpu"])
    if spec["kind"] == "measure":
        return child_measure(spec, step)
    return child_search(spec, step, lower)


# --- the parent -----------------------------------------------------------------------------------


def row(
    framework: str,
    mode: str,
    gpu: bool,
    deadline: float,
    limit: str | None,
    search_seconds: float | None = None,
    parts: tuple[str, ...] = ("measure", "search"),
) -> dict[str, Any]:
    """One mode in one framework: its measurement and its search (``parts``), each in a fresh process."""
    spec = {
        "framework": framework,
        "mode": mode,
        "gpu": gpu,
        "limit": limit,
        "cfg": GPT2 if gpu else TINY,
        "batch": GPU_BATCH if gpu else CPU_BATCH,
        "start": GPU_BATCH if gpu else CPU_BATCH,
    }
    out: dict[str, Any] = {"framework": framework, "mode": mode, "batch": spec["batch"], "limit": limit}
    script = str(Path(__file__).resolve())
    out["detail"] = {}
    if "measure" in parts:
        timeout = max(30.0, min(300.0, deadline - time.perf_counter()))
        measured = benchlib.run_child(script, {**spec, "kind": "measure"}, timeout, cpu_only=not gpu)
        if "error" in measured:
            out["error"] = measured
        else:
            out.update({k: measured[k] for k in ("peak_bytes", "host_peak_bytes", "ms_per_sample")})
            out["detail"] = {"peak_exact": measured["peak_exact"], "note": measured["note"]}
    if "search" not in parts:
        return out
    allowed = SEARCH_SECONDS[framework] if search_seconds is None else search_seconds
    left = deadline - time.perf_counter()
    if left < allowed:
        return {**out, **not_searched(left, allowed)}
    searched = benchlib.run_child(script, {**spec, "kind": "search"}, allowed, cpu_only=not gpu)
    out["detail"]["search"] = searched
    return {**out, **search_outcome(searched, allowed)}


def not_searched(left: float, allowed: float) -> dict[str, Any]:
    """A row's search not started: the budget's ``left`` seconds no longer hold the ``allowed`` ones."""
    return {
        "largest_batch": None,
        "search": f"not run: {left:.0f} s of the budget were left, and a search is given {allowed:.0f} s "
        "(--search-seconds); run this mode alone, or give --budget more",
    }


def search_outcome(searched: dict[str, Any], allowed: float) -> dict[str, Any]:
    """``largest_batch`` and ``search`` of a row from its search's process: ``"finished"``, or why
    there is no answer, with what the search's progress lines show it saw before it was stopped."""
    if "error" not in searched:
        return {"largest_batch": searched.get("largest_batch"), "search": "finished"}
    seen = progress_seen(searched.get("stderr") or "")
    said = f"did not finish: {searched['error']}"
    if seen["compile_seconds"]:
        times = seen["compile_seconds"]
        said += (
            f", after {len(times)} compilation(s) of {min(times):.0f}-{max(times):.0f} s"
            f" ({allowed:.0f} s given: --search-seconds)"
        )
    return {"largest_batch": None, "search": said, "search_seen": seen}


_COMPILED = re.compile(r"find_batch_size\s+compiled\s+(\d+)\s.*?\s(\d+(?:\.\d+)?) s")
_RAN = re.compile(r"find_batch_size\s+call \d+/\d+\s+(\d+)\s+fits")


def progress_seen(stderr: str) -> dict[str, list[Any]]:
    """What a search's progress lines (``progress=True``, on stderr) show: each compilation's size
    and seconds, and the sizes that ran (``ran``)."""
    compiled = [(int(m[1]), float(m[2])) for m in _COMPILED.finditer(stderr)]
    return {
        "compiled_sizes": [size for size, _ in compiled],
        "compile_seconds": [seconds for _, seconds in compiled],
        "ran": [int(m[1]) for m in _RAN.finditer(stderr)],
    }


# What a row says of how its search ran: replaced, not kept, when the search runs again.
_SEARCH_KEYS = ("search", "search_seen", "concurrent", "caveat")


def merge_rows(before: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``before``'s rows, each updated by this run's row of the same framework, mode and cap (its
    figures over the earlier ones, ``detail`` merged), then this run's rows that matched none."""

    def key(r: dict[str, Any]) -> tuple[Any, ...] | None:
        return None if "model" in r else (r.get("framework"), r.get("mode"), r.get("limit"))

    fresh = {key(r): r for r in rows}
    merged = []
    for old in before:
        new = fresh.pop(key(old), None) if key(old) is not None else None
        if new is None:
            merged.append(old)
            continue
        if new.get("skipped") or str(new.get("search", "")).startswith("not run"):
            # not searched this time: an earlier answer and its outcome stand
            new = {k: v for k, v in new.items() if k not in old or k not in ("largest_batch", "search", "skipped")}
        detail = {**(old.get("detail") or {}), **(new.get("detail") or {})}
        # A new search replaces what was said of how the earlier one ran.
        stale = _SEARCH_KEYS if "search" in new and not str(new["search"]).startswith("not run") else ()
        kept = {k: v for k, v in old.items() if k != "skipped" and k not in stale}
        merged.append({**kept, **new, "detail": detail})
    return merged + list(fresh.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "results" / "savers-gpu-h200.json"))
    parser.add_argument("--machine", default=None)
    parser.add_argument("--cpu", action="store_true", help="a tiny model on the CPU, simulated cap")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--budget", type=float, default=1500.0, help="seconds for everything; later rows skip")
    parser.add_argument("--search-seconds", type=float, default=None,
                        help="the most one search may take (default: per framework, SEARCH_SECONDS)")  # fmt: skip
    parser.add_argument("--limit", default=None, help="a cap for each process on the GPU, e.g. 40GiB (default: none)")
    parser.add_argument("--parts", default="measure,search", help="measure, search or both (rows merged later)")
    parser.add_argument("--merge", action="store_true", help="update the rows already in --out with this run's")
    parser.add_argument("--jobs", type=int, default=1,
                        help="modes at once, each its own process and cap (their rows say concurrent)")  # fmt: skip
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(benchlib.RESULT_MARK + json.dumps(child(json.loads(args.child)), default=str), flush=True)
        return 0
    if args.jobs < 1:
        parser.error(f"--jobs: expected 1 or more modes at once, got {args.jobs}")
    from unimem.sizes import parse_size  # the parent only: children import frameworks first

    deadline = time.perf_counter() + args.budget
    gpu = not args.cpu and benchlib.gpu_description() is not None
    total = benchlib.gpu_total_bytes() if gpu and args.limit and args.jobs > 1 else None
    if total is not None and args.jobs * parse_size(args.limit) > total:
        # Caps that add up past the device measure the other processes, not each cap.
        parser.error(
            f"--jobs {args.jobs} x --limit {args.limit} is more than the GPU's {total / 2**30:.0f} GiB: "
            f"run at most {total // parse_size(args.limit)} at once"
        )
    result = benchlib.header("savers", args.machine, sys.argv)
    result.update(mode="gpu" if gpu else "cpu", model=GPT2 if gpu else TINY)
    earlier = benchlib.earlier(args.out) if args.merge else None
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    limit = args.limit if gpu else None
    benchlib.add_source(result, earlier, f"{', '.join(frameworks)}: {', '.join(modes)} ({', '.join(parts)})")
    rows: list[dict[str, Any]] = []
    result["rows"] = [] if earlier is None else earlier.get("rows", [])
    # "none" and "full" in every framework first: when the budget runs out, the comparison stands.
    first = [m for m in modes if m in ("none", "full")]
    order = [(f, m) for f in frameworks for m in first] + [(f, m) for f in frameworks for m in modes if m not in first]

    def one(framework: str, mode: str) -> dict[str, Any]:
        if deadline - time.perf_counter() < 30:
            skipped = {"framework": framework, "mode": mode, "limit": limit, "skipped": "budget"}
            return {**skipped, **({"largest_batch": None, "search": "not run: budget"} if "search" in parts else {})}
        done = row(framework, mode, gpu, deadline, limit, args.search_seconds, parts)
        searched = "search" in parts and not str(done.get("search", "")).startswith("not run")
        return {**done, "concurrent": args.jobs} if searched else done

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for done in pool.map(one, *zip(*order, strict=True)) if order else []:
            rows.append(done)
            result["rows"] = rows if earlier is None else merge_rows(earlier.get("rows", []), rows)
            benchlib.write(result, args.out)  # saved as it goes: a run stopped early keeps its rows
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
