"""profile(): each framework's own memory profiler, its files, and honest refusals.

Run in fresh processes (the test process imports no framework). The torch CUDA
allocator history needs a GPU: here it must refuse clearly; on the GPU machine
benchmarks/bench_monitor.py writes a snapshot and opens it with torch's memory_viz.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import unimem


@pytest.mark.slow
def test_jax_device_memory_profile_on_the_cpu(tmp_path: Path, pyjson: Any, need: Any) -> None:
    need("jax")
    result = pyjson(
        f"""
        import os, jax.numpy as jnp, unimem
        with unimem.profile({str(tmp_path / "prof")!r}, "jax") as p:
            x = jnp.ones((512, 512)).block_until_ready()
            mid = p.snapshot("mid")
        emit({{"paths": [str(q) for q in p.paths], "mid": str(mid), "sizes": [os.path.getsize(q) for q in p.paths]}})
        """
    )
    names = sorted(Path(path).name for path in result["paths"])
    assert names == ["jax_memory.prof", "jax_mid.prof"]
    assert all(size > 0 for size in result["sizes"])


@pytest.mark.slow
def test_jax_that_never_ran_writes_nothing_and_says_so(tmp_path: Path, pyjson: Any, need: Any) -> None:
    need("jax")
    result = pyjson(
        f"""
        import warnings, jax, unimem
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with unimem.profile({str(tmp_path / "idle")!r}, "jax") as p:
                pass
        emit({{"paths": [str(q) for q in p.paths], "warnings": [str(w.message) for w in caught]}})
        """
    )
    assert result["paths"] == []
    assert any("has not run anything" in message for message in result["warnings"])


@pytest.mark.slow
def test_torch_without_cuda_refuses_before_touching_anything(tmp_path: Path, pyjson: Any, need: Any) -> None:
    need("torch")
    target = tmp_path / "torch_prof"
    result = pyjson(
        f"""
        import torch, unimem
        try:
            with unimem.profile({str(target)!r}, "torch"):
                pass
        except unimem.UnsupportedFeature as exc:
            emit({{"error": str(exc), "feature": exc.feature, "is_nie": isinstance(exc, NotImplementedError)}})
        else:
            emit({{"error": None}})
        """
    )
    assert result["error"] is not None and "CUDA" in result["error"]
    assert result["feature"] == "profile" and result["is_nie"]
    assert not target.exists()


@pytest.mark.slow
def test_tensorflow_profiler_trace_on_the_cpu(tmp_path: Path, pyjson: Any, need: Any) -> None:
    need("tensorflow")
    result = pyjson(
        f"""
        import tensorflow as tf, unimem
        with unimem.profile({str(tmp_path / "tf")!r}, "tf") as p:
            y = tf.matmul(tf.ones((256, 256)), tf.ones((256, 256)))
        emit([str(q) for q in p.paths])
        """,
        timeout=300,
    )
    assert result and any(path.endswith(".xplane.pb") for path in result)


def test_bad_arguments(tmp_path: Path) -> None:
    afile = tmp_path / "a_file"
    afile.write_text("x")
    with pytest.raises(unimem.ConfigError) as info:
        unimem.profile(afile, "jax")
    assert info.value.parameter == "path"
    with pytest.raises(unimem.ConfigError) as info:
        unimem.profile(tmp_path, "jax", max_entries=0)
    assert info.value.parameter == "max_entries"
    with pytest.raises(unimem.ConfigError) as info:
        unimem.profile(tmp_path, "numpy")
    assert info.value.parameter == "backend"


def test_nvml_has_no_profiler(tmp_path: Path) -> None:
    with pytest.raises(unimem.UnsupportedFeature, match="no memory profiler"):
        unimem.profile(tmp_path / "n", "nvml").start()
    assert not (tmp_path / "n").exists()
