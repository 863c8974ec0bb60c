"""A monitor dropped without ``stop()`` lets go of everything it held: its descriptors, its sampler
process, its thread, its Prometheus port. A long job that makes one per epoch must not die of
"Too many open files"."""

from __future__ import annotations

import gc
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

import unimem
import unimem.observe.monitor as monitor_module

# A probe the sampler process imports in place of NVML: no NVML to load, so each sampler starts fast.
QUIET_PROBE = """
def steady(device, pid, uuid=None):
    return lambda: (1 << 30, 1 << 29, 1 << 28)
"""


@pytest.fixture
def quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "quiet_probe.py").write_text(QUIET_PROBE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))  # the sampler process copies sys.path
    return "quiet_probe:steady"


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _drop(probe: str) -> None:
    unimem.monitor(0.05, framework_interval=None, probe=probe).start()  # started, never stopped, dropped


def _settled(probe: str) -> int:
    """Open descriptors once unimem's own kept-open files (read on a monitor's first use) are open."""
    unimem.monitor(0.05, framework_interval=None, probe=probe).start().stop()
    gc.collect()
    return _descriptors()


def test_dropped_monitors_let_go_of_their_descriptors_processes_threads_and_port(
    quiet: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _settled(quiet)
    for _ in range(2):
        _drop(quiet)
    # One with the allocator thread running and one serving Prometheus, both dropped while running.
    monkeypatch.setattr(monitor_module, "counter_reader", lambda name, device: (lambda: (1, 2), ""))
    with_thread = unimem.monitor(0.05, framework_interval=0.01, probe=quiet).start()
    served = unimem.monitor(0.05, framework_interval=None, probe=quiet).start()
    port = served.serve_prometheus(0)
    assert any(t.name == "unimem-monitor" for t in threading.enumerate())
    del with_thread, served
    gc.collect()
    deadline = time.monotonic() + 5
    while any(t.name == "unimem-monitor" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)  # the thread ends at its next wake
    assert not any(t.name == "unimem-monitor" for t in threading.enumerate())
    assert psutil.Process().children() == []
    assert _descriptors() <= before + 1
    assert not any(c.laddr.port == port for c in psutil.Process().net_connections() if c.status == "LISTEN")


@pytest.mark.slow  # a thousand sampler processes started and ended
def test_a_thousand_dropped_monitors_hold_at_most_three_more_descriptors(quiet: str) -> None:
    before = _settled(quiet)
    with ThreadPoolExecutor(4) as pool:  # four at a time: the samplers' starts overlap
        list(pool.map(lambda _: _drop(quiet), range(1000)))
    gc.collect()
    assert _descriptors() <= before + 3
    assert psutil.Process().children() == []
