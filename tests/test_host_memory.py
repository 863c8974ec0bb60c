"""Host memory on a host without a GPU: ``stats().host_rss``, ``track()``'s ``host_peak`` and
``host_delta`` (nested, threaded, and where the high-water mark cannot be reset), the step
hook's per-step host peak, and a recording's peak between two marks.

Each measurement runs in a fresh process: the resident high-water mark is process-wide.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

import unimem
from unimem import host_memory
from unimem.observe.recording import Recording
from unimem.observe.samples import Mark, Sample

MB = 1_000_000
TOLERANCE = 10 * MB  # the kernel counts resident pages per CPU and folds them in batches

# A helper the scripts share: allocate ``n`` bytes and touch every page, so they are resident.
_TOUCH = """
import gc, threading, time
def touched(n):
    block = bytearray(n)
    for i in range(0, n, 4096):
        block[i] = 1
    return block
"""


def test_the_host_figures_read_this_process():
    rss = host_memory.rss()
    assert rss is not None and rss > 1 * MB
    mark = host_memory.peak()
    assert mark is not None and mark >= rss - TOLERANCE


def test_stats_carry_the_host_figure_apart_from_the_device_figures():
    snapshot = unimem.stats()
    assert snapshot.host_rss is not None and snapshot.host_rss > MB
    assert snapshot.allocated is None and snapshot.peak_allocated is None  # never host memory
    assert snapshot.as_dict()["host_rss"] == snapshot.host_rss
    assert any(label.startswith("host RSS") and value != "n/a" for label, value in snapshot.rows())
    assert "host RSS" in unimem.summary()
    assert unimem.stats("jax", nvml=False).host_rss is None  # the framework's counters only


def test_a_block_reports_a_known_allocation_as_its_host_peak(pyjson):
    out = pyjson(
        _TOUCH
        + """
import unimem
with unimem.track() as t:
    block = touched(200_000_000)
    del block
emit({"peak": t.host_peak, "exact": t.host_peak_exact, "start": t.start.host_rss, "end": t.end.host_rss,
      "delta": t.host_delta, "device": [t.peak, t.delta], "text": str(t), "data": t.as_dict()})
"""
    )
    assert out["exact"] is True
    assert out["peak"] - out["start"] >= 200 * MB - TOLERANCE
    assert out["peak"] - out["start"] < 260 * MB  # the peak is this block's, not an earlier one's
    assert abs(out["delta"]) < 50 * MB and out["delta"] == out["end"] - out["start"]  # freed in the block
    assert out["device"] == [None, None]  # no GPU: the device figures stay None, never host memory
    assert "host peak" in out["text"]
    assert out["data"]["host_peak"] == out["peak"] and out["data"]["start"]["host_rss"] == out["start"]


def test_nested_blocks_keep_the_outer_host_peak_across_the_inner_reset(pyjson):
    out = pyjson(
        _TOUCH
        + """
import unimem
with unimem.track() as outer:
    big = touched(300_000_000)
    del big
    with unimem.track() as inner:
        small = touched(100_000_000)
        del small
emit({"outer": [outer.host_peak, outer.start.host_rss, outer.host_peak_exact],
      "inner": [inner.host_peak, inner.start.host_rss, inner.host_peak_exact]})
"""
    )
    outer_peak, outer_start, outer_exact = out["outer"]
    inner_peak, inner_start, inner_exact = out["inner"]
    assert outer_exact is True and inner_exact is True
    assert inner_peak - inner_start >= 100 * MB - TOLERANCE
    assert inner_peak - inner_start < 200 * MB, "the inner block's mark was not reset when it opened"
    assert outer_peak - outer_start >= 300 * MB - TOLERANCE, "the inner reset lost the outer block's peak"
    assert outer_peak >= inner_peak


def test_a_block_in_another_thread_does_not_lose_this_threads_peak(pyjson):
    out = pyjson(
        _TOUCH
        + """
import unimem
opened, done = threading.Event(), threading.Event()
result = {}
def worker():
    opened.wait()
    with unimem.track() as t:  # resets the process's mark while the main block is open
        block = touched(50_000_000)
        del block
    result["thread"] = [t.host_peak, t.start.host_rss]
    done.set()
thread = threading.Thread(target=worker)
thread.start()
with unimem.track() as main:
    big = touched(300_000_000)
    del big
    opened.set()
    done.wait(60)
thread.join()
emit({"main": [main.host_peak, main.start.host_rss], **result})
"""
    )
    main_peak, main_start = out["main"]
    thread_peak, thread_start = out["thread"]
    assert main_peak - main_start >= 300 * MB - TOLERANCE
    assert thread_peak - thread_start >= 50 * MB - TOLERANCE
    assert thread_peak - thread_start < 150 * MB


def test_without_a_resettable_mark_a_peak_is_exact_only_when_the_mark_rose(pyjson):
    out = pyjson(
        _TOUCH
        + """
import unimem
from unimem import host_memory
host_memory.reset_peak = lambda: False  # as where /proc/self/clear_refs cannot be written
host_memory.can_reset_peak = lambda: False
old = touched(300_000_000)
del old  # the process's mark now stands 300 MB up, where no later block reaches
with unimem.track() as low:
    small = touched(50_000_000)
    del small
with unimem.track() as high:
    big = touched(400_000_000)
    del big
emit({"low": [low.host_peak, low.host_peak_exact, low.note, low.start.host_rss, low.end.host_rss],
      "high": [high.host_peak, high.host_peak_exact, high.start.host_rss]})
"""
    )
    peak, exact, note, start, end = out["low"]
    assert exact is False and peak == max(start, end)  # a lower bound, said so: never a guess
    assert "lower bound" in note and "clear_refs" in note
    peak, exact, start = out["high"]
    assert exact is True and peak - start >= 400 * MB - TOLERANCE


def test_the_step_hook_records_each_steps_host_peak(pyjson):
    out = pyjson(
        _TOUCH
        + """
import unimem
hook = unimem.MemoryHook()
hook.step()
block = touched(150_000_000)
del block
hook.step()  # a step that held 150 MB for a while
hook.step()  # a step that held nothing more
emit([[s.host_peak, s.host_rss] for s in hook.samples])
"""
    )
    (busy_peak, busy_rss), (idle_peak, idle_rss) = out
    assert busy_peak - busy_rss >= 150 * MB - TOLERANCE
    assert idle_peak - idle_rss < 20 * MB


def test_a_recordings_peak_between_two_marks():
    samples = [
        Sample(1.0, "device", host_rss=100),
        Sample(2.0, "device", host_rss=500),
        Sample(3.0, "device", host_rss=200),
        Sample(4.0, "framework", allocated=40),
        Sample(5.0, "device", host_rss=900),
    ]
    marks = [Mark(1.5, "epoch 1", allocated=70), Mark(3.5, "epoch 2", allocated=10), Mark(4.5, "done")]
    recording = Recording(samples, marks, {})
    assert recording.peak_between("epoch 1", "epoch 2", field="host_rss") == 500
    assert recording.peak_between("epoch 2", "done", field="host_rss") is None  # never read in that window
    assert recording.peak_between("epoch 2", field="host_rss") == 900  # to the end
    assert recording.peak_between("epoch 1", "epoch 2") == 70  # a mark's own figures count
    assert recording.peak_between("epoch 2", "done") == 40
    for kwargs, parameter in (
        ({"start": "epoch 9"}, "start"),
        ({"start": "epoch 2", "end": "epoch 1"}, "end"),  # an end before the start is no window
        ({"start": "epoch 1", "field": "host"}, "field"),
    ):
        with pytest.raises(unimem.ConfigError) as info:
            recording.peak_between(**kwargs)
        assert info.value.parameter == parameter
    assert "epoch 1" in str(pytest.raises(unimem.ConfigError, recording.peak_between, "nope").value)


def test_one_monitor_gives_each_epochs_host_peak(pyjson):
    out = pyjson(
        _TOUCH
        + """
import unimem
with unimem.monitor(0.01) as m:
    time.sleep(0.3)
    m.mark("epoch 1")
    block = touched(200_000_000)
    time.sleep(0.3)
    del block
    gc.collect()
    time.sleep(0.2)
    m.mark("epoch 2")
    time.sleep(0.3)
    m.mark("done")
r = m.recording
emit({"first": r.peak_between("epoch 1", "epoch 2", field="host_rss"),
      "second": r.peak_between("epoch 2", "done", field="host_rss"),
      "start": m.start_stats.host_rss})
"""
    )
    assert out["first"] - out["start"] >= 200 * MB - TOLERANCE
    assert out["second"] < out["first"] - 150 * MB


def test_tracked_as_dict_is_json_ready():
    with unimem.track() as t:
        pass
    data = json.loads(json.dumps(t.as_dict()))
    assert data["backend"] == "nvml" and data["peak"] is None
    assert data["host_peak"] is not None and data["host_delta"] is not None
    assert math.isfinite(data["duration"])


@pytest.mark.slow
def test_the_keras_callback_logs_the_host_peak(pyjson: Any, need: Any) -> None:
    need("tensorflow")
    out = pyjson(
        """
        import os
        os.environ["KERAS_BACKEND"] = "tensorflow"
        import numpy as np
        import keras
        from unimem.integrations.keras import MemoryCallback
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
        cb = MemoryCallback()
        history = model.fit(np.ones((8, 4)), np.ones((8, 2)), epochs=2, batch_size=4, verbose=0, callbacks=[cb])
        emit({"logs": history.history.get("mem_host_peak_mib"), "epochs": [e["host_peak"] for e in cb.epochs]})
        """,
        timeout=300,
    )
    assert len(out["logs"]) == 2 and all(v > 0 for v in out["logs"])
    assert all(v > 0 for v in out["epochs"])


def test_available_memory_is_the_hosts_at_most():
    import psutil

    room = host_memory.available()
    assert room is not None and 0 < room <= psutil.virtual_memory().total


def test_a_memory_cgroups_limit_bounds_what_is_available(tmp_path, monkeypatch):
    # cgroup v2: 1 GiB allowed, 700 MiB charged of which 100 MiB is page cache the kernel drops.
    own = tmp_path / "user.slice" / "job"
    own.mkdir(parents=True)
    (own / "memory.max").write_text(f"{1 << 30}\n")
    (own / "memory.current").write_text(f"{700 << 20}\n")
    (own / "memory.stat").write_text(f"anon {600 << 20}\ninactive_file {100 << 20}\n")
    assert host_memory._cgroup_room(tmp_path, {"": "/user.slice/job"}) == (1 << 30) - (600 << 20)
    (own / "memory.max").write_text("max\n")
    assert host_memory._cgroup_room(tmp_path, {"": "/user.slice/job"}) is None
    # cgroup v1, as a container sees it: its own cgroup at the mount's top, a limit set above it.
    v1 = tmp_path / "memory"
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # no limit of its own
    (v1 / "memory.usage_in_bytes").write_text(f"{300 << 20}\n")
    (v1 / "memory.stat").write_text(f"hierarchical_memory_limit {512 << 20}\ntotal_inactive_file {44 << 20}\n")
    assert host_memory._cgroup_room(tmp_path, {"memory": "/docker/abc"}) == (512 << 20) - (256 << 20)
    # The host's figure where the cgroup leaves more.
    monkeypatch.setattr(host_memory, "_host_available", lambda: 100 << 20)
    monkeypatch.setattr(host_memory, "_CGROUPS", tmp_path)
    monkeypatch.setattr(host_memory, "_own_cgroups", lambda: {"memory": "/docker/abc"})
    assert host_memory.available() == 100 << 20
