"""``unimem.estimate_memory`` against what a step measures on a GPU: one row per model, batch size,
precision and saver.

For each model the estimate (in a fresh process; torch under fake tensors, JAX compiled in a fresh
process of its own) finds the largest batch size whose step fits ``--cap`` (default 24 GiB), and
predicts that size, half of it and a quarter of it. Each size is then measured in a fresh process,
the same step code as the estimate ran:

- torch: one step, ``torch.cuda.reset_peak_memory_stats()``, the second step (the optimizer's state
  then exists): ``max_memory_allocated`` is ``measured_peak``, ``max_memory_reserved``
  ``measured_reserved``;
- JAX (growth on): the step is compiled first in another process that fills a persistent
  compilation cache; the measured process loads it from there (no autotuning runs in it, so the
  compilation's own buffers stay out), makes the arrays and runs the step once:
  ``peak_bytes_in_use`` after the run is ``measured_peak`` (``peak_before_run`` is beside it; the
  run set the peak where it is higher).

Models: transformers' GPT-2 small (``GPT2LMHeadModel(GPT2Config())``, 1024 tokens, AdamW) in float32
and under bf16 autocast, each without a saver and with every ``GPT2Block`` saved (``full``); timm's
ResNet-50 (224 x 224, AdamW); the search rows' torch transformer (``nn.TransformerEncoder``, 4 layers,
d 1024, 16 heads, 4096 wide, 256 tokens); the search rows' Flax MLP and JAX transformer (their own
definitions, imported from ``bench_search_rows.py``). Rows of kind ``"estimate"``.

Rows of kind ``"search"`` (``--kinds search``; GPT-2 small under bf16 autocast): the batch search
sized from the estimate, in one fresh process under the cap (``unimem.configure(limit=cap)``): the
estimate (``target=cap``), then ``find_batch_size(step, start=estimate.largest, lower=estimate)`` on
the real model, its calls, failures, answer and seconds; then the truth, the same step function in
fresh processes under the same cap, three calls each (the second holds the optimizer's state, the
third shows nothing more grows), at the answer and the sizes next to it until one runs and the next
does not: ``share`` is the answer over that largest size. Run with ``--kinds`` naming only some kinds,
the file's rows of the other kinds are kept.

    python benchmarks/bench_estimate.py --out benchmarks/results/estimate-gpu-h200.json --machine LABEL
    python benchmarks/bench_estimate.py --kinds search --out benchmarks/results/estimate-gpu-h200.json --machine LABEL
    python benchmarks/bench_estimate.py --cpu-plan --out benchmarks/results/estimate-cpu-plan.json
    python benchmarks/bench_estimate.py --smoke --kinds estimate,search --out /tmp/estimate-smoke.json   # the CPU

``--cpu-plan`` makes the torch rows' estimates on a machine without a GPU, for the CUDA target, at the
sizes of the GPU file when it is there: set beside it, they show what a CPU machine plans for the GPU.
``--smoke`` runs the same path on the CPU with tiny models (torch's measured on a real CPU run by the
estimate's own tracker, in exact bytes; JAX's not measured, the CPU keeping no peak). Its search rows
hold the tracker's peaks to ``limit=`` (``measure=``), the cap nothing enforces on the CPU: the
truth is then the largest size whose three calls all peak within it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchlib  # noqa: E402

GIB = 2**30
CAP = "24GiB"
SCRIPT = str(Path(__file__).resolve())
GPU_FILE = HERE / "results" / "estimate-gpu-h200.json"


def _model(framework: str, net: str, start: list[int], precision: str | None = None, saver: str | None = None) -> dict:
    return {"framework": framework, "net": net, "precision": precision, "saver": saver, "start": start}


MODELS: dict[str, dict[str, Any]] = {
    "gpt2-fp32": _model("torch", "gpt2", [4, 8]),
    "gpt2-bf16": _model("torch", "gpt2", [4, 8], precision="bf16"),
    "gpt2-fp32-full": _model("torch", "gpt2", [8, 16], saver="full"),
    "gpt2-bf16-full": _model("torch", "gpt2", [8, 16], precision="bf16", saver="full"),
    "resnet50": _model("torch", "resnet50", [32, 64]),
    "torch-transformer": _model("torch", "transformer", [8, 16]),
    "flax-mlp": _model("jax", "flax-mlp", [4096, 65536]),
    "jax-transformer": _model("jax", "jax-transformer", [8, 16]),
}
SMOKE_MODELS: dict[str, dict[str, Any]] = {
    "tiny-torch-mlp": _model("torch", "tiny", [4, 8]),
    "tiny-jax-mlp": _model("jax", "jax-mlp", [64, 256]),
}
# The models the search rows run by default (``--models`` names others).
SEARCHED = ("gpt2-bf16", "tiny-torch-mlp")
# Seconds a child may take: an estimate (several sizes), a compilation, a measured step, an estimate
# and the search after it, one size's truth.
TIMEOUTS = {"estimate": 240.0, "compile": 120.0, "measure": 120.0, "search": 360.0, "truth": 120.0}
# Calls of the step in each process that measures the truth: the first makes the optimizer's state.
TRUTH_CALLS = 3
# Fresh processes the truth may take per model, each at one size.
TRUTH_PROBES = 6


# --- the steps (built in a child; the same code for the estimate and the measurement) -----------------


def torch_build(net: str, precision: str | None, saver: str | None, device: str) -> Callable[[], Any]:
    """``build()`` for ``unimem.estimate_memory`` and for the measured run alike: the model made on
    ``device``, the saver applied, autocast around the forward pass."""
    import torch

    import unimem

    def build() -> Callable[[int], None]:
        with torch.device(device):
            model, inputs, loss_of, match = _torch_net(torch, net)
        if saver is not None:
            unimem.remat_model(model, saver, match=match)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision or "")
        autocast = (lambda: torch.autocast(device, dtype=dtype)) if dtype else contextlib.nullcontext

        def step(n: int) -> None:
            batch = inputs(n)
            with autocast():
                loss = loss_of(model, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step

    return build


def _torch_net(torch: Any, net: str) -> tuple[Any, Callable[[int], Any], Callable[[Any, Any], Any], Any]:
    """``(model, inputs(n), loss(model, batch), the block a saver picks)``, made under the caller's device."""
    device = torch.get_default_device()
    if net == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config()).train()
        tokens = lambda n: torch.randint(0, 50257, (n, 1024), device=device)  # noqa: E731
        return model, tokens, lambda m, x: m(x, labels=x).loss, "GPT2Block"
    if net == "resnet50":
        import timm

        model = timm.create_model("resnet50", pretrained=False).train()
        images = lambda n: (torch.randn(n, 3, 224, 224, device=device), torch.randint(0, 1000, (n,), device=device))  # noqa: E731
        return model, images, lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]), "Bottleneck"
    if net == "tiny":  # the smoke's: no deep copy (the CPU tracker sees no storage a deep copy makes)
        blocks = [torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 256), torch.nn.GELU(),
                                      torch.nn.Linear(256, 64)) for _ in range(2)]  # fmt: skip
        vectors = lambda n: torch.randn(n, 16, 64, device=device)  # noqa: E731
        return torch.nn.Sequential(*blocks), vectors, lambda m, x: m(x).pow(2).mean(), "Sequential"
    d, heads, wide, depth, tokens_per = 1024, 16, 4096, 4, 256
    layer = torch.nn.TransformerEncoderLayer(d, heads, wide, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
    samples = lambda n: torch.randn(n, tokens_per, d, device=device)  # noqa: E731
    return model, samples, lambda m, x: m(x).float().pow(2).mean(), "TransformerEncoderLayer"


def jax_step(net: str, gpu: bool) -> tuple[Any, dict[str, Any], Callable[[int], tuple[Any, Any]]]:
    """``(train, {"params", "opt"}, abstract(n))``: the search rows' model (``bench_search_rows.py``)
    trained with optax, its state, and the abstract batch of size ``n``."""
    import jax
    import jax.numpy as jnp
    from bench_search_rows import JAX_MODELS
    from jax_adam import Adam, optax_or_none

    spec = JAX_MODELS[net](gpu)
    optax: Any = optax_or_none(gpu)
    if optax is None:  # the CPU machine has no optax: the same update in plain JAX
        optimizer: Any = Adam(1e-3, 0.0) if spec.optimizer == "adam" else Adam(1e-4, 1e-4)
        optax = Adam
    else:
        optimizer = optax.adam(1e-3) if spec.optimizer == "adam" else optax.adamw(1e-4)
    state = {"params": spec.params, "opt": optimizer.init(spec.params)}

    @jax.jit
    def train(params: Any, opt_state: Any, x: Any, y: Any) -> Any:
        loss, grads = jax.value_and_grad(spec.loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def abstract(n: int) -> tuple[Any, Any]:
        return (
            jax.ShapeDtypeStruct((n, *spec.x_shape), jnp.float32),
            jax.ShapeDtypeStruct((n, *spec.y_shape), spec.y_dtype),
        )

    return train, state, abstract


# --- what a child does -------------------------------------------------------------------------------


def _sizes_of(largest: int | None) -> list[tuple[str, int]]:
    if not largest:
        return []
    found = {"largest": largest, "half": max(1, largest // 2), "quarter": max(1, largest // 4)}
    return list({n: (role, n) for role, n in reversed(found.items())}.values())[::-1]


def _row(name: str, spec: dict[str, Any], role: str, size: Any) -> dict[str, Any]:
    return {
        "kind": "estimate", "model": name, "framework": spec["framework"], "batch": size.batch, "role": role,
        "precision": spec["precision"] or "fp32", "saver": spec["saver"] or "none", "device": size.device,
        "predicted_peak": size.peak, "predicted_reserved": size.reserved, "predicted_required": size.required,
        "parts": size.parts, "estimate_seconds": round(size.seconds, 2),
        "estimate_cpu_seconds": round(size.cpu_seconds, 2), "estimate_host_peak": size.host_peak,
        "notes": list(size.notes), "unseen": list(size.unseen),
    }  # fmt: skip


def child_estimate(job: dict[str, Any]) -> dict[str, Any]:
    import unimem

    spec, device = job["spec"], job["device"]
    if spec["framework"] == "torch":
        step: Any = torch_build(spec["net"], spec["precision"], spec["saver"], device)
    else:
        train, state, abstract = jax_step(spec["net"], job["gpu"])
        step = lambda n: (train, (state["params"], state["opt"], *abstract(n)))  # noqa: E731
    fixed = job.get("sizes")
    estimate = unimem.estimate_memory(
        step, fixed or spec["start"], target=None if fixed else job["cap"], backend=spec["framework"],
        device=device if spec["framework"] == "torch" else None, max_runs=job["max_runs"],
    )  # fmt: skip
    sizes = [(role, n) for role, n in fixed_roles(fixed)] if fixed else _sizes_of(estimate.largest)
    rows = []
    for role, n in sizes:
        estimate.peak_at(n)
        rows.append(_row(job["name"], spec, role, estimate.sizes[n]))
    return {"rows": rows, "largest": estimate.largest, "above": estimate.above, "search_sizes": sorted(estimate.sizes)}


def fixed_roles(sizes: list[int]) -> list[tuple[str, int]]:
    return [("given", n) for n in sizes]


def child_measure_torch(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    spec, n, device = job["spec"], job["batch"], job["device"]
    torch.manual_seed(0)
    build = torch_build(spec["net"], spec["precision"], spec["saver"], device)
    if device == "cuda":
        step = build()
        step(n)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step(n)
        torch.cuda.synchronize()
        return {
            "measured_peak": torch.cuda.max_memory_allocated(),
            "measured_reserved": torch.cuda.max_memory_reserved(),
        }
    from unimem.backends.torch._recorder import Phases, make_recorder

    from unimem.estimate.trace import replay
    from unimem.step_estimates import Trace

    trace = Trace(caching=False)  # a real CPU run, every storage counted in exact bytes by the estimate's tracker
    with make_recorder(trace, Phases()):
        step = build()
        step(n)
        trace.window = len(trace.events)
        step(n)
    return {"measured_peak": replay(trace).peak, "measured_reserved": None}


def _jax_cache(job: dict[str, Any]) -> None:
    import jax

    jax.config.update("jax_compilation_cache_dir", job["cache"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def child_compile_jax(job: dict[str, Any]) -> dict[str, Any]:
    _jax_cache(job)
    train, state, abstract = jax_step(job["spec"]["net"], job["gpu"])
    started = time.perf_counter()
    train.lower(state["params"], state["opt"], *abstract(job["batch"])).compile()
    return {"compile_seconds": round(time.perf_counter() - started, 2)}


def child_measure_jax(job: dict[str, Any]) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    _jax_cache(job)
    train, state, abstract = jax_step(job["spec"]["net"], job["gpu"])
    x_spec, y_spec = abstract(job["batch"])
    started = time.perf_counter()
    compiled = train.lower(state["params"], state["opt"], x_spec, y_spec).compile()  # from the cache
    seconds = round(time.perf_counter() - started, 2)
    x, y = jnp.ones(x_spec.shape, x_spec.dtype), jnp.zeros(y_spec.shape, y_spec.dtype)
    device = jax.devices()[0]
    before = (device.memory_stats() or {}).get("peak_bytes_in_use")
    jax.block_until_ready(compiled(state["params"], state["opt"], x, y))
    after = (device.memory_stats() or {}).get("peak_bytes_in_use")
    return {"measured_peak": after, "peak_before_run": before, "load_seconds": seconds, "measured_reserved": None}


class HostTally:
    """On the CPU (the smoke), each call's peak of bytes in use, counted by the estimate's tracker in
    exact bytes: a recorder over the whole process from before the model is built, read from where
    the call began (``measure=`` for the search)."""

    def __init__(self) -> None:
        from unimem.backends.torch._recorder import Phases, make_recorder

        from unimem.step_estimates import Trace

        self.trace = Trace(caching=False)
        self.recorder = make_recorder(self.trace, Phases())
        self.began = 0

    def call(self, step: Callable[[int], Any], n: int) -> None:
        self.began = len(self.trace.events)
        step(n)

    def peak(self) -> int:
        from unimem.estimate.trace import replay
        from unimem.step_estimates import Trace

        events = self.trace.events
        return replay(Trace(events, self.trace.categories, self.began, caching=False)).peak


def _trial(trial: Any) -> dict[str, Any]:
    keys = ("batch_size", "fits", "reason", "peak", "peak_reserved", "predicted", "seconds", "error")
    return {key: getattr(trial, key) for key in keys}


def child_search_torch(job: dict[str, Any]) -> dict[str, Any]:
    """The estimate under the cap, then the batch search sized from it on the real model."""
    import unimem

    spec, device, cap = job["spec"], job["device"], job["cap"]
    if device == "cuda":
        unimem.configure(backend="torch", limit=cap)  # the cap the step runs under, set before CUDA starts
    build = torch_build(spec["net"], spec["precision"], spec["saver"], device)
    began = time.perf_counter()
    estimate = unimem.estimate_memory(build, spec["start"], target=cap, backend="torch", device=device,
                                      max_runs=job["max_runs"])  # fmt: skip
    estimated = time.perf_counter() - began
    if estimate.largest is None:
        return {"error": f"no batch size fits {cap} by the estimate", "estimate_sizes": sorted(estimate.sizes)}
    tally = HostTally() if device == "cpu" else None
    with tally.recorder if tally is not None else contextlib.nullcontext():
        step = build()
        if tally is None:
            found = unimem.find_batch_size(step, start=estimate.largest, lower=estimate, backend="torch",
                                           return_trials=True)  # fmt: skip
        else:  # nothing holds the CPU to the cap: the tracker's peaks are held to it
            found = unimem.find_batch_size(lambda n: tally.call(step, n), start=estimate.largest,
                                           lower=estimate, backend="torch", limit=cap, measure=tally.peak,
                                           return_trials=True)  # fmt: skip
    return {
        "estimate_largest": estimate.largest, "estimate_above": estimate.above,
        "estimate_seconds": round(estimated, 2), "estimate_sizes": sorted(estimate.sizes),
        "found": found.batch_size, "step_calls": found.step_calls, "failed_calls": found.failed_calls,
        "converged": found.converged, "search_seconds": round(found.seconds, 2),
        "compile_calls": found.compile_calls, "limit": found.limit,
        "trials": [_trial(t) for t in (*found.trials, *found.confirmations)], "notes": list(found.notes),
        "predicted": estimate.sizes[found.batch_size].as_dict() if found.batch_size in estimate.sizes else None,
    }  # fmt: skip


def child_truth_torch(job: dict[str, Any]) -> dict[str, Any]:
    """One size of the search's step in a fresh process under the same cap: ``TRUTH_CALLS`` calls, and
    whether every one ran (on the CPU: whether each peaked within the cap, by the tracker)."""
    import torch

    import unimem

    spec, n, device = job["spec"], job["batch"], job["device"]
    if device == "cuda":
        unimem.configure(backend="torch", limit=job["cap"])
    torch.manual_seed(0)
    build = torch_build(spec["net"], spec["precision"], spec["saver"], device)
    tally = HostTally() if device == "cpu" else None
    peaks: list[int] = []
    with tally.recorder if tally is not None else contextlib.nullcontext():
        step = build()
        for _ in range(TRUTH_CALLS):
            try:
                if tally is not None:
                    tally.call(step, n)
                    peaks.append(tally.peak())
                else:
                    torch.cuda.reset_peak_memory_stats()
                    step(n)
                    torch.cuda.synchronize()
                    peaks.append(torch.cuda.max_memory_allocated())
            except Exception as exc:
                if not unimem.is_oom(exc):
                    raise
                return {"runs": False, "peaks": peaks, "error": str(exc).strip().splitlines()[0][:200]}
    runs = device != "cpu" or max(peaks) <= unimem.parse_size(job["cap"])
    reserved = torch.cuda.max_memory_reserved() if device == "cuda" else None  # over the three calls
    return {"runs": runs, "peaks": peaks, "peak_reserved": reserved, "error": None if runs else "past the cap"}


CHILDREN: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "estimate": child_estimate,
    "measure-torch": child_measure_torch,
    "compile-jax": child_compile_jax,
    "measure-jax": child_measure_jax,
    "search-torch": child_search_torch,
    "truth-torch": child_truth_torch,
}


def child(job: dict[str, Any]) -> None:
    if job.get("preallocate") is False:
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # growth on: the pool takes what the step needs
    print(benchlib.RESULT_MARK + json.dumps(CHILDREN[job["what"]](job), default=str), flush=True)


# --- the parent ----------------------------------------------------------------------------------------


def _run(job: dict[str, Any], cpu_only: bool) -> dict[str, Any]:
    return benchlib.run_child(SCRIPT, job, TIMEOUTS[job["what"].split("-")[0]], cpu_only=cpu_only)


def measure_rows(name: str, spec: dict[str, Any], rows: list[dict[str, Any]], job: dict[str, Any]) -> None:
    """Each row's size measured in a fresh process (JAX: compiled in another first), figures merged in."""
    for row in rows:
        base = dict(job, spec=spec, batch=row["batch"], name=name)
        if spec["framework"] == "jax":
            with tempfile.TemporaryDirectory() as cache:
                base["cache"] = cache
                compiled = _run(dict(base, what="compile-jax"), job["cpu_only"])
                found = _run(dict(base, what="measure-jax"), job["cpu_only"]) if "error" not in compiled else compiled
                found |= {k: v for k, v in compiled.items() if k != "error"}
        else:
            found = _run(dict(base, what="measure-torch"), job["cpu_only"])
        row.update(found)
        measured = row.get("measured_peak")
        row["ratio"] = round(row["predicted_peak"] / measured, 4) if measured else None
        if row.get("measured_reserved") and row.get("predicted_reserved"):
            row["ratio_reserved"] = round(row["predicted_reserved"] / row["measured_reserved"], 4)


def estimate_rows(models: dict[str, dict[str, Any]], args: argparse.Namespace, result: dict[str, Any]) -> None:
    """The estimate's rows: per model, its largest size under the cap, half and a quarter of it, each
    predicted and (unless planning on the CPU) measured."""
    gpu_sizes = _gpu_sizes() if args.cpu_plan else {}
    deadline = time.monotonic() + args.budget
    for name, spec in models.items():
        if time.monotonic() > deadline:
            result["skipped"].append({"model": name, "why": f"the budget of {args.budget:.0f} s was spent"})
            continue
        device = "cpu" if args.smoke and spec["framework"] == "torch" else "cuda"
        job = {"what": "estimate", "name": name, "spec": spec, "device": device, "cap": args.cap,
               "gpu": not args.cpu_only, "max_runs": args.max_runs, "preallocate": False,
               "cpu_only": args.cpu_only, "sizes": gpu_sizes.get(name)}  # fmt: skip
        found = _run(job, args.cpu_only)
        if "error" in found:
            result["skipped"].append({"model": name, "why": found})
            continue
        result["largest"][name] = {k: found[k] for k in ("largest", "above", "search_sizes")}
        if not args.cpu_plan:
            # The smoke measures its torch model's largest size only, to stay within a minute.
            measured = [r for r in found["rows"] if r["role"] == "largest" and r["framework"] == "torch"]
            measure_rows(name, spec, measured if args.smoke else found["rows"], job)
        result["rows"] += found["rows"]
        benchlib.write(result, args.out)


def _gpu_sizes() -> dict[str, list[int]]:
    """The batch sizes the GPU file measured, per model (the CPU plan predicts the same ones)."""
    if not GPU_FILE.is_file():
        return {}
    sizes: dict[str, list[int]] = {}
    for row in json.loads(GPU_FILE.read_text()).get("rows", []):
        if row.get("kind") == "estimate" and row.get("framework") == "torch":
            sizes.setdefault(row["model"], []).append(row["batch"])
    return sizes


def bracket(runs: Callable[[int], dict[str, Any]], answer: int, most: int = TRUTH_PROBES) -> dict[str, Any]:
    """The largest size that runs, probed around ``answer`` (``runs(n)``: one fresh process's outcome):
    down from the answer until one runs, then up from the largest that ran until one does not, in at
    most ``most`` probes. ``true_max`` is None where the probes ran out before both sides were seen."""
    probes: dict[int, dict[str, Any]] = {}
    size = answer
    while len(probes) < most and size >= 1:
        probes[size] = runs(size)
        if probes[size]["runs"]:
            break
        size -= 1
    ran = max((n for n, p in probes.items() if p["runs"]), default=0)
    size = ran + 1
    while ran and len(probes) < most and size not in probes:
        probes[size] = runs(size)
        if not probes[size]["runs"]:
            break
        ran, size = size, size + 1
    top = ran if ran and ran + 1 in probes and not probes[ran + 1]["runs"] else None
    return {"probes": [{"batch": n, **probes[n]} for n in sorted(probes)], "true_max": top}


def search_row(name: str, spec: dict[str, Any], found: dict[str, Any], truth: dict[str, Any], cap: str) -> dict:
    """One search row: the estimate, the search and the truth; ``share`` is the answer over the truth."""
    top = truth["true_max"]
    share = round(found["found"] / top, 4) if top else None
    meets = bool(share is not None and share >= 0.97 and found["step_calls"] <= 2 and found["failed_calls"] == 0)
    return {"kind": "search", "model": name, "framework": spec["framework"], "precision": spec["precision"] or "fp32",
            "saver": spec["saver"] or "none", "cap": cap, **found, **truth, "share": share,
            "meets": meets}  # fmt: skip


def _truth(job: dict[str, Any], cpu_only: bool, n: int) -> dict[str, Any]:
    return _run(dict(job, what="truth-torch", batch=n), cpu_only)


def search_rows(models: dict[str, dict[str, Any]], args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Per torch model (``SEARCHED`` unless ``--models`` names them): the search sized from the estimate
    under the cap, then the truth around its answer, each in fresh processes."""
    chosen = {n: s for n, s in models.items() if s["framework"] == "torch" and (args.models or n in SEARCHED)}
    deadline = time.monotonic() + args.budget
    for name, spec in chosen.items():
        if time.monotonic() > deadline:
            result["skipped"].append({"kind": "search", "model": name, "why": f"the budget of {args.budget:.0f} s"})
            continue
        device = "cpu" if args.smoke else "cuda"
        job = {"spec": spec, "device": device, "cap": args.cap, "max_runs": args.max_runs, "name": name}
        found = _run(dict(job, what="search-torch"), args.cpu_only)
        if "error" in found:
            result["skipped"].append({"kind": "search", "model": name, "why": found})
            continue
        truth = bracket(partial(_truth, job, args.cpu_only), found["found"])
        result["rows"].append(search_row(name, spec, found, truth, args.cap))
        benchlib.write(result, args.out)


# Each kind of row and what makes it.
ROWS: dict[str, Callable[[dict[str, dict[str, Any]], argparse.Namespace, dict[str, Any]], None]] = {
    "estimate": estimate_rows,
    "search": search_rows,
}


def keep_other_kinds(result: dict[str, Any], before: dict[str, Any] | None, kinds: list[str]) -> None:
    """The rows of ``before`` (the file written earlier) of kinds this run does not make, kept; and
    where this run makes no estimate rows, the estimate's ``largest`` and ``skipped`` entries too."""
    if before is None:
        return
    result["rows"] = [r for r in before.get("rows", []) if r.get("kind") not in kinds] + result["rows"]
    if "estimate" not in kinds:
        result["largest"] = before.get("largest", {}) | result["largest"]
        result["skipped"] = [s for s in before.get("skipped", []) if s.get("kind", "estimate") not in kinds]
    benchlib.add_source(result, before, f"kinds {', '.join(kinds)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    parser.add_argument("--machine", default=None)
    parser.add_argument("--cap", default=CAP, help="the memory the largest batch must fit (default 24GiB)")
    parser.add_argument("--models", default=None, help="comma-separated names (default: all)")
    parser.add_argument("--kinds", default="estimate", help=f"comma-separated kinds of rows: {', '.join(ROWS)}")
    parser.add_argument("--max-runs", type=int, default=5, help="estimates the search for the largest may add")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds, after which no model is started")
    parser.add_argument("--smoke", action="store_true", help="the CPU, tiny models, a small cap")
    parser.add_argument("--cpu-plan", action="store_true", help="torch's estimates for CUDA, made without a GPU")
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    args.cpu_only = args.smoke or args.cpu_plan
    models = SMOKE_MODELS if args.smoke else MODELS
    if args.cpu_plan:
        models = {name: spec for name, spec in models.items() if spec["framework"] == "torch"}
    if args.models:
        models = {name: models[name] for name in args.models.split(",")}
    if args.smoke and args.cap == CAP:
        args.cap, args.max_runs = "24MiB", min(args.max_runs, 3)
    out = args.out or str(HERE / "results" / ("estimate-cpu-plan.json" if args.cpu_plan else "estimate-gpu-h200.json"))
    args.out = out
    command = ["benchmarks/bench_estimate.py", *(argv if argv is not None else sys.argv[1:])]
    result = benchlib.header("estimate", args.machine, command) | {
        "cap": args.cap,
        "rows": [],
        "largest": {},
        "skipped": [],
    }
    kinds = args.kinds.split(",")
    unknown = [kind for kind in kinds if kind not in ROWS]
    if unknown:
        parser.error(f"--kinds: {', '.join(unknown)} unknown (the kinds: {', '.join(ROWS)})")
    keep_other_kinds(result, benchlib.earlier(out), kinds)
    started = time.monotonic()
    for kind in kinds:
        ROWS[kind](models, args, result)
    result["seconds"] = round(time.monotonic() - started, 1)
    benchlib.write(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
