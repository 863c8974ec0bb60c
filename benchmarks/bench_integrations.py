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
the Trainer's default of 8 it would stop at 8; on the CPU at 96). A call is one size the finder
ran, every one the user waits for (Lightning: one run of its trial loop, a re-run of the answer
included; Trainer: one call of its inner training loop, or each of unimem's trials and re-runs).
Per row: ``start``, ``cap``, ``found``, ``calls``, ``failed_calls``, ``seconds`` (the finder
alone), ``reserved_after`` and ``allocated_after`` (torch's pool right after the finder; for
``trainer-auto``, after its three training steps: the finder is the training), ``sizes`` (each
call: size, ran) and, for unimem's finders, ``trials`` (each size of the search: size, ran, peak
bytes in use, peak bytes reserved, why it was tried), enough to replay the search elsewhere.

Each row's ``true_max`` is measured in its finder's own loop, so that no finder can exceed it:
for the Lightning finders, the largest batch for which a fresh Lightning fit (the same model,
module, Trainer settings and precision, no finder) runs under the cap; for the Trainer's, the
largest ``per_device_train_batch_size`` for which a fresh ``Trainer.train()`` (the same arguments,
no ``auto_find_batch_size``) does. The rule for steps: the fit runs ``TRUTH_STEPS[loop]``
optimizer steps, the most that any finder of that loop runs per size it tries (Lightning's
three finders: ``steps_per_trial=3``; ``trainer-auto`` trains ``max_steps=3``; unimem's Trainer
finder runs ``steps_per_trial=2``), so no finder's trial runs longer than the fit that judges it,
and each of unimem's trials holds the optimizer's state beside the activations from its second
step. Each size is tried in a fresh process, two at a time, from the largest answer of that
loop's finders and the size above it, then up or down to a size that runs beside one that does
not (``truths``: every probe, with its peak bytes on a GPU), within ``--truth-budget`` seconds
(both loops at once); ``share`` is ``found / true_max``, and ``exceeds_truth`` says whether the
answer is above what runs in a fresh process of its loop. The summary (``checks``) names every
finder whose answer exceeds its truth, and holds unimem's finders to ``UNIMEM_TARGETS``: not
above the truth, at least 95% of it, in at most 6 calls.
``plain_loop``, for reference only: the largest batch two AdamW steps of a plain loop fit under
the cap, in one process (``find_batch_size(margin=0)``) -- not the finders' loop, so it holds other
memory and judges no row.

    python benchmarks/bench_integrations.py --out benchmarks/results/integrations-gpu-h200.json --machine LABEL
    python benchmarks/bench_integrations.py --cpu --out /tmp/integrations.json   # a tiny GPT-2

On the CPU a tiny GPT-2 "runs out of memory" as a device would (``_emulated_device``): above
``CPU_CAP`` samples, and above ``CPU_CAP - 1`` where an optimizer's state was made by a step of
that size or larger -- the pool a fit's first step leaves, which the state it makes then splits,
holds one sample less at the second step; state made by an earlier, smaller trial splits nothing.
A fresh fit of two steps or more thus runs ``CPU_CAP - 1`` in every loop: logic only, no figure.
Takes about 6 minutes on one H200.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchlib  # noqa: E402

FINDERS = ("lightning-unimem", "lightning-power", "lightning-binsearch", "trainer-unimem", "trainer-auto")
CAP = "24GiB"
TINY = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 64, "vocab_size": 512}
CPU_CAP = 24  # on the CPU, the simulated largest batch
AUTO_START, CPU_AUTO_START = 512, 96
LOOPS = {  # the finders that train in one loop, and so share its truth
    "lightning": ("lightning-unimem", "lightning-power", "lightning-binsearch"),
    "trainer": ("trainer-unimem", "trainer-auto"),
}
# Optimizer steps per size tried: Lightning's finders (its default), trainer-auto's training, unimem's Trainer finder.
LIGHTNING_TRIAL_STEPS, AUTO_STEPS, UNIMEM_TRAINER_STEPS = 3, 3, 2
# A size runs in a loop when a fresh fit of it runs this many optimizer steps: the most any finder of the loop
# runs per size (AdamW's state is made in the first, and held beside the activations from the second).
TRUTH_STEPS = {"lightning": LIGHTNING_TRIAL_STEPS, "trainer": max(AUTO_STEPS, UNIMEM_TRAINER_STEPS)}
TRUTH_WIDTH = 2  # fresh processes at once per loop (each under its own cap)
PROBE_SECONDS = 60.0  # a fresh process's probe is given at least this, else what the truths' budget has left
# Seconds for everything and for the truths: GPU, CPU (fresh processes of the tiny model on a slow CPU).
BUDGET, CPU_BUDGET = 520.0, 1800.0
TRUTH_BUDGET, CPU_TRUTH_BUDGET = 180.0, 600.0
UNIMEM_TARGETS = {"share": 0.95, "calls": 6}
SAMPLES = 4096  # the dataset's length: far above any batch that fits


def _model(spec: dict[str, Any]) -> tuple[Any, int, int]:
    """``(model, seq, vocab)`` on the CPU, a tiny one there with the simulated cap's hook."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(**({} if spec["gpu"] else TINY))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).train()
    if not spec["gpu"]:
        _emulated_device(model)
    return model, config.n_positions, config.vocab_size


def room(size: int, state_made_at: list[int]) -> int:
    """The largest batch the emulated device runs a forward pass of ``size`` at: ``CPU_CAP``, one less
    where an optimizer holds state made by a step of ``size`` or more (``state_made_at``: the batch
    size of the step that made each optimizer's state now held)."""
    return CPU_CAP - (1 if any(made >= size for made in state_made_at) else 0)


def _emulated_device(model: Any) -> None:
    """On the CPU, a device for ``model`` (see the module's docstring): a forward pass above ``room``
    raises torch's out-of-memory error. Each optimizer's state is dated by the batch of the last
    forward pass when a step made it (a step of an optimizer that held none: Lightning's step runs
    its forward pass inside, through the closure)."""
    import weakref

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    made: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
    stateless: weakref.WeakSet[Any] = weakref.WeakSet()
    last = [0]

    def before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not optimizer.state:
            stateless.add(optimizer)

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        if optimizer in stateless and optimizer.state:
            made[optimizer] = last[0]
        stateless.discard(optimizer)

    def forward(module: Any, args: Any, kwargs: Any) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            return
        last[0] = size = int(ids.shape[0])
        if size > room(size, [at for optimizer, at in made.items() if optimizer.state]):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    # Every optimizer of this process (the finders' and the fit's own).
    register_optimizer_step_pre_hook(before_step)
    register_optimizer_step_post_hook(after_step)
    model.register_forward_pre_hook(forward, with_kwargs=True)


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


def _peaks(spec: dict[str, Any]) -> dict[str, int | None]:
    """torch's peak bytes in use and reserved in this process so far (None on the CPU)."""
    import torch

    if not spec["gpu"]:
        return {"peak_allocated": None, "peak_reserved": None}
    return {"peak_allocated": torch.cuda.max_memory_allocated(), "peak_reserved": torch.cuda.max_memory_reserved()}


def _trials(search: Any) -> list[list[Any]]:
    """Each size a unimem search ran: size, ran, peak bytes in use, peak bytes reserved, why it was tried."""
    return [[t.batch_size, t.fits, t.peak, t.peak_reserved, t.reason] for t in (*search.trials, *search.confirmations)]


def _lightning_module(spec: dict[str, Any], batch_size: int = 2) -> Any:
    """The LightningModule every Lightning row trains: GPT-2 with AdamW on random tokens."""
    import lightning.pytorch as L
    import torch

    model, seq, vocab = _model(spec)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.batch_size = batch_size

        def training_step(self, batch: Any, index: int) -> Any:
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(_Tokens(seq, vocab, as_dict=False), batch_size=self.batch_size)

    return Module()


def _lightning_trainer(spec: dict[str, Any], max_steps: int, callbacks: list[Any]) -> Any:
    """The Trainer every Lightning row fits with (its settings and precision, 32-bit by default)."""
    import lightning.pytorch as L

    return L.Trainer(
        max_steps=max_steps,
        callbacks=callbacks,
        accelerator="gpu" if spec["gpu"] else "cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tempfile.mkdtemp(),
    )


def lightning_row(spec: dict[str, Any]) -> dict[str, Any]:
    import lightning.pytorch as L
    from lightning.pytorch.tuner import batch_size_scaling
    from lightning.pytorch.utilities.parsing import lightning_getattr

    from unimem.integrations.lightning import BatchSizeFinder as UnimemFinder

    calls: list[list[Any]] = []
    original = batch_size_scaling._try_loop_run

    def counted(trainer: Any, params: Any) -> None:  # every finder here runs its trials through this
        calls.append([lightning_getattr(trainer.lightning_module, "batch_size"), False])
        original(trainer, params)
        calls[-1][1] = True

    batch_size_scaling._try_loop_run = counted
    after: dict[str, Any] = {}

    class Probe(L.Callback):  # runs after the finder, which the Trainer moves first
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            after.update(_pool(spec), seconds=time.perf_counter() - started)

    if spec["finder"] == "lightning-unimem":
        finder: Any = UnimemFinder(steps_per_trial=LIGHTNING_TRIAL_STEPS, progress=False)
    else:
        finder = L.callbacks.BatchSizeFinder(mode=spec["finder"].split("-")[1], steps_per_trial=LIGHTNING_TRIAL_STEPS)
    module = _lightning_module(spec)
    trainer = _lightning_trainer(spec, 1, [finder, Probe()])
    started = time.perf_counter()
    trainer.fit(module)
    row = {"start": 2, "found": finder.optimal_batch_size, "sizes": calls, **after}
    if spec["finder"] == "lightning-unimem":
        row["trials"] = _trials(finder.search)
    return row


def _hf_trainer(spec: dict[str, Any], batch_size: int, max_steps: int, auto: bool) -> Any:
    """The transformers ``Trainer`` every Trainer row trains with, at ``batch_size`` a device."""
    from transformers import Trainer, TrainingArguments

    model, seq, vocab = _model(spec)
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=batch_size,
        max_steps=max_steps,
        auto_find_batch_size=auto,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=not spec["gpu"],
        logging_strategy="no",
    )
    return Trainer(model=model, args=args, train_dataset=_Tokens(seq, vocab, as_dict=True))


def trainer_row(spec: dict[str, Any]) -> dict[str, Any]:
    from unimem.integrations.transformers import find_batch_size

    auto = spec["finder"] == "trainer-auto"
    start = (AUTO_START if spec["gpu"] else CPU_AUTO_START) if auto else 8
    trainer = _hf_trainer(spec, start, AUTO_STEPS, auto)
    started = time.perf_counter()
    if not auto:
        search = find_batch_size(trainer, steps_per_trial=UNIMEM_TRAINER_STEPS, return_trials=True, progress=False)
        seconds = time.perf_counter() - started
        trials = _trials(search)  # every call of the step: the search's trials and any re-run after it
        sizes = [[size, ran] for size, ran, *_ in trials]
        row = {"start": start, "found": search.batch_size, "sizes": sizes, "trials": trials, "seconds": seconds}
        return row | _pool(spec)
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


def loop_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """One size in a finder's own loop, in this fresh process: whether ``TRUTH_STEPS[loop]`` optimizer
    steps of it run under the cap (a Lightning fit, or ``Trainer.train()``, as the finders' rows build
    them, without the finder), and torch's peaks (on a failure, up to it)."""
    import unimem

    size, started, steps = spec["size"], time.perf_counter(), TRUTH_STEPS[spec["loop"]]
    try:
        if spec["loop"] == "lightning":
            _lightning_trainer(spec, steps, []).fit(_lightning_module(spec, size))
        else:
            _hf_trainer(spec, size, steps, auto=False).train()
        ran = True
    except Exception as exc:
        if not unimem.is_oom(exc):
            raise
        ran = False
    return {"ran": ran, "seconds": round(time.perf_counter() - started, 2), **_peaks(spec), **_pool(spec)}


def plain_loop_row(spec: dict[str, Any]) -> dict[str, Any]:
    """The largest batch two AdamW steps of a plain loop fit under the cap, to the sample (a reference:
    not the finders' loops)."""
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
        "largest": search.batch_size,
        "calls": len(search.trials),
        "seconds": time.perf_counter() - started,
    }


def child(spec: dict[str, Any]) -> dict[str, Any]:
    os.environ["HF_HUB_OFFLINE"] = "1"
    import unimem

    if spec["gpu"]:
        unimem.configure(backend="torch", limit=CAP)
    if spec["finder"] == "plain-loop":
        return plain_loop_row(spec)
    if spec["finder"] == "probe":
        return loop_probe(spec)
    row = lightning_row(spec) if spec["finder"].startswith("lightning") else trainer_row(spec)
    row["calls"] = len(row["sizes"])
    row["failed_calls"] = sum(1 for _, ran in row["sizes"] if not ran)
    return row


# --- the truth in each finder's loop, and the rows judged by it (pure) -------------------------------


def next_sizes(low: int, high: int | None, start: int, width: int = TRUTH_WIDTH) -> list[int]:
    """The next sizes to try in fresh processes for the largest that runs, ``width`` at most: ``low``
    ran (0: nothing yet), ``high`` did not (None: nothing yet). First ``start`` and the size above
    it (the truth is most often an answer or one more); then, while nothing failed, the size above
    ``low`` and a quarter above it; while nothing ran, the size under ``high`` and half of it; else
    sizes evenly inside the bracket; none once ``high`` is ``low + 1``."""
    if low == 0 and high is None:
        return [start, start + 1][:width]
    if high is None:
        return sorted({low + 1, low + max(2, -(-low // 4))})[:width]
    if high - low <= 1:
        return []
    if low == 0:
        return sorted({high - 1, max(1, high // 2)})[:width]
    inside = high - low - 1
    if inside <= width:
        return list(range(low + 1, high))
    return sorted({low + (high - low) * i // (width + 1) for i in range(1, width + 1)})


def narrow(low: int, high: int | None, tried: list[tuple[int, bool]]) -> tuple[int, int | None, list[int]]:
    """``(low, high, odd)`` after the sizes ``tried`` (each: size, ran): ``low`` the largest that ran,
    ``high`` the smallest that did not above it; ``odd``, sizes that did not run below one that did
    (memory is not always monotonic in the batch: the truth is the largest that runs)."""
    low = max([low, *(n for n, ran in tried if ran)])
    failed = [n for n, ran in tried if not ran] + ([high] if high is not None else [])
    above = [n for n in failed if n > low]
    return low, min(above) if above else None, sorted(n for n in failed if n <= low)


def exceeds(found: int, truth: dict[str, Any]) -> bool | None:
    """Whether a finder's answer is above what runs in a fresh process of its loop: True past the
    truth or at a size that did not run there; False at or under a size that ran; None: not known."""
    if truth.get("true_max") is not None:
        return found > truth["true_max"]
    low, high = truth.get("low") or 0, truth.get("high")
    if high is not None and found >= high:
        return True
    return False if found <= low else None


def judge(rows: dict[str, dict[str, Any]], truths: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each finder's row against its loop's truth (``true_max``, ``share``, ``exceeds_truth``), and the
    checks the summary prints: the finders whose answer exceeds their truth, and unimem's finders
    against ``UNIMEM_TARGETS`` (share and calls) and their truth (not above it); None: not known."""
    over: list[str] = []
    unimem: dict[str, dict[str, bool | None]] = {}
    for loop, finders in LOOPS.items():
        truth = truths.get(loop) or {}
        for finder in finders:
            row = rows.get(finder) or {}
            if not isinstance(row.get("found"), int):
                continue
            true_max = truth.get("true_max")
            row.update(truth_loop=loop, true_max=true_max, exceeds_truth=exceeds(row["found"], truth))
            row["share"] = round(row["found"] / true_max, 3) if true_max else None
            if row["exceeds_truth"]:
                over.append(finder)
            if finder.endswith("-unimem"):
                unimem[finder] = {
                    "share": None if row["share"] is None else row["share"] >= UNIMEM_TARGETS["share"],
                    "calls": row["calls"] <= UNIMEM_TARGETS["calls"],
                    "not_above_truth": None if row["exceeds_truth"] is None else not row["exceeds_truth"],
                }
    return {"exceed_their_truth": over, "unimem_targets": UNIMEM_TARGETS, "unimem_met": unimem}


def summary(rows: dict[str, dict[str, Any]], truths: dict[str, dict[str, Any]], checks: dict[str, Any]) -> list[str]:
    lines = [f"targets: unimem's finders >= {UNIMEM_TARGETS['share']:.0%} of their loop's truth "
             f"in <= {UNIMEM_TARGETS['calls']} calls; no finder above its truth"]  # fmt: skip
    for loop, truth in truths.items():
        bracket = f"between {truth.get('low')} and {truth.get('high')}" if truth.get("true_max") is None else ""
        lines.append(f"truth ({loop} loop): {truth.get('true_max') or bracket} in {len(truth.get('probes', []))} "
                     f"fresh processes, {truth.get('seconds', 0):.0f} s")  # fmt: skip
    for finder, row in rows.items():
        if "found" not in row:
            lines.append(f"{finder}: {row.get('error', 'no answer')}"[:200])
            continue
        share = row.get("share")
        line = f"{finder}: found {row['found']} ({'?' if share is None else f'{share:.1%}'} of {row.get('true_max')})"
        line += f", {row.get('calls')} calls, {row.get('failed_calls')} failed"
        line += " -- ABOVE ITS TRUTH" if row.get("exceeds_truth") else ""
        met = checks["unimem_met"].get(finder)
        if met is not None:
            missed = [name for name, ok in met.items() if ok is not True]  # None: not known, so not met
            line += "; targets " + (f"not met: {', '.join(missed)}" if missed else "met")
        lines.append(line)
    return lines


# --- the parent ----------------------------------------------------------------------------------


def _child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    return benchlib.run_child(str(Path(__file__).resolve()), spec, timeout=timeout, cpu_only=not spec["gpu"])


def loop_truth(loop: str, start: int, gpu: bool, until: float) -> dict[str, Any]:
    """The largest batch that runs ``TRUTH_STEPS`` steps in ``loop`` (fresh processes, ``TRUTH_WIDTH``
    at once, ``next_sizes`` from ``start``) while ``until`` (a ``time.monotonic()``) leaves a round's
    time; ``true_max`` once a size that runs sits beside one that does not, else None with the
    bracket so far (``low`` ran, ``high`` did not)."""
    began = time.monotonic()
    low, high = 0, None
    odd: list[int] = []
    probes: list[list[Any]] = []
    sizes, last = next_sizes(0, None, start), 0.0
    while sizes and (not probes or time.monotonic() + last < until):
        t0 = time.monotonic()
        specs = [{"finder": "probe", "loop": loop, "size": n, "gpu": gpu} for n in sizes]
        timeout = max(PROBE_SECONDS, until - t0)
        with ThreadPoolExecutor(max_workers=len(sizes)) as pool:
            outs = list(pool.map(_child, specs, [timeout] * len(specs)))
        probes += [
            [
                n,
                out.get("ran"),
                out.get("seconds"),
                out.get("error"),
                out.get("peak_allocated"),
                out.get("peak_reserved"),
            ]
            for n, out in zip(sizes, outs, strict=True)
        ]
        last = time.monotonic() - t0
        if any(out.get("ran") is None for out in outs):
            break  # a probe erred or timed out: the bracket stops where it is
        low, high, more_odd = narrow(low, high, [(n, bool(out["ran"])) for n, out in zip(sizes, outs, strict=True)])
        odd += more_odd
        sizes = next_sizes(low, high, start)
    closed = high is not None and high - low == 1
    return {
        "loop": loop,
        "true_max": low if closed else None,
        "low": low,
        "high": high,
        "odd": odd,
        "probes": probes,  # [size, ran, seconds, error, peak bytes in use, peak bytes reserved]
        "seconds": round(time.monotonic() - began, 1),
    }


def truths(rows: dict[str, dict[str, Any]], gpu: bool, until: float) -> dict[str, dict[str, Any]]:
    """Each loop's truth, both loops at once, from the largest answer of its finders."""
    starts = {}
    for loop, finders in LOOPS.items():
        answers = [rows[f]["found"] for f in finders if isinstance(rows.get(f, {}).get("found"), int)]
        if answers:
            starts[loop] = max(answers)
    with ThreadPoolExecutor(max_workers=max(1, len(starts))) as pool:
        found = pool.map(lambda loop: loop_truth(loop, starts[loop], gpu, until), starts)
        return dict(zip(starts, found, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "results" / "integrations-gpu-h200.json"))
    parser.add_argument("--machine", default=None)
    parser.add_argument("--cpu", action="store_true", help="a tiny GPT-2 on the CPU, simulated cap: logic only")
    parser.add_argument("--only", nargs="*", default=None, help="these finders (and their loops' truth) only")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help=f"seconds for everything, later rows skip (default {BUDGET:.0f}; --cpu {CPU_BUDGET:.0f})",
    )
    parser.add_argument(
        "--truth-budget",
        type=float,
        default=None,
        help="seconds for the truths in the loops, both at once, out of --budget "
        f"(default {TRUTH_BUDGET:.0f}; --cpu {CPU_TRUTH_BUDGET:.0f})",
    )
    parser.add_argument("--no-plain-loop", action="store_true", help="skip the plain loop's reference")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(benchlib.RESULT_MARK + json.dumps(child(json.loads(args.child)), default=str), flush=True)
        return 0
    gpu = not args.cpu
    budget = args.budget or (BUDGET if gpu else CPU_BUDGET)
    truth_budget = args.truth_budget or (TRUTH_BUDGET if gpu else CPU_TRUTH_BUDGET)
    began = time.monotonic()
    result = benchlib.header("integrations", args.machine, sys.argv)
    result.update(cap=CAP if gpu else f"{CPU_CAP} samples (simulated)", model="GPT-2 small" if gpu else "tiny GPT-2")
    rows: dict[str, Any] = {}
    for finder in ([] if args.no_plain_loop else ["plain-loop"]) + list(args.only or FINDERS):
        # the finders leave the truths their share of the budget
        left = budget - (time.monotonic() - began) - (0 if finder == "plain-loop" else truth_budget)
        if left < 30:
            rows[finder] = {"error": "skipped: the time budget ran out"}
            continue
        rows[finder] = _child({"finder": finder, "gpu": gpu}, left)
        print(f"{finder}: {json.dumps({k: v for k, v in rows[finder].items() if k != 'sizes'})}", file=sys.stderr)
    plain = rows.pop("plain-loop", None)
    until = time.monotonic() + min(truth_budget, budget - (time.monotonic() - began))
    result["truths"] = truths(rows, gpu, until)
    for row in rows.values():
        if "found" in row:
            row["cap"] = result["cap"]
    result["checks"] = judge(rows, result["truths"])
    result["rows"] = rows
    result["plain_loop"] = plain
    result["summary"] = summary(rows, result["truths"], result["checks"])
    result["seconds"] = round(time.monotonic() - began, 1)
    benchlib.write(result, args.out)
    print("\n".join(result["summary"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
