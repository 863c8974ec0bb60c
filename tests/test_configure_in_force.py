"""configure() across calls: the same validation as within one call, overrides that say what they
replaced, "no-device" where there is no GPU to act on, and ``configuration()`` to read it back.

In-process: every test starts with fresh adapters (tests/conftest.py), so nothing configured in
one test is in force in the next; ``fresh()`` does the same between hypothesis examples.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from unimem.backends import nvml_gate
from unimem.backends.jax import configure as jax_configure
from unimem.backends.nvml import adapter as nvml_adapter

import unimem
from unimem import import_hooks, registry


def state() -> dict[str, Any]:
    """What a configure call may change: the environment, the import hooks, what is in force."""
    return {
        "environ": dict(os.environ),
        "hooks": {key: import_hooks.pending_hooks(key) for key in import_hooks._post_import},
        "in_force": unimem.configuration().as_dict(),
    }


def refused(parameter: str, **kwargs: Any) -> unimem.ConfigError:
    """configure(**kwargs) raises ConfigError naming ``parameter`` and changes nothing."""
    before = state()
    with pytest.raises(unimem.ConfigError) as info:
        unimem.configure(**kwargs)
    assert info.value.parameter == parameter, str(info.value)
    assert state() == before, "a refused call changed the process"
    return info.value


def quietly(**kwargs: Any) -> unimem.Applied:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", unimem.UnimemWarning)
        return unimem.configure(**kwargs)


# --- the shares of one device add up, across calls as within one ---------------------------------


def test_a_second_call_that_pushes_the_shares_over_the_device_is_refused_and_changes_nothing():
    unimem.configure(backend="torch", fraction=0.5)
    error = refused("fraction", backend="jax", fraction=0.8)
    assert "1.3" in str(error) and "torch 0.5" in str(error) and "earlier" in str(error)
    assert jax_configure.fraction_variable() not in os.environ
    assert list(unimem.configuration()) == ["torch"]
    applied = unimem.configure(backend="jax", fraction=0.5)  # exactly the whole device: accepted
    assert os.environ[jax_configure.fraction_variable()] == "0.5"
    assert applied.get("jax", "fraction")[0].replaced == ""


def fresh() -> None:
    """A process where nothing was configured (as each test starts): new adapters, no variables."""
    registry._instances.clear()
    for name in [k for k in os.environ if k.startswith(("XLA_", "TF_FORCE", "PYTORCH_"))]:
        del os.environ[name]
    import_hooks._post_import.clear()


share = st.floats(min_value=0.05, max_value=1.0).map(lambda x: round(x, 2))


@settings(max_examples=40, deadline=None)
@given(first=share, second=share)
def test_two_calls_are_refused_exactly_when_one_call_is(first, second):
    fresh()
    try:
        quietly(fraction={"torch": first, "jax": second})
        one_call = True
    except unimem.ConfigError as exc:
        assert exc.parameter == "fraction"
        one_call = False
    fresh()
    quietly(backend="torch", fraction=first)
    try:
        quietly(backend="jax", fraction=second)
        two_calls = True
    except unimem.ConfigError as exc:
        assert exc.parameter == "fraction"
        two_calls = False
    assert one_call == two_calls == (first + second <= 1.0 + 1e-9)
    fresh()


def test_one_share_given_to_several_named_backends_counts_for_each():
    refused("fraction", backend=["torch", "jax"], fraction=0.6)
    unimem.configure(backend=["torch", "jax"], fraction=0.5)


def test_configuring_a_backend_again_replaces_its_share():
    quietly(backend="torch", fraction=0.9)
    quietly(backend="torch", fraction=0.2)  # replaces 0.9: the device now has 0.8 left
    unimem.configure(backend="jax", fraction=0.8)
    quietly(backend="torch", limit="1GiB")  # a limit replaces the share entirely
    assert unimem.configuration()["torch"].fraction is None
    unimem.configure(backend="tf", fraction=0.2)


def test_a_share_spread_over_every_installed_framework_is_for_whichever_one_is_used():
    quietly(fraction=0.6)  # backend="auto", nothing imported: every installed framework gets 0.6
    applied = quietly(backend="jax", fraction=0.8)  # torch's 0.6 is not in use: it does not count
    assert applied.get("jax", "fraction")[0].replaced == "fraction=0.6"


# --- a backend's settings still combine ----------------------------------------------------------


def test_tensorflow_growth_beside_a_cap_from_an_earlier_call_is_refused_either_way():
    unimem.configure(backend="tf", limit="1GiB")
    error = refused("growth", backend="tf", growth=True)
    assert "limit=1.00 GiB (1073741824 B)" in str(error) and "earlier" in str(error)
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in os.environ


def test_a_cap_beside_tensorflow_growth_from_an_earlier_call_names_the_cap():
    unimem.configure(backend="tf", growth=True)
    refused("limit", backend="tf", limit="1GiB")
    refused("fraction", backend="tf", fraction=0.5)


def test_devices_written_to_one_variable_are_one_value_for_the_process():
    unimem.configure(backend="jax", devices=[1])
    error = refused("devices", backend="torch", devices=[0])
    assert "jax" in str(error) and "CUDA_VISIBLE_DEVICES" in str(error)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    unimem.configure(backend="torch", devices=[1])  # the same value: accepted
    applied = quietly(backend=["torch", "jax"], devices=[0])  # both in one call: accepted
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    assert {a.replaced for a in applied.get("jax", "devices")} == {"devices=[1]"}


def test_the_safe_growth_default_never_replaces_growth_given_earlier():
    unimem.configure(backend="jax", growth=False)
    applied = unimem.configure(backend=["torch", "jax"], fraction={"torch": 0.5, "jax": 0.3})
    assert applied.get("jax", "growth") == []
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    assert unimem.configuration()["jax"].growth is False


# --- an override says what it replaced -------------------------------------------------------------


def test_an_override_says_what_it_replaced_and_warns():
    unimem.configure(backend="torch", fraction=0.5)
    with pytest.warns(unimem.UnimemWarning, match="replaces fraction=0.5"):
        applied = unimem.configure(backend="torch", fraction=0.7)
    [action] = applied.get("torch", "fraction")
    assert action.replaced == "fraction=0.5"
    assert applied.replaced == [action]
    assert "replaces fraction=0.5" in str(applied)
    with pytest.warns(unimem.UnimemWarning, match="replaces fraction=0.7"):
        applied = unimem.configure(backend="torch", limit="2GiB")
    assert applied.get("torch", "limit")[0].replaced == "fraction=0.7"
    with warnings.catch_warnings():
        warnings.simplefilter("error", unimem.UnimemWarning)
        again = unimem.configure(backend="torch", limit="2GiB")  # the same value replaces nothing
    assert again.replaced == []
    in_force_now = unimem.configuration()["torch"]
    assert (in_force_now.fraction, in_force_now.limit) == (None, 2 << 30)


def test_a_skipped_setting_leaves_the_earlier_one_in_force():
    unimem.configure(backend="jax", allocator="async")
    with pytest.warns(unimem.UnimemWarning, match="expandable"):
        applied = unimem.configure(backend="jax", allocator="expandable", strict=False)
    assert [a.status for a in applied] == ["skipped"] and applied.replaced == []
    assert unimem.configuration()["jax"].allocator == "async"


# --- no GPU: nothing to apply --------------------------------------------------------------------


class CountingNvml:
    """A stand-in pynvml that counts ``count`` GPUs."""

    class NVMLError(Exception):
        pass

    def __init__(self, count: int) -> None:
        self.count = count

    def nvmlInit(self) -> None:  # noqa: N802
        return None

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return self.count


@pytest.fixture
def nvml_counts(monkeypatch):
    """``nvml_counts(n)``: NVML works on this host and counts ``n`` GPUs."""

    def install(count: int) -> None:
        monkeypatch.setattr(nvml_gate, "_pynvml", None)
        monkeypatch.setattr(nvml_gate, "_init_error", None)
        monkeypatch.setitem(sys.modules, "pynvml", CountingNvml(count))
        monkeypatch.setattr(nvml_adapter, "_DRIVER_PATHS", (os.sep,))  # a driver is "loaded"

    return install


def test_where_nvml_counts_no_gpu_a_waiting_setting_is_no_device(nvml_counts):
    nvml_counts(0)
    with pytest.warns(unimem.UnimemWarning, match="nothing to act on"):
        applied = unimem.configure(backend="jax", growth=True, fraction=0.4)
    assert {a.status for a in applied} == {"no-device"}
    assert applied.no_device == list(applied.actions) and applied.pending == []
    assert all("NVML counts 0 GPU(s)" in a.note for a in applied)
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"  # still made: it is harmless
    assert unimem.configuration()["jax"].fraction == 0.4


def test_where_nvml_counts_a_gpu_a_waiting_setting_stays_pending(nvml_counts):
    nvml_counts(2)
    applied = unimem.configure(backend="jax", growth=True)
    assert [a.status for a in applied] == ["pending"] and applied.note == ""


def test_where_nvml_cannot_count_the_call_says_so_and_settings_stay_pending(monkeypatch):
    monkeypatch.setattr(nvml_adapter, "_DRIVER_PATHS", (os.path.join(os.sep, "no", "such", "driver"),))
    applied = unimem.configure(backend="jax", growth=True)
    assert [a.status for a in applied] == ["pending"]
    assert "NVML cannot count GPUs here" in applied.note and "finds a GPU" in applied.note
    assert applied.note in str(applied)
    assert json.loads(json.dumps(applied.as_dict()))["note"] == applied.note


@pytest.mark.slow
def test_a_framework_that_sees_no_gpu_says_no_device_in_a_fresh_process(pyjson, need):
    need("torch")
    out = pyjson(
        """
        import warnings
        import torch
        import unimem
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            applied = unimem.configure(backend="torch", fraction=0.5)
        emit({"status": [a.status for a in applied], "warned": [str(w.message) for w in caught],
              "in_force": unimem.configuration()["torch"].fraction})
        """
    )
    assert out["status"] == ["no-device"]
    assert any("nothing to act on" in message for message in out["warned"])
    assert out["in_force"] == 0.5


# --- configuration(): what is in force ------------------------------------------------------------


def test_configuration_reads_back_what_is_in_force():
    assert len(unimem.configuration()) == 0
    assert "nothing configured" in str(unimem.configuration())
    unimem.configure(backend="jax", fraction=0.3, growth=True)
    unimem.configure(backend="tf", growth=True)
    config = unimem.configuration()
    assert list(config) == ["jax", "tensorflow"]
    assert config["tf"] is config["tensorflow"]  # aliases read too
    assert "torch" not in config and "cuda" not in config
    jax = config["jax"]
    assert (jax.fraction, jax.limit, jax.growth, jax.allocator, jax.devices) == (0.3, None, True, None, None)
    assert {a.setting for a in jax.actions} == {"fraction", "growth"}
    assert jax.phase == "not imported"
    text = str(config)
    assert jax_configure.fraction_variable() in text
    assert "jax: not imported" in text
    data = json.loads(json.dumps(config.as_dict()))
    assert data["tensorflow"]["growth"] is True and data["jax"]["actions"][0]["backend"] == "jax"


def test_configuration_of_a_fresh_process_after_several_calls(pyjson):
    out = pyjson(
        """
        import warnings
        import unimem
        warnings.simplefilter("ignore")
        unimem.configure(backend="torch", fraction=0.5, allocator="expandable")
        unimem.configure(backend="torch", fraction=0.25)
        unimem.configure(backend="jax", fraction=0.75)
        try:
            unimem.configure(backend="tf", fraction=0.1)
            refused = None
        except unimem.ConfigError as exc:
            refused = exc.parameter
        emit({"in_force": unimem.configuration().as_dict(), "refused": refused})
        """
    )
    torch, jax = out["in_force"]["torch"], out["in_force"]["jax"]
    assert (torch["fraction"], torch["allocator"], jax["fraction"]) == (0.25, "expandable", 0.75)
    assert out["refused"] == "fraction"
    assert "tensorflow" not in out["in_force"]


# --- settings spread over every installed framework: warnings wait for the framework ---------------

_SPREAD = """
import warnings
import unimem
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    applied = unimem.configure(fraction=0.5, allocator="expandable")  # nothing imported: every framework
    LATER
    at_call = [str(w.message) for w in caught]
    import jax
    at_import = [str(w.message) for w in caught][len(at_call):]
emit({"at_call": at_call, "at_import": at_import, "skipped": sorted({a.backend for a in applied.skipped})})
"""


@pytest.mark.slow
def test_a_setting_spread_over_every_framework_is_warned_of_when_the_script_imports_one(pyjson, need):
    need("jax")
    out = pyjson(_SPREAD.replace("LATER", "pass"))
    assert "jax" in out["skipped"]  # still said in the Applied, at once
    assert out["at_call"] == []  # a torch script never hears of JAX's allocator
    assert [m for m in out["at_import"] if m.startswith("jax: allocator not applied")] != []
    assert not [m for m in out["at_import"] if not m.startswith("jax:")]  # of JAX alone


@pytest.mark.slow
def test_a_spread_setting_a_later_call_made_is_not_warned_of(pyjson, need):
    need("jax")
    out = pyjson(_SPREAD.replace("LATER", 'unimem.configure(backend="jax", allocator="async")'))
    assert out["at_import"] == []


def test_a_limit_prints_in_binary_units_with_its_exact_bytes():
    applied = quietly(backend="torch", limit=8_000_000_000)
    [row] = [line for line in str(applied).splitlines() if line.startswith("torch")]
    assert row.split()[:6] == ["torch", "limit", "7.45", "GiB", "(8000000000", "B)"]
    assert applied.actions[0].value == 8_000_000_000 and applied.as_dict()["actions"][0]["value"] == 8_000_000_000
    assert "7.45 GiB (8000000000 B)" in str(unimem.configuration())
    with pytest.warns(unimem.UnimemWarning, match=r"fraction=0\.5 replaces limit=7\.45 GiB \(8000000000 B\)"):
        unimem.configure(backend="torch", fraction=0.5)
