"""Any file unimem writes loads back, whatever its size or its labels; a size limit is a real one (the
memory a file read whole takes, or the caller's own cap) and says how to lift it."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import unimem
from unimem import host_memory
from unimem.cli.main import main as cli_main
from unimem.observe.recording import Recording, load_recording
from unimem.observe.samples import Mark, Sample

START = 1.7e9
MIB = 1 << 20


def _run(samples: int = 200, marks: tuple[Mark, ...] = ()) -> Recording:
    rows = [Sample(START + i * 0.01, "device", process_used=(i + 1) * MIB, host_rss=2 * MIB) for i in range(samples)]
    return Recording(rows, list(marks), {"backend": None, "device": 0, "started": START, "notes": []})


@pytest.mark.parametrize("suffix", [".json", ".csv", ".jsonl"])
def test_a_file_too_large_for_the_memory_available_says_so_and_how_to_read_it_anyway(
    tmp_path: Path, suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / f"memory{suffix}"
    if suffix == ".jsonl":
        path.write_text(
            '{"format": "unimem.recording-stream/1", "meta": {}}\n["d", 1.0, null, null, null, 5, null]\n'
            '{"end": {"samples": 1, "marks": 0, "meta": {}}}\n',
            encoding="utf-8",
        )
    else:
        getattr(_run(), f"to_{suffix[1:]}")(path)
    size = path.stat().st_size
    monkeypatch.setattr(host_memory, "available", lambda: 2 * size)  # far less than a file read whole takes
    if suffix == ".jsonl":  # read a line at a time into bounded series: no memory rule
        assert len(load_recording(path).samples) == 1
        return
    with pytest.raises(unimem.ConfigError) as info:
        load_recording(path)
    message = str(info.value)
    assert info.value.parameter == "path" and str(path) in message
    assert "more than the" in message and "available now" in message
    assert f"max_bytes={size}" in message and f"--max-bytes {size}" in message
    assert load_recording(path, max_bytes=size).samples == _run().samples  # the caller's cap replaces the rule


def test_a_callers_cap_refuses_a_larger_file_by_name_and_takes_sizes_as_text(tmp_path: Path) -> None:
    path = _run().to_json(tmp_path / "memory.json")
    size = path.stat().st_size
    with pytest.raises(unimem.ConfigError, match=rf"over max_bytes={size - 1}; pass a larger max_bytes") as info:
        load_recording(path, max_bytes=size - 1)
    assert info.value.parameter == "path"
    assert len(load_recording(path, max_bytes="1MiB").samples) == 200
    assert len(load_recording(path, max_bytes=1 << 60).samples) == 200  # a huge cap reserves no memory
    for bad in (0, -1, "lots", True, 1.5):
        with pytest.raises(unimem.ConfigError) as refused:
            load_recording(path, max_bytes=bad)  # type: ignore[arg-type]
        assert refused.value.parameter == "max_bytes"


def test_the_commands_take_max_bytes_and_name_it_when_it_is_wrong(tmp_path: Path) -> None:
    path = _run().to_json(tmp_path / "memory.json")
    small = str(path.stat().st_size - 1)
    for command in (["plot", "-o", str(tmp_path / "m.png")], ["view", "-o", str(tmp_path / "m.html")]):
        refused = CliRunner().invoke(cli_main, [*command, str(path), "--max-bytes", small])
        assert refused.exit_code != 0 and f"over max_bytes={small}" in refused.output
        wrong = CliRunner().invoke(cli_main, [*command, str(path), "--max-bytes", "lots"])
        assert wrong.exit_code == 2 and "--max-bytes" in wrong.output
    assert not (tmp_path / "m.png").exists() and not (tmp_path / "m.html").exists()
    page = CliRunner().invoke(cli_main, ["view", str(path), "-o", str(tmp_path / "m.html"), "--max-bytes", "1MiB"])
    assert page.exit_code == 0 and (tmp_path / "m.html").is_file()


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_a_mark_label_of_megabytes_loads_back_as_written(tmp_path: Path, suffix: str) -> None:
    long = 'a label, with "quotes", of 5 MB: ' + "x" * (5 << 20)  # a CSV reader refuses cells over 128 KiB
    written = _run(marks=(Mark(START + 0.5, long, 1, None), Mark(START + 1, "short")))
    loaded = load_recording(getattr(written, f"to_{suffix[1:]}")(tmp_path / f"memory{suffix}"))
    assert loaded.marks == written.marks and loaded.samples == written.samples


@pytest.mark.slow  # writes and reads 300 MiB
def test_a_recording_over_256_mib_saved_by_unimem_loads(tmp_path: Path) -> None:
    label = "x" * MIB  # one string shared by every mark: the recording in memory stays small
    written = _run(10_000, tuple(Mark(START + k * 0.01, label) for k in range(300)))
    path = written.to_json(tmp_path / "long.json")
    assert path.stat().st_size > 300 * MIB
    loaded = load_recording(path)
    assert len(loaded.marks) == 300 and loaded.marks[-1] == written.marks[-1]
    assert loaded.samples == written.samples
