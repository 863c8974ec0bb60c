"""JAX on the GPU: caps, growth, preallocation, late configure, clear_cache and stats, each in a fresh process."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.gpu

MiB = 1 << 20
GiB = 1 << 30
SLACK = 64 * MiB  # see test_context.py


def _check_cap(r: dict[str, Any], context: dict[str, Any], record: Any) -> None:
    bound = r["cap"] + context["jax"]["process_used"] + SLACK
    record(context=context["jax"]["process_used"], bound=bound, margin=bound - r["max_process_used"])
    assert r["oom"], "allocating past the cap raised no OOM"
    assert "RESOURCE_EXHAUSTED" in r["oom_message"]
    assert r["bytes_limit"] <= r["cap"]
    assert r["bytes_limit"] >= 0.97 * r["cap"], "XLA's pool is much smaller than the cap asked for"
    assert r["allocated_at_oom"] <= r["cap"]
    assert r["allocated_at_oom"] >= r["bytes_limit"] - 2 * GiB, "the OOM came well before the cap"
    assert r["max_process_used"] <= bound
    assert r["max_process_used_raw"] <= bound
    assert r["stats_limit"] == r["bytes_limit"]


@pytest.mark.covers("jax:fraction", "jax:stats.limit", "jax:stats.process_used")
def test_jax_fraction_cap(scenario: Any, context: dict[str, Any], record: Any) -> None:
    r = scenario("jax_cap", fraction=0.25)
    assert "0.25" in (r["env.XLA_CLIENT_MEM_FRACTION"], r["env.XLA_PYTHON_CLIENT_MEM_FRACTION"])
    _check_cap(r, context, record)


@pytest.mark.covers("jax:limit", "jax:stats.limit", "jax:stats.process_used")
def test_jax_limit_cap(scenario: Any, context: dict[str, Any], record: Any) -> None:
    r = scenario("jax_cap", limit="20GiB")
    assert r["cap"] == 20 * GiB
    _check_cap(r, context, record)


@pytest.mark.covers("jax:growth")
def test_jax_growth(scenario: Any, context: dict[str, Any], record: Any) -> None:
    """growth=True: near the bare context after the first op, then grows on demand."""
    r = scenario("jax_growth", growth=True)
    driver = context["driver"]["process_used"]
    record(driver_context=driver, over_driver_context=r["process_used_after_first_op"] - driver)
    assert r["env.XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert r["process_used_before_first_op"] is None
    assert r["process_used_after_first_op"] <= context["jax"]["process_used"] + SLACK
    assert r["process_used_after_first_op"] <= driver + 256 * MiB
    assert r["process_used_after_grow"] - r["process_used_after_first_op"] >= r["grow_by"]


@pytest.mark.covers("jax:preallocate", "jax:fraction")
def test_jax_preallocate_fraction(scenario: Any, context: dict[str, Any], record: Any) -> None:
    """growth=False, fraction=0.3: XLA takes about 30% of the device at the first op."""
    r = scenario("jax_growth", growth=False, fraction=0.3)
    share = 0.3 * r["nvml_total"]
    limit = r["memory_stats.bytes_limit"]
    record(share=int(share), process_over_limit=r["process_used_after_first_op"] - limit)
    assert r["env.XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    assert 0.97 * share <= limit <= share
    assert limit <= r["process_used_after_first_op"] <= limit + context["jax"]["process_used"] + SLACK
    # the 2 GiB array comes out of the preallocated pool
    assert r["process_used_after_grow"] - r["process_used_after_first_op"] <= SLACK


@pytest.mark.covers("jax:fraction", "jax:growth")
def test_jax_late_configure(scenario: Any) -> None:
    """After the first op a changed setting raises TooLateError and touches nothing; the
    same setting is a no-op; strict=False warns and skips."""
    r = scenario("jax_late")
    assert r["phase"] == "INITIALIZED"
    assert r["late_error"] == "TooLateError"
    assert r["late_is_runtime_error"] is True
    assert r["env.XLA_CLIENT_MEM_FRACTION"] == "<unset>"
    assert r["env.XLA_PYTHON_CLIENT_MEM_FRACTION"] == "<unset>"
    assert r["same_setting_status"] == "unchanged"
    assert r["lenient_status"] == "skipped"
    assert "UnimemWarning" in r["lenient_warnings"]
    assert r["bytes_limit_after"] == r["bytes_limit_before"]


@pytest.mark.covers("jax:clear_cache", "jax:allocator.uncached")
def test_jax_clear_cache_uncached(scenario: Any, record: Any) -> None:
    """allocator='uncached': an array freed by clear_cache's gc goes back to the device."""
    r = scenario("jax_clear_cache", allocator="uncached")
    record(returned_minus_nvml=r["returned"] - r["nvml_delta"])
    assert r["env.XLA_PYTHON_CLIENT_ALLOCATOR"] == "platform"
    assert r["memory_stats_is_none"] is True
    assert r["returned"] >= r["size"] - SLACK
    assert abs(r["returned"] - r["nvml_delta"]) <= SLACK
    assert r["warning_categories"] == "<none>"


@pytest.mark.covers("jax:clear_cache", "jax:allocator.default")
def test_jax_clear_cache_bfc(scenario: Any) -> None:
    """The default BFC pool keeps freed memory: clear_cache returns 0 and says so."""
    r = scenario("jax_clear_cache", allocator=None)
    assert r["memory_stats_is_none"] is False
    assert r["returned"] == 0
    assert "UnimemWarning" in r["warning_categories"]
    assert r["nvml_delta_settled"] <= SLACK  # the device saw nothing come back either


@pytest.mark.covers(
    "jax:stats.allocated",
    "jax:stats.reserved",
    "jax:stats.peak",
    "jax:stats.limit",
    "jax:stats.largest_free_block",
    "jax:stats.num_allocs",
    "jax:stats.device",
    "jax:stats.process_used",
    "jax:reset_peak",
)
def test_jax_stats(scenario: Any) -> None:
    """stats() against Device.memory_stats() (exact, key by key) and NVML."""
    r = scenario("jax_stats")
    keys = set(r["memory_stats_keys"].split(","))
    mapping = {
        "stats.allocated": "bytes_in_use",
        "stats.reserved": "pool_bytes",
        "stats.peak_allocated": "peak_bytes_in_use",
        "stats.peak_reserved": "peak_pool_bytes",
        "stats.limit": "bytes_limit",
        "stats.largest_free_block": "largest_free_block_bytes",
        "stats.num_allocs": "num_allocs",
    }
    missing = sorted(key for key in mapping.values() if key not in keys)
    assert not missing, f"memory_stats() has no {missing}; it has {sorted(keys)}"
    for field, key in mapping.items():
        assert r[field] == r[f"memory_stats.{key}"], f"{field} != memory_stats()[{key!r}]"
    assert r["stats.num_ooms"] is None
    assert r["stats.device_total"] == r["nvml_total"]
    assert abs(r["stats.device_free"] - r["nvml_free"]) <= SLACK
    assert r["stats.process_used"] == r["raw_process_used"]
    assert r["after_reset.peak_allocated"] is None
    assert r["after_bigger.peak_allocated"] == r["after_bigger.native_peak"]


@pytest.mark.covers("jax:allocator.async")
def test_jax_allocator_async(scenario: Any) -> None:
    """allocator='async' (cuda_async): XLA starts with it and allocates on demand."""
    r = scenario("jax_allocator", allocator="async")
    assert r["env.XLA_PYTHON_CLIENT_ALLOCATOR"] == "cuda_async"
    assert r["process_used_with_array"] - r["process_used_after_first_op"] >= GiB - SLACK
    assert r["stats_live.allocated"] == r["memory_stats.bytes_in_use"] >= GiB
    # cuda_async keeps no pool figures: memory_stats() answers 0 for them, unimem None (an
    # unknown figure is None, never 0)
    assert "pool_bytes" not in r["memory_stats_keys"].split(",")
    assert r["stats_live.reserved"] is None
    assert r["stats_live.limit"] is None
    assert r["stats_live.largest_free_block"] is None


def test_probe_jax_vmm_allocator(scenario: Any) -> None:
    """Not a unimem setting: does this jaxlib's XLA_PYTHON_CLIENT_ALLOCATOR=vmm run here?
    (A candidate for JAX's 'expandable' allocator, recorded for the matrix's authors.)"""
    r = scenario("jax_allocator", allocator="vmm", via_unimem=False)
    assert r["env.XLA_PYTHON_CLIENT_ALLOCATOR"] == "vmm"
    assert r["process_used_with_array"] - r["process_used_after_first_op"] >= GiB - SLACK
