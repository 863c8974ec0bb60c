"""A recording's PNG: long runs drawn thinned to the image's width, marks as one collection with the
labels that fit (each cut to what fits), peaks and gaps kept, the time axis from a start a run could
have, a damaged recording refused before anything is written."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from unimem.cli.main import main as cli_main
from unimem.errors import ConfigError
from unimem.observe.plotting import _ranks_figure, _recording_figure, plot_comparison
from unimem.observe.recording import Recording
from unimem.observe.samples import Mark, Sample

MIB = 1 << 20
START = 1_700_000_000.0


def _long_run(samples: int, marks: int, spike_at: int | None = None) -> Recording:
    """Framework counters and NVML readings interleaved, a failed reading every 1000, marks spread evenly."""
    rows = []
    for i in range(samples):
        t = START + i * 0.001
        if i % 2:
            allocated = (100 + i % 50) * MIB if i != spike_at else 4096 * MIB
            rows.append(Sample(t, "framework", allocated=allocated, reserved=512 * MIB))
        elif i % 1000 == 0:
            rows.append(Sample(t, "device", error="NVML: timeout"))
        else:
            rows.append(Sample(t, "device", process_used=700 * MIB, device_used=900 * MIB))
    span = samples * 0.001
    labels = [Mark(START + (k + 0.5) * span / marks, f"step {k}") for k in range(marks)]
    return Recording(rows, labels, {"backend": "torch", "device": 0, "started": START})


def _lines(fig: Any) -> dict[str, Any]:
    return {str(line.get_label()): line for line in fig.axes[0].get_lines()}


def _label_pixels(fig: Any) -> list[float]:
    ax = fig.axes[0]
    return sorted(ax.transData.transform((text.xy[0], 0))[0] for text in ax.texts)


def test_a_long_run_is_drawn_thinned_to_the_width_with_its_peak_and_its_gaps() -> None:
    recording = _long_run(60_000, 500, spike_at=23_457)
    fig = _recording_figure(recording, None, (10.0, 5.0), 100)
    lines = _lines(fig)
    allocated = lines["allocated (framework)"]
    assert len(allocated.get_xdata()) <= 4 * 1000  # four points per pixel column at most
    assert fig.axes[0].get_ylabel() == "GiB" and max(allocated.get_ydata()) == 4.0  # one spike in 30,000 survives
    process = lines["process (NVML)"]
    assert any(math.isnan(y) for y in process.get_ydata())  # the failed readings still break the line
    assert not any(math.isnan(y) for y in allocated.get_ydata())  # the other stream's readings do not


def test_thousands_of_marks_are_one_collection_with_only_the_labels_that_fit() -> None:
    fig = _recording_figure(_long_run(2_000, 5_000), None, (10.0, 5.0), 100)
    ax = fig.axes[0]
    assert len(ax.collections) <= 4  # gaps, mark ticks, labelled marks: not a line per mark
    assert 10 < len(ax.texts) < 200
    pixels = _label_pixels(fig)
    height = 7 * 100 / 72  # a label's text height in pixels: upright labels sit side by side
    assert all(b - a >= height for a, b in zip(pixels, pixels[1:], strict=False))
    assert f"5000 marks ({len(ax.texts)} labelled)" in _lines(fig)


def test_a_few_marks_are_all_labelled_with_full_lines_and_no_legend_entry() -> None:
    fig = _recording_figure(_long_run(2_000, 6), None, (10.0, 5.0), 100)
    ax = fig.axes[0]
    assert sorted(text.get_text() for text in ax.texts) == [f"step {k}" for k in range(6)]
    assert not any("marks" in label for label in _lines(fig))


def test_ranks_share_the_label_room_and_each_line_is_thinned() -> None:
    ranks = [(_long_run(20_000, 3_000), "memory.rank0.json"), (_long_run(20_000, 3_000), "memory.rank1.json")]
    fig, figure, lines, _ = _ranks_figure(ranks, "process_used", None, (10.0, 5.0), 100)
    assert figure == "process_used" and [line.samples for line in lines] == [9_980, 9_980]
    pixels = _label_pixels(fig)
    assert 10 < len(pixels) < 200 and all(b - a >= 7 * 100 / 72 for a, b in zip(pixels, pixels[1:], strict=False))
    assert all(len(line.get_xdata()) <= 4 * 1000 for line in fig.axes[0].get_lines())


@pytest.mark.parametrize(
    "recording",
    [
        Recording([Sample(1.0, "device", process_used=1 << 70)]),
        Recording([Sample(1.0, "device", process_used=1 << 30)], [], {"limit": 10**400}),
    ],
    ids=["figure", "cap"],
)
def test_a_figure_no_machine_could_hold_is_refused_and_nothing_is_written(recording: Recording, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="beyond any machine's memory"):
        recording.plot(tmp_path / "memory.png")
    assert not (tmp_path / "memory.png").exists()


LONG_LABEL = "epoch 1: " + "x" * (5 << 20)  # a label of 5 MB: drawn whole, it took minutes and a gigabyte


def test_a_mark_label_of_megabytes_is_drawn_cut_to_what_fits() -> None:
    recording = _long_run(2_000, 3)
    recording.marks.append(Mark(START + 0.5, LONG_LABEL))
    fig = _recording_figure(recording, None, (10.0, 5.0), 100)
    texts = [text.get_text() for text in fig.axes[0].texts]
    assert max(map(len, texts)) <= 80 and any(t.startswith("epoch 1: xxx") and t.endswith("…") for t in texts)
    ranks, *_ = _ranks_figure([(recording, "memory.rank0.json")], "allocated", None, (10.0, 5.0), 100)
    assert max(len(text.get_text()) for text in ranks.axes[0].texts) <= 80
    fig.savefig(io.BytesIO(), format="png")  # drawn: the cut label costs what a short one does


@pytest.mark.parametrize("started", [1e308, -1e308, START - 2e9])
def test_a_stated_start_no_run_could_have_is_not_the_axis_origin(started: float, tmp_path: Path) -> None:
    recording = _long_run(2_000, 3)
    recording.meta["started"] = started
    fig = _recording_figure(recording, None, (10.0, 5.0), 100)
    xs = _lines(fig)["allocated (framework)"].get_xdata()
    assert min(xs) >= 0 and max(xs) < 2.5  # seconds since the first sample
    recording.plot(tmp_path / "memory.png")  # matplotlib draws it: no "arange: cannot compute length"


@pytest.mark.parametrize("times", [(START, 1e300), (-1e308, 1e308), (START, START + 2e9)])
def test_times_spanning_more_than_any_run_are_refused_naming_the_span(
    times: tuple[float, float], tmp_path: Path
) -> None:
    recording = Recording([Sample(t, "device", process_used=1 << 30) for t in times], [], {})
    with pytest.raises(ConfigError, match="the recording is damaged") as info:
        recording.plot(tmp_path / "memory.png")
    assert info.value.parameter == "recording" and "span" in str(info.value)
    with pytest.raises(ConfigError, match="the recording is damaged"):
        _ranks_figure([(recording, None)], "process_used", None, (10.0, 5.0), 100)
    assert not (tmp_path / "memory.png").exists()


def test_the_plot_command_says_a_damaged_span_in_one_line(tmp_path: Path) -> None:
    path = Recording([Sample(t, "device", process_used=1) for t in (START, 1e300)], [], {}).to_json(tmp_path / "m.json")
    result = CliRunner().invoke(cli_main, ["plot", str(path)])
    assert result.exit_code == 1 and "the recording is damaged" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "m.png").exists()


@dataclass
class _Runs:
    """A comparison as the chart reads it, with no ``unimem.compare`` in sight."""

    results: list[dict[str, Any]]
    machine: dict[str, Any]
    configs: list[str]
    has_gpu: bool = False
    times_comparable: bool = True


def test_a_comparisons_chart_reads_the_configurations_and_figures_from_the_comparison(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt

    drawn: list[Any] = []
    monkeypatch.setattr(plt, "close", drawn.append)
    run = {"framework": "torch", "workload": "mlp", "ok": True, "step_ms": 10.0}
    results = [
        {**run, "config": "cap", "host_peak_rss": 1 << 30},
        {**run, "config": "default", "host_peak_rss": 3 << 30},
    ]
    comparison = _Runs(results, {"device": "CPU only", "size": "small"}, ["cap", "default"])
    plot_comparison(comparison, tmp_path / "compare.png")
    assert (tmp_path / "compare.png").read_bytes().startswith(b"\x89PNG")
    memory = drawn[0].axes[0]
    assert [label.get_text() for label in memory.get_xticklabels()] == ["cap", "default"], "the comparison's order"
    assert [bar.get_height() for bar in memory.patches] == [1.0, 3.0]
    assert "host peak RSS" in memory.get_ylabel()
