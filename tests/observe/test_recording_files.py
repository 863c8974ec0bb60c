"""Recording files: saves that a kill cannot half-write, cut files told from whole ones and
recovered, and hostile files refused with a ConfigError naming the file, never a raw traceback.

The kills themselves are in test_monitor_faults.py; the hostile files and the damage done to
whole files are made by fault_trials.py (which benchmarks/bench_faults.py runs a hundred times).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import warnings
from pathlib import Path

import pytest
from conftest import run_json
from fault_trials import hostile_paths, mutated_outcomes, outcome, rows_json

import unimem
from unimem.observe import files
from unimem.observe.recording import Recording, load_recording
from unimem.observe.samples import Mark, Sample


def _recording(count: int = 30) -> Recording:
    samples = [Sample(1.7e9 + i, "device", process_used=i << 20, host_rss=(i + 1) << 20) for i in range(count)]
    marks = [Mark(1.7e9 + 5, "epoch 1", 3 << 20, None), Mark(1.7e9 + 20, "epoch 2", None, None)]
    return Recording(samples, marks, {"backend": None, "device": 0, "interval": 1.0, "notes": []})


def _loaded_with_warning(path: Path) -> tuple[Recording, str]:
    with pytest.warns(unimem.UnimemWarning) as caught:
        recording = load_recording(path)
    return recording, str(caught[0].message)


# --- hostile files -------------------------------------------------------------------------------


def test_no_hostile_file_gets_a_raw_traceback(tmp_path: Path) -> None:
    paths = hostile_paths(tmp_path)
    assert len(paths) >= 50
    wrong = []
    for name, (path, due) in paths.items():
        got, detail = outcome(path)
        named = isinstance(path, Path) and str(path) in detail
        if got != due or (got == "refused" and isinstance(path, Path) and not named):
            wrong.append(f"{name}: due {due}, got {got}: {detail[:300]}")
    assert not wrong, "\n".join(wrong)


def test_a_refusal_names_the_parameter_and_changes_nothing(tmp_path: Path) -> None:
    fifo = tmp_path / "memory.json"
    os.mkfifo(fifo)
    with pytest.raises(unimem.ConfigError, match="is a FIFO") as info:
        load_recording(fifo)  # opened without blocking: no writer is waited for
    assert info.value.parameter == "path"
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_damaged_copies_of_whole_files_load_or_are_refused(tmp_path: Path) -> None:
    seen = mutated_outcomes(tmp_path, count=10, seed=7)
    assert [detail for _, got, detail in seen if got == "raw"] == []
    assert {got for _, got, _ in seen} <= {"ok", "cut", "refused"}


# --- saves ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["to_json", "to_csv"])
def test_a_save_that_fails_leaves_the_previous_file_and_no_temporary(
    tmp_path: Path, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    suffix = ".json" if method == "to_json" else ".csv"
    target = getattr(_recording(), method)(tmp_path / f"memory{suffix}")
    before = target.read_bytes()

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full_disk)
    with pytest.raises(unimem.ConfigError, match="No space left on device.*nothing was changed") as info:
        getattr(_recording(50), method)(target)
    assert info.value.parameter == "path"
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


def test_a_save_keeps_the_files_permissions(tmp_path: Path) -> None:
    target = _recording().to_json(tmp_path / "memory.json")
    target.chmod(0o640)
    _recording(40).to_json(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert len(load_recording(target).samples) == 40


# --- cut files -----------------------------------------------------------------------------------


def test_a_json_cut_short_gives_back_every_whole_block_with_a_warning(tmp_path: Path) -> None:
    whole = _recording(2500).to_json(tmp_path / "memory.json").read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(whole[: whole.index(b'{"time": [1700002000.0') + 100])  # in the third block of samples
    recording, message = _loaded_with_warning(cut)
    assert [s.time for s in recording.samples] == [1.7e9 + i for i in range(2000)]
    assert [m.label for m in recording.marks] == ["epoch 1", "epoch 2"]  # written before the samples
    assert "cut short" in message and "recovered 2000 of 2500 samples and 2 of 2 marks" in message
    assert message in recording.notes


def test_a_row_json_cut_short_gives_back_every_whole_sample_with_a_warning(tmp_path: Path) -> None:
    whole = rows_json(_recording())  # the JSON written before columns: one sample a line
    cut = tmp_path / "cut.json"
    cut.write_bytes(whole[: whole.index(b'"time": 1700000012.0') + 5])
    recording, message = _loaded_with_warning(cut)
    assert [s.time for s in recording.samples] == [1.7e9 + i for i in range(12)]
    assert "cut short" in message and "recovered 12 of 30 samples and 0 of 2 marks" in message
    assert message in recording.notes


def test_a_csv_cut_at_a_rows_end_is_told_from_a_whole_one(tmp_path: Path) -> None:
    whole = _recording().to_csv(tmp_path / "memory.csv").read_bytes()
    assert load_recording(tmp_path / "memory.csv").samples == _recording().samples  # whole: no warning
    lines = whole.splitlines(keepends=True)
    cut = tmp_path / "cut.csv"
    cut.write_bytes(b"".join(lines[:12]))  # the comment, the header, 10 rows: a row boundary
    recording, message = _loaded_with_warning(cut)
    assert len(recording.samples) + len(recording.marks) == 10
    assert "recovered 10 of 32 rows" in message


def test_a_csv_written_before_rows_were_counted_still_loads(tmp_path: Path) -> None:
    text = _recording().to_csv(tmp_path / "new.csv").read_text(encoding="utf-8")
    header, _, body = text.partition("\n")
    meta = json.loads(header.partition(" ")[2].partition(" ")[2])["meta"]
    old = tmp_path / "old.csv"
    old.write_text(f"# unimem.observe.recording {json.dumps(meta)}\n{body}", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recording = load_recording(old)
    assert recording.samples == _recording().samples and recording.meta == meta


def _stream_lines(count: int, max_samples: int | None = None) -> list[str]:
    meta = {"backend": None, "device": 0, "started": 1.7e9, "notes": ["at start"]}
    if max_samples is not None:
        meta["max_samples"] = max_samples
    lines = [json.dumps({"format": "unimem.recording-stream/1", "meta": meta})]
    lines += [json.dumps(["d", 1.7e9 + i, None, None, (i % 50) << 20, 1 << 20, None]) for i in range(count)]
    lines += [json.dumps(["f", 1.7e9 + i + 0.5, i, 2 * i, None]) for i in range(count)]
    lines += [json.dumps(["m", 1.7e9 + 1, "epoch 1", None, None])]
    return lines


def test_a_stream_without_its_end_record_loads_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "memory.jsonl"
    path.write_text("\n".join(_stream_lines(10)) + '\n["d", 1700000011.0, null, nu', encoding="utf-8")
    recording, message = _loaded_with_warning(path)
    assert len(recording.samples) == 20 and [m.label for m in recording.marks] == ["epoch 1"]
    assert "no end record" in message and "recovered 20 samples" in message and "written in part" in message
    assert recording.notes == ["at start", message]


def test_a_whole_stream_takes_its_end_records_meta(tmp_path: Path) -> None:
    path = tmp_path / "memory.jsonl"
    end = {"end": {"samples": 20, "marks": 1, "meta": {"stopped": 1.7e9 + 10, "notes": ["at start", "at end"]}}}
    path.write_text("\n".join([*_stream_lines(10), json.dumps(end)]) + "\n", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recording = load_recording(path)
    assert recording.meta["stopped"] == 1.7e9 + 10 and recording.notes == ["at start", "at end"]
    assert [s.time for s in recording.samples] == sorted(s.time for s in recording.samples)


def test_a_long_stream_is_read_into_bounded_series_peaks_kept(tmp_path: Path) -> None:
    path = tmp_path / "memory.jsonl"
    path.write_text("\n".join(_stream_lines(1000, max_samples=100)) + "\n", encoding="utf-8")
    with pytest.warns(unimem.UnimemWarning, match="no end record"):
        recording = load_recording(path)
    device = [s for s in recording.samples if s.source == "device"]
    assert len(device) <= 100 and max(s.process_used or 0 for s in device) == 49 << 20
    assert recording.meta["decimation"]["device_stride"] > 1
    assert any("of the file's 2000 samples" in note for note in recording.notes)


# --- whole columns checked at once, the offending row still named -------------------------------


def _with_values(tmp_path: Path, layout: str, count: int, changes: dict[int, dict[str, object]]) -> Path:
    """A saved recording of ``count`` samples whose sample ``i`` has ``changes[i]`` written into it:
    ``"columns"`` as ``to_json`` writes it, ``"rows"`` as it wrote before (one object a sample)."""
    path = tmp_path / "memory.json"
    if layout == "rows":
        data = json.loads(rows_json(_recording(count)))
        for row, fields in changes.items():
            data["samples"][row].update(fields)
    else:
        data = json.loads(_recording(count).to_json(path).read_text(encoding="utf-8"))
        block = data["samples"][0]
        for row, fields in changes.items():
            for name, value in fields.items():
                block.setdefault(name, [None] * count)[row] = value
    path.write_text(json.dumps(data).replace("Infinity", "1e999"), encoding="utf-8")
    return path


@pytest.mark.parametrize("layout", ["columns", "rows"])
@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("process_used", -1, "process_used is -1, expected a whole number"),
        ("process_used", 1 << 63, "process_used is 9223372036854775808, expected a whole number"),
        ("host_rss", True, "host_rss is True, expected a whole number"),
        ("time", 1e999, "time is inf, expected a finite number"),
        ("time", "noon", "time is 'noon', expected seconds"),
        ("source", "disk", "source is 'disk', expected one of"),
        ("source", ["device"], "source is an array, expected one of"),
        ("peak_exact", 1, "peak_exact is 1, expected true, false or null"),
        ("error", 5, "error is 5, expected text or null"),
    ],
)
def test_a_bad_value_deep_in_a_json_names_its_sample(
    tmp_path: Path, layout: str, field: str, value: object, problem: str
) -> None:
    path = _with_values(tmp_path, layout, 300, {250: {field: value}, 280: {field: value}})
    with pytest.raises(unimem.ConfigError, match=f"sample 251: {problem}".replace("(", r"\(")) as info:
        load_recording(path)
    assert str(path) in str(info.value)


def test_row_json_samples_with_whole_second_times_or_fields_left_out_load(tmp_path: Path) -> None:
    path = tmp_path / "memory.json"
    data = json.loads(rows_json(_recording(30)))
    samples = data["samples"]
    samples[3]["time"] = 1_700_000_003  # an integer time: a float in memory
    del samples[7]["host_peak"]  # a field an older file lacks: unknown
    samples[9]["comment"] = "kept out"  # a name that is no field: left out
    path.write_text(json.dumps(data), encoding="utf-8")
    loaded = load_recording(path)
    assert loaded.samples == _recording(30).samples
    assert type(loaded.samples[3].time) is float and not hasattr(loaded.samples[9], "comment")


def test_column_json_with_whole_second_times_null_columns_or_unknown_columns_loads(tmp_path: Path) -> None:
    path = _with_values(tmp_path, "columns", 30, {3: {"time": 1_700_000_003, "peak": None, "comment": "kept out"}})
    loaded = load_recording(path)
    assert loaded.samples == _recording(30).samples
    assert type(loaded.samples[3].time) is float and not hasattr(loaded.samples[3], "comment")


def test_to_json_writes_blocks_of_columns_that_load_back_whole(tmp_path: Path) -> None:
    """One array per field, at most 1,000 rows a block; a field no row of a block knows is left out."""
    samples = [
        Sample(
            1.7e9 + i, "device", process_used=i << 20, host_rss=(i + 1) << 20, error="NVML: timeout" if i == 5 else None
        )
        for i in range(2500)
    ]
    samples.append(Sample(1.7e9 + 3000, "step", 1, 2, 3, False, 4, 5, 6, 7, 8, 9, None))
    recording = Recording(samples, [Mark(1.7e9 + 1, "epoch 1", 3, None)], {"backend": None, "notes": ["a note"]})
    path = recording.to_json(tmp_path / "memory.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["format"] == "unimem.recording/3" and data["count"] == {"samples": 2501, "marks": 1}
    assert [len(block["time"]) for block in data["samples"]] == [1000, 1000, 501]
    assert list(data["samples"][0]) == ["time", "source", "process_used", "host_rss", "error"]
    assert list(data["samples"][1]) == ["time", "source", "process_used", "host_rss"]
    assert data["marks"] == [{"time": [1.7e9 + 1], "label": ["epoch 1"], "allocated": [3]}]
    for saved in (path, recording.to_csv(tmp_path / "memory.csv")):
        loaded = load_recording(saved)
        assert (loaded.samples, loaded.marks) == (recording.samples, recording.marks), saved
        assert loaded.samples[-1].peak_exact is False and loaded.samples[0].peak is None


def test_columns_of_unequal_length_are_refused_naming_the_block(tmp_path: Path) -> None:
    path = _recording(2500).to_json(tmp_path / "memory.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    del data["samples"][1]["host_rss"][-1]
    path.write_text(json.dumps(data), encoding="utf-8")
    lengths = "(time 1000, source 1000, process_used 1000, host_rss 999)"
    with pytest.raises(
        unimem.ConfigError, match=re.escape(f"samples' block 2: its columns differ in length {lengths}")
    ):
        load_recording(path)


# --- CSV: whole columns, the offending line still named ------------------------------------------


@pytest.mark.parametrize("quoted", [False, True])
def test_a_bad_value_deep_in_a_csv_names_its_line(tmp_path: Path, quoted: bool) -> None:
    """Cells split at once where nothing is quoted, read by the CSV reader where something is."""
    recording = _recording(300)
    if quoted:
        recording.marks.append(Mark(1.7e9 + 30, 'phase "b", part 2'))
    text = recording.to_csv(tmp_path / "memory.csv").read_text(encoding="utf-8")
    assert load_recording(tmp_path / "memory.csv").marks == recording.marks
    lines = text.split("\n")
    header = lines[1].split(",")
    cells = lines[250].split(",")
    cells[header.index("process_used")] = "-5"
    lines[250] = ",".join(cells)
    (tmp_path / "memory.csv").write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(unimem.ConfigError, match=r"line 251: process_used is '-5'"):
        load_recording(tmp_path / "memory.csv")


def test_a_csv_marks_row_is_read_for_a_marks_cells_alone(tmp_path: Path) -> None:
    """A cell a mark has no field for is not read (a sample's column in a mark's row)."""
    text = _recording().to_csv(tmp_path / "memory.csv").read_text(encoding="utf-8")
    lines = text.split("\n")
    header = lines[1].split(",")
    at = next(i for i, line in enumerate(lines) if ",mark," in line)
    cells = lines[at].split(",")
    cells[header.index("peak_exact")] = "maybe"
    lines[at] = ",".join(cells)
    (tmp_path / "memory.csv").write_text("\n".join(lines), encoding="utf-8")
    loaded = load_recording(tmp_path / "memory.csv")
    assert (loaded.samples, loaded.marks) == (_recording().samples, _recording().marks)


def test_a_stream_names_the_first_bad_line_even_before_an_unreadable_one(tmp_path: Path) -> None:
    lines = _stream_lines(100)
    lines[40] = json.dumps(["d", 1.7e9, None, None, -5, 1, None])  # a bad value...
    lines[90] = '["d", 1.7e9, {'  # ...then a line that is no JSON
    path = tmp_path / "memory.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(unimem.ConfigError, match=r"line 41: process_used is -5"):
        load_recording(path)
    lines[40] = json.dumps([["d"], 1.7e9, None, None, 5])  # a record whose tag is no text
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(unimem.ConfigError, match=r"line 41: not a sample or a mark"):
        load_recording(path)


def test_a_stream_with_whole_second_times_loads_as_written(tmp_path: Path) -> None:
    lines = [*_stream_lines(5), json.dumps(["f", 1_700_000_100, 7, 8, None])]
    path = tmp_path / "memory.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.warns(unimem.UnimemWarning, match="no end record"):
        recording = load_recording(path)
    last = recording.samples[-1]
    assert (last.time, last.allocated, last.reserved, last.source) == (1.7e9 + 100, 7, 8, "framework")
    assert type(last.time) is float and len(recording.samples) == 11


def test_a_stream_longer_than_a_read_counts_its_lines_across_reads(tmp_path: Path) -> None:
    lines = _stream_lines(12_000)  # about 1.3 MB: more than one read of the file
    path = tmp_path / "memory.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.warns(unimem.UnimemWarning, match="recovered 24000 samples"):
        assert len(load_recording(path).samples) == 24_000
    lines[20_000] = json.dumps(["f", 1.7e9, 1, "two", None])
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(unimem.ConfigError, match=r"line 20001: reserved is 'two'"):
        load_recording(path)


def test_loading_leaves_the_garbage_collector_as_it_found_it(tmp_path: Path) -> None:
    path = _recording().to_json(tmp_path / "memory.json")
    seen = run_json(
        f"""
        import gc, unimem
        path = {str(path)!r}
        states = []
        for enabled in (True, False):
            gc.enable() if enabled else gc.disable()
            unimem.load_recording(path)
            try:
                unimem.load_recording(path + ".missing")
            except unimem.ConfigError:
                pass
            states.append(gc.isenabled())
        emit(states)
        """
    )
    assert seen == [True, False]


def test_a_link_that_loops_is_named_as_one_by_the_loader_and_the_commands(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from unimem.cli.main import main as cli_main

    loop = tmp_path / "memory.json"
    loop.symlink_to(tmp_path / "other.json")
    (tmp_path / "other.json").symlink_to(loop)
    with pytest.raises(unimem.ConfigError, match="is a symbolic link that loops") as info:
        load_recording(loop)
    assert info.value.parameter == "path" and str(loop) in str(info.value)
    for command in ("plot", "view"):
        result = CliRunner().invoke(cli_main, [command, str(loop)])
        assert result.exit_code != 0
        assert "symbolic link that loops" in result.output and "does not exist" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.json", "other.json"]  # nothing written
