"""`unimem run`: a configuration applied to scripts that were never written for unimem."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import subprocess_env

UNIMEM = [sys.executable, "-m", "unimem"]


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def _run(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        UNIMEM + ["run", *args], capture_output=True, text=True, env=subprocess_env(), timeout=timeout
    )


def _result(proc: subprocess.CompletedProcess[str]) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.covers("jax:fraction", "jax:growth")
@pytest.mark.slow
def test_jax_script_sees_settings_when_it_starts(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import json, os
        import jax.numpy as jnp
        jnp.ones(3).block_until_ready()
        from jax._src import xla_bridge
        print("RESULT " + json.dumps({
            "fraction": os.environ.get("XLA_CLIENT_MEM_FRACTION") or os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
            "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
            "started": xla_bridge.backends_are_initialized(),
        }))
        """,
    )
    proc = _run(["--backend", "jax", "--fraction", "0.3", "--growth", "--", sys.executable, str(script)])
    assert proc.returncode == 0, proc.stderr
    assert _result(proc) == {"fraction": "0.3", "preallocate": "false", "started": True}


@pytest.mark.covers("torch:fraction")
@pytest.mark.slow
def test_torch_cap_is_made_by_the_startup_hook_at_cuda_init(tmp_path: Path) -> None:
    # The script never mentions unimem. On the CPU, CUDA never starts, so what can be
    # shown is the wiring: after `import torch` the cap waits in torch's lazy-init queue.
    script = _script(
        tmp_path,
        """
        import json, sys
        import torch
        queued = [getattr(call, "__name__", "") for call, _ in torch.cuda._queued_calls]
        backend = sys.modules["unimem"].api.registry.get_backend("torch")
        print("RESULT " + json.dumps({
            "queued": "_on_cuda_init" in queued,
            "cap": backend.at_init.pending["cap"].fraction,
            "allocator_conf": __import__("os").environ.get("PYTORCH_ALLOC_CONF"),
        }))
        """,
    )
    proc = _run(
        ["--backend", "torch", "--fraction", "0.25", "--allocator", "expandable", "--", sys.executable, str(script)]
    )
    assert proc.returncode == 0, proc.stderr
    assert _result(proc) == {"queued": True, "cap": 0.25, "allocator_conf": "expandable_segments:True"}


@pytest.mark.covers("tensorflow:growth", "tensorflow:allocator.async")
@pytest.mark.slow
def test_tensorflow_script_sees_growth_and_allocator(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import json, os
        import tensorflow as tf
        tf.zeros(1).numpy()
        print("RESULT " + json.dumps({k: os.environ.get(k) for k in ("TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR")}))
        """,
    )
    proc = _run(["--backend", "tf", "--growth", "--allocator", "async", "--", sys.executable, str(script)])
    assert proc.returncode == 0, proc.stderr
    assert _result(proc) == {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "TF_GPU_ALLOCATOR": "cuda_malloc_async"}


def test_arguments_arrive_verbatim_and_exit_code_comes_back(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import json, sys
        print("RESULT " + json.dumps(sys.argv[1:]))
        sys.exit(7)
        """,
    )
    tricky = ["a b", "$HOME", "x;y", "'quoted'", "--fraction", "*"]
    proc = _run(["--backend", "jax", "--growth", "--", sys.executable, str(script), *tricky])
    assert proc.returncode == 7
    assert _result(proc) == tricky


def test_a_signal_that_kills_the_command_is_the_status(tmp_path: Path) -> None:
    script = _script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    proc = _run(["--backend", "jax", "--growth", "--", sys.executable, str(script)])
    assert proc.returncode == -signal.SIGTERM


@pytest.mark.parametrize(
    "args, message",
    [
        (["--fraction", "0.5"], "after --"),  # no `--`
        (["--frac", "0.5", "--"], "No such option"),
        (["--fraction", "1.5", "--"], "fraction"),
        (["--fraction", "half", "--"], "fraction"),
        (["--limit", "lots", "--"], "limit"),
        (["--fraction", "0.5", "--limit", "8GiB", "--"], "exclude"),
        (["--allocator", "bogus", "--"], "allocator"),
        (["--devices", "a,b", "--"], "devices"),
        (["--backend", "mxnet", "--"], "backend"),
    ],
)
def test_bad_configuration_fails_before_the_command_starts(tmp_path: Path, args: list[str], message: str) -> None:
    marker = tmp_path / "started"
    script = _script(tmp_path, f"open({str(marker)!r}, 'w').close()\n")
    proc = _run([*args, sys.executable, str(script)])
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not marker.exists(), "the command ran although the configuration was bad"


def test_missing_command_is_127(tmp_path: Path) -> None:
    proc = _run(["--backend", "jax", "--growth", "--", str(tmp_path / "no-such-program")])
    assert proc.returncode == 127
    assert "not found" in proc.stderr


@pytest.mark.slow
def test_unimem_warnings_print_as_one_line_without_unimems_source_line(
    tmp_path: Path, need: Callable[[str], None]
) -> None:
    need("jax")  # one installed framework without an expandable-segments allocator: a warning
    script = _script(
        tmp_path,
        """
        import warnings
        import jax
        import unimem
        warnings.warn("a warning of the script's own")
        warnings.warn("unimem says so", unimem.UnimemWarning)
        """,
    )
    proc = _run(["--allocator", "expandable", "--", sys.executable, str(script)])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    # Said once, when the script imports JAX (the startup hook's hook on the import).
    assert [line for line in lines if line.startswith("unimem: jax: allocator not applied")] != [], proc.stderr
    assert "unimem: unimem says so" in lines
    assert "UnimemWarning" not in proc.stderr
    assert "unimem/cli/run.py" not in proc.stderr and "unimem.configure(" not in proc.stderr
    # Other warnings keep Python's format, with the line that raised them.
    assert any(line.endswith("UserWarning: a warning of the script's own") for line in lines), proc.stderr


@pytest.mark.slow
def test_a_script_that_does_not_use_jax_hears_nothing_of_jax(tmp_path: Path, need: Callable[[str], None]) -> None:
    """Settings given to every installed framework speak of one only once the script imports it."""
    need("jax")
    need("torch")
    script = _script(tmp_path, "import torch\nprint('RESULT ' + str(torch.ones(2).sum().item()))\n")
    proc = _run(["--fraction", "0.5", "--allocator", "expandable", "--", sys.executable, str(script)])
    assert proc.returncode == 0, proc.stderr
    assert _result(proc) == 2.0
    assert "jax" not in proc.stderr.lower() and "xla" not in proc.stderr.lower(), proc.stderr
