"""The Keras 3 callback in a real model.fit, under each Keras backend (fresh processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

FIT = """
    import numpy as np, keras
    from PIL import Image
    from unimem.keras_callback import MemoryCallback
    import unimem.integrations.keras as integration

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    cb = MemoryCallback(per_batch={per_batch})
    x, y = np.random.rand(64, 8), np.random.rand(64, 1)
    history = model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[cb])
    png = cb.plot({png!r})
    with Image.open(png) as image:
        size = list(image.size)
    emit({{
        "keras": keras.backend.backend(),
        "unimem": cb.backend,
        "history": history.history,
        "samples": [[s.step, s.allocated, s.peak, s.host_rss] for s in cb.hook.samples],
        "marks": [m.label for m in cb.hook.recording.marks],
        "epochs": cb.epochs,
        "async_safe": cb.async_safe,
        "png": size,
        "same_class": MemoryCallback is integration.MemoryCallback,
    }})
"""


@pytest.mark.parametrize("keras_backend", ["tensorflow", "jax", "torch"])
@pytest.mark.slow
def test_callback_records_memory_per_batch_and_epoch(
    keras_backend: str, tmp_path: Path, pyjson: Any, need: Any
) -> None:
    need(keras_backend)
    result = pyjson(
        FIT.format(per_batch=True, png=str(tmp_path / "fit.png")), env={"KERAS_BACKEND": keras_backend}, timeout=300
    )
    assert result["keras"] == keras_backend and result["unimem"] == keras_backend
    history = result["history"]
    assert len(history["loss"]) == 2
    # On the CPU only the host figure is known: it is in the logs; unknown figures are left
    # out of them (Keras logs must be numbers) rather than logged as 0.
    assert len(history["mem_host_rss"]) == 2 and all(v > 0 for v in history["mem_host_rss"])
    assert "mem_allocated" not in history and "mem_peak" not in history
    assert len(result["samples"]) == 8  # 2 epochs x 4 batches
    assert all(allocated is None and peak is None and rss > 0 for _, allocated, peak, rss in result["samples"])
    assert result["marks"] == ["epoch 1", "epoch 2"]
    assert [e["epoch"] for e in result["epochs"]] == [0, 1]
    assert all(e["peak"] is None and e["duration"] > 0 for e in result["epochs"])
    assert result["async_safe"] is False  # per-batch reads need Keras to wait for the batch
    assert result["png"] == [1000, 500]
    assert result["same_class"] is True  # unimem.keras_callback re-exports unimem.integrations.keras


@pytest.mark.slow
def test_epoch_only_callback_keeps_async_dispatch(tmp_path: Path, pyjson: Any, need: Any) -> None:
    need("jax")
    result = pyjson(FIT.format(per_batch=False, png=str(tmp_path / "e.png")), env={"KERAS_BACKEND": "jax"}, timeout=300)
    assert result["async_safe"] is True
    assert len(result["samples"]) == 2  # one per epoch
    assert len(result["history"]["mem_host_rss"]) == 2


def test_import_unimem_does_not_import_keras(py: Any) -> None:
    proc = py(
        "import sys, unimem; assert 'keras' not in sys.modules and 'unimem.keras_callback' not in sys.modules "
        "and 'unimem.integrations.keras' not in sys.modules"
    )
    assert proc.returncode == 0, proc.stderr
