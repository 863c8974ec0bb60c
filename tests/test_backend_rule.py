"""The one rule for ``backend=None`` (``unimem.registry.resolve``), in fresh processes:
which frameworks are imported or started is process-global.

Queries (stats, track, monitor, summary): configured, else started, else the framework-free
view. Actions (mixed_precision, find_batch_size, oom_guard, profile): configured, else the
one framework the user imported (not one another framework imported itself), else a
ConfigError listing the candidates. Several at one level: a ConfigError naming them.
"""

from __future__ import annotations

import pytest

# Reads what each kind of call resolves to, without raising: the error's class and text if any.
PROBE = """
import unimem
from unimem import registry

def outcome(call):
    try:
        return {"name": call()}
    except unimem.ConfigError as exc:
        return {"error": str(exc), "parameter": exc.parameter}

def snapshot():
    return {
        "query": outcome(lambda: registry.resolve(None, "query")),
        "action": outcome(lambda: registry.resolve(None, "action")),
        "stats": outcome(lambda: unimem.stats().backend),
    }
"""


@pytest.mark.slow
def test_tensorflow_only_script_before_and_after_its_first_op(pyjson, need):
    need("tensorflow")
    out = pyjson(
        PROBE
        + """
import sys
import tensorflow as tf
before = snapshot()
before["jax_imported"] = "jax" in sys.modules
tf.zeros(1).numpy()
emit({"before": before, "after": snapshot()})
"""
    )
    before, after = out["before"], out["after"]
    # TensorFlow imports JAX itself: that is no sign the script uses JAX.
    assert before["query"] == {"name": None}, "before its first op nothing has started: the framework-free view"
    assert before["stats"] == {"name": "nvml"}
    assert before["action"] == {"name": "tensorflow"}
    assert after["query"] == {"name": "tensorflow"}
    assert after["stats"] == {"name": "tensorflow"}
    assert after["action"] == {"name": "tensorflow"}


@pytest.mark.slow
def test_torch_and_jax_imported_before_and_after_jax_starts(pyjson, need):
    need("torch")
    need("jax")
    out = pyjson(
        PROBE
        + """
import torch, jax, jax.numpy as jnp
before = snapshot()
jnp.zeros(1).block_until_ready()
emit({"before": before, "after": snapshot()})
"""
    )
    before, after = out["before"], out["after"]
    assert before["query"] == {"name": None}, "imported is no evidence of use for a query"
    assert before["stats"] == {"name": "nvml"}
    assert before["action"]["parameter"] == "backend"
    assert "torch" in before["action"]["error"] and "jax" in before["action"]["error"]
    # JAX started (torch cannot start a device runtime on a CPU-only host).
    assert after["query"] == {"name": "jax"}
    assert after["stats"] == {"name": "jax"}
    assert "torch" in after["action"]["error"] and "jax" in after["action"]["error"], "actions look at imports"


@pytest.mark.slow
def test_a_framework_another_module_imported_does_not_count(pyjson, need):
    need("torch")
    need("jax")
    out = pyjson(
        PROBE
        + """
import sys, types
sys.modules["transformers"] = types.ModuleType("transformers")  # it imports torch itself
import torch, jax
emit(snapshot())
"""
    )
    assert out["action"] == {"name": "jax"}


@pytest.mark.slow
def test_configured_wins_and_two_configured_are_ambiguous(pyjson, need):
    need("torch")
    need("jax")
    out = pyjson(
        PROBE
        + """
import jax.numpy as jnp
jnp.zeros(1).block_until_ready()
unimem.configure(backend="torch", growth=True)
one = snapshot()
unimem.configure(backend="jax", strict=False)
emit({"one": one, "two": snapshot()})
"""
    )
    assert out["one"] == {"query": {"name": "torch"}, "action": {"name": "torch"}, "stats": {"name": "torch"}}
    for kind in ("query", "action", "stats"):
        assert "torch" in out["two"][kind]["error"] and "jax" in out["two"][kind]["error"]


def test_cpu_only_host_without_nvml_answers_the_framework_free_view(pyjson):
    out = pyjson(
        """
import sys
sys.modules["pynvml"] = None  # nvidia-ml-py absent: importing it fails
import unimem
snapshot = unimem.stats()
try:
    unimem.stats("nvml")
    explicit = None
except unimem.BackendUnavailable as exc:
    explicit = str(exc)
emit({"backend": snapshot.backend, "figures": [snapshot.device_total, snapshot.allocated], "explicit": explicit})
"""
    )
    assert out["backend"] == "nvml"
    assert out["figures"] == [None, None], "a number unimem cannot know is None"
    assert out["explicit"] is not None, "an explicit NVML query without NVML is an error, not Nones"


def test_nothing_imported_is_a_config_error_for_actions_listing_candidates(pyjson):
    out = pyjson(
        """
import unimem
try:
    unimem.mixed_precision("bf16")
    emit({"raised": None})
except unimem.ConfigError as exc:
    emit({"raised": exc.parameter, "message": str(exc)})
"""
    )
    assert out["raised"] == "backend"
    assert "pass backend=" in out["message"]


@pytest.mark.parametrize("kind", ["query", "action"])
def test_an_explicit_name_is_taken_as_given(kind):
    from unimem import registry

    assert registry.resolve("tf", kind) == "tensorflow"
    with pytest.raises(Exception) as info:
        registry.resolve("cuda", kind)
    assert getattr(info.value, "parameter", None) == "backend"
