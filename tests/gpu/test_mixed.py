"""torch and JAX in one process, one device split between them."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.gpu

MiB = 1 << 20
GiB = 1 << 30
SLACK = 64 * MiB  # see test_context.py


@pytest.mark.covers("torch:fraction", "jax:fraction")
def test_torch_and_jax_split(scenario: Any, context: dict[str, Any], record: Any) -> None:
    """fraction={"torch": 0.5, "jax": 0.3}: each allocates up to its share and no further."""
    r = scenario("mixed", torch_share=0.5, jax_share=0.3)
    contexts = context["torch"]["process_used"] + context["jax"]["process_used"]
    bound = r["torch_cap"] + r["jax_cap"] + contexts + SLACK
    record(bound=bound, margin=bound - r["max_process_used"])
    assert abs(r["torch_fraction_in_torch"] - 0.5) < 1e-9
    assert r["torch_oom"], "torch allocated past its 50% without an OOM"
    assert r["torch_reserved_max"] <= r["torch_cap"]
    assert r["torch_allocated_max"] >= r["torch_cap"] - 2 * GiB
    assert r["jax_oom"], "JAX allocated past its 30% without an OOM"
    assert r["jax_bytes_limit"] <= r["jax_cap"]
    assert r["jax_allocated_max"] <= r["jax_cap"]
    assert r["jax_allocated_max"] >= r["jax_bytes_limit"] - 2 * GiB
    assert r["max_process_used"] <= bound
    assert r["stats_torch.limit"] == int(r["total_memory"] * 0.5)
    assert r["stats_jax.limit"] == r["jax_bytes_limit"]
