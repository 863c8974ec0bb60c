"""The Hugging Face Trainer integration in a real Trainer.train on the CPU (a fresh process, a tiny GPT-2,
no downloads): unimem's batch search through the trainer's own step sets the batch train() uses, memory
figures reach the callbacks that log, and an out-of-memory error comes out explained."""

from __future__ import annotations

from typing import Any

import pytest
from trainers import need_package

TRAIN = """
    import os
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch, unimem
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
    from unimem.integrations.transformers import add_memory_callback, find_batch_size, oom_guard

    LIMIT = 24  # a batch above this "runs out of memory"; measure() reads 1000 bytes + 100 a sample
    seen = []

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, index):
            ids = torch.randint(0, 64, (16,))
            return {{"input_ids": ids, "labels": ids}}

    def forward(module, args, kwargs):
        seen.append(kwargs["input_ids"].shape[0])
        if seen[-1] > LIMIT:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    class Saw(TrainerCallback):  # a logger: what it is handed is what a reporting callback would write
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs))

    def make(batch_size):
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
        model = GPT2LMHeadModel(config)
        model.register_forward_pre_hook(forward, with_kwargs=True)
        args = TrainingArguments(
            output_dir={out!r}, per_device_train_batch_size=batch_size, max_steps=2, logging_steps=1,
            report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True,
        )
        saw = Saw()
        return Trainer(model=model, args=args, train_dataset=Data(), callbacks=[saw]), saw

    trainer, saw = make(4)
    before = {{k: v.clone() for k, v in trainer.model.state_dict().items()}}
    rng = torch.get_rng_state()
    measure = lambda: 1000 + 100 * seen[-1]
    search = find_batch_size(trainer, measure=measure, limit=1000 + 100 * LIMIT, return_trials=True)
    unchanged = all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    callback = add_memory_callback(trainer)
    seen.clear()
    trainer.train()
    trained = list(seen)

    # Training at a size that does not fit, inside the guard.
    big, _ = make(LIMIT + 8)
    try:
        with oom_guard(big):
            big.train()
        error = None
    except unimem.OutOfMemory as exc:
        error = {{"cause": type(exc.__cause__).__name__, "batch_size": exc.report.batch_size}}

    refused = {{}}
    for name, call in {{
        "trainer": lambda: find_batch_size(object()),
        "steps_per_trial": lambda: find_batch_size(trainer, steps_per_trial=0),
        "margin": lambda: find_batch_size(trainer, margin=2.0),
    }}.items():
        try:
            call()
        except unimem.ConfigError as exc:
            refused[name] = exc.parameter
    emit({{
        "answer": search.batch_size,
        "trials": [[t.batch_size, t.error is None] for t in search.trials],
        "unchanged": unchanged,
        "rng_restored": torch.equal(rng, torch.get_rng_state()) or None,
        "per_device": trainer.args.per_device_train_batch_size,
        "trained": trained,
        "logs": saw.logs,
        "history": trainer.state.log_history,
        "first": type(trainer.callback_handler.callbacks[0]).__name__,
        "recorded": len(callback.hook.samples),
        "error": error,
        "refused": refused,
    }})
"""


@pytest.mark.slow
def test_trainer_trains_with_the_batch_found_logs_memory_and_explains_an_oom(
    tmp_path: Any, pyjson: Any, need: Any
) -> None:
    need("torch")
    need_package("transformers")
    result = pyjson(TRAIN.format(out=str(tmp_path / "out")), timeout=400)
    # The largest size that fits is 24; the margin (5%) allows 23 or 24, never above.
    assert 23 <= result["answer"] <= 24, result["trials"]
    assert result["unchanged"] is True  # the trials' optimizer steps are undone
    assert result["per_device"] == result["answer"]
    # The dataloader train() builds uses the answer (the Trainer copies the argument when made).
    assert result["trained"] == [result["answer"]] * 2
    assert result["first"] == "MemoryCallback"
    steps = [log for log in result["logs"] if "loss" in log]
    assert len(steps) == 2
    # A callback listed before unimem's (as report_to's are) still sees the figures; unknown ones stay out.
    assert all(log["mem_host_rss"] > 0 and "mem_allocated" not in log for log in steps)
    assert all("mem_host_rss" in entry for entry in result["history"] if "loss" in entry)
    assert result["recorded"] == 2
    assert result["error"] == {"cause": "OutOfMemoryError", "batch_size": 32}
    assert result["refused"] == {"trainer": "trainer", "steps_per_trial": "steps_per_trial", "margin": "margin"}
