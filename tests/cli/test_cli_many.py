"""Many GPUs and many ranks from the command line: ``unimem watch`` over every GPU of a node
(NVML faked at the gate: two GPUs, three processes, one GPU holding memory no listed process
accounts for) and ``unimem plot`` of one recording per rank on one wall-clock axis.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.cli.cli_process import run_cli
from tests.conftest import subprocess_env
from unimem.observe.recording import Recording
from unimem.observe.samples import Mark, Sample

GIB = 1 << 30
MIB = 1 << 20

# The gate's public functions replaced in a fresh interpreter, then the CLI run there. GPU 0:
# this process (3 GiB) and 4242 (2 GiB) of the 5.25 GiB in use; GPU 1: 777 (1 GiB) of 7 GiB in
# use: 6 GiB held by processes NVML does not list. 4242 and 777 do not exist here: no name.
_FAKE_GATE = """
import os, sys
from unimem.backends import nvml_gate as gate

GIB = 1 << 30
PROCS = {0: [(os.getpid(), 3 * GIB), (4242, 2 * GIB)], 1: [(777, 1 * GIB)]}
USED = {0: 5 * GIB + 256 * 2**20, 1: 7 * GIB}

def device_usage(index):
    row = {"index": index, "name": f"Fake GPU {index}", "total": 80 * GIB, "used": USED[index],
           "free": 80 * GIB - USED[index], "error": None}
    return row, list(PROCS[index])

gate.nvml_status = lambda: "ok"
gate.device_count = lambda: 2
gate.device_usage = device_usage

from unimem.cli.main import main
main(sys.argv[1:], prog_name="unimem")
"""


def _watch_with_fake_gpus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _FAKE_GATE, "watch", *args],
        capture_output=True,
        text=True,
        env=subprocess_env({"COLUMNS": "80"}),
        timeout=120,
    )


def test_watch_json_lists_every_gpu_its_processes_and_what_nvml_cannot_see() -> None:
    proc = _watch_with_fake_gpus("--json", "--count", "2", "--interval", "0.05")
    assert proc.returncode == 0, proc.stderr
    frames = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(frames) == 2  # one JSON line per frame
    frame = frames[-1]
    assert frame["nvml"] == "ok"
    assert [row["index"] for row in frame["devices"]] == [0, 1]
    assert {(p["device"], p["pid"], p["used"]) for p in frame["processes"]} == {
        (0, frame["processes"][0]["pid"], 3 * GIB),
        (0, 4242, 2 * GIB),
        (1, 777, 1 * GIB),
    }
    names = {p["pid"]: p["name"] for p in frame["processes"]}
    assert names[4242] == "?" and names[777] == "?"  # no such process here: its name cannot be read
    assert "python" in names[frame["processes"][0]["pid"]].lower()
    first, second = frame["devices"]
    assert (first["attributed"], first["unattributed"], first["cannot_see"]) == (5 * GIB, 256 * MIB, False)
    assert (second["attributed"], second["unattributed"], second["cannot_see"]) == (1 * GIB, 6 * GIB, True)


def test_watch_tables_in_a_pipe_show_cannot_see_on_the_gpu_that_holds_it() -> None:
    proc = _watch_with_fake_gpus("--once")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    unseen = [line for line in lines if "cannot see" in line]
    assert len(unseen) == 1, proc.stdout
    cells = [cell.strip() for cell in unseen[0].strip("│ ").split("│")]
    assert cells[0] == "1" and cells[-1] == "6.00 GiB", unseen[0]  # on GPU 1, whole on one line
    assert any("4242" in line and "2.00 GiB" in line for line in lines), proc.stdout
    assert any("777" in line and "1.00 GiB" in line for line in lines), proc.stdout
    assert "Fake GPU 0" in proc.stdout and "Fake GPU 1" in proc.stdout


def test_watch_device_option_keeps_the_chosen_gpus_and_refuses_missing_ones() -> None:
    only = json.loads(_watch_with_fake_gpus("--json", "--once", "--device", "1").stdout)
    assert [row["index"] for row in only["devices"]] == [1]
    assert {p["device"] for p in only["processes"]} == {1}
    both = json.loads(_watch_with_fake_gpus("--json", "--once", "-d", "1", "-d", "0,1").stdout)
    assert [row["index"] for row in both["devices"]] == [1, 0]
    missing = _watch_with_fake_gpus("--once", "--device", "0,5")
    assert missing.returncode == 2
    assert "'--device'" in missing.stderr and "no GPU 5 on this node" in missing.stderr, missing.stderr
    garbled = _watch_with_fake_gpus("--once", "--device", "first")
    assert garbled.returncode == 2 and "'--device'" in garbled.stderr and "0,1" in garbled.stderr


def test_watch_unseen_threshold_is_an_option() -> None:
    lower = json.loads(_watch_with_fake_gpus("--json", "--once", "--unseen-above", "128MiB").stdout)
    assert [row["cannot_see"] for row in lower["devices"]] == [True, True]
    bad = _watch_with_fake_gpus("--once", "--unseen-above", "lots")
    assert bad.returncode == 2 and "'--unseen-above'" in bad.stderr and "8GiB" in bad.stderr


def test_watch_device_option_without_nvml_says_why_no_gpu_is_shown() -> None:
    proc = run_cli("watch", "--once", "--device", "0")
    assert proc.returncode == 0, proc.stderr
    assert "NVML: " in proc.stdout and "No GPU figures here: showing host memory." in proc.stdout


# --- one recording per rank ------------------------------------------------------------------

_RANK_MONITOR = """
import os, time, unimem
with unimem.monitor(0.02) as m:
    held = bytearray((int(os.environ["RANK"]) + 1) * 32 * 2**20)  # resident: (rank + 1) x 32 MiB
    time.sleep(0.3)
    m.mark("step")
    time.sleep(0.2)
print(m.to_json(unimem.rank_path(os.environ["TARGET"])))
"""


@pytest.fixture(scope="module")
def rank_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two ranks of a torchrun-like job, each monitored and saved to its own file, started together."""
    folder = tmp_path_factory.mktemp("ranks")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_RANK_MONITOR)],
            env=subprocess_env(
                {
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": "2",
                    "LOCAL_WORLD_SIZE": "2",
                    "TARGET": str(folder / "memory.json"),
                }
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
    return [folder / "memory.rank0.json", folder / "memory.rank1.json"]


@pytest.mark.slow
def test_plot_of_two_ranks_writes_one_png_naming_both(rank_files: list[Path], tmp_path: Path) -> None:
    target = tmp_path / "all.png"
    proc = run_cli("plot", *map(str, rank_files), "-o", str(target), "--json")
    assert proc.returncode == 0, proc.stderr
    done = json.loads(proc.stdout)
    assert [(line["label"], line["rank"], line["file"]) for line in done["lines"]] == [
        ("rank 0", 0, "memory.rank0.json"),
        ("rank 1", 1, "memory.rank1.json"),
    ]
    assert done["figure"] == "host_rss" and all(line["samples"] > 5 for line in done["lines"])
    assert done["notes"] == []
    assert target.stat().st_size > 10_000 and target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = run_cli("plot", *map(str, rank_files), "-o", str(target))
    assert text.returncode == 0 and "rank 0 (memory.rank0.json" in text.stdout and "rank 1 (" in text.stdout


@pytest.mark.slow
def test_plot_reads_a_quoted_pattern_in_rank_order_and_names_the_png_after_it(rank_files: list[Path]) -> None:
    folder = rank_files[0].parent
    proc = run_cli("plot", str(folder / "memory.rank*.json"), "--json")
    assert proc.returncode == 0, proc.stderr
    done = json.loads(proc.stdout)
    assert done["output"] == str(folder / "memory.ranks.png") and (folder / "memory.ranks.png").is_file()
    assert [line["rank"] for line in done["lines"]] == [0, 1]
    nothing = run_cli("plot", str(folder / "nothing.rank*.json"))
    assert nothing.returncode == 2 and "no file matches" in nothing.stderr


def test_the_ranks_are_aligned_on_the_wall_clock(rank_files: list[Path]) -> None:
    from unimem.observe.plotting import _ranks_figure
    from unimem.observe.recording import load_recording

    loaded = [(load_recording(path), path.name) for path in rank_files]
    fig, figure, lines, notes = _ranks_figure(loaded, None, None, (10.0, 5.0), 100)
    ax = fig.axes[0]
    # The two ranks' marks fall close together when the ranks start together, and a legend entry
    # then says how many are labelled: the ranks' entries are what this test reads.
    legend = [text.get_text() for text in ax.get_legend().get_texts() if text.get_text().startswith("rank")]
    assert legend == ["rank 0", "rank 1"]
    origin = min(r.start_time for r, _ in loaded if r.start_time is not None)
    for (recording, _), line in zip(loaded, [ln for ln in ax.lines if ln.get_label() in legend], strict=True):
        first = next(s.time for s in recording.samples if s.host_rss is not None)
        assert line.get_xdata()[0] == pytest.approx(first - origin)  # seconds since the earliest start
    assert all(recording.meta["rank"] == rank for rank, (recording, _) in enumerate(loaded))


def _saved(folder: Path, name: str, meta: dict[str, object], start: float, used: int) -> Path:
    samples = [Sample(start + i, "device", process_used=used + i * MIB) for i in range(3)]
    return Recording(samples, [Mark(start + 1, "epoch 1")], meta).to_json(folder / name)


def test_plot_recordings_labels_ranks_from_metadata_else_the_file_name_and_says_what_did_not_match(
    tmp_path: Path,
) -> None:
    from unimem.observe.plotting import _ranks_figure
    from unimem.observe.recording import load_recording, plot_recordings

    files = [
        _saved(tmp_path, "a.json", {"rank": 2, "world_size": 4}, 100.0, 3 * GIB),
        _saved(tmp_path, "memory.rank1.json", {}, 101.0, 2 * GIB),  # no metadata: rank from the name
        _saved(tmp_path, "b.json", {"rank": 2, "world_size": 8}, 102.0, 1 * GIB),  # rank 2 again, another size
        _saved(tmp_path, "loose.json", {}, 103.0, 1 * GIB),  # neither: its name
    ]
    done = plot_recordings(files, tmp_path / "ranks.png")
    assert done.path.stat().st_size > 10_000 and done.figure == "process_used"
    assert [line.label for line in done.lines] == ["rank 1", "rank 2 (a.json)", "rank 2 (b.json)", "loose.json"]
    notes = "\n".join(done.notes)
    assert "memory.rank1.json: no rank in its metadata; rank 1 read from its name" in notes
    assert "loose.json: no rank in its metadata or its name" in notes
    assert "rank 2 is named by 2 recordings" in notes and "different world sizes (4, 8)" in notes
    fig, *_ = _ranks_figure([(load_recording(f), f.name) for f in files], None, None, (10.0, 5.0), 100)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [line.label for line in done.lines]


def test_plot_recordings_without_a_common_figure_draws_what_it_has_and_says_so(tmp_path: Path) -> None:
    from unimem.observe.recording import plot_recordings

    gpu = Recording([Sample(1.0, "device", process_used=GIB), Sample(2.0, "device", process_used=GIB)], [], {"rank": 0})
    cpu = Recording([Sample(1.5, "device", host_rss=MIB), Sample(2.5, "device", host_rss=MIB)], [], {"rank": 1})
    done = plot_recordings([gpu, cpu], tmp_path / "mixed.png")
    assert done.figure == "process_used" and [line.samples for line in done.lines] == [2, 0]
    assert "rank 1 has no process_used figures: no line" in done.notes
    asked = plot_recordings([gpu, cpu], tmp_path / "host.png", figure="host_rss")
    assert [line.samples for line in asked.lines] == [0, 2]


@pytest.mark.parametrize(
    "recordings, path, parameter",
    [
        ("memory.json", "out.png", "recordings"),
        ([], "out.png", "recordings"),
        ([Recording()], "out.json", "path"),
        ([Recording()], "missing/out.png", "path"),
    ],
)
def test_plot_recordings_refuses_bad_arguments_and_writes_nothing(
    tmp_path: Path, recordings: object, path: str, parameter: str
) -> None:
    from unimem.errors import ConfigError
    from unimem.observe.recording import plot_recordings

    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(ConfigError) as caught:
        plot_recordings(recordings, tmp_path / path)  # type: ignore[arg-type]
    assert caught.value.parameter == parameter
    assert sorted(tmp_path.rglob("*")) == before


def test_plot_of_several_refuses_a_bad_output_and_creates_nothing(rank_files: list[Path], tmp_path: Path) -> None:
    before = sorted(tmp_path.rglob("*"))
    for output, message in (("missing/deeper/out.png", "does not exist"), ("out.json", "does not end in .png")):
        proc = run_cli("plot", *map(str, rank_files), "-o", str(tmp_path / output))
        assert proc.returncode == 2 and "'--output'" in proc.stderr and message in proc.stderr, proc.stderr
    assert sorted(tmp_path.rglob("*")) == before
    absent = run_cli("plot", str(rank_files[0]), str(tmp_path / "rank9.json"))
    assert absent.returncode == 2 and "does not exist" in absent.stderr


def test_plot_of_one_recording_is_unchanged(rank_files: list[Path], tmp_path: Path) -> None:
    target = tmp_path / "one.png"
    proc = run_cli("plot", str(rank_files[1]), "-o", str(target))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {target} (") and "samples" in proc.stdout and "1 marks" in proc.stdout
    assert target.stat().st_size > 10_000
