"""NVML as ground truth, and CUDA_VISIBLE_DEVICES given as the GPU's UUID."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.gpu

MiB = 1 << 20
GiB = 1 << 30
SLACK = 64 * MiB  # see test_context.py


@pytest.fixture(scope="module")
def gpu_uuid() -> str:
    import pynvml

    pynvml.nvmlInit()
    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


@pytest.mark.covers("nvml:stats.device", "nvml:stats.process_used")
def test_nvml_stats(scenario: Any) -> None:
    """Before this process has a context NVML does not list it (None, not 0); after, it matches."""
    r = scenario("nvml_stats")
    assert r["before.process_used"] is None
    assert r["before_raw_process"] is None
    assert r["before.device_total"] == r["before_raw_total"]
    assert abs(r["before.device_free"] - r["before_raw_free"]) <= SLACK
    assert r["after.device_total"] == r["after_raw_total"]
    assert abs(r["after.device_free"] - r["after_raw_free"]) <= SLACK
    assert r["after.process_used"] == r["after_raw_process"]
    assert r["after.process_used"] >= GiB
    assert r["after.allocated"] is None  # NVML sees no pool


def _check_device(r: dict[str, Any], uuid: str) -> None:
    assert r["framework_device_count"] == 1
    assert r["stats.device_total"] == r["raw_total"]
    assert r["stats.process_used"] is not None, "stats() did not find this process on the UUID's device"
    assert r["stats.process_used"] == r["raw_process_used"]
    assert r["stats.process_used"] >= GiB


@pytest.mark.covers("torch:stats.device", "torch:stats.process_used")
def test_torch_visible_uuid(scenario: Any, gpu_uuid: str, record: Any) -> None:
    r = scenario(
        "devices", env={"CUDA_VISIBLE_DEVICES": gpu_uuid}, framework="torch", uuid=gpu_uuid, configure_devices=False
    )
    record(uuid=gpu_uuid)
    assert r["framework_uuid"].removeprefix("GPU-") == gpu_uuid.removeprefix("GPU-")
    _check_device(r, gpu_uuid)


@pytest.mark.covers("jax:stats.device", "jax:stats.process_used")
def test_jax_visible_uuid(scenario: Any, gpu_uuid: str, record: Any) -> None:
    r = scenario(
        "devices", env={"CUDA_VISIBLE_DEVICES": gpu_uuid}, framework="jax", uuid=gpu_uuid, configure_devices=False
    )
    record(uuid=gpu_uuid)
    _check_device(r, gpu_uuid)


@pytest.mark.covers("torch:devices")
def test_torch_devices_under_uuid(scenario: Any, gpu_uuid: str, record: Any) -> None:
    """configure(devices=[0]) where CUDA_VISIBLE_DEVICES already named the GPU by UUID."""
    r = scenario(
        "devices", env={"CUDA_VISIBLE_DEVICES": gpu_uuid}, framework="torch", uuid=gpu_uuid, configure_devices=True
    )
    record(uuid=gpu_uuid)
    _check_device(r, gpu_uuid)


@pytest.mark.covers("jax:devices")
def test_jax_devices_under_uuid(scenario: Any, gpu_uuid: str, record: Any) -> None:
    r = scenario(
        "devices", env={"CUDA_VISIBLE_DEVICES": gpu_uuid}, framework="jax", uuid=gpu_uuid, configure_devices=True
    )
    record(uuid=gpu_uuid)
    _check_device(r, gpu_uuid)
