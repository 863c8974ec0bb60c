"""``import unimem`` and everything that needs no framework imports none, and
``backend="auto"`` picks only frameworks already imported. Fresh processes."""

from __future__ import annotations

import pytest

HEAVY = ("torch", "tensorflow", "jax", "jaxlib", "pynvml")


def test_the_front_imports_no_framework_and_no_nvml(pyjson):
    out = pyjson(
        f"""
        import importlib.util, sys, time
        t0 = time.perf_counter()
        import unimem
        R = {{"import_s": time.perf_counter() - t0}}
        R["after_import"] = [m for m in {HEAVY!r} if m in sys.modules]
        R["available"] = unimem.available_backends()
        R["tables"] = {{b: sorted(unimem.capabilities(b)) for b in ("torch", "tensorflow", "tf", "jax", "nvml")}}
        R["has_matrix"] = importlib.util.find_spec("unimem.cli.matrix") is not None
        if R["has_matrix"]:
            import unimem.cli.matrix
            text = unimem.cli.matrix.render()
            R["matrix"] = [type(text).__name__, len(text), "| feature |" in text]
        R["phases"] = {{}}
        from unimem import registry
        for name in ("torch", "tensorflow", "jax", "nvml"):
            R["phases"][name] = int(registry.get_backend(name).phase())
        R["applied"] = [[a.target, a.status] for a in unimem.configure(backend="jax", growth=True)]
        R["loaded"] = [m for m in {HEAVY!r} if m in sys.modules]
        emit(R)
        """
    )
    assert out["after_import"] == []
    assert out["import_s"] < 2.0, "import unimem is meant to cost milliseconds"
    assert set(out["available"]) >= {"torch", "tensorflow", "jax", "nvml"}
    assert out["tables"]["tf"] == out["tables"]["tensorflow"]
    assert out["phases"] == {"torch": 0, "tensorflow": 0, "jax": 0, "nvml": 0}
    assert out["applied"] == [["XLA_PYTHON_CLIENT_PREALLOCATE=false", "pending"]]
    if out["has_matrix"]:
        assert out["matrix"] == ["str", out["matrix"][1], True] and out["matrix"][1] > 0
    assert out["loaded"] == [], f"imported by unimem: {out['loaded']}"


def test_auto_with_nothing_imported_imports_nothing(pyjson):
    out = pyjson(
        f"""
        import os, sys
        import unimem
        applied = unimem.configure(growth=True)
        emit({{"backends": list(applied.backends),
              "loaded": [m for m in {HEAVY!r} if m in sys.modules],
              "env": {{k: os.environ.get(k) for k in ("XLA_PYTHON_CLIENT_PREALLOCATE", "TF_FORCE_GPU_ALLOW_GROWTH")}}}})
        """
    )
    assert out["loaded"] == []
    # Nothing imported: every installed framework takes what it can before import.
    assert set(out["backends"]) == {"torch", "tensorflow", "jax", "cupy"}
    assert out["env"] == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}


@pytest.mark.slow
def test_auto_with_only_torch_imported_configures_only_torch(pyjson, need):
    need("torch")
    out = pyjson(
        """
        import os, sys
        import torch
        import unimem
        applied = unimem.configure(allocator="expandable")
        emit({"backends": list(applied.backends),
              "settings": sorted({a.backend for a in applied}),
              "loaded": [m for m in ("tensorflow", "jax", "jaxlib") if m in sys.modules],
              "xla": sorted(k for k in os.environ if k.startswith(("XLA_", "TF_GPU", "TF_FORCE")))})
        """
    )
    assert out["backends"] == ["torch"]
    assert out["settings"] == ["torch"]
    assert out["loaded"] == []
    assert out["xla"] == []


@pytest.mark.parametrize("name", ["torch", "tensorflow", "jax"])
def test_adapter_modules_import_without_their_framework(py, name):
    proc = py(
        f"""
        import sys
        import unimem.backends.{name}.adapter
        import unimem.backends.nvml_gate
        loaded = [m for m in {HEAVY!r} if m in sys.modules]
        assert not loaded, loaded
        """
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
