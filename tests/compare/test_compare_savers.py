"""The memory savers as ``unimem compare`` configurations: ``remat`` (every block recomputed)
and ``offload`` (every block's saved activations on the host).

On the CPU: each configuration runs in every framework that can do it and reports its
figures; TensorFlow, which cannot offload, gives a row that says unsupported and why. The
blocks compute exactly ``unimem.workload_specs.forward``'s loss (checked with a numpy op table).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import unimem
from tests.conftest import required_frameworks, subprocess_env
from unimem.compare import harness as compare_module
from unimem.compare.workloads import SIZES
from unimem.workload_specs import Shapes, forward, forward_in_blocks, input_shape, parameter_shapes


class NumpyOps:
    """``forward``'s op table in numpy (float64), for a framework-free check of the blocks."""

    matmul = staticmethod(np.matmul)
    mean = staticmethod(np.mean)

    @staticmethod
    def relu(t: Any) -> Any:
        return np.maximum(t, 0.0)

    @staticmethod
    def gelu(t: Any) -> Any:
        return 0.5 * t * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (t + 0.044715 * t**3)))

    @staticmethod
    def softmax(t: Any) -> Any:
        e = np.exp(t - t.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    @staticmethod
    def layer_norm(t: Any) -> Any:
        mu = t.mean(-1, keepdims=True)
        return (t - mu) / np.sqrt(((t - mu) ** 2).mean(-1, keepdims=True) + 1e-5)

    @staticmethod
    def split_heads(t: Any, heads: int, head: int) -> Any:
        return t.reshape(t.shape[0], t.shape[1], heads, head).transpose(0, 2, 1, 3)

    @staticmethod
    def merge_heads(t: Any) -> Any:
        b, h, q, d = t.shape
        return t.transpose(0, 2, 1, 3).reshape(b, q, h * d)

    @staticmethod
    def transpose_last(t: Any) -> Any:
        return np.swapaxes(t, -1, -2)


@pytest.mark.parametrize("workload", compare_module.WORKLOADS)
def test_the_blocks_compute_the_workloads_loss_exactly(workload: str) -> None:
    s = Shapes(batch=3, width=8, hidden=12, depth=2, seq=5, heads=2)
    rng = np.random.default_rng(0)
    params = {n: rng.standard_normal(shape) * 0.3 for n, shape in parameter_shapes(workload, s).items()}
    x = rng.standard_normal(input_shape(workload, s))
    wrapped: list[str] = []

    def wrap(block: Any) -> Any:
        wrapped.append(block.__name__)
        return block

    expected = forward(NumpyOps, workload, s, params, x)
    assert forward_in_blocks(NumpyOps, workload, s, params, x, wrap) == pytest.approx(expected, rel=1e-12)
    # Every block goes through the saver: each MLP layer, or both halves of the transformer block.
    assert wrapped == (["layer"] * (s.depth + 1) if workload == "mlp" else ["attention", "mlp"])


def test_the_adapter_gets_the_saver_from_the_front(monkeypatch: pytest.MonkeyPatch) -> None:
    """``build_step`` hands the adapter the saver each block runs under (``unimem.remat`` in the step's
    framework); the adapter's loss calls it for every block, and without it refuses rather than run
    the configuration with no saver."""
    from unimem import registry
    from unimem.compare.workloads import build_step
    from unimem.training import savers
    from unimem.workload_specs import loss_function

    remats: list[tuple[str, str, str | None]] = []

    def remat(fn: Any, policy: str = "full", backend: str | None = None) -> Any:
        remats.append((getattr(fn, "__name__", "?"), policy, backend))
        return fn

    handed: list[Shapes] = []

    class Workloads:
        def workload_step(self, workload: str, shapes: Shapes, dtype: str) -> tuple[Any, int]:
            handed.append(shapes)
            return (lambda: None), 0

    class Adapter:
        workloads = Workloads()

    monkeypatch.setattr(savers, "remat", remat)
    monkeypatch.setattr(registry, "get_backend", lambda name: Adapter())
    s = Shapes(batch=3, width=8, hidden=12, depth=2, seq=5, heads=2, saver="full")
    build_step("torch", "mlp", s, "float32")
    (shapes,) = handed
    assert shapes == s and shapes.wrap is not None
    assert remats == [("<lambda>", "full", "torch")], "an unsupported policy is refused before the adapter runs"

    rng = np.random.default_rng(0)
    params = {n: rng.standard_normal(shape) for n, shape in parameter_shapes("mlp", s).items()}
    x = rng.standard_normal(input_shape("mlp", s))
    loss = loss_function(NumpyOps, "mlp", shapes)(params, x)
    assert loss == pytest.approx(forward(NumpyOps, "mlp", s, params, x), rel=1e-12)
    assert remats[1:] == [("layer", "full", "torch")] * (s.depth + 1)
    with pytest.raises(ValueError, match="saver='full' need wrap="):
        loss_function(NumpyOps, "mlp", s)


def test_the_savers_are_configurations() -> None:
    assert {"remat", "offload"} <= set(compare_module.CONFIGS)
    assert compare_module.SAVERS == {"remat": "full", "offload": "offload"}
    with pytest.raises(unimem.ConfigError) as info:
        compare_module.compare(configs=["recompute"])
    assert info.value.parameter == "configs" and "remat" in str(info.value) and "offload" in str(info.value)


def test_an_unsupported_row_says_so_in_the_table() -> None:
    comparison = compare_module.Comparison(
        [
            {
                "framework": "tensorflow",
                "workload": "mlp",
                "config": "offload",
                "ok": False,
                "unsupported": True,
                "error": "tensorflow: remat.offload: no hook",
            },
            {"framework": "torch", "workload": "mlp", "config": "remat", "ok": False, "error": "worker exited 1: x"},
        ]
    )
    _, rows = compare_module.table_rows(comparison)
    assert [row[3] for row in rows] == ["unsupported", "failed"]
    assert compare_module.unsupported(comparison) == ["tensorflow · mlp · offload: tensorflow: remat.offload: no hook"]
    assert compare_module.failures(comparison) == ["torch · mlp · remat: worker exited 1: x"]


@pytest.fixture(scope="module")
def saver_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[tuple[str, str, str], dict], str]:
    frameworks = [name for name in required_frameworks() if name in compare_module._runners()]
    out = tmp_path_factory.mktemp("compare")
    args = [sys.executable, "-m", "unimem", "compare", "--config", "remat", "--config", "offload", "--steps", "1"]
    args += ["--out", str(out)]
    for framework in frameworks:
        args += ["--framework", framework]
    proc = subprocess.run(args, capture_output=True, text=True, env=subprocess_env(), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((Path(out) / "compare.json").read_text())
    return {(r["framework"], r["workload"], r["config"]): r for r in data["results"]}, proc.stdout


# Which frameworks can run which saver (compat_matrix.md, rows remat.full and remat.offload).
CAN = {("torch", "remat"), ("torch", "offload"), ("jax", "remat"), ("jax", "offload"), ("tensorflow", "remat")}


@pytest.mark.parametrize("framework", ["torch", "tensorflow", "jax"])
@pytest.mark.parametrize("config", ["remat", "offload"])
@pytest.mark.slow
def test_each_saver_runs_where_the_framework_supports_it(saver_runs: Any, framework: str, config: str) -> None:
    runs, stdout = saver_runs
    if framework not in required_frameworks():
        pytest.skip(f"{framework} is not among the required frameworks here")
    for workload in compare_module.WORKLOADS:
        r = runs[(framework, workload, config)]
        if (framework, config) in CAN:
            assert r["ok"], r
            assert r["saver"] == compare_module.SAVERS[config]
            assert r["step_ms"] > 0 and r["host_peak_rss"] > 0
            assert r["parameters"] == sum(np.prod(s) for s in parameter_shapes(workload, SIZES["small"]).values())
        else:
            assert not r["ok"] and r["unsupported"], r
            assert "remat.offload" in r["error"] and "remat(fn, 'full')" in r["error"]
            assert f"unsupported: {framework} · {workload} · {config}" in stdout
