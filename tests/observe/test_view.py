"""``unimem view``: one self-contained page holding every figure of each recording, exactly; lanes
labelled as the PNG labels ranks; a comparison as its table and charts; bad input refused before
anything is written. The page in a real browser: test_view_browser.py."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from view_pages import GIB, START, page_parts, synthetic_run

from unimem.cli.main import main
from unimem.compare.harness import Comparison, table_rows
from unimem.errors import ConfigError
from unimem.observe.recording import Recording
from unimem.observe.samples import Mark, Sample
from unimem.view import FIGURES, view_html, write_view

RUNS = [
    {
        "framework": "torch",
        "workload": "mlp",
        "config": "default",
        "ok": True,
        "parameters": 1_000_000,
        "step_ms": 12.5,
        "process_peak": 3 * GIB,
        "host_peak_rss": GIB,
    },
    {"framework": "torch", "workload": "mlp", "config": "bf16", "ok": False, "error": "worker exited 1: boom"},
    {
        "framework": "jax",
        "workload": "mlp",
        "config": "default",
        "ok": True,
        "parameters": 1_000_000,
        "step_ms": 8.0,
        "process_peak": 5 * GIB,
    },
]


def _compare_file(folder: Path, runs: list[dict] | None = None) -> Path:
    path = folder / "compare.json"
    Comparison(runs if runs is not None else RUNS, {"device": "NVIDIA H200", "size": "small"}).to_json(path)
    return path


def test_every_figure_travels_exactly_with_its_gaps_marks_and_cap(tmp_path: Path) -> None:
    recording = synthetic_run(3000)
    page = write_view([recording], tmp_path / "memory.html")
    manifest, values = page_parts(page.path)
    assert page.size == page.path.stat().st_size and [lane.samples for lane in page.lanes] == [3000]
    assert page.lanes[0].label == "recording" and page.notes == ()  # one lane: no rank to tell it apart
    (lane,) = manifest["lanes"]
    assert lane["limit"] == 6 * GIB and lane["errors"] == ["NVML: GPU is lost"] and len(lane["gaps"]) == 4
    assert [mark[1] for mark in lane["marks"]] == [mark.label for mark in recording.marks]
    figures = {line["figure"]: line for line in lane["lines"]}
    assert list(figures) == [name for name in FIGURES if recording.peak(name) is not None]
    assert [name for name, line in figures.items() if not line["shown"]] == ["device_total"]
    for name, line in figures.items():
        start, length = manifest["arrays"][line["v"]]
        sent = values[start : start + length]
        times_start, times_length = manifest["arrays"][line["t"]]
        stream = [s for s in recording.samples if getattr(s, name) is not None or s.error is not None]
        if name in ("allocated", "reserved"):
            stream = [s for s in stream if s.source == "framework"]
        else:
            stream = [s for s in stream if s.source == "device"]
        assert times_length == length == len(stream) == line["known"] + sum(s.error is not None for s in stream)
        assert list(values[times_start : times_start + times_length]) == [s.time for s in stream]
        expected = [getattr(s, name) for s in stream]
        assert [None if math.isnan(v) else int(v) for v in sent] == expected  # exact, NaN at each failed reading
    # The sampler's four figures share one time array: it travels once.
    assert len({figures[name]["t"] for name in ("process_used", "device_used", "host_rss")}) == 1


def test_the_page_needs_nothing_from_outside(tmp_path: Path) -> None:
    text = view_html([synthetic_run(200)])
    assert not re.search(r"""(src|href)\s*=\s*["']?[a-z]+:""", text, re.IGNORECASE)  # no script, style or font fetched
    assert not re.search(r"""<(script|link|img|iframe)[^>]*\s(src|href)=""", text, re.IGNORECASE)
    assert 'performance.mark("drawn")' in text


def test_text_from_a_recording_stays_text(tmp_path: Path) -> None:
    hostile = "</script><script>alert(1)</script> {{DATA}} <!--"
    recording = Recording([Sample(START, "framework", allocated=1)], [Mark(START, hostile)], {"backend": "x"})
    page = write_view([recording], tmp_path / "m.html", title="<b>bold</b>")
    text = page.path.read_text(encoding="utf-8")
    assert "<script>alert(1)" not in text and "<b>bold</b>" not in text
    manifest, _ = page_parts(page.path)
    assert manifest["lanes"][0]["marks"][0][1] == hostile and manifest["title"] == "<b>bold</b>"


def test_ranks_are_lanes_in_rank_order_labelled_as_the_plot_labels_them(tmp_path: Path) -> None:
    synthetic_run(300, rank=1).to_json(tmp_path / "memory.rank1.json")
    synthetic_run(300, rank=0).to_json(tmp_path / "memory.rank0.json")
    unnamed = synthetic_run(100)
    unnamed.to_json(tmp_path / "other.json")
    page = write_view(
        [tmp_path / "memory.rank1.json", tmp_path / "memory.rank0.json", tmp_path / "other.json"], tmp_path / "all.html"
    )
    assert [(lane.label, lane.rank, lane.file) for lane in page.lanes] == [
        ("rank 0", 0, "memory.rank0.json"),
        ("rank 1", 1, "memory.rank1.json"),
        ("other.json", None, "other.json"),
    ]
    assert page.notes == ("other.json: no rank in its metadata or its name; labelled by its name",)
    manifest, _ = page_parts(page.path)
    assert [lane["label"] for lane in manifest["lanes"]] == ["rank 0", "rank 1", "other.json"]
    assert manifest["notes"] == list(page.notes) and manifest["title"] == "unimem: 3 recordings"
    assert manifest["origin"] == START  # one wall clock for every lane: the earliest start


def test_a_comparison_is_its_table_and_a_chart_per_workload_and_figure(tmp_path: Path) -> None:
    page = write_view([_compare_file(tmp_path)], tmp_path / "compare.html")
    manifest, values = page_parts(page.path)
    assert page.lanes == () and page.comparisons == ("compare.json",) and len(values) == 0
    (shown,) = manifest["comparisons"]
    header, rows = table_rows(Comparison(RUNS, {}))
    assert shown["header"] == header and shown["rows"] == rows
    assert shown["frameworks"] == ["jax", "torch"] and shown["configs"] == ["default", "bf16"]
    memory, steps = shown["charts"]
    assert memory["title"] == "mlp: process peak on the GPU (NVML)" and memory["unit"] == "bytes"
    assert memory["values"] == [[5 * GIB, None], [3 * GIB, None]]  # the failed run has no bar
    assert steps["values"] == [[8.0, None], [12.5, None]] and steps["unit"] == "ms"
    assert "failed: torch · mlp · bf16: worker exited 1: boom" in shown["notes"]
    assert manifest["title"] == "unimem compare · NVIDIA H200 · size small"


@pytest.mark.parametrize(
    ("run", "said"),
    [
        ({"workload": "mlp", "config": "default", "ok": False}, "result 1: framework is None, expected text"),
        ({**RUNS[0], "step_ms": "fast"}, "result 1: step_ms is 'fast', expected a finite number"),
        ({**RUNS[0], "process_peak": -1}, "result 1: process_peak is -1, expected a whole number"),
        ({**RUNS[0], "parameters": None}, "result 1: parameters is None, expected a finite number"),
    ],
)
def test_a_damaged_comparison_is_refused_naming_the_file_and_the_run(tmp_path: Path, run: dict, said: str) -> None:
    source = _compare_file(tmp_path, [run])
    with pytest.raises(ConfigError, match=re.escape(f"{source}, {said}")):
        write_view([source], tmp_path / "page.html")
    assert not (tmp_path / "page.html").exists()


def test_a_comparison_object_is_checked_as_its_file_would_be(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"comparison 1, result 2: step_ms is nan, expected a finite number"):
        write_view([Comparison([RUNS[0], {**RUNS[0], "step_ms": math.nan}])], tmp_path / "page.html")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("inputs", "path", "said"),
    [
        ("memory.json", "page.html", "inputs: expected a list"),
        ([], "page.html", "inputs: nothing to show"),
        ([42], "page.html", "inputs: expected recordings, comparisons or paths, got int"),
        ([synthetic_run(10)], "page.htm", "would hold HTML; name it with the .html suffix"),
        ([synthetic_run(10)], "no/such/page.html", "does not exist; create the folder first"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(tmp_path: Path, inputs: object, path: str, said: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(said)):
        write_view(inputs, tmp_path / path)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_neither_says_what_is_wrong_with_it_as_a_recording(tmp_path: Path) -> None:
    stray = tmp_path / "notes.json"
    stray.write_text('{"hello": 1}', encoding="utf-8")
    with pytest.raises(ConfigError, match="is not a unimem recording"):
        write_view([stray], tmp_path / "page.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.json"]


def test_the_command_writes_the_page_beside_the_ranks_and_says_what_it_holds(tmp_path: Path) -> None:
    for rank in (0, 1):
        synthetic_run(200, rank=rank).to_json(tmp_path / f"memory.rank{rank}.json")
    compare = _compare_file(tmp_path)
    result = CliRunner().invoke(main, ["view", str(tmp_path / "memory.rank*.json"), str(compare), "--json"])
    assert result.exit_code == 0, result.output
    done = json.loads(result.output)
    target = tmp_path / "memory.ranks.html"
    assert done["output"] == str(target) and done["bytes"] == target.stat().st_size
    assert [(lane["label"], lane["samples"]) for lane in done["lanes"]] == [("rank 0", 200), ("rank 1", 200)]
    assert done["comparisons"] == ["compare.json"]
    plain = CliRunner().invoke(main, ["view", str(compare), "-o", str(tmp_path / "c.html"), "--title", "mine"])
    assert plain.exit_code == 0 and plain.output.startswith(f"wrote {tmp_path / 'c.html'} (")
    assert page_parts(tmp_path / "c.html")[0]["title"] == "mine"


def test_the_command_line_errors_name_the_option(tmp_path: Path) -> None:
    synthetic_run(10).to_json(tmp_path / "memory.json")
    wrong = CliRunner().invoke(main, ["view", str(tmp_path / "memory.json"), "-o", str(tmp_path / "memory.png")])
    assert wrong.exit_code == 2 and "'--output'" in wrong.output and "name it with the .html suffix" in wrong.output
    missing = CliRunner().invoke(main, ["view", str(tmp_path / "nothing.json")])
    assert missing.exit_code == 2 and "nothing.json does not exist" in missing.output
    stray = tmp_path / "stray.csv"
    stray.write_text("a,b\n1,2\n", encoding="utf-8")
    damaged = CliRunner().invoke(main, ["view", str(stray)])
    assert damaged.exit_code == 1 and damaged.output.startswith("unimem view: ") and "stray.csv" in damaged.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.json", "stray.csv"]


def test_open_hands_the_page_to_the_web_browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import webbrowser

    synthetic_run(10).to_json(tmp_path / "memory.json")
    opened: list[str] = []
    monkeypatch.setattr(webbrowser, "open", lambda url: opened.append(url) or True)
    result = CliRunner().invoke(main, ["view", str(tmp_path / "memory.json"), "--open"])
    assert result.exit_code == 0 and opened == [(tmp_path / "memory.html").resolve().as_uri()]
    monkeypatch.setattr(webbrowser, "open", lambda url: False)
    none = CliRunner().invoke(main, ["view", str(tmp_path / "memory.json"), "--open"])
    assert none.exit_code == 1 and "no web browser to open it here; open file://" in none.output
    assert (tmp_path / "memory.html").is_file()  # the page is written all the same


def test_text_of_any_length_travels_cut_so_the_page_stays_small(tmp_path: Path) -> None:
    recording = synthetic_run(500)
    long = "epoch 1: " + "x" * (5 << 20)
    recording.marks.append(Mark(START + 1, long))
    recording.samples.append(Sample(START + 2, "device", error="NVML: " + "y" * (5 << 20)))
    recording.meta["notes"] = [f"note {k}: " + "z" * 10_000 for k in range(1000)]
    recording.meta["backend"] = "b" * (5 << 20)
    page = write_view([recording], tmp_path / "memory.html")
    assert page.size < 1 << 20  # the texts' megabytes stay out of the page
    manifest, _ = page_parts(page.path)
    (lane,) = manifest["lanes"]
    cut = next(mark[1] for mark in lane["marks"] if mark[1].startswith("epoch 1: "))
    assert len(cut) <= 500 and cut.endswith("…")
    assert max(map(len, lane["errors"])) <= 500 and len(lane["about"]) <= 500 and len(manifest["title"]) <= 500
    assert len(lane["notes"]) == 101 and lane["notes"][-1] == "... and 900 more notes"


@pytest.mark.parametrize("started", [1e308, -1e308])
def test_a_stated_start_no_run_could_have_is_not_the_pages_origin(tmp_path: Path, started: float) -> None:
    recording = synthetic_run(500)
    recording.meta["started"] = started
    manifest, _ = page_parts(write_view([recording], tmp_path / "memory.html").path)
    assert manifest["origin"] == min(s.time for s in recording.samples)


def test_times_spanning_more_than_any_run_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    recording = Recording([Sample(t, "device", process_used=1) for t in (START, 1e300)], [], {})
    with pytest.raises(ConfigError, match="the recording is damaged") as info:
        write_view([recording], tmp_path / "memory.html")
    assert info.value.parameter == "recording" and not (tmp_path / "memory.html").exists()
