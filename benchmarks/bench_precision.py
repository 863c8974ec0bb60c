"""Peak memory of the example MLP's training step at bf16 and fp16 against fp32 (torch, JAX).

    python benchmarks/bench_precision.py --out benchmarks/results/ [--machine LABEL]

Each (framework, precision, batch size) runs in a FRESH subprocess, so every peak is
that configuration's own: JAX cannot reset its peak (unimem's ``reset_peak`` for JAX is a
baseline), and neither framework gives memory back to the device. A worker builds
``examples/train.py``'s MLP and trainer (Adam, float32 parameters), makes one warm-up
step (compilation, gradient and Adam buffers, cuBLAS workspace), then ``--steps``
measured steps, and records from ``unimem.stats()``:

- ``peak_allocated``: torch: since ``reset_peak()`` after the warm-up step; JAX: since the
  process started (the warm-up step is the same step, so the peak is the step's);
- ``allocated_between_steps``: what stays between steps (parameters, Adam state, and for
  torch the last gradients), so ``peak - between`` is the step's working memory;
- ``process_used``: NVML's figure for the process (CUDA context + the framework's pool).

JAX runs with ``configure(growth=True)`` (no 75% preallocation), so NVML's figure follows
what it uses. Configurations run ``--jobs`` at a time on the one GPU: memory figures are
per process and unaffected; the step times are informational only.

Without a GPU it runs the same workers on the CPU at a small size, says so, and reports
the memory figures as None (no framework tracks CPU memory).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FRAMEWORKS = ("torch", "jax")
PRECISIONS = ("fp32", "bf16", "fp16")
GPU_SIZES = {"width": 8192, "depth": 8, "features": 1024, "batch_sizes": "4096,16384"}
CPU_SIZES = {"width": 256, "depth": 2, "features": 64, "batch_sizes": "256,1024"}
RESULT = "RESULT "


# --- worker: one configuration, in its own process ------------------------------------------


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import unimem

    # Before the framework is imported: JAX must not preallocate 75% of the GPU.
    applied = unimem.configure(args.framework, growth=True)
    sys.path.insert(0, str(ROOT / "examples"))
    import train  # examples/train.py: the same MLP, trainer and step as the example

    policy = unimem.mixed_precision(args.precision, backend=args.framework)
    scaler = policy.loss_scaler()
    x, y = train.make_data(args.batch_size, args.features, seed=0)
    with policy:
        trainer = train.TRAINERS[args.framework](policy, args.features, args.width, args.depth, 1e-4, 0)
        batch = trainer.batch(x, y)
        del x, y
        sync = _sync(args.framework, trainer)
        started = time.perf_counter()
        loss, _ = train.train_step(trainer, scaler, *batch)  # warm-up: compile, allocate, workspaces
        first_loss = float(loss)
        sync()
        warmup_s = time.perf_counter() - started
        between = unimem.stats(args.framework)
        peak_since_start = between.peak_allocated
        if args.framework == "torch":
            unimem.reset_peak(args.framework)
        times, skipped = [], 0
        for _ in range(args.steps):
            started = time.perf_counter()
            loss, applied_step = train.train_step(trainer, scaler, *batch)
            sync()
            times.append(time.perf_counter() - started)
            skipped += not applied_step
        last_loss = float(loss)
        after = unimem.stats(args.framework)
    peak = after.peak_allocated
    if args.framework == "jax" and peak is None:
        peak = peak_since_start  # no new high since the baseline: the warm-up step's peak is the step's
    params = _param_count(args.framework, trainer)
    return {
        "framework": args.framework,
        "precision": args.precision,
        "batch_size": args.batch_size,
        "width": args.width,
        "depth": args.depth,
        "features": args.features,
        "device": policy.device if args.framework != "jax" else _jax_platform(),
        "compute_dtype": policy.compute_dtype,
        "param_count": params,
        "param_bytes": params * 4,
        "peak_allocated": peak,
        "peak_source": "reset_peak() after the warm-up step"
        if args.framework == "torch"
        else "since process start (JAX cannot reset its peak)",
        "peak_allocated_since_start": peak_since_start if args.framework == "torch" else peak,
        "allocated_between_steps": between.allocated,
        "step_working_memory": None if peak is None or between.allocated is None else peak - between.allocated,
        "peak_reserved": after.peak_reserved,
        "reserved": after.reserved,
        "process_used": after.process_used,
        "device_total": after.device_total,
        "warmup_s": round(warmup_s, 4),
        "step_s": [round(t, 4) for t in times],
        "loss_first": first_loss,
        "loss_last": last_loss,
        "skipped_steps": skipped,
        "loss_scale": scaler.scale_value,
        "configure": str(applied),
    }


def _sync(framework: str, trainer: Any) -> Any:
    if framework == "torch":
        torch = sys.modules["torch"]
        return torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    jax = sys.modules["jax"]
    return lambda: jax.block_until_ready(trainer.params)


def _param_count(framework: str, trainer: Any) -> int:
    if framework == "torch":
        return sum(p.numel() for p in trainer.model.parameters())
    return sum(int(leaf.size) for leaf in sys.modules["jax"].tree_util.tree_leaves(trainer.params))


def _jax_platform() -> str:
    return str(sys.modules["jax"].default_backend())


# --- parent: every configuration in a fresh subprocess ------------------------------------------


def _run_one(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker"]
    command += ["--framework", config["framework"], "--precision", config["precision"]]
    command += ["--batch-size", str(config["batch_size"]), "--width", str(config["width"])]
    command += ["--depth", str(config["depth"]), "--features", str(config["features"])]
    command += ["--steps", str(config["steps"])]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        return {**config, "error": f"timed out after {timeout:.0f} s"}
    wall = round(time.perf_counter() - started, 2)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout)[-3000:]
        return {**config, "error": f"exit {done.returncode}", "output": tail, "wall_s": wall}
    return {**json.loads(lines[-1][len(RESULT) :]), "wall_s": wall}


def _saving(base: int | None, value: int | None) -> dict[str, Any] | None:
    if base is None or value is None or base <= 0:
        return None
    return {"bytes": base - value, "percent": round(100.0 * (base - value) / base, 1)}


def savings(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """bf16 and fp16 against fp32 at the same framework and batch size."""
    table = {(r["framework"], r["batch_size"], r["precision"]): r for r in results if "error" not in r}
    rows = []
    for (framework, batch, precision), result in sorted(table.items()):
        base = table.get((framework, batch, "fp32"))
        if precision == "fp32" or base is None:
            continue
        rows.append(
            {
                "framework": framework,
                "batch_size": batch,
                "precision": precision,
                "peak_allocated": _saving(base["peak_allocated"], result["peak_allocated"]),
                "step_working_memory": _saving(base["step_working_memory"], result["step_working_memory"]),
                "process_used": _saving(base["process_used"], result["process_used"]),
            }
        )
    return rows


def _gib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.2f} GiB"


def _print_table(results: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    print(
        f"{'framework':10} {'batch':>6} {'prec':5} {'peak alloc':>11} {'step work':>11} {'process':>11} {'step s':>7}"
    )
    for r in sorted(results, key=lambda r: (r["framework"], r["batch_size"], PRECISIONS.index(r["precision"]))):
        if "error" in r:
            print(f"{r['framework']:10} {r['batch_size']:>6} {r['precision']:5} ERROR {r['error']}")
            continue
        step = min(r["step_s"]) if r["step_s"] else float("nan")
        print(
            f"{r['framework']:10} {r['batch_size']:>6} {r['precision']:5} {_gib(r['peak_allocated']):>11} "
            f"{_gib(r['step_working_memory']):>11} {_gib(r['process_used']):>11} {step:>7.3f}"
        )

    def less(saving: dict[str, Any] | None) -> str:
        return "n/a" if saving is None else f"{saving['percent']}% ({_gib(saving['bytes'])}) less"

    for row in rows:
        print(
            f"{row['framework']} batch {row['batch_size']} {row['precision']} vs fp32: "
            f"peak {less(row['peak_allocated'])}; NVML {less(row['process_used'])}"
        )


def _plot(results: list[dict[str, Any]], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    ok = [r for r in results if "error" not in r and r["peak_allocated"] is not None]
    if not ok:
        return None
    groups = sorted({(r["framework"], r["batch_size"]) for r in ok})
    fig, ax = plt.subplots(figsize=(2.2 * len(groups) + 2, 4))
    width = 0.8 / len(PRECISIONS)
    for i, precision in enumerate(PRECISIONS):
        values = []
        for framework, batch in groups:
            match = [
                r for r in ok if (r["framework"], r["batch_size"], r["precision"]) == (framework, batch, precision)
            ]
            values.append(match[0]["peak_allocated"] / 2**30 if match else 0.0)
        ax.bar([g + i * width for g in range(len(groups))], values, width, label=precision)
    ax.set_xticks([g + width for g in range(len(groups))])
    ax.set_xticklabels([f"{f}\nbatch {b}" for f, b in groups])
    ax.set_ylabel("peak allocated (GiB)")
    ax.set_title("training step peak memory by precision (unimem.stats)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "results"), help="a directory, or a .json file path")
    parser.add_argument("--machine", default=None, help="how to name this machine in the output")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--batch-sizes", default=None, help="comma-separated (default: 4096,16384 on a GPU)")
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--depth", type=int, default=None)
    parser.add_argument("--features", type=int, default=None)
    parser.add_argument("--steps", type=int, default=3, help="measured steps after the warm-up step")
    parser.add_argument("--jobs", type=int, default=3, help="configurations run at once (memory is per process)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per configuration")
    # worker mode (internal)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--framework", help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        print(RESULT + json.dumps(worker(args)), flush=True)
        return 0

    sys.path.insert(0, str(HERE))
    import benchlib

    gpu = benchlib.gpu_description()
    sizes = GPU_SIZES if gpu is not None else CPU_SIZES
    notes = []
    if gpu is None:
        notes.append(
            "no NVIDIA GPU (NVML found none): ran a small model on the CPU, where no framework tracks "
            "memory, so every memory figure is None; run this on the GPU machine for the measurement"
        )
    width = args.width or sizes["width"]
    depth = args.depth or sizes["depth"]
    features = args.features or sizes["features"]
    batch_sizes = [int(b) for b in (args.batch_sizes or str(sizes["batch_sizes"])).split(",")]
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    configs = [
        {"framework": f, "precision": p, "batch_size": b, "width": width, "depth": depth, "features": features}
        | {"steps": args.steps}
        for f in frameworks
        for b in batch_sizes
        for p in precisions
    ]
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"{len(configs)} configurations, {args.jobs} at a time, each in a fresh process", file=sys.stderr)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda c: _run_one(c, args.timeout), configs))
    rows = savings(results)
    _print_table(results, rows)

    out = Path(args.out)
    json_path = out if out.suffix == ".json" else out / "precision.json"
    command = [str(Path(__file__).relative_to(ROOT)), *(argv if argv is not None else sys.argv[1:])]
    report = benchlib.header("precision", args.machine, command) | {
        "notes": notes,
        "jobs": args.jobs,
        "sizes": {"width": width, "depth": depth, "features": features, "batch_sizes": batch_sizes},
        "optimizer": "Adam (examples/train.py), float32 parameters",
        "configs": results,
        "savings_vs_fp32": rows,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    png = _plot(results, json_path.with_suffix(".png"))
    if png:
        report["plot"] = png
    benchlib.write(report, str(json_path))
    failed = [r for r in results if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
