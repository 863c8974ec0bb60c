"""Queries with backend=None or a device index that does not exist: a clear error or an
honest None, never a framework's own crash or an invented figure."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_a_device_the_started_framework_lacks_is_a_config_error(pyjson) -> None:
    result = pyjson(
        """
        import unimem
        import jax.numpy as jnp
        jnp.ones(2).block_until_ready()
        try:
            unimem.stats("jax", device=3)
            emit({"raised": None})
        except unimem.ConfigError as exc:
            emit({"raised": exc.parameter, "message": str(exc), "device0": unimem.stats("jax").allocated})
        """
    )
    assert result["raised"] == "device"
    assert "jax sees 1 device" in result["message"]
    assert result["device0"] is None  # JAX on the CPU keeps no memory statistics


@pytest.mark.slow
def test_a_framework_without_gpus_answers_none_for_any_device(pyjson) -> None:
    result = pyjson(
        """
        import unimem
        import tensorflow as tf
        tf.zeros(1).numpy()
        emit(unimem.stats("tensorflow", device=3).as_dict())
        """
    )
    assert result["allocated"] is None and result["device"] == 3


@pytest.mark.slow
def test_precision_and_stats_pick_the_started_framework_when_tf_brings_jax(pyjson) -> None:
    # `import tensorflow` also imports JAX (TF Lite); only TF runs, so backend=None means TF.
    result = pyjson(
        """
        import sys
        import unimem
        import tensorflow as tf
        tf.zeros(1).numpy()
        emit({
            "jax_imported": "jax" in sys.modules,
            "stats": unimem.stats().backend,
            "policy": unimem.mixed_precision("fp32").backend,
        })
        """
    )
    assert result == {"jax_imported": True, "stats": "tensorflow", "policy": "tensorflow"}
