"""Validation: every bad argument is a ConfigError naming the parameter, raised before
anything changes (a refused call changes nothing); sizes parse exactly; UNIMEM_* variables; query arguments."""

from __future__ import annotations

import os
import subprocess
import sys
from fractions import Fraction
from typing import Any

import pytest
from conftest import REPO, run_py, subprocess_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from unimem.backends import nvml_gate as nvml_backend
from unimem.backends import steps
from unimem.backends.jax import configure as jax_configure

import unimem
from unimem import import_hooks, registry
from unimem.sizes import parse_size

NAN, INF = float("nan"), float("inf")


# --- a snapshot of everything configure may touch ------------------------------------------


def _adapters() -> dict[str, Any]:
    names = [n for n in ("torch", "tensorflow", "jax") if n in registry.available_backends()]
    return {name: registry.get_backend(name) for name in names}


def _adapter_state(adapter: Any) -> dict[str, Any]:
    state = {}
    for key, value in vars(adapter).items():
        if key == "_lock":
            continue
        state[key] = dict(value) if isinstance(value, dict) else list(value) if isinstance(value, list) else value
    return state


def snapshot() -> dict[str, Any]:
    return {
        "environ": dict(os.environ),
        "modules": sorted(sys.modules),
        "meta_path": list(sys.meta_path),
        "post_import": {key: list(value) for key, value in import_hooks._post_import.items()},
        "visible_devices": dict(steps._visible),
        "configured": list(registry._configured),
        "adapters": {name: _adapter_state(a) for name, a in _adapters().items()},
        "nvml": (nvml_backend._pynvml, nvml_backend._init_error, dict(nvml_backend._handles)),
    }


def changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What differs between two snapshots, readably (modules and variables as added/removed)."""
    diff: dict[str, Any] = {}
    for key in before:
        if before[key] == after[key]:
            continue
        if key == "modules":
            diff[key] = {
                "added": sorted(set(after[key]) - set(before[key])),
                "removed": sorted(set(before[key]) - set(after[key])),
            }
        elif key == "environ":
            diff[key] = {
                k: (before[key].get(k), after[key].get(k))
                for k in set(before[key]) | set(after[key])
                if before[key].get(k) != after[key].get(k)
            }
        else:
            diff[key] = (before[key], after[key])
    return diff


def _fresh_nvml() -> None:
    """NVML as in a process that never asked it: not imported, not initialised."""
    sys.modules.pop("pynvml", None)
    nvml_backend._pynvml = None
    nvml_backend._init_error = None
    nvml_backend._handles.clear()


@pytest.fixture
def warm():
    """Import what configure imports on a valid call (adapters, package metadata), so that a
    snapshot before a refused call differs from one after only by what that call did."""
    for adapter in _adapters().values():
        adapter.version()
    _fresh_nvml()


def refused(parameter: str | tuple[str, ...], **kwargs: Any) -> unimem.ConfigError:
    """configure(**kwargs) raises ConfigError naming ``parameter`` and changes nothing."""
    before = snapshot()
    with pytest.raises(unimem.ConfigError) as info:
        unimem.configure(**kwargs)
    after = snapshot()
    names = (parameter,) if isinstance(parameter, str) else parameter
    assert info.value.parameter in names, f"{kwargs}: names {info.value.parameter!r}, not {names}"
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith(f"{info.value.parameter}: ")
    assert changes(before, after) == {}, f"{kwargs}: the refused call changed the process"
    return info.value


# --- bad arguments, one at a time ----------------------------------------------------------------


@pytest.mark.parametrize(
    "fraction", [0, 0.0, 1.5, -0.1, NAN, INF, -INF, "half", "0.5", True, False, [0.5], 1 + 0j, 1e-320, 1e-16]
)
def test_bad_fraction(warm, fraction):
    refused("fraction", backend="jax", fraction=fraction)


@pytest.mark.parametrize("limit", [-1, 0, "lots", "12 parsecs", NAN, INF, True, False, 1.5, "", "-1GB", "1e9", [1]])
def test_bad_limit(warm, limit):
    refused("limit", backend="torch", limit=limit)


def test_fraction_and_limit_exclude_each_other(warm):
    error = refused(("fraction", "limit"), backend="torch", fraction=0.5, limit="1GiB")
    assert "fraction" in str(error) and "limit" in str(error)


@pytest.mark.parametrize(
    "backend", ["cuda", "", "pytorch2", "numpy", 3, None, [], ["torch", "torch"], ["tf", "tensorflow"], ["jax", 1]]
)
def test_bad_backend(warm, backend):
    refused("backend", backend=backend, growth=True)


def test_unknown_backend_error_lists_the_known_names():
    with pytest.raises(unimem.ConfigError) as info:
        unimem.configure(backend="cuda", growth=True)
    assert all(name in str(info.value) for name in ("torch", "tensorflow", "jax", "nvml"))


@pytest.mark.parametrize("allocator", ["bfc", "platform", "cudaMallocAsync", "", "ASYNC", 1, ["async"], True])
def test_bad_allocator(warm, allocator):
    refused("allocator", backend="torch", allocator=allocator)


@pytest.mark.parametrize(
    "devices", [["0"], [0.5], [True], "0,1", [-1], [0, 0], [], (), True, 1.5, {0: 1}, [0, None], [10**19], [2**31]]
)
def test_bad_devices(warm, devices):
    refused("devices", backend="jax", devices=devices)


@pytest.mark.parametrize("growth", ["yes", "true", 1, 0, 1.0, [True]])
def test_bad_growth(warm, growth):
    refused("growth", backend="jax", growth=growth)


@pytest.mark.parametrize("strict", ["yes", 1, None])
def test_bad_strict(warm, strict):
    refused("strict", backend="jax", growth=True, strict=strict)


def test_split_shares_over_the_whole_device(warm):
    error = refused("fraction", backend=["torch", "jax"], fraction={"torch": 0.6, "jax": 0.5})
    assert "1.1" in str(error)


def test_split_naming_a_backend_not_configured(warm):
    error = refused("fraction", backend="torch", fraction={"torch": 0.5, "jax": 0.3})
    assert "jax" in str(error)
    refused("limit", backend=["torch"], limit={"tf": "1GiB"})


@pytest.mark.parametrize(
    "split",
    [{}, {"nvml": 0.5}, {3: 0.5}, {"cuda": 0.5}, {"torch": 0.5, "pytorch": 0.3}, {"torch": 1.5}, {"torch": True}],
)
def test_bad_split(warm, split):
    refused("fraction", fraction=split)


def test_a_combination_one_backend_refuses_touches_nothing_first(warm):
    """tensorflow refuses growth with a cap; torch and jax, planned first, must not have
    imported NVML or changed anything by then."""
    refused("growth", backend=["torch", "jax", "tensorflow"], limit="1GiB", growth=True)
    refused("growth", limit="1GiB", growth=True)  # backend="auto": every installed framework


@pytest.mark.parametrize("backend", ["torch", "tensorflow", "jax"])
def test_devices_count_among_the_devices_already_visible(backend):
    os.environ["CUDA_VISIBLE_DEVICES"] = "3,5"
    applied = unimem.configure(backend=backend, devices=[1])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    assert [a.target for a in applied] == ["CUDA_VISIBLE_DEVICES=5"]
    # Configuring again counts from the same base, not from the value unimem wrote.
    assert [a.status for a in unimem.configure(backend=backend, devices=[1])] == ["unchanged"]
    unimem.configure(backend=backend, devices=[1, 0])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,3"
    error = refused("devices", backend=backend, devices=[2])
    assert "3,5" in str(error)


def test_devices_map_uuid_entries_and_stop_at_an_invalid_one():
    os.environ["CUDA_VISIBLE_DEVICES"] = "GPU-aaaa,GPU-bbbb,junk"
    unimem.configure(backend="jax", devices=[1])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-bbbb"
    refused("devices", backend="jax", devices=[2])


@pytest.mark.parametrize("value", ["GPU-aaaa,junk,7", "0,-1,1", "0,,1", "1,0,1"])
def test_a_cuda_visible_devices_cuda_would_misread_is_refused(value):
    # CUDA stops reading at the first entry that is no index or UUID: the devices after it stay hidden.
    os.environ["CUDA_VISIBLE_DEVICES"] = value
    refused("CUDA_VISIBLE_DEVICES", backend="jax", devices=[0])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == value


def test_a_refused_call_does_not_move_the_devices_base(warm):
    """torch plans devices before tensorflow refuses growth with a cap: nothing may stick."""
    os.environ["CUDA_VISIBLE_DEVICES"] = "3,5"
    refused("growth", backend=["torch", "tensorflow"], devices=[1], fraction=0.5, growth=True)
    # What it would cost: a launcher now narrows the process to GPU 5; device 0 is GPU 5.
    os.environ["CUDA_VISIBLE_DEVICES"] = "5"
    unimem.configure(backend="jax", devices=[0])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"


def test_valid_split_and_alias():
    applied = unimem.configure(fraction={"tf": 0.25, "jax": 0.5})
    assert applied.backends == ("tensorflow", "jax")
    assert os.environ[jax_configure.fraction_variable()] == "0.5"
    assert [a.value for a in applied.get("tensorflow", "fraction")] == [0.25]


# --- "changes nothing", for arbitrary bad combinations ----------------------------------------------

VALID: dict[str, st.SearchStrategy[Any]] = {
    "backend": st.sampled_from(
        ["auto", "torch", "tf", "tensorflow", "jax", "TF", ["torch", "jax"], ["jax", "tensorflow"], ("torch", "tf")]
    ),
    "fraction": st.none() | st.floats(min_value=0.01, max_value=1.0),
    "limit": st.none() | st.integers(1, 1 << 40) | st.sampled_from(["8GiB", "512MB", "1.5 GB", "2G", "100 KiB"]),
    "growth": st.none() | st.booleans(),
    "allocator": st.none() | st.sampled_from(["default", "async", "expandable", "uncached"]),
    "devices": st.none() | st.integers(0, 7) | st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True),
    "strict": st.booleans(),
}
INVALID: dict[str, st.SearchStrategy[Any]] = {
    "backend": st.sampled_from(["cuda", "", "pytorch2", 3, None, [], ["torch", "torch"], ["tf", "tensorflow"]]),
    "fraction": st.sampled_from(
        [0, -0.1, 1.5, NAN, INF, "half", True, [0.5], {}, {"nvml": 0.5}, {"torch": 1.5}, {"cuda": 0.5}]
    )
    | st.floats(min_value=1.0, exclude_min=True, allow_nan=False)
    | st.floats(max_value=0.0, allow_nan=False),
    "limit": st.sampled_from([0, "lots", "12 parsecs", NAN, True, 1.5, "", "-1GB", {}, {"torch": -1}])
    | st.integers(max_value=0)
    | st.text(alphabet="xyz!?", min_size=1, max_size=5),
    "growth": st.sampled_from(["yes", 1, 0, "true", 1.0]),
    "allocator": st.sampled_from(["bfc", "platform", "", "ASYNC", 1, ["async"]]) | st.text(alphabet="qwz", min_size=1),
    "devices": st.sampled_from([["0"], [0.5], [True], "0,1", [-1], [0, 0], [], True, 1.5, {0: 1}])
    | st.lists(st.integers(max_value=-1), min_size=1, max_size=3),
    "strict": st.sampled_from(["yes", 1, None, 0.0]),
}
# Valid values that are refused together.
COMBINATIONS = ("fraction+limit", "tensorflow growth+cap")


@st.composite
def bad_configure_calls(draw: st.DrawFn) -> dict[str, Any]:
    bad = draw(st.sets(st.sampled_from(sorted(INVALID) + list(COMBINATIONS)), min_size=1, max_size=3))
    kwargs = {name: draw(INVALID[name] if name in bad else VALID[name]) for name in VALID}
    if "fraction+limit" in bad:
        kwargs["fraction"] = draw(st.floats(min_value=0.01, max_value=1.0))
        kwargs["limit"] = draw(VALID["limit"].filter(lambda v: v is not None))
    if "tensorflow growth+cap" in bad:
        if "backend" not in bad:
            kwargs["backend"] = draw(st.sampled_from(["auto", "tf", ["torch", "jax", "tensorflow"], ["jax", "tf"]]))
        kwargs["growth"] = True
        cap = draw(st.sampled_from(["fraction", "limit"]))
        other = "limit" if cap == "fraction" else "fraction"
        if other not in bad:
            kwargs[other] = None
        if cap not in bad:
            kwargs[cap] = draw(VALID[cap].filter(lambda v: v is not None))
    return kwargs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kwargs=bad_configure_calls())
@pytest.mark.slow
def test_any_bad_call_raises_config_error_and_changes_nothing(warm, kwargs):
    _fresh_nvml()
    before = snapshot()
    try:
        with pytest.raises(unimem.ConfigError):
            unimem.configure(**kwargs)
        assert changes(before, snapshot()) == {}, "the refused call changed the process"
    finally:
        os.environ.clear()
        os.environ.update(before["environ"])
        registry._configured[:] = before["configured"]


# --- sizes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("8GiB", 8 * 2**30),
        ("512MB", 512 * 10**6),
        ("1.5 GB", 1_500_000_000),
        ("2G", 2 * 2**30),
        ("100 KiB", 102_400),
        ("1kb", 1000),
        ("  3 MiB ", 3 * 2**20),
        ("1TB", 10**12),
        ("2TiB", 2 * 2**40),
        ("4.1 GB", 4_100_000_000),
        (".5GiB", 2**29),
        ("7", 7),
        ("7 B", 7),
        (4096, 4096),
        (2.0, 2),
    ],
)
def test_sizes_parse(text, size):
    assert parse_size(text) == size
    assert type(parse_size(text)) is int


UNITS = {"B": 1, "KB": 10**3, "KiB": 2**10, "MB": 10**6, "MiB": 2**20, "GB": 10**9, "GiB": 2**30}
UNITS |= {"TB": 10**12, "TiB": 2**40, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "": 1}
UNITS |= {"PB": 10**15, "PiB": 2**50, "EB": 10**18, "EiB": 2**60, "P": 2**50, "E": 2**60}


@given(
    whole=st.integers(0, 100_000),
    frac=st.text(alphabet="0123456789", max_size=4),
    unit=st.sampled_from(sorted(UNITS)),
    space=st.booleans(),
)
def test_decimal_sizes_parse_exactly(whole, frac, unit, space):
    """'4.1 GB' is 4_100_000_000 bytes, not 4_099_999_999: no float rounding on the way."""
    number = f"{whole}.{frac}" if frac else str(whole)
    exact = Fraction(number) * UNITS[unit]
    if exact.denominator != 1 or exact <= 0:
        return  # not a whole, positive number of bytes
    assert parse_size(f"{number}{' ' if space else ''}{unit}") == int(exact)


@given(st.integers(1024, 1 << 70))
def test_what_format_bytes_prints_reads_back_within_its_rounding(n):
    from unimem.sizes import format_bytes

    back = parse_size(format_bytes(n))
    assert abs(back - n) <= 0.005 * n  # two decimals of the printed unit


@given(st.integers(1, 1 << 50))
def test_whole_byte_counts_pass_through(n):
    assert parse_size(n) == n
    assert parse_size(str(n)) == n


def test_limit_string_reaches_the_backend_in_bytes():
    applied = unimem.configure(backend="torch", limit="1.5 GB")
    assert [a.value for a in applied.get("torch", "limit")] == [1_500_000_000]


# --- UNIMEM_* variables -------------------------------------------------------------------------------


def test_configure_from_env_reads_every_variable(monkeypatch):
    monkeypatch.setenv("UNIMEM_BACKEND", "jax")
    monkeypatch.setenv("UNIMEM_FRACTION", "0.4")
    monkeypatch.setenv("UNIMEM_GROWTH", "true")
    monkeypatch.setenv("UNIMEM_ALLOCATOR", "async")
    monkeypatch.setenv("UNIMEM_DEVICES", "1,0")
    applied = unimem.configure_from_env()
    assert applied.backends == ("jax",)
    assert os.environ[jax_configure.fraction_variable()] == "0.4"
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] == "cuda_async"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,0"


def test_configure_from_env_reads_a_split(monkeypatch):
    monkeypatch.setenv("UNIMEM_FRACTION", "torch=0.6, jax=0.3")
    applied = unimem.configure_from_env()
    assert applied.backends == ("torch", "jax")
    assert [a.value for a in applied.get("torch", "fraction")] == [0.6]
    assert [a.value for a in applied.get("jax", "fraction")] == [0.3]
    assert os.environ[jax_configure.fraction_variable()] == "0.3"


def test_configure_from_env_reads_a_limit_split(monkeypatch):
    monkeypatch.setenv("UNIMEM_BACKEND", "torch,tf")
    monkeypatch.setenv("UNIMEM_LIMIT", "torch=2GiB,tf=512MB")
    applied = unimem.configure_from_env()
    assert [a.value for a in applied.get("torch", "limit")] == [2 * 2**30]
    assert [a.value for a in applied.get("tensorflow", "limit")] == [512 * 10**6]


@pytest.mark.parametrize(
    ("value", "growth"), [("1", True), ("yes", True), ("On", True), ("TRUE", True), ("0", False), ("off", False)]
)
def test_configure_from_env_growth_spellings(monkeypatch, value, growth):
    monkeypatch.setenv("UNIMEM_BACKEND", "jax")
    monkeypatch.setenv("UNIMEM_GROWTH", value)
    applied = unimem.configure_from_env()
    assert [a.value for a in applied.get("jax", "growth")] == [growth]


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"UNIMEM_FRACTION": "abc"}, "UNIMEM_FRACTION"),
        ({"UNIMEM_FRACTION": "1.5"}, "UNIMEM_FRACTION"),
        ({"UNIMEM_FRACTION": "torch=0.6,jax=0.6"}, "UNIMEM_FRACTION"),
        ({"UNIMEM_FRACTION": "torch=0.6,jax"}, "UNIMEM_FRACTION"),
        ({"UNIMEM_FRACTION": "torch=half"}, "UNIMEM_FRACTION"),
        ({"UNIMEM_BACKEND": "jax", "UNIMEM_FRACTION": "torch=0.5"}, "UNIMEM_FRACTION"),
        ({"UNIMEM_LIMIT": "12 parsecs"}, "UNIMEM_LIMIT"),
        ({"UNIMEM_LIMIT": "-3GB"}, "UNIMEM_LIMIT"),
        ({"UNIMEM_FRACTION": "0.5", "UNIMEM_LIMIT": "1GiB"}, ("UNIMEM_FRACTION", "UNIMEM_LIMIT")),
        ({"UNIMEM_GROWTH": "maybe"}, "UNIMEM_GROWTH"),
        ({"UNIMEM_DEVICES": "0,x"}, "UNIMEM_DEVICES"),
        ({"UNIMEM_DEVICES": "0,0"}, "UNIMEM_DEVICES"),
        ({"UNIMEM_DEVICES": "-1"}, "UNIMEM_DEVICES"),
        ({"UNIMEM_BACKEND": "cuda"}, "UNIMEM_BACKEND"),
        ({"UNIMEM_BACKEND": "torch,torch"}, "UNIMEM_BACKEND"),
        ({"UNIMEM_ALLOCATOR": "bfc"}, "UNIMEM_ALLOCATOR"),
        ({"UNIMEM_FRACTION": "torch=0.5,torch=0.6"}, "UNIMEM_FRACTION"),
        ({"UNIMEM_FRACTION": "tf=0.3,tensorflow=0.2"}, "UNIMEM_FRACTION"),
        ({"UNIMEM_FRACTION": "torch="}, "UNIMEM_FRACTION"),
        ({"UNIMEM_FRACTION": "1e-320"}, "UNIMEM_FRACTION"),
        ({"UNIMEM_FRACTION": "nan"}, "UNIMEM_FRACTION"),
        ({"UNIMEM_LIMIT": "torch=1GiB,torch=2GiB"}, "UNIMEM_LIMIT"),
        ({"UNIMEM_LIMIT": "1e-320"}, "UNIMEM_LIMIT"),
        ({"UNIMEM_DEVICES": "12345678901234567890"}, "UNIMEM_DEVICES"),
        ({"UNIMEM_DEVICES": "0,,1"}, "UNIMEM_DEVICES"),
        ({"UNIMEM_DEVICES": "+1"}, "UNIMEM_DEVICES"),
        ({"UNIMEM_BACKEND": "torch,,jax"}, "UNIMEM_BACKEND"),
        ({"UNIMEM_BACKEND": "tf,tensorflow"}, "UNIMEM_BACKEND"),
        ({"UNIMEM_VERBOSE": "yes"}, "UNIMEM_VERBOSE"),
        ({"UNIMEM_RUN": "true"}, "UNIMEM_RUN"),
    ],
)
def test_configure_from_env_errors_name_the_variable(monkeypatch, env, variable):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    before = dict(os.environ)
    with pytest.raises(unimem.ConfigError) as info:
        unimem.configure_from_env()
    names = (variable,) if isinstance(variable, str) else variable
    assert info.value.parameter in names
    assert str(info.value).startswith(f"{info.value.parameter}: ")
    assert dict(os.environ) == before


_HOOK = str(REPO / "unimem" / "_bootstrap")


@pytest.mark.parametrize(
    "env",
    [
        {"UNIMEM_FRACTION": "torch=0.5,torch=0.6"},
        {"UNIMEM_FRACTION": "1e-320"},
        {"UNIMEM_DEVICES": "12345678901234567890"},
        {"UNIMEM_GROWTH": "maybe"},
    ],
)
def test_the_startup_hook_refuses_bad_variables_with_one_line_and_status_2(env: dict[str, str]) -> None:
    # Before, it printed "Error in sitecustomize" and ran the script uncapped with status 0.
    proc = run_py("print('the script ran')", env={**env, "UNIMEM_RUN": "1", "PYTHONPATH": _HOOK})
    assert proc.returncode == 2 and "the script ran" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"unimem run: {next(iter(env))}: "), proc.stderr


def test_unimem_run_refuses_the_command_s_bad_variables_before_it_runs(tmp_path: Any) -> None:
    marker = tmp_path / "ran"
    command = [sys.executable, "-m", "unimem", "run", "--fraction", "0.3", "--", sys.executable, "-c"]
    proc = subprocess.run(
        [*command, f"open({str(marker)!r}, 'w').close()"],
        env=subprocess_env({"UNIMEM_DEVICES": "0,0"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and not marker.exists()
    assert "UNIMEM_DEVICES: device 0 is listed twice" in proc.stderr


def test_configure_from_env_with_nothing_set_changes_nothing():
    before = dict(os.environ)
    applied = unimem.configure_from_env()
    assert len(applied) == 0
    assert dict(os.environ) == before


# --- query arguments -------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", [-1, "0", True, 1.0, None])
@pytest.mark.parametrize("query", [unimem.stats, unimem.reset_peak, unimem.clear_cache, unimem.summary])
def test_bad_device_in_a_query(query, device):
    with pytest.raises(unimem.ConfigError) as info:
        query("jax", device=device)
    assert info.value.parameter == "device"


def test_unknown_backend_in_a_query():
    with pytest.raises(unimem.ConfigError) as info:
        unimem.stats("cuda")
    assert info.value.parameter == "backend"


def test_query_without_backend_when_two_are_configured_is_ambiguous():
    unimem.configure(backend=["torch", "jax"], growth=True)
    with pytest.raises(unimem.ConfigError) as info:
        unimem.stats()
    assert info.value.parameter == "backend"
    assert "torch" in str(info.value) and "jax" in str(info.value)


def test_query_without_backend_uses_the_one_configured():
    unimem.configure(backend="tf", growth=True)
    assert unimem.stats().backend == "tensorflow"
    assert unimem.stats("tf").backend == "tensorflow"


def test_auto_over_every_installed_framework_keeps_queries_unambiguous():
    unimem.configure(growth=True)  # nothing imported: spreads over torch, tensorflow, jax
    assert unimem.stats().backend == "nvml"
