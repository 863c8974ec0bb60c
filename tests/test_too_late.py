"""One too-late rule in every framework, a repeated call that changes nothing, and what
``configuration()`` says once the framework has started.

The in-process tests drive stand-in framework modules (marked as such) whose phase the adapters
read from ``sys.modules``; the subprocess tests at the end run the real frameworks on the CPU.
"""

from __future__ import annotations

import os
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import unimem
from unimem import registry
from unimem.support import Phase

# --- stand-in frameworks, each already started (CPU only: no GPU) --------------------------------


def _started_tensorflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorFlow with its eager context made (its runtime started) and no GPU."""
    experimental = types.SimpleNamespace(get_memory_growth=lambda gpu: False)
    config = types.SimpleNamespace(
        list_physical_devices=lambda kind: [],
        get_visible_devices=lambda kind: [],
        experimental=experimental,
    )
    tf = types.ModuleType("tensorflow")
    tf.config = config  # type: ignore[attr-defined]
    handle = types.SimpleNamespace(_context_handle=object())
    context = types.ModuleType("tensorflow.python.eager.context")
    context.context_safe = lambda: handle  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorflow", tf)
    monkeypatch.setitem(sys.modules, "tensorflow.python.eager.context", context)


def _started_jax(monkeypatch: pytest.MonkeyPatch) -> None:
    """JAX with its backend created."""
    bridge = types.ModuleType("jax._src.xla_bridge")
    bridge.backends_are_initialized = lambda: True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jax", types.ModuleType("jax"))
    monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", bridge)


def _started_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch with CUDA initialised on its native allocator, one device."""
    cuda = types.SimpleNamespace(
        is_initialized=lambda: True,
        is_available=lambda: True,
        get_allocator_backend=lambda: "native",
        device_count=lambda: 1,
    )
    torch = types.ModuleType("torch")
    torch.cuda = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)


def _imported_cpu_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's CPU wheel, imported: CUDA never starts, and there is no allocator backend to ask."""

    def no_cuda_allocator() -> str:
        raise AttributeError("module 'torch._C' has no attribute '_cuda_getAllocatorBackend'")

    cuda = types.SimpleNamespace(
        is_initialized=lambda: False, is_available=lambda: False, get_allocator_backend=no_cuda_allocator
    )
    torch = types.ModuleType("torch")
    torch.cuda = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)


# A setting each started framework can no longer take: its start, the call, the fix's words.
LATE: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], dict[str, Any], str]] = {
    "tensorflow": (_started_tensorflow, {"growth": True}, "restart the process"),
    "jax": (_started_jax, {"growth": True}, "restart the process"),
    "jax-limit": (_started_jax, {"limit": "1GiB"}, "restart the process"),
    "torch": (_started_torch, {"allocator": "uncached"}, "before the first CUDA call"),
}


@pytest.mark.parametrize("case", list(LATE))
def test_a_setting_too_late_is_the_same_error_in_every_framework(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    start, kwargs, fix = LATE[case]
    backend = case.partition("-")[0]
    start(monkeypatch)
    assert registry.get_backend(backend).phase() is Phase.INITIALIZED
    before = dict(os.environ)
    with pytest.raises(unimem.TooLateError) as info:
        unimem.configure(backend=backend, **kwargs)
    assert isinstance(info.value, RuntimeError)
    [setting] = kwargs
    assert (info.value.backend, info.value.setting) == (backend, setting)
    assert fix in str(info.value)
    assert dict(os.environ) == before
    assert len(unimem.configuration()) == 0, "a refused call put something in force"
    with pytest.warns(unimem.UnimemWarning, match=setting):
        lenient = unimem.configure(backend=backend, strict=False, **kwargs)
    assert [a.status for a in lenient] == ["skipped"] and lenient.actions[0].note.startswith("too late")


def test_torch_allocator_backend_after_import_is_too_late_on_a_cpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch reads ``backend:`` of its conf when it is imported (its CUDA library's static
    initialiser), not at CUDA init: the same refusal whether or not the build has CUDA."""
    _imported_cpu_torch(monkeypatch)
    with pytest.raises(unimem.TooLateError) as info:
        unimem.configure(backend="torch", allocator="async")
    assert info.value.setting == "allocator" and "before `import torch`" in str(info.value)
    assert not any(name in os.environ for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"))
    # The other allocator keys are read at CUDA init, which has not come: still pending.
    [action] = [a for a in unimem.configure(backend="torch", allocator="expandable") if a.target.startswith("PYTORCH")]
    assert action.status == "pending"


def test_torch_allocator_backend_set_before_import_is_unchanged_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    unimem.configure(backend="torch", allocator="async")
    _imported_cpu_torch(monkeypatch)
    again = unimem.configure(backend="torch", allocator="async")
    assert {a.status for a in again} == {"unchanged"}
    with pytest.raises(unimem.TooLateError):
        unimem.configure(backend="torch", allocator="default")  # back to native: fixed at import too


# --- the same call twice -------------------------------------------------------------------------

REPEATS = [
    ("torch", {"fraction": 0.5}),
    ("torch", {"limit": "8GiB", "growth": True}),
    ("tensorflow", {"limit": "2GiB", "allocator": "async"}),
    ("jax", {"fraction": 0.3, "growth": True, "allocator": "async"}),
    ("cupy", {"limit": "1GiB"}),
]


@pytest.mark.parametrize(("backend", "kwargs"), REPEATS)
def test_configure_twice_alike_says_unchanged_and_keeps_what_is_in_force(backend: str, kwargs: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", unimem.UnimemWarning)  # no device here: said once, by the first call
        first = unimem.configure(backend=backend, **kwargs)
        in_force = unimem.configuration()[backend]
        with warnings.catch_warnings():
            warnings.simplefilter("error", unimem.UnimemWarning)  # nothing replaced: nothing to say
            second = unimem.configure(backend=backend, **kwargs)
    assert {a.status for a in second} == {"unchanged"}, str(second)
    assert len(second) == len(first)
    # What is in force is still described by the call that made it.
    assert unimem.configuration()[backend] == in_force


def test_a_value_in_force_asked_for_again_after_the_start_is_unchanged_not_too_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unimem.configure(backend="tf", growth=True)  # TF_FORCE_GPU_ALLOW_GROWTH, before import
    _started_tensorflow(monkeypatch)
    [action] = unimem.configure(backend="tf", growth=True)
    assert action.status == "unchanged"
    with pytest.raises(unimem.TooLateError):
        unimem.configure(backend="tf", growth=False)


# --- configuration() reads the phase now ---------------------------------------------------------


def test_configuration_says_applied_once_the_framework_started(monkeypatch: pytest.MonkeyPatch) -> None:
    unimem.configure(backend="tf", growth=True)
    unimem.configure(backend="torch", fraction=0.5)
    assert [a.status for a in unimem.configuration()["tensorflow"].actions] == ["pending"]
    _started_tensorflow(monkeypatch)
    in_force = unimem.configuration()
    [growth] = in_force["tensorflow"].actions
    assert growth.status == "applied" and "started" in growth.note
    assert [a.status for a in in_force["torch"].actions] == ["pending"]  # torch not imported: still waiting
    assert "applied" in str(in_force) and in_force.as_dict()["tensorflow"]["actions"][0]["status"] == "applied"


def test_configuration_does_not_claim_a_variable_changed_after_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    unimem.configure(backend="jax", growth=True)
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true"  # the script changed it before JAX started
    _started_jax(monkeypatch)
    [growth] = unimem.configuration()["jax"].actions
    assert growth.status == "pending"
    assert "XLA_PYTHON_CLIENT_PREALLOCATE is 'true' now" in growth.note


# --- the real frameworks, each in a fresh process ------------------------------------------------


@pytest.mark.slow
def test_real_frameworks_follow_the_rule_after_they_started(pyjson: Any, need: Any) -> None:
    need("jax")
    need("tensorflow")
    out = pyjson(
        """
        import unimem

        def attempt(**kwargs):
            try:
                return [a.status for a in unimem.configure(**kwargs)]
            except unimem.UnimemError as exc:
                return type(exc).__name__

        R = {"before": attempt(backend="jax", growth=True, fraction=0.5)}
        import jax.numpy as jnp
        import tensorflow as tf
        jnp.ones(2).block_until_ready()
        tf.ones(1)
        R["in_force"] = [a.status for a in unimem.configuration()["jax"].actions]
        R["jax_again"] = attempt(backend="jax", growth=True, fraction=0.5)
        R["jax_other"] = attempt(backend="jax", fraction=0.4)
        R["tf_growth"] = attempt(backend="tf", growth=True)
        emit(R)
        """
    )
    assert out["before"] == ["pending", "pending"]
    assert out["in_force"] == ["applied", "applied"]
    assert out["jax_again"] == ["unchanged", "unchanged"]
    assert out["jax_other"] == "TooLateError"
    assert out["tf_growth"] == "TooLateError"


@pytest.mark.slow
def test_real_torch_cpu_build_refuses_the_async_backend_after_import(pyjson: Any, need: Any) -> None:
    need("torch")
    out = pyjson(
        """
        import os
        import torch
        import unimem
        try:
            unimem.configure(backend="torch", allocator="async")
            emit({"error": None})
        except unimem.TooLateError as exc:
            emit({"error": exc.setting, "env": [k for k in os.environ if k.startswith("PYTORCH")]})
        """
    )
    assert out == {"error": "allocator", "env": []}
