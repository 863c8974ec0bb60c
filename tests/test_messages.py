"""Every message names its source once: no "nvml: nvml:", no "unimem plot: plot:"."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from unimem.backends import nvml_gate

import unimem
from unimem.cli.main import main as cli_main

# A word, a colon, and the same word again: "nvml: nvml:", "NVML: nvml:", "backend: backend:".
DOUBLED = re.compile(r"\b([\w.'-]+):\s+\1:", re.IGNORECASE)


def _doubled(text: str) -> list[str]:
    return [match.group(0) for match in DOUBLED.finditer(text)]


@pytest.mark.parametrize(
    "error, expected",
    [
        (unimem.ConfigError("limit", "expected a size"), "limit: expected a size"),
        # A reason passed on from another error that already names the parameter.
        (unimem.ConfigError("limit", "limit: expected a size"), "limit: expected a size"),
        (unimem.TooLateError("jax", "growth", "jax: growth: restart"), "jax: growth: restart"),
        (unimem.TooLateError("jax", "growth", "growth: restart"), "jax: growth: restart"),
        (unimem.UnsupportedFeature("nvml", "reset_peak", "nvml: reset_peak: no"), "nvml: reset_peak: no"),
        (unimem.UnsupportedFeature("nvml", "reset_peak", "reset_peak: no"), "nvml: reset_peak: no"),
        (unimem.UnsupportedFeature("nvml", "reset_peak", "no peak"), "nvml: reset_peak: no peak"),
    ],
)
def test_an_error_names_its_parameter_and_backend_once(error: Exception, expected: str) -> None:
    assert str(error) == expected
    assert not _doubled(str(error))


def test_the_nvml_error_says_nvml_once_and_its_status_is_the_bare_reason(no_nvml_state: None) -> None:
    with pytest.raises(unimem.BackendUnavailable) as info:
        unimem.stats("nvml")
    message = str(info.value)
    assert message.startswith("nvml: ") and message.count("nvml: ") == 1, message
    status = nvml_gate.nvml_status()
    assert status != "ok" and not status.lower().startswith("nvml:"), status
    assert message == f"nvml: {status}"


@pytest.fixture
def no_nvml_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML's module state as in a fresh process (this machine has no driver)."""
    monkeypatch.setattr(nvml_gate, "_pynvml", None)
    monkeypatch.setattr(nvml_gate, "_init_error", None)
    monkeypatch.setattr(nvml_gate, "_handles", {})


@pytest.mark.parametrize(
    "args",
    [
        ["info"],
        ["info", "--json"],
        ["stats"],
        ["stats", "--json"],
        ["stats", "--pid", "1"],
        ["watch", "--once"],
        ["watch", "--once", "--json"],
    ],
)
def test_cli_output_without_nvml_says_nvml_once(args: list[str], no_nvml_state: None) -> None:
    result = CliRunner().invoke(cli_main, args)
    assert result.exit_code == 0, result.output
    assert "nvmlInit failed" in result.output
    assert not _doubled(result.output), result.output
    if "--json" in args:  # the status under the "nvml" key is the bare reason
        data = json.loads(result.output) if args[0] != "watch" else json.loads(result.output.splitlines()[0])
        assert not data["nvml"].lower().startswith("nvml:"), data["nvml"]


@pytest.mark.parametrize(
    "args, option",
    [
        (["stats", "--backend", "mxnet"], "--backend"),
        (["stats", "--backend", "torch", "--device", "-1"], "--device"),
        (["watch", "--interval", "0"], "--interval"),
        (["watch", "--unseen-above", "lots"], "--unseen-above"),
        (["compare", "--workload", "resnet"], "--workload"),
        (["compare", "--framework", "mxnet"], "--framework"),
        (["compare", "--steps", "0"], "--steps"),
        (["watch", "--once", "--prometheus", "99999"], "--prometheus"),
    ],
)
def test_a_bad_option_is_named_once_by_its_option(args: list[str], option: str) -> None:
    result = CliRunner().invoke(cli_main, args)
    assert result.exit_code == 2, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("Error:"))
    assert option in line, line
    # click names the option; the parameter's own name does not follow it again.
    assert not re.search(rf"{re.escape(option)}'?: {re.escape(option.lstrip('-').replace('-', '_'))}s?:", line), line
    assert not _doubled(line), line


def test_plot_without_matplotlib_names_the_command_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from unimem.observe.recording import Recording
    from unimem.observe.samples import Sample

    saved = Recording([Sample(1.0, "device", host_rss=1 << 20)]).to_json(tmp_path / "memory.json")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where the plot extra is not installed
    for args in (["plot", str(saved)], ["plot", str(saved), str(saved), "-o", str(tmp_path / "ranks.png")]):
        result = CliRunner().invoke(cli_main, args)
        assert result.exit_code == 1, result.output
        assert result.stderr.strip() == "unimem plot: matplotlib is not installed; pip install 'unimem[plot]'"
    with pytest.raises(unimem.BackendUnavailable) as info:
        Recording([]).plot(tmp_path / "memory.png")
    assert str(info.value).count("plot:") == 1
