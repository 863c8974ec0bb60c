"""NVML: what this machine (no driver) gives, and the CUDA-ordinal -> NVML mapping
against a stand-in ``pynvml`` module."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import pytest
from unimem.backends import nvml_gate as nvml_backend

import unimem


@pytest.fixture
def no_nvml_state(monkeypatch):
    """NVML's module state as in a fresh process."""
    monkeypatch.setattr(nvml_backend, "_pynvml", None)
    monkeypatch.setattr(nvml_backend, "_init_error", None)
    monkeypatch.setattr(nvml_backend, "_handles", {})
    monkeypatch.setattr(nvml_backend, "_use_v2", True)


# --- this machine: pynvml installed, no driver ------------------------------------------------


@pytest.mark.covers("nvml:stats.device", "nvml:stats.process_used")
def test_explicit_nvml_stats_raise_backend_unavailable_saying_why(no_nvml_state):
    with pytest.raises(unimem.BackendUnavailable) as info:
        unimem.stats("nvml")
    assert isinstance(info.value, ImportError)
    message = str(info.value)
    assert "nvmlInit failed" in message and "driver" in message
    # The failure is remembered: a second query fails the same way without a new nvmlInit.
    with pytest.raises(unimem.BackendUnavailable, match="driver"):
        unimem.stats("nvml")
    assert message == f"nvml: {nvml_backend.nvml_status()}"  # the status is the reason; the error names nvml once


def test_stats_with_nothing_imported_are_all_none(no_nvml_state):
    snapshot = unimem.stats()
    assert snapshot.backend == "nvml" and snapshot.device == 0
    skip = ("backend", "device", "timestamp", "host_rss")
    figures = {k: v for k, v in snapshot.as_dict().items() if k not in skip}
    assert figures and all(value is None for value in figures.values()), figures
    assert snapshot.host_rss is not None and snapshot.host_rss > 0  # the host's memory: known without a driver


def test_device_figures_without_a_driver_are_none(no_nvml_state):
    assert nvml_backend.device_figures(0) == (None, None, None)
    assert nvml_backend.device_count() is None


@pytest.mark.parametrize("backend", ["torch", "tensorflow", "jax"])
def test_framework_stats_have_no_device_figures_without_nvml(backend, need, no_nvml_state):
    need(backend)
    snapshot = unimem.stats(backend)
    assert (snapshot.device_total, snapshot.device_free, snapshot.process_used) == (None, None, None)
    assert backend not in sys.modules


def test_nvml_takes_no_configuration():
    with pytest.raises(unimem.UnsupportedFeature):
        unimem.configure(backend="nvml", growth=True)
    with pytest.raises(unimem.ConfigError) as info:
        unimem.configure(backend="torch", fraction={"nvml": 0.5})
    assert info.value.parameter == "fraction"


# --- a stand-in pynvml ------------------------------------------------------------------------


class NVMLError(Exception):
    pass


class NVMLError_FunctionNotFound(NVMLError):  # noqa: N801 - pynvml's name
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's name
    pass


class FakeNvml(types.ModuleType):
    """Devices by NVML index, each with a UUID, memory and a process list."""

    NVMLError = NVMLError
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_NotSupported = NVMLError_NotSupported
    nvmlMemory_v2 = 0x02000028

    def __init__(self, devices: list[dict[str, Any]], *, v2: bool = True, uuid_bytes: bool = False) -> None:
        super().__init__("pynvml")
        self.devices = devices
        self.v2 = v2
        self.uuid_bytes = uuid_bytes
        self.by_index: list[int] = []
        self.memory_calls: list[str] = []

    def nvmlInit(self) -> None:  # noqa: N802
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:  # noqa: N802
        self.by_index.append(index)
        if index >= len(self.devices):
            raise NVMLError("Invalid Argument")
        return ("handle", index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes:  # noqa: N802
        uuid = self.devices[handle[1]]["uuid"]
        return uuid.encode() if self.uuid_bytes else uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:  # noqa: N802
        device = self.devices[handle[1]]
        if version is not None:
            self.memory_calls.append("v2")
            if not self.v2:
                raise NVMLError_FunctionNotFound("Function Not Found")
            return types.SimpleNamespace(total=device["total"], free=device["free"], used=0, reserved=1)
        self.memory_calls.append("v1")
        return types.SimpleNamespace(total=device["total"], free=device["free"], used=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:  # noqa: N802
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.devices[handle[1]]["procs"]]


GIB = 1 << 30


def _devices(procs: dict[int, list[tuple[int, int | None]]] | None = None) -> list[dict[str, Any]]:
    procs = procs or {}
    return [
        {
            "uuid": f"GPU-{chr(ord('a') + i) * 8}-1111-2222-3333-444455556666",
            "total": (10 + i) * GIB,
            "free": (5 + i) * GIB,
            "procs": procs.get(i, []),
        }
        for i in range(4)
    ]


@pytest.fixture
def fake_nvml(monkeypatch, no_nvml_state):
    """Install a stand-in pynvml; returns a function building it."""

    def install(devices: list[dict[str, Any]] | None = None, **kwargs: Any) -> FakeNvml:
        fake = FakeNvml(devices if devices is not None else _devices(), **kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return install


def test_without_cuda_visible_devices_the_ordinal_is_the_nvml_index(fake_nvml):
    fake_nvml()
    assert nvml_backend.device_figures(1)[:2] == (11 * GIB, 6 * GIB)


@pytest.mark.covers("nvml:stats.device")
def test_cuda_visible_devices_indices_map_ordinals_to_nvml_indices(fake_nvml, monkeypatch):
    fake = fake_nvml()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert nvml_backend.device_figures(0)[:2] == (12 * GIB, 7 * GIB)
    assert nvml_backend.device_figures(1)[:2] == (13 * GIB, 8 * GIB)
    assert fake.by_index == [2, 3]
    assert nvml_backend.device_figures(2) == (None, None, None), "ordinal 2 is not visible"


def test_cuda_visible_devices_uuid_prefix_maps_by_uuid(fake_nvml, monkeypatch):
    fake_nvml(uuid_bytes=True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-dddd,GPU-bbbbbbbb-1111")
    assert nvml_backend.device_figures(0)[0] == 13 * GIB
    assert nvml_backend.device_figures(1)[0] == 11 * GIB


def test_a_uuid_from_the_framework_wins_over_the_environment(fake_nvml, monkeypatch):
    fake_nvml()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert nvml_backend.device_figures(0, uuid="GPU-cccccccc-1111-2222-3333-444455556666")[0] == 12 * GIB


def test_an_unknown_uuid_gives_no_figures(fake_nvml, monkeypatch):
    fake_nvml()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ffff")
    assert nvml_backend.device_figures(0) == (None, None, None)


@pytest.mark.parametrize(
    ("visible", "ordinal", "total"),
    [
        ("1,foo,0", 0, 11 * GIB),  # entries before the invalid one count
        ("1,foo,0", 1, None),  # CUDA stops at the invalid entry: ordinal 1 does not exist
        ("3,-1,0", 1, None),
        ("", 0, None),  # an empty list hides every device
        (" 2 , 1 ", 1, 11 * GIB),
    ],
)
def test_an_invalid_entry_cuts_the_visible_list(fake_nvml, monkeypatch, visible, ordinal, total):
    fake_nvml()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert nvml_backend.device_figures(ordinal)[0] == total


def test_v2_memory_info_falls_back_to_v1_when_the_driver_lacks_it(fake_nvml):
    fake = fake_nvml(v2=False)
    assert nvml_backend.device_figures(0)[:2] == (10 * GIB, 5 * GIB)
    assert nvml_backend._use_v2 is False
    assert nvml_backend.device_figures(1)[:2] == (11 * GIB, 6 * GIB)
    assert fake.memory_calls == ["v2", "v1", "v1"], "v2 is asked once, then v1 only"


def test_v2_memory_info_is_used_when_available(fake_nvml):
    fake = fake_nvml(v2=True)
    assert nvml_backend.device_figures(0)[:2] == (10 * GIB, 5 * GIB)
    assert fake.memory_calls == ["v2"]
    assert nvml_backend._use_v2 is True


@pytest.mark.covers("nvml:stats.process_used")
def test_process_used_sums_only_this_pid(fake_nvml):
    me = os.getpid()
    fake_nvml(_devices({0: [(me, 100 << 20), (me + 1, 5 * GIB), (me, 50 << 20), (me, None)]}))
    assert nvml_backend.device_figures(0)[2] == 150 << 20


@pytest.mark.parametrize(
    "procs",
    [[], [(os.getpid() + 1, GIB)], [(os.getpid(), None)]],
    ids=["nobody", "another-process", "this-pid-without-a-figure"],
)
def test_process_used_is_none_when_this_pid_is_not_listed(fake_nvml, procs):
    fake_nvml(_devices({0: procs}))
    total, free, used = nvml_backend.device_figures(0)
    assert used is None
    assert (total, free) == (10 * GIB, 5 * GIB)


def test_nvml_stats_with_a_working_nvml(fake_nvml, monkeypatch):
    me = os.getpid()
    fake_nvml(_devices({2: [(me, 3 * GIB)]}))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    snapshot = unimem.stats("nvml")
    assert (snapshot.backend, snapshot.device) == ("nvml", 0)
    assert (snapshot.device_total, snapshot.device_free, snapshot.process_used) == (12 * GIB, 7 * GIB, 3 * GIB)
    assert snapshot.allocated is None and snapshot.reserved is None
    with pytest.raises(unimem.UnsupportedFeature):
        unimem.reset_peak("nvml")
    with pytest.raises(unimem.UnsupportedFeature):
        unimem.clear_cache("nvml")


def test_a_vanished_device_gives_no_figures_not_an_error(fake_nvml):
    fake_nvml(_devices()[:1])
    assert nvml_backend.device_figures(3) == (None, None, None)


@pytest.mark.parametrize("backend", ["torch", "tensorflow", "jax"])
def test_stats_without_nvml_never_touch_nvml(backend, need, fake_nvml):
    need(backend)
    fake = fake_nvml()
    snapshot = unimem.stats(backend, nvml=False)
    assert (snapshot.device_total, snapshot.device_free, snapshot.process_used) == (None, None, None)
    assert fake.by_index == [] and fake.memory_calls == []
    assert nvml_backend._pynvml is None, "nvml=False initialised NVML"


def test_stats_nvml_flag_must_be_a_bool():
    with pytest.raises(unimem.ConfigError) as info:
        unimem.stats("jax", nvml="no")
    assert info.value.parameter == "nvml"
