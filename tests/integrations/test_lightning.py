"""The Lightning callbacks in real fits on the CPU (fresh processes): the batch-size finder with a
simulated memory limit, on one device and over two DDP ranks (gloo), memory in the loggers, and an
out-of-memory error explained. Each package, ``lightning.pytorch`` and ``pytorch_lightning``."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import free_port, run_ranks
from trainers import need_package

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
        return L.Trainer(
            max_steps=2, callbacks=callbacks, logger=L.loggers.CSVLogger(root), log_every_n_steps=1,
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
            accelerator="cpu", default_root_dir=root, **kwargs,
        )

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


def test_import_unimem_imports_no_trainer(py: Any) -> None:
    proc = py(
        "import sys, unimem, unimem.integrations, unimem.integrations.descent, unimem.integrations.memory_logs\n"
        "names = ('lightning', 'pytorch_lightning', 'transformers', 'accelerate', 'torch')\n"
        "loaded = [m for m in names if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    assert proc.returncode == 0, proc.stderr
