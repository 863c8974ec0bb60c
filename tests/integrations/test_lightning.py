"""The Lightning callbacks in real fits on the CPU (fresh processes): the batch-size finder with a
simulated memory limit, on one device and over two DDP ranks (gloo), memory in the loggers, and an
out-of-memory error explained. Each package, ``lightning.pytorch`` and ``pytorch_lightning``."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import free_port, run_ranks
from trainers import EMULATED_DEVICE, SHAPED_SEARCH, need_package

# A tiny model whose step "runs out of memory" above LIMIT samples; measure() reads the simulated
# peak of the last step (1000 bytes fixed + PER bytes a sample), so the search sees real figures.
MODEL = """
    import csv, glob, os, sys, torch
    from torch.utils.data import DataLoader, TensorDataset
    import {package} as L
    from {integration} import BatchSizeFinder, MemoryCallback

    LIMIT = {limit}
    PER = 100
    seen = []

    class Model(L.LightningModule):
        def __init__(self, batch_size):
            super().__init__()
            self.batch_size = batch_size
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, index):
            x, y = batch
            seen.append(len(x))
            if len(x) > LIMIT:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("loss", loss, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.1)

        def train_dataloader(self):
            data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
            return DataLoader(data, batch_size=self.batch_size)

    def peak():
        return int(1000 + PER * seen[-1])

    def trainer(callbacks, root, **kwargs):
        settings = dict(
            max_steps=2, callbacks=callbacks, logger=L.loggers.CSVLogger(root), log_every_n_steps=1,
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
            accelerator="cpu", default_root_dir=root,
        )
        return L.Trainer(**(settings | kwargs))

    def logged(root):
        rows = []
        for path in glob.glob(os.path.join(root, "**", "metrics.csv"), recursive=True):
            with open(path) as file:
                rows += list(csv.DictReader(file))
        return rows
"""

SINGLE = """
    root = {root!r}
    model = Model(batch_size=2)
    start = model.layer.weight.detach().clone()
    finder = BatchSizeFinder(measure=peak, limit=1000 + 4000)
    memory = MemoryCallback()
    fit = trainer([memory, finder], root)
    first_real = []
    original_step = Model.training_step
    fit.fit(model)
    after_search = seen[-2:]  # the fit's own two steps, after the search's trials

    # An out-of-memory error inside training: the error Lightning re-raises carries unimem's report.
    oom_model = Model(batch_size=LIMIT + 8)
    memory_oom = MemoryCallback()
    try:
        trainer([memory_oom], root + "/oom").fit(oom_model)
        raised = None
    except torch.OutOfMemoryError as exc:
        raised = exc
    bad = {{}}
    for name, value in {{"mode": "linear", "margin": 1.5, "init_val": 0}}.items():
        try:
            BatchSizeFinder(**{{name: value}})
        except ValueError as exc:
            bad[name] = getattr(exc, "parameter", None)
    power = BatchSizeFinder(mode="power", measure=peak, limit=1000 + 4000)
    trainer([power], root + "/power").fit(Model(batch_size=2))
    emit({{
        "answer": finder.optimal_batch_size,
        "attribute": model.batch_size,
        "trials": [[t.batch_size, t.error is None] for t in finder.search.trials],
        "after_search": after_search,
        "first_in_callbacks": type(fit.callbacks[0]).__name__,
        "rows": [{{k: v for k, v in row.items() if v}} for row in logged(root)],
        "samples": len(memory.recording.samples),
        "oom_notes": [note[:300] for note in getattr(raised, "__notes__", [])],
        "oom_report": memory_oom.report is not None and memory_oom.report.batch_size,
        "bad": bad,
        "power": power.optimal_batch_size,
    }})
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "package, integration",
    [
        ("lightning.pytorch", "unimem.integrations.lightning"),
        ("pytorch_lightning", "unimem.integrations.pytorch_lightning"),
    ],
)
def test_fit_finds_and_uses_the_largest_batch_logs_memory_and_explains_an_oom(
    package: str, integration: str, tmp_path: Any, pyjson: Any, need: Any
) -> None:
    need("torch")
    need_package(package.split(".")[0])
    code = MODEL.format(package=package, integration=integration, limit=40) + SINGLE.format(root=str(tmp_path))
    result = pyjson(code, timeout=400)
    # The largest size that fits is 40; unimem's margin (5%) allows 38 to 40, and nothing above 40.
    assert 38 <= result["answer"] <= 40, result["trials"]
    assert result["attribute"] == result["answer"]  # set where Lightning's finder sets it
    assert result["after_search"] == [result["answer"]] * 2  # the fit trains with it
    assert result["first_in_callbacks"] == "BatchSizeFinder"  # the Trainer moves its own finder class first
    assert len(result["trials"]) <= 6
    # The fit's two steps are in the logger (host figures only on the CPU: device figures are unknown, not 0).
    memory_rows = [row for row in result["rows"] if "mem_host_rss" in row]
    assert [int(row["step"]) for row in memory_rows] == [0, 1] or len(memory_rows) == 2, result["rows"]
    assert all(int(row["mem_host_rss"]) > 0 and "mem_allocated" not in row for row in memory_rows)
    assert result["samples"] == 2
    assert result["oom_notes"] and result["oom_notes"][0].startswith("unimem: ")
    assert result["oom_report"] == 48  # the report knows the batch size the step ran at
    assert result["bad"] == {"mode": "mode", "margin": "margin", "init_val": "init_val"}
    assert result["power"] == 32  # mode="power": the answer rounded down to a power of two


DDP = """
    import time
    rank = int(os.environ["LOCAL_RANK"])
    root = {root!r}
    model = Model(batch_size=2)
    finder = BatchSizeFinder(measure=peak, limit=1000 + 4000, timeout=120)
    memory = MemoryCallback()
    fit = trainer([memory, finder], root, devices=2, strategy="ddp")
    fit.fit(model)
    emit({{
        "rank": rank,
        "answer": finder.optimal_batch_size,
        "attribute": model.batch_size,
        "trials": [[t.batch_size, t.error is None] for t in finder.search.trials],
        "after_search": seen[-2:],
        "rows": [{{k: v for k, v in row.items() if v}} for row in logged(root)] if rank == 0 else [],
    }})
"""


@pytest.mark.slow
def test_ddp_ranks_agree_on_the_largest_batch_that_fits_on_every_rank(tmp_path: Any, need: Any) -> None:
    """Rank 1 fits 30 samples, rank 0 fits 40, and the figures of both say 40: rank 1's trials above 30
    fail while rank 0's run, no collective inside a trial leaves either waiting, and both train with
    the same answer."""
    need("torch")
    need_package("lightning")
    port = str(free_port())
    envs = [
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "NODE_RANK": "0", "LOCAL_RANK": str(rank)}
        for rank in range(2)
    ]
    code = MODEL.format(
        package="lightning.pytorch",
        integration="unimem.integrations.lightning",
        limit="40 if os.environ['LOCAL_RANK'] == '0' else 30",
    ) + DDP.format(root=str(tmp_path))
    ranks = run_ranks(code, envs, timeout=400)
    assert [r["rank"] for r in ranks] == [0, 1]
    answers = {r["answer"] for r in ranks}
    assert len(answers) == 1, ranks
    answer = answers.pop()
    assert 29 <= answer <= 30, ranks[0]["trials"]  # within 5% of rank 1's largest, never above it
    assert ranks[0]["trials"] == ranks[1]["trials"]
    assert any(not ok for _, ok in ranks[0]["trials"])  # a size that failed on rank 1 alone
    for r in ranks:
        assert r["attribute"] == answer and r["after_search"] == [answer, answer]
    memory_rows = [row for row in ranks[0]["rows"] if "mem_host_rss" in row]
    assert memory_rows and all(int(row["mem_host_rss"]) > 0 for row in memory_rows)


# The finder against a fresh fit of its own loop, on an emulated device (EMULATED_DEVICE): the fit makes its
# optimizer's state in its first step, so a fresh fit of three steps runs 23 samples, not 24.
FIT_START = """
    import unimem.integrations.lightning_base as base

    STATE = True

    class Emulated(Model):  # MODEL's, on the emulated device, with data far above any batch that fits
        def training_step(self, batch, index):
            x, y = batch
            device(self, len(x), state=STATE)
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(4096, 8), torch.randn(4096, 1)), batch_size=self.batch_size)

    def fit(size, callbacks=(), steps=3):
        try:
            trainer(list(callbacks), {root!r}, max_steps=steps).fit(Emulated(size))
        except torch.OutOfMemoryError:
            return False
        return True

    truth = {{n: fit(n) for n in (23, 24)}}
    # The peaks read as if 25 fit: the device, not the limit, decides.
    finder = BatchSizeFinder(measure=lambda: 1000 + 100 * sizes[-1], limit=1000 + 100 * (CAP + 1), progress=False)
    fitted = fit(2, [finder])

    # A GPT-2-like step, read as a GPU's search reads it, whose fit runs 12 samples.
    STATE, CAP = False, 12
    shaped(base, "find_batch_size")
    gpt2 = BatchSizeFinder(progress=False)
    fit(2, [gpt2], steps=1)
    emit({{"truth": truth, "answer": finder.optimal_batch_size, "fitted": fitted,
           "trials": [[t.batch_size, t.fits] for t in finder.search.trials],
           "gpt2": gpt2.optimal_batch_size, "calls": calls}})
"""


@pytest.mark.slow
def test_the_finder_answers_no_more_than_a_fresh_fit_runs_in_six_calls_at_most(
    tmp_path: Any, pyjson: Any, need: Any
) -> None:
    """Each trial starts as the fit starts (no optimizer state yet, no gradients), so a size whose fit
    makes its state at that size and then cannot run it is not the answer; and a GPT-2-like step is found
    within 5% in six calls at most (the search bounded by the data, not aimed at it)."""
    need("torch")
    need_package("lightning")
    model = MODEL.format(package="lightning.pytorch", integration="unimem.integrations.lightning", limit=4096)
    code = model + EMULATED_DEVICE + SHAPED_SEARCH + FIT_START.format(root=str(tmp_path))
    result = pyjson(code, timeout=400)
    assert result["truth"] == {"23": True, "24": False}  # the fit's own truth on this device
    assert 22 <= result["answer"] <= 23, result["trials"]
    assert result["fitted"] is True  # the fit that follows trains with the answer
    assert result["gpt2"] == 12 and 0 < len(result["calls"]) <= 6, result["calls"]


# Lightning's own behaviours the drop-in keeps, each run in one shared fresh process; a scenario that
# raises records its error instead, so each test reads its own scenario alone.
AS_LIGHTNING = """
    import traceback, warnings
    from lightning.pytorch.tuner import Tuner
    import lightning.pytorch.callbacks.batch_size_finder as lightning_finder

    root = {root!r}
    out = {{}}

    def scenario(name, run):
        try:
            out[name] = run()
        except Exception as exc:
            out[name] = {{"error": traceback.format_exception_only(type(exc), exc)[-1][:400]}}

    def trainer(callbacks, run_root, **kwargs):
        # MODEL's trainer, with any of its settings overridden.
        settings = dict(max_steps=2, logger=L.loggers.CSVLogger(run_root), log_every_n_steps=1,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        accelerator="cpu", default_root_dir=run_root)
        return L.Trainer(callbacks=callbacks, **(settings | kwargs))

    class Counter(L.Callback):
        # The fit's own training batches (the finder's trials run without the trainer's callbacks).
        def __init__(self):
            self.batches = 0
        def on_train_batch_end(self, *args):
            self.batches += 1

    def upper_case_mode():
        finder = BatchSizeFinder(mode="POWER", measure=peak, limit=1000 + 4000)
        trainer([finder], root + "/upper").fit(Model(batch_size=2))
        return {{"answer": finder.optimal_batch_size, "bad": [refused(mode=m) for m in ("linear", " power", 3)]}}

    def refused(**arguments):
        # The parameter a refused finder names; None when it is accepted.
        try:
            BatchSizeFinder(**arguments)
        except ValueError as exc:
            return getattr(exc, "parameter", None)
        return None

    def no_trials():
        finder = BatchSizeFinder(max_trials=0, init_val=6, measure=peak, limit=1000 + 4000)
        model = Model(batch_size=2)
        seen.clear()
        trainer([finder], root + "/zero").fit(model)
        return {{"answer": finder.optimal_batch_size, "attribute": model.batch_size, "seen": list(seen),
                 "search": finder.search is None, "refused": refused(max_trials=-1)}}

    def under_tuner():
        # Lightning's Tuner builds the finder class its module names: ours, as a peer's suite swaps it in.
        lightning_finder.BatchSizeFinder = BatchSizeFinder
        counter = Counter()
        fit = trainer([counter], root + "/tuner")
        model = Model(batch_size=2)
        answer = Tuner(fit).scale_batch_size(model, max_val=64)
        return {{"answer": answer, "attribute": model.batch_size, "fit_batches": counter.batches,
                 "global_step": fit.global_step, "status": str(fit.state.status)}}

    class Both(Model):
        def __init__(self, batch_size):
            super().__init__(batch_size)
            self.save_hyperparameters()

    def both_holders():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = Both(batch_size=2)
            finder = BatchSizeFinder(measure=peak, limit=1000 + 4000)
            trainer([finder], root + "/both").fit(model)
        return {{"warnings": [str(w.message) for w in caught if "mutually exclusive" in str(w.message)],
                 "answer": finder.optimal_batch_size, "attribute": model.batch_size,
                 "hparams": model.hparams.batch_size}}

    def steps(run_root, **kwargs):
        trainer([MemoryCallback()], run_root, **kwargs).fit(Model(batch_size=8))
        rows = logged(run_root)
        return {{"loss": [int(r["step"]) for r in rows if r.get("loss")],
                 "memory": [int(r["step"]) for r in rows if r.get("mem_host_rss")]}}

    def memory_beside_loss():
        return {{
            "every_step": steps(root + "/csv1", max_steps=3),
            "every_second": steps(root + "/csv2", max_steps=4, log_every_n_steps=2),
            "accumulated": steps(root + "/csv3", max_steps=2, accumulate_grad_batches=2),
        }}

    scenario("upper_case_mode", upper_case_mode)
    scenario("no_trials", no_trials)
    scenario("under_tuner", under_tuner)
    scenario("both_holders", both_holders)
    scenario("memory_beside_loss", memory_beside_loss)
    emit(out)
"""


@pytest.fixture(scope="module")
def as_lightning(tmp_path_factory: Any, pyjson: Any, need: Any) -> Any:
    need("torch")
    need_package("lightning")
    root = str(tmp_path_factory.mktemp("as_lightning"))
    code = MODEL.format(package="lightning.pytorch", integration="unimem.integrations.lightning", limit=40)
    return pyjson(code + AS_LIGHTNING.format(root=root), timeout=500)


@pytest.mark.slow
def test_the_mode_is_read_case_blind_as_lightning_reads_it(as_lightning: Any) -> None:
    result = as_lightning["upper_case_mode"]
    assert result.get("answer") == 32, result  # "POWER" is "power": the answer rounded down to a power of two
    assert result["bad"] == ["mode", "mode", "mode"]  # an unknown mode is still refused, naming it


@pytest.mark.slow
def test_max_trials_zero_keeps_the_start_size_untried_as_lightning_does(as_lightning: Any) -> None:
    result = as_lightning["no_trials"]
    assert result.get("answer") == 6, result
    assert result["attribute"] == 6 and result["search"]  # set on the model; no search ran
    assert result["seen"] == [6, 6]  # the fit's two steps, at the start size: no trial before them
    assert result["refused"] == "max_trials"  # below 0 is still refused, naming it


@pytest.mark.slow
def test_under_lightnings_tuner_the_fit_stops_after_the_search(as_lightning: Any) -> None:
    result = as_lightning["under_tuner"]
    assert result.get("answer") == 32, result  # the Tuner asks mode="power"; 40 fit and max_val is 64
    assert result["attribute"] == 32
    assert result["fit_batches"] == 0 and result["global_step"] == 0  # no training after the search
    assert result["status"].endswith("FINISHED")


@pytest.mark.slow
def test_a_batch_size_on_the_model_and_in_its_hparams_is_warned_about(as_lightning: Any) -> None:
    result = as_lightning["both_holders"]
    assert len(result.get("warnings", [])) == 1, result
    assert "`model.batch_size` and `model.hparams.batch_size` are mutually exclusive" in result["warnings"][0]
    assert result["attribute"] == result["hparams"] == result["answer"]  # both set to the answer


@pytest.mark.slow
def test_memory_lands_on_the_step_the_loss_is_logged_at(as_lightning: Any) -> None:
    result = as_lightning["memory_beside_loss"]
    assert result.get("every_step") == {"loss": [0, 1, 2], "memory": [0, 1, 2]}, result
    assert result["every_second"] == {"loss": [1, 3], "memory": [1, 3]}  # log_every_n_steps=2, as the loss
    assert result["accumulated"] == {"loss": [0, 1], "memory": [0, 1]}  # once per optimizer step


def test_import_unimem_imports_no_trainer(py: Any) -> None:
    proc = py(
        "import sys, unimem, unimem.integrations, unimem.integrations.descent, unimem.integrations.memory_logs\n"
        "names = ('lightning', 'pytorch_lightning', 'transformers', 'accelerate', 'torch')\n"
        "loaded = [m for m in names if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    assert proc.returncode == 0, proc.stderr
