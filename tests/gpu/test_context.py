"""The CUDA context measured in this run: the tolerance every NVML bound below builds on."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.gpu

MiB = 1 << 20
GiB = 1 << 30
# Added to "cap + context" in every NVML bound: NVML counts in pages, and a framework
# loads kernels and small bookkeeping buffers outside its pool as it runs.
SLACK = 64 * MiB


def test_context_baselines(context: dict[str, dict[str, Any]], record: Any) -> None:
    """A bare driver context, torch with one tiny tensor, JAX (growth) after one op."""
    for name, result in context.items():
        record(**{f"{name}.{key}": value for key, value in result.items()})
    record(slack=SLACK)
    driver = context["driver"]["process_used"]
    record(
        torch_over_driver=context["torch"]["process_used"] - driver,
        jax_over_driver=context["jax"]["process_used"] - driver,
    )
    assert 64 * MiB < driver < 2 * GiB
    assert context["torch"]["process_used"] >= driver - SLACK
    assert context["jax"]["process_used"] >= driver - SLACK
