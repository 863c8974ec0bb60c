"""monitor(): sampling rate, files, plots, marks, NVML failures, clean stop, bounded memory.

Rates and stop times are checked with wide tolerances: they prove the mechanism
(a sampler at the asked rate, a stop that does not wait out the interval), not
performance; the overhead targets live in benchmarks/bench_monitor.py.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import sys
import textwrap
import threading
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner
from PIL import Image

import unimem
import unimem.observe.monitor as monitor_module
from unimem.cli.main import main as cli_main
from unimem.observe.recording import Recording, load_recording
from unimem.observe.samples import BoundedSeries, Sample

FLAKY_PROBE = """
    calls = {"n": 0}

    def flaky(device, pid, uuid=None):
        def read():
            calls["n"] += 1
            n = calls["n"]
            if n % 4 == 2:
                raise RuntimeError(f"injected NVML failure {n}")
            return 80 << 30, (n % 10) << 20, (n % 7) << 20
        return read

    def broken(device, pid, uuid=None):
        raise RuntimeError("no such device here")
"""


@pytest.fixture
def probes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of fake NVML probes importable by the sampler process (it copies sys.path)."""
    (tmp_path / "fake_probes.py").write_text(textwrap.dedent(FLAKY_PROBE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "fake_probes"


def _children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize("interval", [0, -0.5, math.nan, math.inf, "0.1", True, None, 0.0005])
def test_bad_intervals_are_config_errors_naming_interval(interval: Any) -> None:
    with pytest.raises(unimem.ConfigError) as info:
        unimem.monitor(interval)
    assert info.value.parameter == "interval"


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"framework_interval": 0.001}, "framework_interval"),
        ({"framework_interval": "fast"}, "framework_interval"),
        ({"max_samples": 10}, "max_samples"),
        ({"device": -1}, "device"),
        ({"backend": "cuda"}, "backend"),
        ({"probe": "no_colon"}, "probe"),
    ],
)
def test_other_bad_arguments_are_config_errors(kwargs: dict[str, Any], parameter: str) -> None:
    before = _children()
    with pytest.raises(unimem.ConfigError) as info:
        unimem.monitor(0.1, **kwargs)
    assert info.value.parameter == parameter
    assert _children() == before  # validated before anything started


def test_samples_at_the_requested_rate_with_host_figures_and_marks() -> None:
    m = unimem.monitor(interval=0.02)
    with m:
        time.sleep(0.3)
        m.mark("phase 1")
        running = len(m.samples)  # read while running: asks the sampler process
        time.sleep(0.7)
        m.mark("phase 2")
    device = [s for s in m.samples if s.source == "device"]
    span = m.recording.meta["stopped"] - m.recording.meta["started"]
    expected = span / 0.02
    assert 0.4 * expected <= len(device) <= 1.1 * expected + 2, (len(device), expected)
    assert 0 < running < len(device)
    times = [s.time for s in device]
    assert times == sorted(times)
    assert all(s.host_rss is not None and s.host_rss > 0 for s in device)  # host figures without a GPU
    assert [mark.label for mark in m.marks] == ["phase 1", "phase 2"]
    notes = " ".join(m.recording.notes)
    if all(s.process_used is None for s in device):
        assert "device figures unavailable" in notes  # no NVML here: said, not silently missing


def test_csv_and_json_round_trip_and_png_size(probes: str, tmp_path: Path) -> None:
    with unimem.monitor(0.01, probe=f"{probes}:flaky") as m:
        time.sleep(0.3)
        m.mark("epoch 1")
        time.sleep(0.2)
    recording = m.recording
    assert recording.samples and recording.marks

    back = load_recording(m.to_json(tmp_path / "run.json"))
    assert back.samples == recording.samples
    assert back.marks == recording.marks
    assert back.meta["interval"] == 0.01 and back.meta["device_errors"] == recording.meta["device_errors"]

    from_csv = load_recording(m.to_csv(tmp_path / "run.csv"))
    assert from_csv.samples == recording.samples  # None stays None (an empty cell), never 0
    assert from_csv.marks == recording.marks

    png = m.plot(tmp_path / "run.png")
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size == (1000, 500)
    small = back.plot(tmp_path / "small.png", figsize=(6, 3), dpi=50)
    with Image.open(small) as image:
        assert image.size == (300, 150)


def test_nvml_errors_mid_run_are_gaps_and_sampling_goes_on(probes: str, tmp_path: Path) -> None:
    with unimem.monitor(0.01, probe=f"{probes}:flaky") as m:
        time.sleep(0.5)
    device = [s for s in m.samples if s.source == "device"]
    gaps = [s for s in device if s.error is not None]
    good = [s for s in device if s.error is None]
    assert len(device) >= 12
    assert gaps and "injected NVML failure" in gaps[0].error
    assert all(s.process_used is None and s.device_used is None for s in gaps)  # a gap, not a 0
    assert all(s.host_rss is not None for s in gaps)  # host figures still read in a failed tick
    assert good[-1].time > gaps[0].time  # sampling went on after the first failure
    assert 0.15 < len(gaps) / len(device) < 0.4  # every 4th reading fails
    assert m.recording.meta["device_errors"] >= len(gaps)
    assert any("failed" in note and "injected NVML failure" in note for note in m.recording.notes)
    assert m.recording.gaps and m.plot(tmp_path / "gaps.png").stat().st_size > 0


def test_a_probe_that_cannot_start_leaves_host_figures_and_a_note(probes: str) -> None:
    with unimem.monitor(0.02, probe=f"{probes}:broken") as m:
        time.sleep(0.2)
    device = [s for s in m.samples if s.source == "device"]
    assert device and all(s.process_used is None and s.error is None for s in device)
    assert all(s.host_rss for s in device)
    assert any("no such device here" in note for note in m.recording.notes)


def test_stop_takes_less_than_one_interval_and_leaves_nothing_behind() -> None:
    threads_before = set(threading.enumerate())
    children_before = _children()
    # A long interval, stopped early in it: a stop that waited for the interval to end would take
    # a minute, one that does not takes a fraction of a second, on any machine's load.
    m = unimem.monitor(interval=60.0, framework_interval=60.0).start()
    assert len(_children()) == len(children_before) + 1  # the sampler process
    time.sleep(0.5)
    started = time.perf_counter()
    m.stop()
    took = time.perf_counter() - started
    assert took < 30.0, f"stop took {took:.3f} s: it waited for the interval to end"
    assert set(threading.enumerate()) == threads_before
    assert _children() == children_before
    assert m.stop() is not None  # a second stop is harmless


def test_framework_counters_are_sampled_in_process_and_failures_are_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}

    def reader() -> tuple[int | None, int | None]:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("allocator busy")
        return calls["n"] * 1000, calls["n"] * 2000

    monkeypatch.setattr(monitor_module, "counter_reader", lambda name, device: (reader, ""))
    threads_before = set(threading.enumerate())
    with unimem.monitor(0.05, framework_interval=0.02) as m:
        time.sleep(0.5)
        mark = m.mark("checkpoint")
    framework = [s for s in m.samples if s.source == "framework"]
    assert 8 <= len(framework) <= 27
    assert [s.error for s in framework].count("RuntimeError: allocator busy") == 1
    assert all(s.allocated for s in framework if s.error is None)
    assert mark.allocated is not None  # marks read the counters in the caller's thread
    assert set(threading.enumerate()) == threads_before


def test_framework_interval_none_runs_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(monitor_module, "counter_reader", lambda name, device: (lambda: (7, 8), ""))
    before = set(threading.enumerate())
    with unimem.monitor(0.05, framework_interval=None) as m:
        assert set(threading.enumerate()) == before
        m.mark("x")
    assert [s for s in m.samples if s.source == "framework"] == []
    assert m.marks[0].allocated == 7


def test_memory_stays_bounded_on_long_runs() -> None:
    with unimem.monitor(0.002, max_samples=100) as m:
        time.sleep(1.5)
    device = [s for s in m.samples if s.source == "device"]
    assert 40 <= len(device) <= 100
    assert m.recording.meta["decimation"]["device_stride"] >= 2


def test_decimation_keeps_peaks_and_gaps() -> None:
    series = BoundedSeries(100)
    for i in range(1000):
        value = 10_000 if i == 537 else i % 50
        series.add(Sample(float(i), "device", process_used=value, error="nvml lost" if i == 801 else None))
    items = series.items()
    assert len(items) <= 100
    assert series.stride == 16
    assert max(s.process_used or 0 for s in items) == 10_000
    assert [s.error for s in items if s.error] == ["nvml lost"]
    assert [s.time for s in items] == sorted(s.time for s in items)


def test_a_monitor_runs_once() -> None:
    m = unimem.monitor(0.1)
    with pytest.raises(unimem.UnimemError, match="never started"):
        m.stop()
    with m:
        pass
    with pytest.raises(unimem.UnimemError, match="already started"):
        m.start()


def test_prometheus_endpoint_on_loopback() -> None:
    pytest.importorskip("prometheus_client")
    with unimem.monitor(0.05) as m:
        port = m.serve_prometheus(port=0)
        time.sleep(0.2)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert "unimem_host_rss_bytes" in body
        if all(s.process_used is None for s in m.samples):
            assert "unimem_process_used_bytes" not in body  # unknown is left out, never served as 0
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_prometheus_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with unimem.monitor(0.1) as m, pytest.raises(unimem.BackendUnavailable, match="pip install prometheus-client"):
        m.serve_prometheus(port=0)


def test_cli_watch_once_shows_host_memory_without_nvml() -> None:
    result = CliRunner().invoke(cli_main, ["watch", "--once", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["host"]["total"] > 0
    table = CliRunner().invoke(cli_main, ["watch", "--once"])
    assert table.exit_code == 0, table.output
    assert "Host memory" in table.output
    if data["nvml"] != "ok":
        assert "NVML" in table.output and "host memory" in table.output


def test_cli_plot_turns_a_saved_recording_into_a_png(tmp_path: Path) -> None:
    with unimem.monitor(0.02) as m:
        time.sleep(0.2)
        m.mark("end")
    saved = m.to_json(tmp_path / "monitor.json")
    out = tmp_path / "out.png"
    result = CliRunner().invoke(cli_main, ["plot", str(saved), "-o", str(out), "--width", "800", "--height", "400"])
    assert result.exit_code == 0, result.output
    with Image.open(out) as image:
        assert image.size == (800, 400)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    failed = CliRunner().invoke(cli_main, ["plot", str(bad)])
    assert failed.exit_code == 1 and "not a unimem recording" in failed.output


def test_monitor_imports_no_framework(py: Any) -> None:
    proc = py(
        """
        import sys, time, unimem
        with unimem.monitor(0.02) as m:
            time.sleep(0.1)
        bad = [n for n in ("torch", "jax", "tensorflow", "keras", "matplotlib") if n in sys.modules]
        assert not bad, bad
        """
    )
    assert proc.returncode == 0, proc.stderr


def test_interleaved_streams_each_draw_a_line(tmp_path: Path) -> None:
    """Framework counters and NVML samples interleave; each figure's line must still be
    drawn from its own stream (on the H200 the allocated line vanished: every point was
    isolated between the other stream's Nones)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from unimem.observe.plotting import _draw_line
    from unimem.observe.recording import Recording
    from unimem.observe.samples import SOURCE_DEVICE, SOURCE_FRAMEWORK, Sample

    samples = []
    for i in range(20):
        samples.append(Sample(time=100.0 + i, source=SOURCE_FRAMEWORK, allocated=(1 + i) << 20, reserved=64 << 20))
        samples.append(Sample(time=100.5 + i, source=SOURCE_DEVICE, process_used=(100 + i) << 20))
    samples.append(Sample(time=121.0, source=SOURCE_DEVICE, error="NVML: GPU is lost"))
    recording = Recording(samples=samples, meta={"started": 100.0})
    fig, ax = plt.subplots()
    for name in ("allocated", "reserved", "process_used"):
        assert _draw_line(ax, recording, name, name, "-", 100.0, 1 << 20) == 1
    lines = {line.get_label(): line for line in ax.get_lines()}
    # 20 connected readings per framework line; the device line has its 20 plus the gap.
    assert len(lines["allocated"].get_xdata()) == 20
    assert not any(math.isnan(y) for y in lines["allocated"].get_ydata())
    process = list(lines["process_used"].get_ydata())
    assert len(process) == 21 and math.isnan(process[-1]) and not any(math.isnan(y) for y in process[:-1])
    plt.close(fig)


def test_csv_keeps_the_metadata_a_plot_needs(tmp_path):
    recording = Recording(
        [Sample(1.0, "device", host_rss=1 << 20), Sample(2.0, "device", host_rss=2 << 20)],
        [],
        {"backend": "jax", "device": 1, "limit": 3 << 30, "interval": 0.01},
    )
    back = load_recording(recording.to_csv(tmp_path / "run.csv"))
    assert back.meta == {"backend": "jax", "device": 1, "limit": 3 << 30, "interval": 0.01}
    assert [s.host_rss for s in back.samples] == [1 << 20, 2 << 20]


@pytest.mark.parametrize(
    ("method", "name"),
    [("plot", "memory.json"), ("to_json", "memory.png"), ("to_csv", "memory.json"), ("plot", "memory")],
)
def test_a_file_named_for_another_format_is_refused_and_nothing_is_written(tmp_path, method, name):
    recording = Recording([Sample(1.0, "device", host_rss=1 << 20)], [], {})
    with pytest.raises(unimem.ConfigError) as info:
        getattr(recording, method)(tmp_path / name)
    assert info.value.parameter == "path"
    assert list(tmp_path.iterdir()) == []


def test_a_missing_folder_is_refused_not_created(tmp_path):
    recording = Recording([Sample(1.0, "device", host_rss=1 << 20)], [], {})
    for method, name in (("to_json", "run.json"), ("to_csv", "run.csv"), ("plot", "run.png")):
        with pytest.raises(unimem.ConfigError, match="does not exist"):
            getattr(recording, method)(tmp_path / "no" / "such" / name)
    assert not (tmp_path / "no").exists()


# --- printing a monitor or a recording --------------------------------------------------------


def test_a_monitor_prints_its_backend_device_interval_samples_and_state() -> None:
    m = unimem.monitor(0.01)
    assert repr(m) == "Monitor(backend=None, device=0, interval=0.01 s, 0 samples, not started)"
    with m:
        deadline = time.monotonic() + 60
        while not m.samples:  # the sampler's first readings (host RSS here)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        running = repr(m)
        found = re.fullmatch(r"Monitor\(backend=None, device=0, interval=0\.01 s, (\d+) samples?, running\)", running)
        assert found and int(found.group(1)) >= 1, running
    stopped = repr(m)
    assert re.search(rf", {len(m.samples)} samples?, stopped\)$", stopped), stopped
    assert str(m) == stopped and "object at 0x" not in stopped


def test_a_recording_prints_a_summary_not_its_samples() -> None:
    samples = [Sample(float(i), "framework", allocated=i << 20) for i in range(20_000)]
    samples.append(Sample(20_000.0, "device", error="NVML: GPU is lost"))
    meta = {"backend": "torch", "device": 1, "started": 0.0, "stopped": 20_000.0}
    recording = Recording(samples, [], meta)
    text = repr(recording)
    assert len(text) < 200, text
    assert text == (
        "Recording(backend='torch', device=1, 20001 samples over 20000.0 s, 0 marks, 1 gap, "
        f"peak allocated {unimem.format_bytes(19_999 << 20)})"
    )
    assert str(recording) == text


# --- one module draws ---------------------------------------------------------------------------


def _imports_matplotlib(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "matplotlib" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "matplotlib":
            return True
    return False


def test_only_plotting_draws_among_the_observers() -> None:
    """One module of the family imports matplotlib: a change to the plots is made in one place."""
    folder = Path(unimem.__file__).parent / "observe"
    assert sorted(path.name for path in folder.glob("*.py") if _imports_matplotlib(path)) == ["plotting.py"]


def test_monitor_and_hook_save_what_their_recording_saves(tmp_path: Path) -> None:
    hook = unimem.MemoryHook()
    for _ in range(3):
        hook.step()
    hook.mark("epoch 1")
    with unimem.monitor(0.01) as m:
        m.mark("start")
    for name, maker in (("hook", hook), ("monitor", m)):
        recording = maker.recording
        for method, suffix in (("to_json", ".json"), ("to_csv", ".csv")):
            made = getattr(maker, method)(tmp_path / f"{name}{suffix}")
            direct = getattr(recording, method)(tmp_path / f"{name}.direct{suffix}")
            assert made.read_text(encoding="utf-8") == direct.read_text(encoding="utf-8"), (name, method)
        png = maker.plot(tmp_path / f"{name}.png", title=name, figsize=(4, 2), dpi=50)
        with Image.open(png) as image:
            assert image.format == "PNG" and image.size == (200, 100)


def test_a_plot_without_matplotlib_says_so_even_where_parts_of_it_are_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.backends.backend_agg  # noqa: F401  (loaded, as after an earlier plot in the process)

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where the plot extra is not installed
    recording = Recording([Sample(1.0, "device", host_rss=1 << 20)], [], {})
    with pytest.raises(unimem.BackendUnavailable, match=r"pip install 'unimem\[plot\]'"):
        recording.plot(tmp_path / "memory.png")
    with pytest.raises(unimem.BackendUnavailable, match=r"pip install 'unimem\[plot\]'"):
        unimem.plot_recordings([recording, recording], tmp_path / "ranks.png")
    assert list(tmp_path.iterdir()) == []


# --- a recording streamed to a file as it runs ----------------------------------------------------


def _stream_lines(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _records(path: Path, tag: str) -> list[list[Any]]:
    """The stream's records of one kind: ``"d"`` device samples, ``"f"`` framework samples, ``"m"`` marks."""
    return [line for line in _stream_lines(path) if isinstance(line, list) and line[0] == tag]


def test_a_monitor_streams_every_sample_and_mark_to_its_path_as_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(monitor_module, "counter_reader", lambda name, device: (lambda: (7 << 20, 8 << 20), ""))
    path = tmp_path / "memory.jsonl"
    with unimem.monitor(0.02, framework_interval=0.02, path=path) as m:
        m.mark("start")
        deadline = time.monotonic() + 30
        while len(_records(path, "f")) < 5:  # on disk within FLUSH_EVERY
            assert time.monotonic() < deadline, "nothing streamed"
            time.sleep(0.05)
        with pytest.warns(unimem.UnimemWarning, match="no end record"):
            running = load_recording(path)  # readable while it is written: a cut file
        assert running.samples and [mark.label for mark in running.marks] == ["start"]
    lines = _stream_lines(path)
    assert lines[0]["format"] == "unimem.recording-stream/1" and lines[0]["meta"]["interval"] == 0.02
    end = lines[-1]["end"]
    assert end["samples"] == len(lines) - 3 and end["marks"] == 1
    assert end["meta"]["stopped"] == m.recording.meta["stopped"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", unimem.UnimemWarning)  # whole: no "cut short" warning
        back = load_recording(path)
    assert back.samples == m.samples and back.marks == m.marks
    assert {s.source for s in back.samples} == {"device", "framework"}


def test_a_streamed_file_keeps_every_sample_while_memory_is_thinned(tmp_path: Path) -> None:
    path = tmp_path / "memory.jsonl"
    with unimem.monitor(0.002, max_samples=100, path=path) as m:
        time.sleep(1.0)
    kept = [s for s in m.samples if s.source == "device"]
    streamed = _records(path, "d")
    assert len(kept) <= 100 < len(streamed)
    assert len(streamed) == _stream_lines(path)[-1]["end"]["samples"]


@pytest.mark.parametrize("name", ["memory.json", "memory.csv", "memory", "no/such/folder/memory.jsonl", ""])
def test_a_stream_path_is_checked_before_anything_starts(tmp_path: Path, name: str) -> None:
    before = _children()
    with pytest.raises(unimem.ConfigError) as info:
        unimem.monitor(0.1, path=tmp_path / name if name else name)
    assert info.value.parameter == "path"
    assert _children() == before and list(tmp_path.iterdir()) == []


def test_a_stream_that_cannot_be_created_leaves_nothing_running(tmp_path: Path) -> None:
    folder = tmp_path / "gone"
    folder.mkdir()
    m = unimem.monitor(0.1, path=folder / "memory.jsonl")
    folder.rmdir()  # the folder went away between monitor() and start()
    before = _children()
    with pytest.raises(unimem.ConfigError, match="cannot write in") as info:
        m.start()
    assert info.value.parameter == "path"
    assert _children() == before and not m.running


def test_a_mark_too_long_for_a_stream_line_stays_in_memory_and_the_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "memory.jsonl"
    with unimem.monitor(0.05, path=path) as m:
        m.mark("x" * (1 << 20))
        m.mark("short")
    assert [len(mark.label) for mark in m.marks] == [1 << 20, 5]
    assert [mark.label for mark in load_recording(path).marks] == ["short"]


def test_a_stream_whose_writes_fail_keeps_what_it_wrote_and_says_why(tmp_path: Path) -> None:
    from unimem.observe.stream import DEVICE, StreamWriter, encode

    writer = StreamWriter(tmp_path / "memory.jsonl", {"backend": None})
    writer.add(encode([DEVICE, 1.0, None, None, None, 1, None]), DEVICE)
    writer.flush()
    os.close(writer.fd)  # as when the disk fails under it
    writer.fd = os.open(os.devnull, os.O_RDONLY)  # a descriptor no write succeeds on
    writer.add(encode([DEVICE, 2.0, None, None, None, 1, None]), DEVICE)
    writer.flush()
    assert writer.error is not None and "memory.jsonl" in writer.error and "the file ends there" in writer.error
    writer.finish({})  # no raise: the end record is not written after a failure
    with pytest.warns(unimem.UnimemWarning, match="no end record"):
        assert [s.time for s in load_recording(tmp_path / "memory.jsonl").samples] == [1.0]
