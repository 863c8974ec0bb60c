"""The GPU suite's evidence: its two halves split every test file, and are joined only as one run.

The whole suite takes longer than one call on the GPU machine may run, so it runs in two halves
(``tests/gpu/run_suite.py --part``) joined into ``evidence/gpu.json`` (``--merge``), with a later run
of tests that failed in their place (``--rerun``). Joining refuses what is not one run's evidence.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("run_suite", ROOT / "tests" / "gpu" / "run_suite.py")
assert SPEC is not None and SPEC.loader is not None
run_suite = importlib.util.module_from_spec(SPEC)
sys.modules["run_suite"] = run_suite
SPEC.loader.exec_module(run_suite)

RUN = {
    "machine": "gpu box",
    "gpu": "NVIDIA H200",
    "driver": "580",
    "cuda": "13.0",
    "python": "3.12.3",
    "versions": {"jax": "0.11.2"},
    "date": "2026-12-04",
}


def _half(path: Path, command: str, outcomes: dict[str, str], **changes: Any) -> Path:
    tests = [
        {"nodeid": n, "outcome": o, "covers": [], "figures": {}, "message": "", "seconds": 1.0}
        for n, o in outcomes.items()
    ]
    path.write_text(json.dumps({**RUN, **changes, "command": command, "tests": tests}))
    return path


def test_the_halves_hold_every_test_file_once() -> None:
    files = [name for part in run_suite.PARTS for name in run_suite.PARTS[part]]
    assert sorted(files) == sorted(path.name for path in (ROOT / "tests" / "gpu").glob("test_*.py"))
    assert len(files) == len(set(files))
    with pytest.raises(SystemExit, match="--part"):
        run_suite.part_files(3)


def test_halves_of_one_run_join_and_a_rerun_replaces_what_failed(tmp_path: Path) -> None:
    one = _half(tmp_path / "1.json", "part 1", {"a::x": "passed", "a::y": "failed"})
    two = _half(tmp_path / "2.json", "part 2", {"b::z": "passed"})
    again = _half(tmp_path / "3.json", "again", {"a::y": "passed"})
    out = tmp_path / "gpu.json"
    assert run_suite.main(["--merge", str(one), str(two), "--out", str(out)]) == 1  # a test failed
    assert run_suite.main(["--merge", str(one), str(two), "--rerun", str(again), "--out", str(out)]) == 0
    joined = json.loads(out.read_text())
    assert [(t["nodeid"], t["outcome"], t.get("rerun", False)) for t in joined["tests"]] == [
        ("a::x", "passed", False),
        ("a::y", "passed", True),
        ("b::z", "passed", False),
    ]
    assert joined["command"] == "part 1 && part 2 && (rerun) again"
    assert {key: joined[key] for key in RUN} == RUN


def test_what_is_not_one_run_is_refused(tmp_path: Path) -> None:
    one = _half(tmp_path / "1.json", "part 1", {"a::x": "passed", "a::y": "failed"})
    other_day = _half(tmp_path / "2.json", "part 2", {"b::z": "passed"}, date="2026-12-05")
    twice = _half(tmp_path / "3.json", "part 2", {"a::x": "passed"})
    passed_again = _half(tmp_path / "4.json", "again", {"a::x": "passed"})
    unknown = _half(tmp_path / "5.json", "again", {"c::w": "passed"})
    two = _half(tmp_path / "6.json", "part 2", {"b::z": "passed"})
    out = tmp_path / "gpu.json"
    with pytest.raises(SystemExit, match="date differ"):
        run_suite.main(["--merge", str(one), str(other_day), "--out", str(out)])
    with pytest.raises(SystemExit, match="more than one half: a::x"):
        run_suite.main(["--merge", str(one), str(twice), "--out", str(out)])
    with pytest.raises(SystemExit, match="did not fail"):
        run_suite.main(["--merge", str(one), str(two), "--rerun", str(passed_again), "--out", str(out)])
    with pytest.raises(SystemExit, match="in neither half"):
        run_suite.main(["--merge", str(one), str(two), "--rerun", str(unknown), "--out", str(out)])
    assert not out.exists()  # nothing written for what was refused
