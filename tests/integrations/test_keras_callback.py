"""The Keras 3 callback in a real model.fit, under each Keras backend (fresh processes)."""

from __future__ import annotations

import re
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
    # In MiB, the unit in the key: a process holds tens to thousands of MiB, not 10**8 of them.
    assert len(history["mem_host_rss_mib"]) == 2 and all(10 < v < 100_000 for v in history["mem_host_rss_mib"])
    assert not {"mem_allocated_mib", "mem_peak_mib", "mem_host_rss"} & set(history)
    epoch_bytes = [e["host_rss"] for e in result["epochs"]]  # the exact bytes stay with the callback
    assert [round(b / 2**20, 2) for b in epoch_bytes] == history["mem_host_rss_mib"]
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
    assert len(result["history"]["mem_host_rss_mib"]) == 2


def test_import_unimem_does_not_import_keras(py: Any) -> None:
    proc = py(
        "import sys, unimem; assert 'keras' not in sys.modules and 'unimem.keras_callback' not in sys.modules "
        "and 'unimem.integrations.keras' not in sys.modules"
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_the_progress_bar_shows_readable_figures(py: Any, need: Any) -> None:
    """Keras prints every log entry with four decimals: bytes read ``708263936.0000``, MiB ``675.45``."""
    need("torch")
    proc = py(
        """
        import numpy as np, keras
        from unimem.integrations.keras import MemoryCallback

        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        model.fit(np.ones((8, 4)), np.ones((8, 1)), epochs=1, batch_size=4, verbose=1, callbacks=[MemoryCallback()])
        """,
        env={"KERAS_BACKEND": "torch"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    shown = re.findall(r"(mem_\w+): ([0-9.e+]+)", proc.stdout)
    assert shown and all(name.endswith("_mib") for name, _ in shown), proc.stdout
    assert all(float(value) < 100_000 for _, value in shown), proc.stdout
