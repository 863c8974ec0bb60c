"""PyTorch on the GPU: caps, preallocation, allocators, clear_cache and stats, each in a fresh process."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.gpu

MiB = 1 << 20
GiB = 1 << 30
SLACK = 64 * MiB  # see test_context.py
# Left free by an uncapped preallocation, as the torch adapter (backends/torch/adapter.py) does.
UNCAPPED_HEADROOM = GiB
SMALL_POOL_HEADROOM = 64 * MiB


def _check_cap(r: dict[str, Any], context: dict[str, Any], record: Any) -> None:
    """An OOM came from the cap, at the cap, and NVML never saw more than cap + context."""
    bound = r["cap"] + context["torch"]["process_used"] + SLACK
    record(context=context["torch"]["process_used"], bound=bound, margin=bound - r["max_process_used"])
    assert r["oom"], "allocating past the cap raised no OOM"
    assert r["oom_type"].endswith("OutOfMemoryError")
    assert r["allocated_at_oom"] <= r["cap"]
    assert r["allocated_at_oom"] >= r["cap"] - 2 * GiB, "the OOM came well before the cap"
    assert r["max_reserved"] <= r["cap"]
    assert r["max_process_used"] <= bound
    assert r["max_process_used_raw"] <= bound


@pytest.mark.covers("torch:fraction", "torch:stats.limit", "torch:stats.process_used")
def test_torch_fraction_cap(scenario: Any, context: dict[str, Any], record: Any) -> None:
    r = scenario("torch_cap", fraction=0.25)
    assert r["torch_imported_at_configure"] is False
    assert abs(r["fraction_in_torch"] - 0.25) < 1e-9
    assert r["stats_limit"] == int(r["total_memory"] * 0.25)
    _check_cap(r, context, record)


@pytest.mark.covers("torch:limit", "torch:stats.limit", "torch:stats.process_used")
def test_torch_limit_cap(scenario: Any, context: dict[str, Any], record: Any) -> None:
    r = scenario("torch_cap", limit="20GiB")
    assert r["cap"] == 20 * GiB
    assert abs(r["fraction_in_torch"] - 20 * GiB / r["total_memory"]) < 1e-9
    assert abs(r["stats_limit"] - 20 * GiB) <= MiB
    _check_cap(r, context, record)


@pytest.mark.covers("torch:fraction", "torch:allocator.expandable")
def test_torch_configure_after_import_before_cuda(scenario: Any, context: dict[str, Any], record: Any) -> None:
    """``import torch`` first, configure before the first CUDA call: cap and allocator still apply."""
    r = scenario("torch_cap", fraction=0.25, after_import=True, allocator="expandable")
    assert r["torch_imported_at_configure"] is True
    assert r["torch_initialized_at_configure"] is False
    assert abs(r["fraction_in_torch"] - 0.25) < 1e-9
    assert r.get("large_segments") == 1, "expandable segments did not take effect (one segment expected)"
    _check_cap(r, context, record)


@pytest.mark.covers("torch:preallocate")
def test_torch_preallocate_uncapped(scenario: Any, context: dict[str, Any], record: Any) -> None:
    r = scenario("torch_prealloc")
    ctx = context["torch"]["process_used"]
    expected_min = r["nvml_free_before_init"] - ctx - UNCAPPED_HEADROOM - GiB
    record(context=ctx, expected_min_reserved=expected_min)
    assert r["initialized_after_import"] is False
    assert r["process_used_before_init"] is None
    assert r["reserved_after_init"] >= expected_min, "growth=False did not preallocate at CUDA init"
    assert r["process_used_after_init"] >= r["reserved_after_init"]
    # the preallocation is used: a large tensor comes out of it, not from the device
    assert r["reserved_after_use"] == r["reserved_after_init"]
    assert r["process_used_after_use"] - r["process_used_after_init"] <= SLACK


@pytest.mark.covers("torch:preallocate", "torch:fraction")
def test_torch_preallocate_capped(scenario: Any, context: dict[str, Any], record: Any) -> None:
    r = scenario("torch_prealloc", fraction=0.25)
    ctx = context["torch"]["process_used"]
    cap = int(r["total_memory"] * 0.25)
    expected = cap - SMALL_POOL_HEADROOM
    record(context=ctx, cap=cap, expected_reserved=expected)
    assert r["initialized_after_import"] is False
    assert abs(r["fraction_in_torch"] - 0.25) < 1e-9
    assert expected <= r["reserved_after_init"] <= expected + 8 * MiB
    assert r["reserved_after_init"] <= cap
    assert r["process_used_after_init"] <= cap + ctx + SLACK
    assert r["process_used_after_init"] >= r["reserved_after_init"]
    assert r["reserved_after_use"] == r["reserved_after_init"]
    assert r["process_used_after_use"] - r["process_used_after_init"] <= SLACK


@pytest.mark.covers("torch:allocator.expandable")
def test_torch_allocator_expandable(scenario: Any) -> None:
    """Three 1 GiB tensors: one growing segment with expandable segments, three without."""
    r = scenario("torch_allocator", allocator="expandable")
    control = scenario("torch_allocator", allocator=None, prefix="control.")
    assert r["allocator_backend"] == "native"
    assert control["large_segments"] == 3
    assert r["large_segments"] == 1
    assert "stats_error" not in r


@pytest.mark.covers("torch:allocator.async")
@pytest.mark.parametrize("after_import", [False, True], ids=["before-import", "after-import"])
def test_torch_allocator_async(scenario: Any, after_import: bool) -> None:
    """Before ``import torch`` the cudaMallocAsync backend takes effect. After it (CUDA not
    started yet) it is too late: torch reads the backend at import, and a backend set later
    fails CUDA init with an INTERNAL ASSERT, so configure raises TooLateError, sets nothing,
    and CUDA starts on the import-time choice."""
    r = scenario("torch_allocator", allocator="async", after_import=after_import)
    if after_import:
        assert r["torch_initialized_at_configure"] is False
        assert r.get("configure_error") == "TooLateError", "configure after import did not refuse the backend"
        assert "import" in r["configure_message"]
        assert r["initialized_after_configure"] is False  # asking torch which backend it has starts no CUDA
        assert r["env.PYTORCH_ALLOC_CONF"] == "<unset>"  # refused before anything was set
        assert r["allocator_backend"] == "native"
        return
    assert r["allocator_backend"] == "cudaMallocAsync"
    assert "stats_error" not in r, r.get("stats_error")
    assert r["stats_allocated"] == r["memory_allocated"]


@pytest.mark.covers("torch:fraction", "torch:allocator.async", "torch:allocator.expandable")
def test_torch_configure_after_cuda_init(scenario: Any) -> None:
    """After CUDA started: the allocator backend is too late (TooLateError); a cap applies
    at once; expandable segments apply to segments made from then on."""
    r = scenario("torch_after_init")
    assert r["async_error"] == "TooLateError"
    assert abs(r["fraction_in_torch"] - 0.3) < 1e-9
    assert r["large_segments"] == 1
    assert r["expandable_warnings"] == "", "unimem's own call raised a warning"


@pytest.mark.covers("torch:allocator.uncached", "torch:clear_cache")
def test_torch_allocator_uncached(scenario: Any) -> None:
    """PYTORCH_NO_CUDA_MEMORY_CACHING: freed memory goes back at once; nothing left to clear."""
    r = scenario("torch_uncached")
    assert r["process_used_with_tensor"] - r["process_used_start"] >= r["size"]
    assert r["process_used_after_del"] - r["process_used_start"] <= SLACK
    assert r["returned"] == 0


@pytest.mark.covers("torch:clear_cache")
def test_torch_clear_cache(scenario: Any, record: Any) -> None:
    r = scenario("torch_clear_cache")
    record(returned_minus_nvml=r["returned"] - r["nvml_delta"])
    assert r["allocated_before"] < MiB
    assert r["returned"] >= 8 * GiB
    assert r["returned"] == r["reserved_delta"]
    assert abs(r["returned"] - r["nvml_delta"]) <= SLACK
    assert r["returned_second_call"] == 0
    assert r["warnings"] == ""


@pytest.mark.covers(
    "torch:allocator.default",
    "torch:stats.allocated",
    "torch:stats.reserved",
    "torch:stats.peak",
    "torch:stats.limit",
    "torch:stats.num_allocs",
    "torch:stats.device",
    "torch:stats.process_used",
    "torch:reset_peak",
)
def test_torch_stats(scenario: Any, record: Any) -> None:
    """stats() against torch.cuda.memory_stats() (exact), NVML (exact) and cudaMemGetInfo (1%)."""
    r = scenario("torch_stats")
    tolerance = r["nvml_total"] // 100
    record(
        tolerance_device=tolerance,
        nvml_total_minus_cuda_total=r["nvml_total"] - r["cuda_total"],
        stats_free_minus_cuda_free=r["stats.device_free"] - r["cuda_free"],
    )
    assert r["allocator_backend"] == "native"
    assert r["stats.allocated"] == r["native.allocated_bytes.all.current"]
    assert r["stats.reserved"] == r["native.reserved_bytes.all.current"]
    assert r["stats.peak_allocated"] == r["native.allocated_bytes.all.peak"]
    assert r["stats.peak_reserved"] == r["native.reserved_bytes.all.peak"]
    assert r["stats.num_allocs"] == r["native.allocation.all.allocated"]
    assert r["stats.num_ooms"] == r["native.num_ooms"] == 0
    assert r["stats.limit"] == r["expected_limit"]
    assert r["stats.largest_free_block"] is None  # unsupported for torch: None, not a guess
    assert r["stats.device_total"] == r["nvml_total"]
    assert abs(r["stats.device_total"] - r["cuda_total"]) <= tolerance
    assert abs(r["stats.device_free"] - r["nvml_free"]) <= SLACK
    assert abs(r["stats.device_free"] - r["cuda_free"]) <= tolerance
    assert r["stats.process_used"] == r["raw_process_used"]
    assert r["after_reset.peak_allocated"] == r["after_reset.allocated"] == r["after_reset.native_peak"]
    assert r["oom_raised"] is True
    assert r["after_oom.num_ooms"] == r["after_oom.native_num_ooms"] == 1
