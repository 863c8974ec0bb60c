"""`unimem compare` on the CPU: every framework runs, the JSON keeps its schema, the PNG opens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import unimem
from tests.conftest import required_frameworks, subprocess_env
from unimem import compare as compare_module


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
    for key in ("date", "python", "platform", "device", "versions", "size", "steps"):
        assert key in data["machine"]
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
    from unimem.workloads import parameter_shapes

    mlp = parameter_shapes("mlp", shapes)
    assert mlp["w0"] == (shapes.width, shapes.hidden)
    assert mlp[f"w{shapes.depth}"] == (shapes.hidden, shapes.width)
    block = parameter_shapes("transformer", shapes)
    assert block["w1"] == (shapes.width, 4 * shapes.width)
