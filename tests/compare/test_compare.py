"""`unimem compare` on the CPU: every framework runs, the JSON keeps its schema, the PNG opens."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import unimem
from tests.conftest import required_frameworks, subprocess_env
from unimem.compare import harness as compare_module


@pytest.mark.slow
def test_compare_runs_every_framework_with_the_same_model(tmp_path: Path) -> None:
    # The required frameworks whose adapter runs the reference workloads (cupy's does not).
    frameworks = [name for name in required_frameworks() if name in compare_module._runners()]
    args = [sys.executable, "-m", "unimem", "compare", "--config", "default", "--config", "bf16", "--steps", "1"]
    args += ["--out", str(tmp_path)]
    for framework in frameworks:
        args += ["--framework", framework]
    proc = subprocess.run(args, capture_output=True, text=True, env=subprocess_env(), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]

    data = json.loads((tmp_path / "compare.json").read_text())
    assert data["schema"] == compare_module.SCHEMA_VERSION
    for key in ("date", "python", "platform", "device", "versions", "size", "steps", "cores", "load_average"):
        assert key in data["machine"]
    assert isinstance(data["times_comparable"], bool) and isinstance(data["notes"], list)
    runs = data["results"]
    assert {(r["framework"], r["workload"], r["config"]) for r in runs} == {
        (f, w, c) for f in frameworks for w in compare_module.WORKLOADS for c in ("default", "bf16")
    }
    failed = [r for r in runs if not r["ok"]]
    assert not failed, failed
    for workload in compare_module.WORKLOADS:
        counts = {r["parameters"] for r in runs if r["workload"] == workload}
        assert len(counts) == 1, f"{workload}: frameworks differ in parameter count {counts}"
    for r in runs:
        assert r["step_ms"] > 0
        assert r["step_ms_min"] <= r["step_ms"] <= r["step_ms_max"] and len(r["step_times_ms"]) == 1
        assert r["warm_up"] == ["default", "bf16"] and r["imported_while_measuring"] == [], r
        assert r["host_peak_rss"] > 0
        # No GPU here: the device figures are unknown, never zero.
        for key in ("start_process_used", "peak_allocated", "peak_reserved", "process_peak", "device_total"):
            assert r[key] is None, (key, r)

    import matplotlib.image

    image = matplotlib.image.imread(tmp_path / "compare.png")
    assert image.shape[0] > 400 and image.shape[1] > 800
    assert "No GPU here" in proc.stdout


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        ({"frameworks": ["nvml"]}, "frameworks"),
        ({"frameworks": ["mxnet"]}, "frameworks"),
        ({"workloads": ["resnet"]}, "workloads"),
        ({"configs": ["turbo"]}, "configs"),
        ({"size": "huge"}, "size"),
        ({"steps": 0}, "steps"),
    ],
)
def test_bad_compare_arguments_are_config_errors(kwargs: dict, parameter: str) -> None:
    with pytest.raises(unimem.ConfigError) as info:
        compare_module.compare(**kwargs)
    assert info.value.parameter == parameter


def test_only_frameworks_whose_adapter_runs_the_workloads_are_compared() -> None:
    from unimem import registry

    runners = compare_module._runners()
    assert {"torch", "tensorflow", "jax"} <= set(runners) <= set(registry.FRAMEWORKS)
    for name in [n for n in registry.BACKENDS if n not in runners]:
        with pytest.raises(unimem.ConfigError) as info:
            compare_module.compare(frameworks=[name])
        assert info.value.parameter == "frameworks" and "runs no workload" in str(info.value)


def test_parameter_shapes_are_shared_by_every_framework() -> None:
    shapes = compare_module.SIZES["small"]
    from unimem.workload_specs import parameter_shapes

    mlp = parameter_shapes("mlp", shapes)
    assert mlp["w0"] == (shapes.width, shapes.hidden)
    assert mlp[f"w{shapes.depth}"] == (shapes.hidden, shapes.width)
    block = parameter_shapes("transformer", shapes)
    assert block["w1"] == (shapes.width, 4 * shapes.width)


# --- every configuration after the same warm-up ------------------------------------------------


@pytest.mark.slow
def test_remat_and_default_are_measured_after_the_same_imports(need: Callable[[str], None]) -> None:
    # torch's first checkpointed call imports torch._dynamo and sympy (tens of MiB of host memory):
    # measured only in the remat row, it read as remat costing more memory than no saver at all.
    need("torch")
    from unimem.compare.worker import warm_up_paths

    assert warm_up_paths(["default", "growth", "remat", "bf16"]) == [
        (None, "float32"),
        ("full", "float32"),
        (None, "bfloat16"),
    ]
    result = compare_module.compare(["torch"], ["mlp"], ["default", "remat"], steps=1)
    default, remat = result.results
    for run in (default, remat):
        assert run["ok"], run
        assert run["warm_up"] == ["default", "remat"] and run["warm_up_skipped"] == []
        assert run["imported_while_measuring"] == [], run["imported_while_measuring"][:20]
    # The small MLP's activations are a few MiB: the two peaks differ by far less than the imports.
    assert abs(remat["host_peak_rss"] - default["host_peak_rss"]) < 0.1 * default["host_peak_rss"], (
        default["host_peak_rss"],
        remat["host_peak_rss"],
    )


# --- step times: their spread, and when they are not comparable ----------------------------------


def _fake_run(step_seconds: list[float]) -> Callable[..., dict[str, Any]]:
    from unimem.compare.worker import step_times

    def run(framework: str, workload: str, config: str, *args: Any) -> dict[str, Any]:
        row = {"framework": framework, "workload": workload, "config": config, "ok": True, "parameters": 1000}
        return {**row, **step_times(step_seconds), "host_peak_rss": 1 << 28}

    return run


def test_step_times_give_the_median_the_range_and_the_spread_of_the_middle_half() -> None:
    from unimem.compare.worker import step_times

    steady = step_times([0.010, 0.0101, 0.0099, 0.0100, 0.0102])
    assert steady["step_ms"] == pytest.approx(10.0)
    assert (steady["step_ms_min"], steady["step_ms_max"]) == (pytest.approx(9.9), pytest.approx(10.2))
    assert steady["step_spread"] < compare_module.SPREAD_LIMIT
    # One slow step (a garbage collection) widens the range, not the middle half.
    assert step_times([0.010, 0.010, 0.010, 0.010, 0.050])["step_spread"] == pytest.approx(0.0)
    wide = step_times([0.010, 0.014, 0.020, 0.026, 0.030])
    assert wide["step_ms"] == pytest.approx(20.0) and wide["step_spread"] == pytest.approx(0.6)
    assert step_times([0.010])["step_spread"] is None  # one timed step has no spread


def _compare_with(monkeypatch: pytest.MonkeyPatch, load: float, step_seconds: list[float]) -> Any:
    monkeypatch.setattr(compare_module.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(compare_module.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(compare_module, "_run_worker", _fake_run(step_seconds))
    return compare_module.compare(["torch"], ["mlp"], ["default", "remat"])


def _printed(result: Any) -> str:
    from rich.console import Console

    from unimem.cli.main import print_comparison

    console = Console(width=300, record=True, file=io.StringIO())
    print_comparison(console, result)
    return console.export_text()


STEADY = [0.010, 0.0101, 0.0099, 0.0100, 0.0102]


def test_a_comparison_lists_its_configurations_in_the_order_of_the_table() -> None:
    """The chart's columns: the configurations the runs ran, in ``CONFIGS``'s order, each once."""
    runs = [
        {"framework": "torch", "workload": "mlp", "config": c} for c in ("remat", "turbo", "default", "cap", "default")
    ]
    assert compare_module.Comparison(runs).configs == ["default", "cap", "remat"]
    assert compare_module.Comparison([]).configs == []


def test_on_a_loaded_machine_the_output_says_the_times_are_not_comparable(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _compare_with(monkeypatch, 5.0, STEADY)  # a load of 5 on 2 cores
    assert [run["load_average"] for run in result.results] == [5.0, 5.0]
    assert result.machine["cores"] == 2 and result.machine["load_average"] == 5.0
    notes = compare_module.timing_notes(result)
    assert len(notes) == 1 and "not comparable" in notes[0] and "load average was up to 5.0 on 2 cores" in notes[0]
    assert result.times_comparable is False
    assert result.as_dict()["notes"] == notes and result.as_dict()["times_comparable"] is False
    assert f"note: {notes[0]}" in _printed(result)


def test_on_an_idle_machine_with_steady_steps_no_note_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _compare_with(monkeypatch, 1.0, STEADY)
    assert compare_module.timing_notes(result) == [] and result.times_comparable is True
    printed = _printed(result)
    assert "not comparable" not in printed
    assert "10.0 (9.9–10.2)" in printed  # the median step, then the fastest and the slowest


def test_widely_spread_steps_are_said_not_to_be_comparable(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _compare_with(monkeypatch, 1.0, [0.010, 0.014, 0.020, 0.026, 0.030])
    notes = compare_module.timing_notes(result)
    assert len(notes) == 1 and "not comparable" in notes[0] and "spread over 20%" in notes[0], notes
    assert "torch · mlp · default 60%" in notes[0] and "torch · mlp · remat 60%" in notes[0]
    assert f"note: {notes[0]}" in _printed(result)


# --- the command: what it runs by default, how far it has got, and where it writes ----------------


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """Each run the command makes, recorded instead of started (a worker takes seconds)."""
    made: list[tuple[str, str, str]] = []

    def fake_worker(framework: str, workload: str, config: str, *rest: Any) -> dict[str, Any]:
        made.append((framework, workload, config))
        return {"framework": framework, "workload": workload, "config": config, "ok": False, "error": "not run"}

    monkeypatch.setattr(compare_module, "_run_worker", fake_worker)
    return made


def _cli(*args: str) -> Any:
    from click.testing import CliRunner

    from unimem.cli.main import main

    return CliRunner().invoke(main, ["compare", *args])


def test_compare_runs_the_quick_grid_by_default_and_every_configuration_with_full(runs: list) -> None:
    frameworks = [n for n in compare_module._runners() if n in unimem.available_backends()]
    result = _cli("--steps", "1")
    assert result.exit_code == 0, result.output
    assert runs == [(f, w, c) for f in frameworks for w in compare_module.WORKLOADS for c in ("default", "cap")]
    runs.clear()
    assert _cli("--steps", "1", "--full", "-f", frameworks[0]).exit_code == 0
    assert runs == [(frameworks[0], w, c) for w in compare_module.WORKLOADS for c in compare_module.CONFIGS]
    both = _cli("--full", "-c", "cap")
    assert both.exit_code == 2 and "--full" in both.output and "--config" in both.output


def test_compare_progress_says_how_many_runs_are_left(runs: list) -> None:
    result = _cli("-f", "torch", "-f", "jax", "-w", "mlp", "-c", "default", "-c", "cap", "--steps", "1")
    assert result.exit_code == 0, result.output
    said = [line for line in result.stderr.splitlines() if line.startswith("unimem compare: run ")]
    assert said == [
        "unimem compare: run 1 of 4: torch · mlp · default",
        "unimem compare: run 2 of 4: torch · mlp · cap",
        "unimem compare: run 3 of 4: jax · mlp · default",
        "unimem compare: run 4 of 4: jax · mlp · cap",
    ]


def test_compare_refuses_an_unwritable_out_folder_before_running_anything(
    runs: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from unimem.observe import plotting

    monkeypatch.setattr(plotting, "plot_comparison", lambda result, path: Path(path).write_bytes(b"png"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = _cli("-f", "torch", "-w", "mlp", "-c", "default", "-o", str(blocker / "results"))
    assert result.exit_code == 2
    assert "--out" in result.stderr and "cannot write to" in result.stderr and "Not a directory" in result.stderr
    assert runs == [], "a run was made before the folder was found unwritable"
    ok = _cli("-f", "torch", "-w", "mlp", "-c", "default", "-o", str(tmp_path / "new" / "results"))
    assert ok.exit_code == 0 and (tmp_path / "new" / "results" / "compare.json").is_file()
    assert not [p for p in (tmp_path / "new" / "results").iterdir() if p.name.startswith(".unimem")]
