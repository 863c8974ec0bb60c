"""Several frameworks in one process: a split of the device and the safe growth default."""

from __future__ import annotations

import pytest

# One device split between frameworks, each in a fresh process: the slow set.
pytestmark = pytest.mark.slow


@pytest.mark.covers("jax:growth", "jax:fraction", "torch:fraction")
def test_split_with_torch_and_jax_turns_jax_growth_on_and_says_so(pyjson) -> None:
    result = pyjson(
        """
        import os, warnings
        import unimem
        import torch, jax
        warnings.simplefilter("ignore")
        applied = unimem.configure(backend=["torch", "jax"], fraction={"torch": 0.5, "jax": 0.3})
        growth = applied.get("jax", "growth")
        emit({
            "growth": [(a.value, a.status, a.note) for a in growth],
            "env": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
            "fraction": os.environ.get("XLA_CLIENT_MEM_FRACTION") or os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
            "torch_fraction": [a.value for a in applied.get("torch", "fraction")],
            "text": str(applied),
        })
        """
    )
    assert result["env"] == "false"
    assert result["fraction"] == "0.3"
    assert result["torch_fraction"] == [0.5]
    [(value, status, note)] = result["growth"]
    assert value is True and status == "pending"
    assert "safe default" in note and "torch" in note
    assert "safe default" in result["text"]


def test_user_choices_win_over_the_safe_default(pyjson) -> None:
    result = pyjson(
        """
        import os, warnings
        import unimem
        import torch, jax
        warnings.simplefilter("ignore")
        explicit = unimem.configure(backend=["torch", "jax"], growth=False)
        explicit_env = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE")
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true"  # the user's own setting
        respected = unimem.configure(backend=["torch", "jax"], fraction={"torch": 0.5, "jax": 0.3})
        emit({
            "explicit_env": explicit_env,
            "explicit_notes": [a.note for a in explicit.get("jax", "growth")],
            "respected_growth": [a.value for a in respected.get("jax", "growth")],
            "env_after": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
        })
        """
    )
    assert result["explicit_env"] == "true"
    assert not any("safe default" in note for note in result["explicit_notes"])
    assert result["respected_growth"] == []
    assert result["env_after"] == "true"


def test_one_framework_alone_keeps_its_default(pyjson) -> None:
    result = pyjson(
        """
        import os
        import unimem
        import jax
        applied = unimem.configure(backend="jax", fraction=0.3)
        growth = [a.value for a in applied.get("jax", "growth")]
        emit({"growth": growth, "env": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE")})
        """
    )
    assert result == {"growth": [], "env": None}


def test_safe_default_too_late_is_skipped_not_raised(pyjson) -> None:
    result = pyjson(
        """
        import warnings
        import unimem
        import jax.numpy as jnp
        jnp.ones(2).block_until_ready()   # JAX started (and would have preallocated on a GPU)
        import torch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            applied = unimem.configure(backend=["torch", "jax"])
        emit({
            "growth": [(a.status, a.note) for a in applied.get("jax", "growth")],
            "warned": [str(w.message) for w in caught if issubclass(w.category, unimem.UnimemWarning)],
        })
        """
    )
    [(status, note)] = result["growth"]
    assert status == "skipped"
    assert "safe default not applied" in note
    assert any("jax" in message for message in result["warned"])
