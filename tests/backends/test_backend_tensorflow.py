"""TensorFlow: the contract, plus TF's env-before-import / tf.config-after-import split.

TF's GPU paths cannot run here (no GPU, and no TF GPU build on the GPU machine): these
tests show which variable or call unimem uses in each phase, that the CPU build imports
and starts with those settings in place, and that settings with no GPU to act on are
skipped with a note rather than silently dropped.
"""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

import unimem
from unimem.import_hooks import pending_hooks
from unimem.testing import BackendContract


@pytest.fixture(autouse=True)
def _tensorflow(need):
    need("tensorflow")


class TestTensorFlowContract(BackendContract):
    backend = "tensorflow"
    module = "tensorflow"
    start = "import tensorflow as tf\nassert float(tf.reduce_sum(tf.ones(4) + 1)) == 8.0"
    env_kwargs = {"allocator": "async"}
    env_expect = {"TF_GPU_ALLOCATOR": "cuda_malloc_async"}
    late_kwargs = {"allocator": "default"}
    late_setting = "allocator"

    @pytest.mark.covers("tensorflow:allocator.async")
    def test_configure_before_import_sets_env_and_is_pending(self, run):
        super().test_configure_before_import_sets_env_and_is_pending(run)

    @pytest.mark.covers("tensorflow:allocator.default", "tensorflow:allocator.async")
    def test_late_configure_raises_too_late(self, run):
        super().test_late_configure_raises_too_late(run)


# --- before import (in this process; TF is never imported here) ---------------------------


@pytest.mark.covers("tensorflow:growth", "tensorflow:preallocate")
@pytest.mark.parametrize(("growth", "value"), [(True, "true"), (False, "false")])
def test_growth_before_import_sets_force_gpu_allow_growth(growth, value):
    applied = unimem.configure(backend="tf", growth=growth)
    assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == value
    [action] = applied.get("tensorflow", "growth")
    assert (action.method, action.status, action.target) == ("env", "pending", f"TF_FORCE_GPU_ALLOW_GROWTH={value}")
    assert "tensorflow" not in sys.modules


@pytest.mark.covers("tensorflow:growth", "tensorflow:fraction", "tensorflow:limit")
@pytest.mark.parametrize("cap", [{"fraction": 0.5}, {"limit": "4GiB"}, {"fraction": {"tf": 0.5}}])
def test_growth_with_a_cap_is_a_config_error_and_changes_nothing(cap):
    before_env, before_meta = dict(os.environ), list(sys.meta_path)
    with pytest.raises(unimem.ConfigError) as info:
        unimem.configure(backend="tensorflow", growth=True, **cap)
    assert info.value.parameter == "growth"
    assert "growth" in str(info.value) and "limit" in str(info.value)
    assert dict(os.environ) == before_env
    assert sys.meta_path == before_meta
    assert pending_hooks("tensorflow") == []


@pytest.mark.covers("tensorflow:allocator.async", "tensorflow:allocator.default")
def test_async_allocator_sets_tf_gpu_allocator_and_default_unsets_it():
    applied = unimem.configure(backend="tensorflow", allocator="async")
    assert os.environ["TF_GPU_ALLOCATOR"] == "cuda_malloc_async"
    assert [a.target for a in applied] == ["TF_GPU_ALLOCATOR=cuda_malloc_async"]
    applied = unimem.configure(backend="tensorflow", allocator="default")
    assert "TF_GPU_ALLOCATOR" not in os.environ
    assert [(a.target, a.status) for a in applied] == [("unset TF_GPU_ALLOCATOR", "pending")]


@pytest.mark.covers("tensorflow:allocator.uncached", "tensorflow:allocator.expandable")
@pytest.mark.parametrize("allocator", ["uncached", "expandable"])
def test_uncached_and_expandable_are_unsupported(allocator):
    before = dict(os.environ)
    with pytest.raises(unimem.UnsupportedFeature) as info:
        unimem.configure(backend="tensorflow", allocator=allocator)
    assert (info.value.backend, info.value.feature) == ("tensorflow", "allocator")
    with pytest.warns(unimem.UnimemWarning, match=allocator):
        applied = unimem.configure(backend="tensorflow", allocator=allocator, strict=False)
    assert [a.status for a in applied] == ["skipped"]
    assert dict(os.environ) == before


@pytest.mark.covers("tensorflow:devices")
def test_devices_before_import_set_cuda_visible_devices():
    applied = unimem.configure(backend="tensorflow", devices=[1])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert [(a.method, a.status) for a in applied] == [("env", "pending")]


@pytest.mark.covers("tensorflow:limit", "tensorflow:fraction")
@pytest.mark.parametrize("cap", [{"limit": "2GiB"}, {"fraction": 0.5}])
def test_cap_before_import_is_a_post_import_hook(cap):
    applied = unimem.configure(backend="tensorflow", **cap)
    [action] = applied
    assert (action.method, action.status) == ("hook", "pending")
    assert "memory_limit" in action.target
    assert pending_hooks("tensorflow") == ["unimem.tf.cap"]
    assert "tensorflow" not in sys.modules


# --- real TensorFlow in a fresh process ------------------------------------------------------


@pytest.mark.covers(
    "tensorflow:growth",
    "tensorflow:preallocate",
    "tensorflow:devices",
    "tensorflow:limit",
    "tensorflow:fraction",
)
@pytest.mark.slow
def test_after_import_on_cpu_api_settings_are_skipped_with_a_note(pyjson):
    out = pyjson(
        """
        import os, warnings
        import unimem
        from unimem import registry
        from unimem.import_hooks import pending_hooks
        R = {}
        R["pending"] = [a.status for a in unimem.configure(backend="tensorflow", limit="1GiB")]
        import tensorflow as tf
        adapter = registry.get_backend("tensorflow")
        R["hooks_left"] = pending_hooks("tensorflow")
        R["phase_imported"] = int(adapter.phase())
        for kwargs in ({"growth": True}, {"growth": False}, {"devices": [0]}, {"limit": "1GiB"}, {"fraction": 0.5}):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    applied = unimem.configure(backend="tensorflow", **kwargs)
                except unimem.ConfigError as exc:  # growth beside the 1GiB cap still in force
                    R[str(kwargs)] = {"refused": exc.parameter}
                    continue
            [setting] = kwargs
            R[str(kwargs)] = {
                "actions": [[a.setting, a.method, a.status, a.note] for a in applied.get("tensorflow", setting)],
                "warnings": [str(w.message) for w in caught if w.category is unimem.UnimemWarning],
            }
        R["phase_after_configure"] = int(adapter.phase())
        R["env"] = {k: os.environ.get(k) for k in ("TF_FORCE_GPU_ALLOW_GROWTH", "CUDA_VISIBLE_DEVICES")}
        tf.constant(1.0) + 1
        R["phase_started"] = int(adapter.phase())
        emit(R)
        """
    )
    assert out["pending"] == ["pending"]
    assert out["hooks_left"] == [], "the cap hook did not run at import"
    assert out["phase_imported"] == 1
    # TensorFlow cannot combine growth with a cap, across calls as within one.
    assert out["{'growth': True}"] == {"refused": "growth"}
    for kwargs, setting in (
        ("{'growth': False}", "growth"),
        ("{'devices': [0]}", "devices"),
        ("{'limit': '1GiB'}", "limit"),
        ("{'fraction': 0.5}", "fraction"),
    ):
        [[name, method, status, note]] = out[kwargs]["actions"]
        assert (name, method, status) == (setting, "api", "no-device"), kwargs
        assert "no GPU" in note
        assert any(setting in message and "no GPU" in message for message in out[kwargs]["warnings"])
    assert out["phase_after_configure"] == 1, "configure after import started TF's runtime"
    assert out["env"] == {"TF_FORCE_GPU_ALLOW_GROWTH": None, "CUDA_VISIBLE_DEVICES": None}
    assert out["phase_started"] == 2


@pytest.mark.covers("tensorflow:growth")
@pytest.mark.slow
def test_growth_set_before_import_is_what_tf_starts_with(pyjson):
    out = pyjson(
        """
        import os
        import unimem
        from unimem import registry
        unimem.configure(backend="tf", growth=True)
        import tensorflow as tf
        x = tf.reduce_sum(tf.ones(8))
        emit({"env": os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"), "sum": float(x),
              "phase": int(registry.get_backend("tensorflow").phase())})
        """
    )
    assert out == {"env": "true", "sum": 8.0, "phase": 2}


def test_fraction_hook_without_nvml_does_not_break_import_tensorflow(py, tmp_path):
    """A stand-in ``tensorflow`` package with one GPU, on this machine without NVML.

    configure(fraction=...) before import cannot know the device total yet; it must either
    refuse at configure time (ConfigError naming 'fraction') or leave ``import tensorflow``
    working and say the cap was not applied. It must not make the import itself raise.
    """
    fake = tmp_path / "tensorflow"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        textwrap.dedent(
            """
            import types
            made = []
            class LogicalDeviceConfiguration:
                def __init__(self, memory_limit=None):
                    self.memory_limit = memory_limit
            def list_physical_devices(kind=None):
                return ["/physical_device:GPU:0"] if kind == "GPU" else []
            def set_logical_device_configuration(gpu, configs):
                made.append((gpu, [c.memory_limit for c in configs]))
            config = types.SimpleNamespace(
                list_physical_devices=list_physical_devices,
                set_logical_device_configuration=set_logical_device_configuration,
                LogicalDeviceConfiguration=LogicalDeviceConfiguration,
            )
            """
        )
    )
    proc = py(
        """
        import sys, warnings
        import unimem
        from unimem.backends.nvml_gate import nvml_status
        assert nvml_status() != "ok", "this test describes a machine without NVML"
        try:
            applied = unimem.configure(backend="tensorflow", fraction=0.5)
        except unimem.ConfigError as exc:
            assert exc.parameter == "fraction", exc
            print("REFUSED AT CONFIGURE")
            sys.exit(0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import tensorflow
        assert tensorflow.__file__.startswith(FAKE_DIR), tensorflow.__file__
        assert any(issubclass(w.category, unimem.UnimemWarning) for w in caught) or tensorflow.made, (
            "the cap was neither made nor reported"
        )
        print("IMPORT OK")
        """.replace("FAKE_DIR", repr(str(fake))),
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode == 0, f"import tensorflow failed:\n{proc.stderr[-3000:]}"
    assert "REFUSED AT CONFIGURE" in proc.stdout or "IMPORT OK" in proc.stdout
