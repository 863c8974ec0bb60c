"""Fault injection for ``monitor()`` and recording files, one trial per call.

Kills (``kill -9``, SIGTERM, SIGINT, to the training process alone or to its whole process
group) during a streamed recording; kills during saves; forks while another thread marks; the
sampler after its parent's ``kill -9`` with a forked child alive; hostile recording files.
Each function runs one trial and returns what it saw. tests/observe/test_monitor_faults.py and
test_recording_files.py assert on a few trials; benchmarks/bench_faults.py counts a hundred.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import psutil

import unimem
from unimem.observe.recording import Recording, load_recording
from unimem.observe.samples import SAMPLE_FIELDS, Mark, Sample

INTERVAL = 0.05  # the streamed monitor's interval in the kill trials

# A training process: a streamed monitor with allocator samples (a stand-in reader) and marks.
RECORDER = """
import sys, time
import unimem
import unimem.observe.monitor as monitor_module

calls = [0]

def reader():
    calls[0] += 1
    return calls[0] << 20, calls[0] << 21

monitor_module.counter_reader = lambda name, device: (reader, "")
with unimem.monitor(float(sys.argv[2]), path=sys.argv[1], framework_interval=0.02) as m:
    print("READY", m._link.proc.pid, flush=True)
    step = 0
    while True:
        m.mark(f"step {step}")
        step += 1
        sum(range(5_000))  # a step's work, then a short wait: many trials share the machine's cores
        time.sleep(0.001)
"""

# A training process streaming to a file: it marks, then dies at once (kill -9), as a crashed job does.
CRASHER = """
import os, signal, sys, time
import unimem

with unimem.monitor(0.01, path=sys.argv[1], framework_interval=None) as m:
    for step in range(int(sys.argv[2])):
        m.mark(f"step {step}")
        time.sleep(0.002)
    print("READY", m._link.proc.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""

# Saves one recording over and over to one file (JSON or CSV by its suffix).
SAVER = """
import sys
from unimem.observe.recording import Recording
from unimem.observe.samples import Mark, Sample

samples = [Sample(1.7e9 + i / 100, "device", process_used=i << 10, host_rss=(i % 97) << 20) for i in range(20_000)]
marks = [Mark(1.7e9 + i, f"epoch {i}", i << 20, None) for i in range(50)]
recording = Recording(samples, marks, {"backend": None, "device": 0, "interval": 0.01})
save = recording.to_json if sys.argv[1].endswith(".json") else recording.to_csv
save(sys.argv[1])
print("READY", flush=True)
while True:
    save(sys.argv[1])
"""

# Forks while a thread marks; each child uses its copy of the monitor, then exits.
FORKER = """
import json, os, sys, threading, time
import unimem

forks, limit = int(sys.argv[1]), float(sys.argv[2])
m = unimem.monitor(0.01).start()
done = threading.Event()

def marker():
    while not done.is_set():
        m.mark("busy")

thread = threading.Thread(target=marker)
thread.start()
hangs = 0
for _ in range(forks):
    pid = os.fork()
    if pid == 0:
        try:
            m.mark("child")
            repr(m)
            m.recording
            m.stop()
        finally:
            os._exit(0)
    deadline = time.monotonic() + limit
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            hangs += 1
            break
        time.sleep(0.002)
done.set()
thread.join()
recording = m.stop()
print(json.dumps({"forks": forks, "hangs": hangs, "samples": len(recording.samples)}), flush=True)
"""

# A monitor whose process forks a child that outlives it; "libc" forks without Python's
# at-fork hooks, so the child keeps the pipe to the sampler open.
FORKED_CHILD = """
import ctypes, os, sys, time
import unimem

with unimem.monitor(0.05, path=sys.argv[2]) as m:
    pid = ctypes.PyDLL(None).fork() if sys.argv[1] == "libc" else os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    print("READY", m._link.proc.pid, pid, flush=True)
    time.sleep(60)
"""


def _start(script: str, args: list[str], env: dict[str, str] | None) -> tuple[subprocess.Popen[str], list[str]]:
    """The script in a new session (its own process group), once it printed its READY line."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        _, err = proc.communicate()
        raise RuntimeError(f"the trial's process did not start: {line!r}\n{err[-3000:]}")
    return proc, line.split()[1:]


def _reap(proc: subprocess.Popen[str], limit: float = 30) -> None:
    """Wait for the trial's process (killed if it outlives ``limit``); its pipes are not read to
    their end, which a forked child still holding them would put off."""
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_ended(pid: int, limit: float) -> float | None:
    """Seconds until ``pid`` ended (exited or a zombie), None if it still ran after ``limit``."""
    started = time.monotonic()
    while not _ended(pid):
        if time.monotonic() - started > limit:
            return None
        time.sleep(0.005)
    return time.monotonic() - started


def outcome(path: object) -> tuple[str, str]:
    """How ``load_recording`` answered: ``("ok" | "cut" | "refused" | "raw", detail)``.

    ``cut``: loaded with a ``UnimemWarning``; ``refused``: a ``ConfigError``; ``raw``: anything
    else escaped (a raw traceback a user would see).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            load_recording(path)  # type: ignore[arg-type]
        except unimem.ConfigError as exc:
            return "refused", str(exc)
        except Exception as exc:
            return "raw", f"{type(exc).__name__}: {exc}"
    cuts = [str(w.message) for w in caught if issubclass(w.category, unimem.UnimemWarning)]
    return ("cut", cuts[0]) if cuts else ("ok", "")


def kill_during_recording(
    folder: Path, sig: int, group: bool, delay: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Kill a training process (or its whole group) ``delay`` s into a streamed recording.

    Returns whether a file was left, how it loaded, how old its last sample was at the kill
    (``staleness``, seconds; from the recording's start when it holds none yet) and how long
    the sampler outlived the kill.
    """
    path = folder / f"kill-{os.getpid()}-{time.monotonic_ns()}.jsonl"
    proc, (sampler,) = _start(RECORDER, [str(path), repr(INTERVAL)], env)
    time.sleep(delay)
    killed = time.time()
    if group:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    _reap(proc)
    sampler_ended = _wait_ended(int(sampler), 10)
    result: dict[str, Any] = {"file_left": path.exists(), "sampler_ended_after": sampler_ended}
    if path.exists():
        result["load"], result["detail"] = outcome(path)
        if result["load"] in ("ok", "cut"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                recording = load_recording(path)
            result["samples"] = len(recording.samples)
            # Killed before the first write: the file covers the run up to its start.
            last = recording.samples[-1].time if recording.samples else recording.meta.get("started")
            result["staleness"] = None if last is None else killed - last
        path.unlink()
    return result


def crash_after_marks(path: Path, marks: int, env: dict[str, str] | None = None) -> None:
    """A process streaming to ``path`` marks ``marks`` times and is killed (kill -9); returns once its
    sampler has written what it held and ended."""
    proc, (sampler,) = _start(CRASHER, [str(path), str(marks)], env)
    _reap(proc)
    if _wait_ended(int(sampler), 10) is None:
        raise RuntimeError(f"the sampler (pid {sampler}) outlived its killed process by 10 s")


def saves_killed_mid_write(path: Path, count: int, env: dict[str, str] | None = None) -> None:
    """``count`` processes each saving a recording to ``path`` over and over, each killed (kill -9)
    while a save of its own writes its temporary file."""
    folder = path.parent
    for _ in range(count):
        before = {p.name for p in folder.iterdir()}
        proc, _ = _start(SAVER, [str(path)], env)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            p.name.endswith(".tmp") and p.name not in before for p in os.scandir(folder)
        ):
            pass  # the kill follows the temporary file's creation by a few microseconds
        proc.kill()
        _reap(proc)


def kill_during_save(
    folder: Path, suffix: str, delay: float, env: dict[str, str] | None = None, *, in_write: bool = False
) -> dict[str, Any]:
    """``kill -9`` a process saving one recording over and over to one file, ``delay`` s in; with
    ``in_write``, at the first moment after that when a save is writing its temporary file.

    Returns whether the file left is byte for byte the complete save (``intact``), how it loaded,
    and whether the kill landed mid-save (a temporary file was left beside it).
    """
    trial = folder / f"save-{os.getpid()}-{time.monotonic_ns()}"
    trial.mkdir()
    path = trial / f"memory{suffix}"
    proc, _ = _start(SAVER, [str(path)], env)
    whole = path.read_bytes()  # written before READY: the previous file every later save replaces
    time.sleep(delay)
    deadline = time.monotonic() + 10
    while in_write and time.monotonic() < deadline and not any(p.name.endswith(".tmp") for p in os.scandir(trial)):
        pass  # the kill follows the temporary file's creation by a few microseconds
    proc.kill()
    _reap(proc)
    left = path.read_bytes() if path.exists() else b""
    temporaries = [p for p in trial.iterdir() if p.name.endswith(".tmp")]
    result = {
        "intact": left == whole,
        "load": outcome(path)[0],
        "mid_save": bool(temporaries),
    }
    for item in trial.iterdir():
        item.unlink()
    trial.rmdir()
    return result


def fork_while_marking(forks: int, limit: float = 5.0, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``forks`` forks while another thread marks; a child not done within ``limit`` s is a hang."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FORKER), str(forks), repr(limit)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60 + forks * (limit + 1),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the fork trial failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def sampler_after_parent_kill(folder: Path, kind: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``kill -9`` a monitored process whose forked child lives on (``kind``: ``"os"`` fork, or
    ``"libc"``, a fork that runs no Python at-fork hook); how long its sampler outlives it."""
    path = folder / f"forked-{os.getpid()}-{time.monotonic_ns()}.jsonl"
    proc, (sampler, child) = _start(FORKED_CHILD, [kind, str(path)], env)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    _reap(proc)
    ended = _wait_ended(int(sampler), 10)
    child_alive = not _ended(int(child))
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(child), signal.SIGKILL)
    load = outcome(path)[0] if path.exists() else "no file"
    if path.exists():
        path.unlink()
    return {"sampler_ended_after": ended, "child_alive": child_alive, "load": load}


# --- hostile files ---------------------------------------------------------------------------------


def _valid_files(folder: Path) -> dict[str, bytes]:
    """A whole JSON, CSV and stream recording, as bytes."""
    samples = [Sample(1.7e9 + i, "device", process_used=i << 20, host_rss=5 << 20) for i in range(20)]
    samples += [Sample(1.7e9 + i + 0.5, "framework", allocated=i << 10, reserved=i << 11) for i in range(20)]
    samples.sort(key=lambda s: s.time)
    recording = Recording(samples, [Mark(1.7e9 + 3, "epoch 1", 1 << 20, None)], {"backend": None, "device": 0})
    out = {
        ".json": recording.to_json(folder / "valid.json").read_bytes(),
        ".csv": recording.to_csv(folder / "valid.csv").read_bytes(),
    }
    header = {"format": "unimem.recording-stream/1", "meta": {"backend": None, "device": 0, "started": 1.7e9}}
    lines = [json.dumps(header)]
    lines += [json.dumps(["d", 1.7e9 + i, None, None, i << 20, 5 << 20, None]) for i in range(20)]
    lines += [json.dumps(["m", 1.7e9 + 3, "epoch 1", 1 << 20, None])]
    lines += [json.dumps({"end": {"samples": 20, "marks": 1, "meta": {"stopped": 1.7e9 + 20}}})]
    out[".jsonl"] = ("\n".join(lines) + "\n").encode()
    return out


def _json_doc(**changes: Any) -> bytes:
    doc: dict[str, Any] = {
        "format": "unimem.recording/1",
        "meta": {"backend": None},
        "samples": [{"time": 1.0, "source": "device", "host_rss": 1 << 20}],
        "marks": [{"time": 1.0, "label": "a"}],
    }
    doc.update(changes)
    return json.dumps(doc).encode()


def _sample(**changes: Any) -> bytes:
    return _json_doc(samples=[{"time": 1.0, "source": "device", "host_rss": 1 << 20, **changes}])


def rows_json(recording: Recording) -> bytes:
    """``recording`` in the JSON ``to_json`` wrote before columns: one object per sample or mark, one a line."""
    samples = ",\n".join(json.dumps({name: getattr(s, name) for name in SAMPLE_FIELDS}) for s in recording.samples)
    marks = ",\n".join(json.dumps(dataclasses.asdict(m)) for m in recording.marks)
    count = json.dumps({"samples": len(recording.samples), "marks": len(recording.marks)})
    return (
        f'{{"format": "unimem.recording/1",\n"count": {count},\n"meta": {json.dumps(recording.meta)},\n'
        f'"samples": [\n{samples}\n],\n"marks": [\n{marks}\n]}}\n'
    ).encode()


def _columns(samples: Any, marks: Any = None) -> bytes:
    """A columnar JSON (``to_json``'s) holding these blocks of samples and of marks."""
    doc = {"format": "unimem.recording/3", "meta": {"backend": None}, "marks": marks or [], "samples": samples}
    return json.dumps(doc).encode()


def _csv(header: str, *rows: str) -> bytes:
    first = f'# unimem.recording/2 {{"rows": {len(rows)}, "meta": {{}}}}\n'
    return (first + header + "\r\n" + "".join(row + "\r\n" for row in rows)).encode()


_COLUMNS = ",".join(
    ["time", "elapsed", "source", "allocated", "reserved", "peak", "peak_exact", "process_used", "device_used"]
    + ["device_total", "host_rss", "host_peak", "step", "error", "label"]
)
_EMPTY = "," * 12  # the 12 cells after time, elapsed and source


def _stream(*lines: str, end: bool = True) -> bytes:
    header = json.dumps({"format": "unimem.recording-stream/1", "meta": {"backend": None}})
    body = [header, *lines]
    if end:
        body.append(json.dumps({"end": {"samples": len(lines), "marks": 0, "meta": {}}}))
    return ("\n".join(body) + "\n").encode()


def _doubled_block(data: bytes) -> bytes:
    """A columnar JSON whose last block of samples is written twice (a line doubled)."""
    block = data.split(b"\n")[-3]
    return data.replace(block + b"\n]}", block + b",\n" + block + b"\n]}")


def hostile_contents(folder: Path) -> dict[str, tuple[str, bytes]]:
    """``name -> (suffix, bytes)`` of files no loader may answer with a raw traceback.

    Each is malformed (a ``ConfigError`` is due) except those named ``cut ...`` (a file cut
    short: it loads with a ``UnimemWarning``).
    """
    valid = _valid_files(folder)
    deep = b"[" * 100_000 + b"]" * 100_000
    big = "9" * 5000
    files: dict[str, tuple[str, bytes]] = {
        "empty": (".json", b""),
        "whitespace": (".json", b" \n\t "),
        "binary junk": (".json", bytes(range(256)) * 8),
        "not UTF-8": (".json", '{"format": "unimem.recording/1", "x": "é"}'.encode("latin-1")),
        "UTF-16": (".json", _json_doc().decode().encode("utf-16")),
        "a list": (".json", b"[]"),
        "a string": (".json", b'"recording"'),
        "null": (".json", b"null"),
        "no format": (".json", b'{"samples": []}'),
        "another format": (".json", _json_doc(format="other/1")),
        "deeply nested": (".json", deep),
        "deeply nested member": (".json", b'{"format": "unimem.recording/1", "meta": ' + deep + b"}"),
        "5000-digit integer": (
            ".json",
            _sample(host_rss=None).replace(b'"host_rss": null', f'"host_rss": {big}'.encode()),
        ),
        "huge integer": (".json", _sample(host_rss=10**30)),
        "negative bytes": (".json", _sample(allocated=-1)),
        "fractional bytes": (".json", _sample(allocated=1.5)),
        "bytes as text": (".json", _sample(allocated="1GiB")),
        "bytes as boolean": (".json", _sample(allocated=True)),
        "NaN time": (".json", _sample().replace(b'"time": 1.0', b'"time": NaN')),
        "Infinity bytes": (".json", _sample().replace(b'"host_rss": 1048576', b'"host_rss": Infinity')),
        "1e999 time": (".json", _sample().replace(b'"time": 1.0', b'"time": 1e999')),
        "time as text": (".json", _sample(time="noon")),
        "no time": (".json", _json_doc(samples=[{"source": "device"}])),
        "unknown source": (".json", _sample(source="gpu")),
        "source a list": (".json", _sample(source=["device"])),
        "error a number": (".json", _sample(error=3)),
        "peak_exact a text": (".json", _sample(peak_exact="yes")),
        "samples an object": (".json", _json_doc(samples={"0": {}})),
        "a sample a number": (".json", _json_doc(samples=[7])),
        "marks a text": (".json", _json_doc(marks="none")),
        "label a number": (".json", _json_doc(marks=[{"time": 1.0, "label": 7}])),
        "meta a list": (".json", _json_doc(meta=[])),
        "meta limit a text": (".json", _json_doc(meta={"limit": "8GiB"})),
        "meta limit huge": (".json", _json_doc(meta={"limit": 10**40})),
        "meta started NaN": (".json", _json_doc(meta={"started": 1}).replace(b'"started": 1', b'"started": NaN')),
        "meta notes a text": (".json", _json_doc(meta={"notes": "n"})),
        "count disagrees": (".json", _json_doc(count={"samples": 5, "marks": 1})),
        "broken mid-file": (".json", valid[".json"].replace(b"\n{", b"\n{{", 1)),
        "extra data": (".json", valid[".json"] + b"{}"),
        "cut JSON": (".json", valid[".json"][: len(valid[".json"]) // 2]),
        "columns of unequal length": (".json", _columns([{"time": [1.0, 2.0], "source": ["device"]}])),
        "a column not an array": (".json", _columns([{"time": 1.0, "source": "device"}])),
        "a column null": (".json", _columns([{"time": [1.0], "source": ["device"], "allocated": None}])),
        "a block not an object": (".json", _columns([[1.0, "device"]])),
        "blocks an object": (".json", _columns({"time": [1.0], "source": ["device"]})),
        "bytes as text in a column": (
            ".json",
            _columns([{"time": [1.0, 2.0], "source": ["device"] * 2, "allocated": [1, "1GiB"]}]),
        ),
        "time as text in a column": (".json", _columns([{"time": ["noon"], "source": ["device"]}])),
        "no time column": (".json", _columns([{"source": ["device"]}])),
        "a mark's label a number in a column": (".json", _columns([], [{"time": [1.0], "label": [7]}])),
        "columnar count disagrees": (
            ".json",
            valid[".json"].replace(b'"samples": 40', b'"samples": 41'),
        ),
        "a block doubled": (".json", _doubled_block(valid[".json"])),
        "cut JSON at a block's end": (
            ".json",
            valid[".json"][: valid[".json"].index(b"\n", valid[".json"].index(b'"samples": [')) + 1],
        ),
        "CSV empty": (".csv", b""),
        "CSV binary": (".csv", random.Random(1).randbytes(4096)),
        "CSV not UTF-8": (".csv", _csv(_COLUMNS, "1.0,0,device" + _EMPTY).replace(b"device", b"d\xe9vice")),
        "CSV no columns": (".csv", _csv("a,b,c", "1,2,3")),
        "CSV time a text": (".csv", _csv(_COLUMNS, "noon,0,device" + _EMPTY)),
        "CSV time nan": (".csv", _csv(_COLUMNS, "nan,0,device" + _EMPTY)),
        "CSV time inf": (".csv", _csv(_COLUMNS, "inf,0,device" + _EMPTY)),
        "CSV negative bytes": (".csv", _csv(_COLUMNS, "1.0,0,device,-5" + _EMPTY[1:])),
        "CSV bytes in e-notation": (".csv", _csv(_COLUMNS, "1.0,0,device,1e9" + _EMPTY[1:])),
        "CSV 5000-digit integer": (".csv", _csv(_COLUMNS, f"1.0,0,device,{big}" + _EMPTY[1:])),
        "CSV extra fields": (".csv", _csv(_COLUMNS, "1.0,0,device" + _EMPTY + ",x,y")),
        "CSV missing fields": (".csv", _csv(_COLUMNS, "1.0,0,device", "2.0,0,device" + _EMPTY)),
        "CSV unknown source": (".csv", _csv(_COLUMNS, "1.0,0,gpu" + _EMPTY)),
        "CSV peak_exact maybe": (".csv", _csv(_COLUMNS, "1.0,0,device,,,,maybe" + _EMPTY[4:])),
        "CSV NUL bytes": (".csv", _csv(_COLUMNS, "1.0,0,dev\x00ice" + _EMPTY)),
        "CSV header not JSON": (".csv", b"# unimem.recording/2 {rows: 1}\n" + _COLUMNS.encode() + b"\r\n"),
        "CSV header a list": (".csv", b"# unimem.recording/2 []\n" + _COLUMNS.encode() + b"\r\n"),
        "CSV row count a text": (".csv", b'# unimem.recording/2 {"rows": "many"}\n' + _COLUMNS.encode() + b"\r\n"),
        "CSV more rows than counted": (
            ".csv",
            _csv(_COLUMNS, "1.0,0,device" + _EMPTY).replace(b'"rows": 1', b'"rows": 0'),
        ),
        "CSV meta limit a text": (".csv", _csv(_COLUMNS).replace(b'"meta": {}', b'"meta": {"limit": "x"}')),
        "cut CSV at a row's end": (".csv", valid[".csv"][: valid[".csv"].index(b"\r\n", 400) + 2]),
        "cut CSV mid-row": (".csv", valid[".csv"][:-30]),
        "stream no header": (".jsonl", b'["d", 1.0, null, null, null, 1, null]\n'),
        "stream header not JSON": (".jsonl", b"{format\n"),
        "stream header cut": (".jsonl", b'{"format": "unimem.recording-stream/1", "me'),
        "stream another format": (".jsonl", b'{"format": "x", "meta": {}}\n'),
        "stream line not JSON": (".jsonl", _stream("[1, 2", '["d", 1.0, null, null, null, 1, null]')),
        "stream unknown record": (".jsonl", _stream('["x", 1.0]')),
        "stream wrong arity": (".jsonl", _stream('["d", 1.0, null]')),
        "stream NaN time": (".jsonl", _stream('["d", NaN, null, null, null, 1, null]')),
        "stream negative bytes": (".jsonl", _stream('["f", 1.0, -1, null, null]')),
        "stream label a number": (".jsonl", _stream('["m", 1.0, 5, null, null]')),
        "stream deeply nested": (".jsonl", _stream(deep.decode())),
        "stream line over 1 MiB": (".jsonl", _stream('["m", 1.0, "' + "x" * (1 << 20) + '", null, null]')),
        "stream after the end": (
            ".jsonl",
            _stream('["d", 1.0, null, null, null, 1, null]') + b'["d", 2.0, null, null, null, 1, null]\n',
        ),
        "stream end counts disagree": (".jsonl", valid[".jsonl"].replace(b'"samples": 20', b'"samples": 21')),
        "stream end not an object": (
            ".jsonl",
            _stream('["d", 1.0, null, null, null, 1, null]', end=False) + b'{"end": 5}\n',
        ),
        "cut stream": (".jsonl", valid[".jsonl"][: valid[".jsonl"].index(b"\n", 300) + 1]),
        "cut stream mid-line": (".jsonl", valid[".jsonl"][:-40]),
    }
    return files


def hostile_paths(folder: Path) -> dict[str, tuple[Path | object, str]]:
    """``name -> (path, due)``: every hostile file written under ``folder``, and paths that are no
    regular file; ``due`` is ``"cut"`` (a warning) or ``"refused"`` (a ``ConfigError``)."""
    paths: dict[str, tuple[Path | object, str]] = {}
    for number, (name, (suffix, data)) in enumerate(hostile_contents(folder).items()):
        path = folder / f"hostile-{number}{suffix}"
        path.write_bytes(data)
        paths[name] = (path, "cut" if name.startswith("cut ") else "refused")
    fifo = folder / "fifo.json"
    os.mkfifo(fifo)
    links = {"link to /dev/zero": "/dev/zero", "link to /dev/null": "/dev/null", "link to nothing": "nowhere"}
    for name, target in links.items():
        link = folder / f"{name.replace(' ', '-').replace('/', '')}.json"
        link.symlink_to(target)
        paths[name] = (link, "refused")
    loop = folder / "loop.json"
    loop.symlink_to(loop)
    (folder / "folder.json").mkdir()
    over = folder / "over-the-limit.json"
    with over.open("wb") as handle:
        handle.truncate(1 << 40)  # sparse: no disk used; read whole, more than any machine here has
    paths |= {
        "FIFO": (fifo, "refused"),
        "link to itself": (loop, "refused"),
        "directory": (folder / "folder.json", "refused"),
        "too large for memory": (over, "refused"),
        "missing": (folder / "missing.json", "refused"),
        "not a path": (5, "refused"),
        "empty path": ("", "refused"),
    }
    if os.geteuid() != 0:  # root reads any file
        unreadable = folder / "unreadable.json"
        unreadable.write_bytes(_json_doc())
        unreadable.chmod(0)
        paths["unreadable"] = (unreadable, "refused")
    return paths


def mutate(data: bytes, rng: random.Random) -> bytes:
    """``data`` damaged one random way: cut, bytes flipped, junk inserted, a line dropped or doubled."""
    how = rng.choice(("cut", "flip", "insert", "drop line", "double line"))
    if how == "cut":
        return data[: rng.randrange(len(data))]
    if how == "flip":
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        return bytes(damaged)
    if how == "insert":
        at = rng.randrange(len(data))
        return data[:at] + rng.randbytes(rng.randint(1, 64)) + data[at:]
    lines = data.splitlines(keepends=True)
    at = rng.randrange(len(lines))
    return b"".join(lines[:at] + lines[at + 1 :] if how == "drop line" else lines[: at + 1] + lines[at:])


def mutated_outcomes(folder: Path, count: int, seed: int) -> list[tuple[str, str, str]]:
    """``(suffix, outcome, detail)`` for ``count`` randomly damaged copies of each format's whole file."""
    rng = random.Random(seed)
    out = []
    for suffix, data in _valid_files(folder).items():
        for number in range(count):
            path = folder / f"mutated-{number}{suffix}"
            path.write_bytes(mutate(data, rng))
            out.append((suffix, *outcome(path)))
            path.unlink()
    return out
