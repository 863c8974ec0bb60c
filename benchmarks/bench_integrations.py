"""The trainers' batch-size finders against unimem's through the integrations, on GPT-2 under a cap.

The model is ``GPT2LMHeadModel(GPT2Config())`` (12 layers, width 768, 1024 positions; random weights,
nothing downloaded), fp32, trained with AdamW on random tokens, under ``unimem.configure(limit="24GiB")``.
Each finder runs in a fresh process:

- ``lightning-unimem``: ``unimem.integrations.lightning.BatchSizeFinder()`` in a Lightning fit;
- ``lightning-power``, ``lightning-binsearch``: Lightning's own ``BatchSizeFinder(mode=...)``;
- ``trainer-unimem``: ``unimem.integrations.transformers.find_batch_size(trainer)``;
- ``trainer-auto``: ``Trainer(auto_find_batch_size=True, max_steps=3)``, accelerate's descent.

Starts: Lightning's finders start at its default ``init_val=2``; ``trainer-unimem`` at the Trainer's
default ``per_device_train_batch_size=8``; ``trainer-auto`` only comes down, so it starts at 512 (at
the Trainer's default of 8 it would stop at 8). A call is one size tried (Lightning: one run of its
trial loop; Trainer: one call of its inner training loop or one unimem trial). Per row: ``start``,
``cap``, ``found``, ``calls``, ``failed_calls``, ``seconds`` (the finder alone), ``reserved_after``
and ``allocated_after`` (torch's pool right after the finder; for ``trainer-auto``, after its
three training steps: the finder is the training), and ``sizes`` (each call: size, ran).
``true_max`` is measured once, in a process of its own: the largest batch for which two AdamW steps
of a plain loop run under the cap (``find_batch_size(margin=0)``, a bisection to the exact size).

    python benchmarks/bench_integrations.py --out benchmarks/results/integrations-gpu-h200.json --machine LABEL
    python benchmarks/bench_integrations.py --cpu --out /tmp/integrations.json   # tiny GPT-2, simulated cap

On the CPU a tiny GPT-2 "runs out of memory" above ``CPU_CAP`` samples (a forward hook raises torch's
error): logic only, no figure. Takes about 8 minutes on one H200.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchlib  # noqa: E402

FINDERS = ("lightning-unimem", "lightning-power", "lightning-binsearch", "trainer-unimem", "trainer-auto")
CAP = "24GiB"
TINY = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 64, "vocab_size": 512}
CPU_CAP = 24  # on the CPU, the simulated largest batch
AUTO_START = 512
SAMPLES = 4096  # the dataset's length: far above any batch that fits


def _model(spec: dict[str, Any]) -> tuple[Any, int, int]:
    """``(model, seq, vocab)`` on the CPU, a tiny one there with the simulated cap's hook."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(**({} if spec["gpu"] else TINY))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).train()
    if not spec["gpu"]:

        def simulated_cap(module: Any, args: Any, kwargs: Any) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None and ids.shape[0] > CPU_CAP:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

        model.register_forward_pre_hook(simulated_cap, with_kwargs=True)
    return model, config.n_positions, config.vocab_size


class _Tokens:
    """Random token ids, made per item: a dataset that takes no memory."""

    def __init__(self, seq: int, vocab: int, as_dict: bool) -> None:
        self.seq, self.vocab, self.as_dict = seq, vocab, as_dict

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> Any:
        import torch

        ids = torch.randint(0, self.vocab, (self.seq,))
        return {"input_ids": ids, "labels": ids} if self.as_dict else ids


def _pool(spec: dict[str, Any]) -> dict[str, int | None]:
    import torch

    if not spec["gpu"]:
        return {"reserved_after": None, "allocated_after": None}
    return {"reserved_after": torch.cuda.memory_reserved(), "allocated_after": torch.cuda.memory_allocated()}


def lightning_row(spec: dict[str, Any]) -> dict[str, Any]:
    import lightning.pytorch as L
    import torch
    from lightning.pytorch.tuner import batch_size_scaling
    from lightning.pytorch.utilities.parsing import lightning_getattr

    from unimem.integrations.lightning import BatchSizeFinder as UnimemFinder

    model, seq, vocab = _model(spec)
    calls: list[list[Any]] = []
    original = batch_size_scaling._try_loop_run

    def counted(trainer: Any, params: Any) -> None:  # every finder here runs its trials through this
        calls.append([lightning_getattr(trainer.lightning_module, "batch_size"), False])
        original(trainer, params)
        calls[-1][1] = True

    batch_size_scaling._try_loop_run = counted

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.batch_size = 2

        def training_step(self, batch: Any, index: int) -> Any:
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(_Tokens(seq, vocab, as_dict=False), batch_size=self.batch_size)

    after: dict[str, Any] = {}

    class Probe(L.Callback):  # runs after the finder, which the Trainer moves first
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            after.update(_pool(spec), seconds=time.perf_counter() - started)

    if spec["finder"] == "lightning-unimem":
        finder: Any = UnimemFinder(progress=False)
    else:
        finder = L.callbacks.BatchSizeFinder(mode=spec["finder"].split("-")[1])
    module = Module()
    root = tempfile.mkdtemp()
    trainer = L.Trainer(
        max_steps=1,
        callbacks=[finder, Probe()],
        accelerator="gpu" if spec["gpu"] else "cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=root,
    )
    started = time.perf_counter()
    trainer.fit(module)
    return {"start": 2, "found": finder.optimal_batch_size, "sizes": calls, **after}


def trainer_row(spec: dict[str, Any]) -> dict[str, Any]:
    from transformers import Trainer, TrainingArguments

    from unimem.integrations.transformers import find_batch_size

    model, seq, vocab = _model(spec)
    auto = spec["finder"] == "trainer-auto"
    start = AUTO_START if auto else 8
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=start,
        max_steps=3,
        auto_find_batch_size=auto,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=not spec["gpu"],
        logging_strategy="no",
    )
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens(seq, vocab, as_dict=True))
    started = time.perf_counter()
    if not auto:
        search = find_batch_size(trainer, return_trials=True, progress=False)
        seconds = time.perf_counter() - started
        sizes = [[t.batch_size, t.error is None] for t in search.trials]
        return {"start": start, "found": search.batch_size, "sizes": sizes, "seconds": seconds, **_pool(spec)}
    calls: list[list[Any]] = []
    inner = trainer._inner_training_loop

    def counted(batch_size: int, *rest: Any, **kwargs: Any) -> Any:  # one call: one size tried
        calls.append([batch_size, False])
        result = inner(batch_size, *rest, **kwargs)
        calls[-1][1] = True
        return result

    trainer._inner_training_loop = counted
    trainer.train()
    seconds = time.perf_counter() - started
    return {"start": start, "found": trainer._train_batch_size, "sizes": calls, "seconds": seconds, **_pool(spec)}


def truth_row(spec: dict[str, Any]) -> dict[str, Any]:
    """The largest batch two AdamW steps of a plain loop fit under the cap, to the sample."""
    import torch

    import unimem

    model, seq, vocab = _model(spec)
    device = "cuda" if spec["gpu"] else "cpu"
    model = model.to(device)

    def step(n: int) -> None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for _ in range(2):
            ids = torch.randint(0, vocab, (n, seq), device=device)
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    started = time.perf_counter()
    search = unimem.find_batch_size(
        step, start=2, backend="torch", margin=0.0, max_trials=40, return_trials=True, progress=False
    )
    return {
        "true_max": search.batch_size,
        "calls": len(search.trials),
        "seconds": time.perf_counter() - started,
    }


def child(spec: dict[str, Any]) -> dict[str, Any]:
    os.environ["HF_HUB_OFFLINE"] = "1"
    import unimem

    if spec["gpu"]:
        unimem.configure(backend="torch", limit=CAP)
    if spec["finder"] == "truth":
        return truth_row(spec)
    row = lightning_row(spec) if spec["finder"].startswith("lightning") else trainer_row(spec)
    row["calls"] = len(row["sizes"])
    row["failed_calls"] = sum(1 for _, ran in row["sizes"] if not ran)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "results" / "integrations-gpu-h200.json"))
    parser.add_argument("--machine", default=None)
    parser.add_argument("--cpu", action="store_true", help="a tiny GPT-2 on the CPU, simulated cap: logic only")
    parser.add_argument("--only", nargs="*", default=None, help="these finders (and truth) only")
    parser.add_argument("--budget", type=float, default=520.0, help="seconds for everything; later rows skip")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(benchlib.RESULT_MARK + json.dumps(child(json.loads(args.child)), default=str), flush=True)
        return 0
    gpu = not args.cpu
    began = time.monotonic()
    result = benchlib.header("integrations", args.machine, sys.argv)
    result.update(cap=CAP if gpu else f"{CPU_CAP} samples (simulated)", model="GPT-2 small" if gpu else "tiny GPT-2")
    rows: dict[str, Any] = {}
    for finder in ("truth", *(args.only or FINDERS)):
        left = args.budget - (time.monotonic() - began)
        if left < 30:
            rows[finder] = {"error": "skipped: the time budget ran out"}
            continue
        spec = {"finder": finder, "gpu": gpu}
        rows[finder] = benchlib.run_child(str(Path(__file__).resolve()), spec, timeout=left, cpu_only=not gpu)
        print(f"{finder}: {json.dumps({k: v for k, v in rows[finder].items() if k != 'sizes'})}", file=sys.stderr)
    true_max = rows["truth"].get("true_max")
    for finder, row in rows.items():
        if finder != "truth" and isinstance(row.get("found"), int) and true_max:
            row["true_max"] = true_max
            row["cap"] = result["cap"]
            row["share_of_true_max"] = round(row["found"] / true_max, 3)
    result["rows"] = rows
    result["seconds"] = round(time.monotonic() - began, 1)
    benchlib.write(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
