"""The memory savers on transformers' GPT-2 small, as a user runs it: one row per mode.

The model is ``GPT2LMHeadModel(GPT2Config())`` (12 layers, width 768, 1024 positions; random
weights, nothing downloaded) in train mode, fp32, SDPA attention, dropout 0.1 as configured; each
mode in a fresh process under a 24 GiB cap (``unimem.configure(limit=...)``):

- ``none``: no saver;
- ``full``, ``matmuls``, ``offload``: ``unimem.remat_model(model, mode, match="GPT2Block")``.

Per row: ``peak_bytes`` (the device peak of one AdamW step at ``batch``, ``unimem.track``),
``host_peak_bytes``, ``ms_per_sample`` (median of the timed steps over the batch),
``largest_batch`` (``unimem.find_batch_size``, a few trials), and ``grad_equal``: max over
parameters of |g_mode - g_none| over the global norm of g_none, at a small batch with the same
seed (the ``none`` row holds ``floor``: the same figure for two plain runs, what the kernels
differ run to run). The ``none`` process writes its gradients to a temporary file the later
processes compare with.

    python benchmarks/bench_savers_gpt2.py --out benchmarks/results/savers-gpu-h200.json --machine LABEL
    python benchmarks/bench_savers_gpt2.py --cpu --out /tmp/gpt2.json   # a tiny GPT-2 on the CPU: logic only

The rows are merged into ``--out``: rows of this model are replaced, the others kept, and a
``sources`` entry records the command. Takes about 8 minutes on one H200.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchlib  # noqa: E402

MODEL = "transformers GPT-2 small"
MODES = ("none", "full", "matmuls", "offload")
SEQ, CAP = 1024, "24GiB"
BATCH, GRAD_BATCH = 8, 2
TINY = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 64, "vocab_size": 512}
CPU_CAP = 12  # on the CPU, the simulated largest batch
WARMUP, TIMED = 2, 3
SEARCH = {"max_trials": 8, "time_limit": 60.0}


def build(spec: dict[str, Any]) -> tuple[Any, Any, int]:
    """``(model, config, seq)``: GPT-2 (tiny on the CPU) with the mode's saver, on the device."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import unimem

    sizes = {} if spec["gpu"] else TINY
    config = GPT2Config(**sizes, attn_implementation="sdpa")
    torch.manual_seed(0)  # the same weights in every process
    model = GPT2LMHeadModel(config).train()
    if spec["mode"] != "none":
        unimem.remat_model(model, spec["mode"], match="GPT2Block")
    return model.to(spec["device"]), config, config.n_positions


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    import unimem

    if spec["gpu"]:
        unimem.configure(backend="torch", limit=CAP)
    spec["device"] = "cuda" if spec["gpu"] else "cpu"
    model, config, seq = build(spec)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.Generator().manual_seed(1)

    def ids(n: int) -> Any:
        return torch.randint(0, config.vocab_size, (n, seq), generator=tokens).to(spec["device"])

    def grads() -> list[Any]:
        model.zero_grad(set_to_none=True)
        batch = torch.randint(0, config.vocab_size, (GRAD_BATCH, seq), generator=torch.Generator().manual_seed(2))
        torch.manual_seed(1234)  # the same dropout masks in every process
        batch = batch.to(spec["device"])
        model(batch, labels=batch, use_cache=False).loss.backward()  # no cache: a recomputed block would fill it twice
        found = [p.grad.detach().float().cpu() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return found

    def grad_equal(plain: list[Any], other: list[Any]) -> float:
        norm = float(sum((g.double() ** 2).sum() for g in plain) ** 0.5)
        return max(float((a.double() - b.double()).abs().max()) for a, b in zip(plain, other, strict=True)) / norm

    out: dict[str, Any] = {"attention": str(model.config._attn_implementation)}
    path = Path(spec["grads"])
    if spec["mode"] == "none":
        first = grads()
        torch.save(first, path)
        out["floor"] = grad_equal(first, grads())
    else:
        out["grad_equal"] = grad_equal(torch.load(path), grads())

    def step(n: int) -> None:
        if not spec["gpu"] and n > CPU_CAP:
            torch.empty(1 << 58, dtype=torch.uint8)  # torch's own out-of-memory error on the CPU
        batch = ids(n)
        loss = model(batch, labels=batch, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss)  # waits for the device

    n = spec["batch"]
    for _ in range(WARMUP):
        step(n)
    with unimem.track(backend="torch") as tracked:
        step(n)
    times = []
    for _ in range(TIMED):
        start = time.perf_counter()
        step(n)
        times.append(time.perf_counter() - start)
    out.update(
        peak_bytes=tracked.peak, host_peak_bytes=tracked.host_peak, ms_per_sample=statistics.median(times) * 1e3 / n
    )
    search = unimem.find_batch_size(step, start=n, backend="torch", return_trials=True, progress=True, **SEARCH)
    out["largest_batch"] = search.batch_size
    out["search"] = {"seconds": search.seconds, "trials": [[t.batch_size, t.fits] for t in search.trials]}
    return out


def row(mode: str, gpu: bool, grads: str, timeout: float) -> dict[str, Any]:
    spec = {"mode": mode, "gpu": gpu, "grads": grads, "batch": BATCH if gpu else 2}
    measured = benchlib.run_child(str(Path(__file__).resolve()), spec, timeout, cpu_only=not gpu)
    base = {"model": MODEL if gpu else "transformers GPT-2 (tiny)", "framework": "torch", "mode": mode}
    base.update(batch=spec["batch"], limit=CAP if gpu else None)
    if "error" in measured:
        return {**base, "error": measured}
    detail = {"precision": "fp32", "attention": measured.pop("attention"), "seq": SEQ if gpu else TINY["n_positions"]}
    detail["search"] = measured.pop("search")
    return {**base, **measured, "detail": detail}


def merge(out: str, rows: list[dict[str, Any]], gpu: bool) -> dict[str, Any]:
    """``out``'s result with this model's rows replaced by ``rows`` and the command recorded."""
    path = Path(out)
    result: dict[str, Any] = json.loads(path.read_text()) if out != "-" and path.is_file() else {}
    if not result:
        result = benchlib.header("savers", None, sys.argv)
        result.update(mode="gpu" if gpu else "cpu", rows=[])
    names = {r["model"] for r in rows}
    result["rows"] = [r for r in result.get("rows", []) if r.get("model") not in names] + rows
    source = {"rows": f"{', '.join(sorted(names))}: {', '.join(r['mode'] for r in rows)}"}
    source.update(command=" ".join(["python", *sys.argv]), date=datetime.date.today().isoformat())
    source["versions"] = {**benchlib.versions(), "transformers": _version("transformers")}
    result.setdefault("sources", []).append(source)
    return result


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "results" / "savers-gpu-h200.json"))
    parser.add_argument("--machine", default=None)
    parser.add_argument("--cpu", action="store_true", help="a tiny GPT-2 on the CPU, simulated cap: logic only")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for everything; later rows skip")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(benchlib.RESULT_MARK + json.dumps(child(json.loads(args.child)), default=str), flush=True)
        return 0
    deadline = time.perf_counter() + args.budget
    gpu = not args.cpu and benchlib.gpu_description() is not None
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        grads = str(Path(folder) / "plain-grads.pt")
        for mode in MODES:  # "none" first: it writes the gradients the others compare with
            left = deadline - time.perf_counter()
            if left < 30:
                rows.append({"model": MODEL, "framework": "torch", "mode": mode, "skipped": "budget"})
                continue
            rows.append(row(mode, gpu, grads, min(left, 240.0)))
    result = merge(args.out, rows, gpu)
    if args.machine:
        result["sources"][-1]["machine"] = benchlib.machine(args.machine)
    benchlib.write(result, args.out)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
