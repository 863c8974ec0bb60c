"""monitor() under faults: kills during a streamed recording and during saves, forks while
marking, the sampler after its parent's kill -9 with a forked child alive.

A few trials of each (the trials: fault_trials.py); benchmarks/bench_faults.py runs a hundred
of each and docs/measurements.md has the counts. Kill moments are random but seeded.
"""

from __future__ import annotations

import random
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import run_json, subprocess_env
from fault_trials import (
    INTERVAL,
    fork_while_marking,
    kill_during_recording,
    kill_during_save,
    sampler_after_parent_kill,
)

SIGNALS = {"kill -9": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}


@pytest.mark.slow
@pytest.mark.parametrize("target", ["process", "group"])
@pytest.mark.parametrize("name", list(SIGNALS))
def test_a_kill_during_a_streamed_recording_leaves_a_file_that_loads_up_to_the_kill(
    tmp_path: Path, name: str, target: str
) -> None:
    rng = random.Random(f"{name} {target}")
    for _ in range(2):
        seen = kill_during_recording(
            tmp_path, SIGNALS[name], target == "group", rng.uniform(0.05, 1.2), subprocess_env()
        )
        assert seen["file_left"] and seen["load"] in ("ok", "cut"), seen
        assert seen["staleness"] is not None and seen["staleness"] <= 1.0 + INTERVAL, seen
        assert seen["sampler_ended_after"] is not None and seen["sampler_ended_after"] < 2.0, seen
        if target == "process":  # the sampler outlived it and wrote the end record: a whole file
            assert seen["load"] == "ok", seen


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_a_kill_during_a_save_leaves_the_previous_file_whole(tmp_path: Path, suffix: str) -> None:
    rng = random.Random(suffix)
    for in_write in (False, True, True):  # at a random moment, then while the new file is being written
        seen = kill_during_save(tmp_path, suffix, rng.uniform(0.0, 0.6), subprocess_env(), in_write=in_write)
        assert seen["intact"] and seen["load"] == "ok", seen


def test_forks_while_another_thread_marks_never_hang() -> None:
    seen = fork_while_marking(10, limit=5.0, env=subprocess_env())
    assert seen == {"forks": 10, "hangs": 0, "samples": seen["samples"]}
    assert seen["samples"] > 0  # the parent's monitor went on after its children used their copies


@pytest.mark.parametrize("kind", ["os", "libc"])
def test_the_sampler_ends_within_2_s_of_its_parents_kill_with_a_forked_child_alive(tmp_path: Path, kind: str) -> None:
    """``os``: the child closed its copy of the sampler's pipe at the fork. ``libc``: a fork that runs
    no Python hook, so the child keeps the pipe open: only the sampler watching its parent ends it."""
    seen = sampler_after_parent_kill(tmp_path, kind, subprocess_env())
    assert seen["child_alive"], seen
    assert seen["sampler_ended_after"] is not None and seen["sampler_ended_after"] < 2.0, seen
    assert seen["load"] == "ok", seen  # the sampler wrote the end record for its dead parent


def test_without_a_pidfd_the_sampler_sees_its_parent_gone_within_a_second() -> None:
    """The fallback where the kernel has no pidfds: ``os.getppid()`` checked every PARENT_CHECK s."""
    result: dict[str, Any] = run_json(
        textwrap.dedent(
            """
            import os, time
            from unimem.observe.sampler import PARENT_CHECK, ParentWatch

            read, write = os.pipe()
            parent = os.fork()
            if parent == 0:  # the monitored process: starts the sampler, then dies
                if os.fork() == 0:  # the sampler
                    watch = ParentWatch(os.getppid(), use_pidfd=False)
                    assert watch.fd is None and watch.alive()
                    died = float(os.read(read, 64))
                    while watch.alive():
                        time.sleep(max(0.0, watch.deadline() - time.monotonic()))
                    os.write(write, repr(time.monotonic() - died).encode())
                    os._exit(0)
                time.sleep(0.3)
                os.write(write, repr(time.monotonic()).encode())
                os._exit(0)
            os.waitpid(parent, 0)
            time.sleep(0.05)
            emit({"noticed_after": float(os.read(read, 64)), "check": PARENT_CHECK})
            """
        ),
        timeout=60,
    )
    assert result["check"] <= 1.0
    assert 0 <= result["noticed_after"] <= result["check"] + 0.5, result


def test_a_hangup_the_training_process_ignores_leaves_the_stream_going(tmp_path: Path) -> None:
    """Under ``nohup`` (SIGHUP ignored) a terminal's hangup must not end the sampler's file early."""
    path = tmp_path / "memory.jsonl"
    seen = run_json(
        textwrap.dedent(
            f"""
            import os, signal, time, warnings
            import unimem

            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
            with unimem.monitor(0.05, path={str(path)!r}) as m:
                os.kill(m._link.proc.pid, signal.SIGHUP)
                time.sleep(0.5)
                m.mark("after the hangup")
                alive = m._link.proc.poll() is None
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                recording = unimem.load_recording({str(path)!r})
            emit({{"alive": alive, "marks": [mark.label for mark in recording.marks], "notes": recording.notes,
                   "warnings": [str(w.message) for w in caught]}})
            """
        ),
        timeout=60,
    )
    assert seen["alive"] and seen["marks"] == ["after the hangup"] and seen["warnings"] == [], seen
    assert not any("signal" in note for note in seen["notes"]), seen
