"""JAX: the contract, plus XLA's environment variables checked against jaxlib's own reader.

jaxlib's CUDA plugin builds its client options with
``jaxlib.xla_client.generate_pjrt_gpu_plugin_options()``, a plain function of the
environment. It runs on the CPU, so these tests check that what unimem writes is what
the GPU client would be created with, without a GPU.
"""

from __future__ import annotations

import os
import sys
import warnings

import pytest
from unimem.backends.jax import adapter as jax_backend
from unimem.backends.jax import configure as jax_configure

import unimem
from unimem.import_hooks import pending_hooks
from unimem.testing import BackendContract

FRACTION_VAR = jax_configure.fraction_variable()
OTHER_FRACTION_VAR = (
    jax_configure.FRACTION_OLD if FRACTION_VAR == jax_configure.FRACTION_NEW else jax_configure.FRACTION_NEW
)


class TestJaxContract(BackendContract):
    backend = "jax"
    module = "jax"
    start = "import jax.numpy as jnp\n(jnp.ones(4) + 1).block_until_ready()"
    env_kwargs = {"fraction": 0.3, "growth": True}
    env_expect = {FRACTION_VAR: "0.3", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    late_kwargs = {"fraction": 0.5}
    late_setting = "fraction"

    @pytest.mark.covers("jax:fraction", "jax:growth")
    def test_configure_before_import_sets_env_and_is_pending(self, run):
        super().test_configure_before_import_sets_env_and_is_pending(run)

    @pytest.mark.covers("jax:fraction")
    def test_late_configure_raises_too_late(self, run):
        super().test_late_configure_raises_too_late(run)


@pytest.fixture(autouse=True)
def _jax(need):
    need("jax")


def test_fraction_variable_is_the_one_jaxlib_reads(pyjson):
    """Only fraction_variable() set: jaxlib's option builder takes it as the memory fraction."""
    out = pyjson(
        f"""
        import os
        os.environ[{FRACTION_VAR!r}] = "0.3"
        from jaxlib import xla_client
        emit(xla_client.generate_pjrt_gpu_plugin_options().get("memory_fraction"))
        """
    )
    assert out == pytest.approx(0.3)


@pytest.mark.covers("jax:fraction", "jax:growth", "jax:preallocate")
def test_what_unimem_sets_is_what_jaxlib_builds_the_gpu_client_with(pyjson):
    """A pre-existing value under the other fraction name would make jaxlib raise; unimem removes it."""
    out = pyjson(
        f"""
        import os, sys
        os.environ[{OTHER_FRACTION_VAR!r}] = "0.9"
        import unimem
        from jaxlib import xla_client
        def options():
            try:
                return xla_client.generate_pjrt_gpu_plugin_options()
            except ValueError as exc:
                return "ValueError: " + str(exc)
        R = {{}}
        os.environ[{FRACTION_VAR!r}] = "0.2"
        R["both_names_without_unimem"] = options()
        del os.environ[{FRACTION_VAR!r}]
        R["applied"] = unimem.configure(backend="jax", fraction=0.3, growth=True).as_dict()
        R["env"] = {{k: os.environ.get(k) for k in ({FRACTION_VAR!r}, {OTHER_FRACTION_VAR!r})}}
        R["growth_true"] = options()
        unimem.configure(backend="jax", growth=False)
        R["growth_false"] = options()
        R["jax_imported"] = "jax" in sys.modules
        emit(R)
        """
    )
    assert str(out["both_names_without_unimem"]).startswith("ValueError"), "the trap unimem avoids is not real"
    targets = {(a["target"], a["status"]) for a in out["applied"]["actions"]}
    assert (f"{FRACTION_VAR}=0.3", "pending") in targets
    assert (f"unset {OTHER_FRACTION_VAR}", "pending") in targets
    assert out["env"] == {FRACTION_VAR: "0.3", OTHER_FRACTION_VAR: None}
    assert isinstance(out["growth_true"], dict), out["growth_true"]
    assert out["growth_true"]["memory_fraction"] == pytest.approx(0.3)
    assert out["growth_true"]["preallocate"] is False
    assert out["growth_false"]["preallocate"] is True
    assert out["jax_imported"] is False


@pytest.mark.covers("jax:allocator.default", "jax:allocator.async", "jax:allocator.uncached")
def test_allocators_map_to_values_jaxlib_accepts(pyjson):
    out = pyjson(
        """
        import os
        import unimem
        from jaxlib import xla_client
        R = {}
        for name in ("uncached", "async", "default"):
            applied = unimem.configure(backend="jax", allocator=name)
            R[name] = {
                "targets": [a.target for a in applied],
                "env": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR"),
                "jaxlib": xla_client.generate_pjrt_gpu_plugin_options()["allocator"],
            }
        emit(R)
        """
    )
    assert out["uncached"] == {
        "targets": ["XLA_PYTHON_CLIENT_ALLOCATOR=platform"],
        "env": "platform",
        "jaxlib": "platform",
    }
    assert out["async"] == {
        "targets": ["XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async"],
        "env": "cuda_async",
        "jaxlib": "cuda_async",
    }
    assert out["default"] == {"targets": ["unset XLA_PYTHON_CLIENT_ALLOCATOR"], "env": None, "jaxlib": "default"}


def test_fraction_replaces_a_stale_value_under_the_other_name():
    os.environ[OTHER_FRACTION_VAR] = "0.9"
    applied = unimem.configure(backend="jax", fraction=0.25)
    assert os.environ[FRACTION_VAR] == "0.25"
    assert OTHER_FRACTION_VAR not in os.environ
    assert [a.target for a in applied] == [f"{FRACTION_VAR}=0.25", f"unset {OTHER_FRACTION_VAR}"]


@pytest.mark.covers("jax:allocator.expandable")
def test_expandable_allocator_is_unsupported():
    before = dict(os.environ)
    with pytest.raises(unimem.UnsupportedFeature) as info:
        unimem.configure(backend="jax", allocator="expandable")
    assert isinstance(info.value, NotImplementedError)
    assert (info.value.backend, info.value.feature) == ("jax", "allocator")
    assert dict(os.environ) == before

    with pytest.warns(unimem.UnimemWarning, match="expandable"):
        applied = unimem.configure(backend="jax", allocator="expandable", strict=False)
    [action] = applied.get("jax", "allocator")
    assert action.status == "skipped"
    assert "unsupported" in action.note
    assert dict(os.environ) == before


@pytest.mark.covers("jax:limit")
def test_limit_without_nvml_on_a_cpu_jax_is_skipped_with_a_note():
    assert not jax_configure._cuda_plugin_installed(), "this test describes a JAX without a CUDA plugin"
    before = dict(os.environ)
    with pytest.warns(unimem.UnimemWarning, match="limit"):
        applied = unimem.configure(backend="jax", limit="2GiB")
    [action] = applied.get("jax", "limit")
    assert action.status == "no-device"
    assert action.value == 2 * 2**30
    assert "no CUDA plugin" in action.note
    assert dict(os.environ) == before


@pytest.mark.covers("jax:devices")
def test_devices_set_cuda_visible_devices():
    applied = unimem.configure(backend="jax", devices=[1, 0])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,0"
    [action] = applied.get("jax", "devices")
    assert (action.method, action.status, action.target) == ("env", "pending", "CUDA_VISIBLE_DEVICES=1,0")


def test_jax_settings_need_no_import_hook():
    unimem.configure(backend="jax", fraction=0.4, growth=True, allocator="async", devices=[0])
    assert pending_hooks("jax") == []
    assert "jax" not in sys.modules


@pytest.mark.covers("jax:growth", "jax:devices", "jax:allocator.uncached")
@pytest.mark.slow
def test_jax_devices_call_also_counts_as_started(pyjson):
    """jax.devices() starts the backend as an op does: growth, devices and allocator are then too late."""
    out = pyjson(
        """
        import warnings
        import unimem
        from unimem import registry
        unimem.configure(backend="jax", growth=True)
        import jax
        before = int(registry.get_backend("jax").phase())
        jax.devices()
        after = int(registry.get_backend("jax").phase())
        refused = {}
        for kwargs in ({"growth": False}, {"devices": [0]}, {"allocator": "uncached"}):
            try:
                unimem.configure(backend="jax", **kwargs)
                refused[str(kwargs)] = None
            except unimem.TooLateError as exc:
                refused[str(kwargs)] = [exc.backend, exc.setting]
        emit({"before": before, "after": after, "refused": refused,
              "same": [a.status for a in unimem.configure(backend="jax", growth=True)]})
        """
    )
    assert (out["before"], out["after"]) == (1, 2)
    assert out["refused"] == {
        "{'growth': False}": ["jax", "growth"],
        "{'devices': [0]}": ["jax", "devices"],
        "{'allocator': 'uncached'}": ["jax", "allocator"],
    }
    assert out["same"] == ["unchanged"]


def test_no_warning_for_pending_jax_settings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        applied = unimem.configure(backend="jax", growth=False)
    assert applied.pending and not applied.skipped


def test_search_capacity_under_growth_is_one_piece_of_the_pool():
    # With growth on a step's new bytes must come from one region: the room left under the cap,
    # or the largest free block, whichever is larger; a preallocated pool is one region (the cap).
    GiB = 1 << 30
    adapter = jax_backend.JaxBackend().search

    def pool(reserved: int, in_use: int, block: int) -> unimem.MemoryStats:
        return unimem.MemoryStats(
            "jax", 0, allocated=in_use, reserved=reserved, limit=8 * GiB, largest_free_block=block
        )

    assert adapter.search_capacity(pool(3 * GiB, 1 * GiB, 1 * GiB)) == 1 * GiB + 5 * GiB
    assert adapter.search_capacity(pool(6 * GiB, 1 * GiB, 4 * GiB)) == 1 * GiB + 4 * GiB
    assert adapter.search_capacity(pool(8 * GiB, 1 * GiB, 7 * GiB)) == 8 * GiB
    assert adapter.search_capacity(unimem.MemoryStats("jax", 0, limit=8 * GiB)) == 8 * GiB
