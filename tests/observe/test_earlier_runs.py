"""A file of an earlier run is never destroyed: a monitor started on the path of an earlier recording
(a crashed job restarted) keeps it aside and says where; the temporary files killed saves leave are
removed by the next save, and nothing else is."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from conftest import subprocess_env
from fault_trials import crash_after_marks, saves_killed_mid_write

import unimem
from unimem.observe import files
from unimem.observe.recording import Recording, load_recording
from unimem.observe.samples import Sample


def _quietly(path: Path) -> Recording:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a crashed run's file may lack its end record
        return load_recording(path)


def _restart(path: Path) -> tuple[unimem.Monitor, str]:
    """A new monitor started on ``path``, and the warning it gave."""
    m = unimem.monitor(0.01, path=path, framework_interval=None)
    with pytest.warns(unimem.UnimemWarning, match="held an earlier recording") as caught:
        m.start()
    return m, str(caught[0].message)


@pytest.mark.slow  # a crashed process and its sampler, then a second monitor
def test_a_job_restarted_on_its_crashed_runs_path_keeps_every_sample_of_that_run(tmp_path: Path) -> None:
    path = tmp_path / "memory.jsonl"
    crash_after_marks(path, 166, subprocess_env())
    crashed = _quietly(path)
    assert len(crashed.marks) == 166
    m, said = _restart(path)
    try:
        kept = tmp_path / "memory.1.jsonl"
        assert f"kept as {kept}" in said and f"streams to {path}" in said
        time.sleep(0.2)  # a fifth of a second into the new run
        again = _quietly(kept)
        assert again.marks == crashed.marks and again.samples == crashed.samples
        m.mark("restarted")
    finally:
        m.stop()
    run = load_recording(path)
    assert [mark.label for mark in run.marks] == ["restarted"]
    assert any(f"kept as {kept}" in note for note in run.notes)


def test_each_restart_keeps_the_run_before_it_under_the_next_free_number(tmp_path: Path) -> None:
    path = tmp_path / "memory.rank0.jsonl"  # unimem.rank_path's name: the rank stays last
    with unimem.monitor(0.05, path=path, framework_interval=None) as m:
        m.mark("first")
    (tmp_path / "memory.1.rank0.jsonl").write_text("someone's file\n", encoding="utf-8")  # taken: skipped
    m, said = _restart(path)
    m.mark("second")
    m.stop()
    assert "kept as " + str(tmp_path / "memory.2.rank0.jsonl") in said
    assert [k.label for k in load_recording(tmp_path / "memory.2.rank0.jsonl").marks] == ["first"]
    assert (tmp_path / "memory.1.rank0.jsonl").read_text(encoding="utf-8") == "someone's file\n"
    assert [k.label for k in load_recording(path).marks] == ["second"]


def test_an_empty_file_is_replaced_without_a_word_and_one_that_cannot_be_moved_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "memory.jsonl"
    path.touch()  # nothing to keep
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        unimem.monitor(0.05, path=path, framework_interval=None).start().stop()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.jsonl"]
    before = path.read_bytes()

    def refused(*args: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(files.os, "link", refused)
    monkeypatch.setattr(files.os, "rename", refused)
    with pytest.raises(unimem.ConfigError, match="cannot be kept aside .Permission denied.; move it") as info:
        unimem.monitor(0.05, path=path, framework_interval=None).start()
    assert info.value.parameter == "path"
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["memory.jsonl"]


# --- temporary files of killed saves ---------------------------------------------------------------


def _recording() -> Recording:
    return Recording([Sample(1.7e9 + i, "device", host_rss=i << 20) for i in range(10)], [], {})


def _reaped() -> int:
    """The pid of a process of this host that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_save_removes_the_temporaries_of_dead_writers_and_keeps_the_rest(tmp_path: Path) -> None:
    target = tmp_path / "memory.json"
    host = files._host()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = f".memory.json.{host}-{_reaped()}-0123abcd.tmp"
        live = f".memory.json.{host}-{sleeper.pid}-0123abcd.tmp"
        elsewhere = f".memory.json.{'0' * 6 if host != '0' * 6 else '1' * 6}-{_reaped()}-0123abcd.tmp"
        earlier_old, earlier_new = ".memory.json.0a1b2c3d.tmp", ".memory.json.4e5f6a7b.tmp"
        theirs = [".memory.json.notes.tmp", ".other.json.0a1b2c3d.tmp"]
        for name in (dead, live, elsewhere, earlier_old, earlier_new, *theirs):
            (tmp_path / name).write_bytes(b"{")
        hour_ago = time.time() - 2 * 3600
        os.utime(tmp_path / earlier_old, (hour_ago, hour_ago))
        _recording().to_json(target)
        left = sorted(p.name for p in tmp_path.iterdir())
    finally:
        sleeper.kill()
        sleeper.wait()
    assert left == sorted([live, elsewhere, earlier_new, *theirs, "memory.json"])
    assert len(load_recording(target).samples) == 10


@pytest.mark.slow  # three processes killed while they save
def test_temporaries_of_saves_killed_mid_write_do_not_pile_up(tmp_path: Path) -> None:
    target = tmp_path / "memory.json"
    saves_killed_mid_write(target, 3, subprocess_env())
    _recording().to_json(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.json"]
    assert len(load_recording(target).samples) == 10
