"""PyTorch: the contract, plus the caching allocator's settings.

On the CPU torch never initialises CUDA, so a setting made "too late" cannot happen
for real here. What the CPU can show: the env-based settings are pending before and
after ``import torch`` (CUDA not started), torch itself parses what unimem writes into
its allocator config, caps wait in a post-import hook and then in torch's lazy CUDA
init queue, and are skipped with a note where torch sees no CUDA device. The
INITIALIZED branch is exercised against a stand-in ``torch`` module (marked as such,
and claimed as evidence for no matrix cell).
"""

from __future__ import annotations

import os
import sys
import types
import warnings
from typing import Any

import pytest
from unimem.backends.torch import adapter as torch_backend
from unimem.backends.torch import configure as torch_configure

import unimem
from unimem import registry
from unimem.import_hooks import _finder, pending_hooks
from unimem.support import Phase
from unimem.testing import BackendContract

CONF_VAR = torch_configure.conf_var(torch_backend.TorchBackend().version())


@pytest.fixture(autouse=True)
def _torch(need):
    need("torch")


# --- a stand-in torch whose CUDA is already initialised ---------------------------------


class _FakeCuda:
    def __init__(self, *, initialized: bool, backend: str = "native", count: int = 2, total: int = 80 << 30):
        self._initialized = initialized
        self._backend = backend
        self._count = count
        self._total = total
        self.fractions: dict[int, float] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.memory = types.SimpleNamespace(_set_allocator_settings=lambda s: self.calls.append(("settings", s)))

    def is_initialized(self) -> bool:
        return self._initialized

    def is_available(self) -> bool:
        return True

    def get_allocator_backend(self) -> str:
        return self._backend

    def device_count(self) -> int:
        return self._count

    def get_device_properties(self, device: int) -> Any:
        return types.SimpleNamespace(total_memory=self._total, uuid=None)

    def get_per_process_memory_fraction(self, device: int) -> float:
        return self.fractions.get(device, 1.0)

    def set_per_process_memory_fraction(self, fraction: float, device: int) -> None:
        self.calls.append(("fraction", fraction, device))
        self.fractions[device] = fraction


@pytest.fixture
def fake_torch(monkeypatch):
    """Install a stand-in ``torch`` in sys.modules; returns a function making its CUDA."""

    def install(**kwargs: Any) -> _FakeCuda:
        module = types.ModuleType("torch")
        module.cuda = _FakeCuda(**kwargs)  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "torch", module)
        return module.cuda  # type: ignore[attr-defined]

    return install


class TestTorchContract(BackendContract):
    backend = "torch"
    module = "torch"
    start = "import torch\nassert float((torch.ones(4) + 1).sum()) == 8.0"
    starts_on_cpu = False  # CPU ops never initialise CUDA
    env_kwargs = {"allocator": "expandable"}
    env_expect = {CONF_VAR: "expandable_segments:True"}

    @pytest.mark.covers("torch:allocator.expandable")
    def test_configure_before_import_sets_env_and_is_pending(self, run):
        super().test_configure_before_import_sets_env_and_is_pending(run)

    def test_late_configure_raises_too_late(self, fake_torch):
        """Stand-in torch with CUDA started on the native allocator: switching to
        'uncached' (read only at CUDA init) is refused, and nothing changes."""
        fake_torch(initialized=True, backend="native")
        assert registry.get_backend("torch").phase() is Phase.INITIALIZED
        before = dict(os.environ)
        with pytest.raises(unimem.TooLateError) as info:
            unimem.configure(backend="torch", allocator="uncached")
        assert isinstance(info.value, RuntimeError)
        assert (info.value.backend, info.value.setting) == ("torch", "allocator")
        assert "before the first CUDA call" in str(info.value)
        assert dict(os.environ) == before

    def test_late_configure_lenient_warns_and_skips(self, fake_torch):
        fake_torch(initialized=True, backend="native")
        with pytest.warns(unimem.UnimemWarning, match="allocator"):
            applied = unimem.configure(backend="torch", allocator="async", strict=False)
        [action] = applied.get("torch", "allocator")
        assert action.status == "skipped" and action.note.startswith("too late")


# --- before import (this process: torch is never imported here) ----------------------


@pytest.mark.covers("torch:fraction")
def test_cap_before_import_registers_a_post_import_hook():
    applied = unimem.configure(backend="torch", fraction=0.25)
    [action] = applied.get("torch", "fraction")
    assert (action.method, action.status) == ("hook", "pending")
    assert "set_per_process_memory_fraction(0.25)" in action.target
    assert pending_hooks("torch") == ["unimem.torch.at_init"]
    assert _finder in sys.meta_path
    assert "torch" not in sys.modules


@pytest.mark.covers("torch:limit")
def test_limit_before_import_is_pending_as_a_hook():
    applied = unimem.configure(backend="torch", limit="6GiB")
    [action] = applied.get("torch", "limit")
    assert (action.method, action.status, action.value) == ("hook", "pending", 6 * 2**30)
    assert pending_hooks("torch") == ["unimem.torch.at_init"]


def test_configuring_twice_before_import_keeps_one_hook():
    unimem.configure(backend="torch", fraction=0.25)
    unimem.configure(backend="torch", fraction=0.5, growth=False)
    assert pending_hooks("torch") == ["unimem.torch.at_init"]


@pytest.mark.covers("torch:allocator.expandable")
def test_expandable_keeps_the_users_other_allocator_keys():
    os.environ[CONF_VAR] = "max_split_size_mb:128,garbage_collection_threshold:0.6"
    applied = unimem.configure(backend="torch", allocator="expandable")
    conf = os.environ[CONF_VAR].split(",")
    assert "expandable_segments:True" in conf
    assert "max_split_size_mb:128" in conf and "garbage_collection_threshold:0.6" in conf
    assert [(a.method, a.status) for a in applied] == [("env", "pending")]


@pytest.mark.covers("torch:allocator.async")
def test_async_sets_the_cuda_malloc_async_backend():
    os.environ[CONF_VAR] = "max_split_size_mb:128"
    unimem.configure(backend="torch", allocator="async")
    assert sorted(os.environ[CONF_VAR].split(",")) == ["backend:cudaMallocAsync", "max_split_size_mb:128"]
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" not in os.environ


@pytest.mark.covers("torch:allocator.uncached")
def test_uncached_sets_no_cuda_memory_caching():
    applied = unimem.configure(backend="torch", allocator="uncached")
    assert os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
    assert any(a.target == "PYTORCH_NO_CUDA_MEMORY_CACHING=1" and a.status == "pending" for a in applied)


@pytest.mark.covers("torch:allocator.default")
def test_default_undoes_unimems_allocator_keys_and_keeps_the_users():
    os.environ[CONF_VAR] = "max_split_size_mb:128"
    unimem.configure(backend="torch", allocator="expandable")
    unimem.configure(backend="torch", allocator="uncached")
    unimem.configure(backend="torch", allocator="default")
    assert os.environ[CONF_VAR] == "max_split_size_mb:128"
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" not in os.environ


@pytest.mark.covers("torch:devices")
def test_devices_set_cuda_visible_devices():
    applied = unimem.configure(backend="torch", devices=[2, 3])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    [action] = applied.get("torch", "devices")
    assert (action.method, action.status) == ("env", "pending")


@pytest.mark.covers("torch:growth")
def test_growth_is_torchs_default_and_cancels_a_pending_preallocation():
    unimem.configure(backend="torch", growth=False)
    adapter = registry.get_backend("torch")
    applied = unimem.configure(backend="torch", growth=True)
    [action] = applied.get("torch", "growth")
    assert (action.method, action.status) == ("none", "applied")
    assert "preallocate" not in adapter.at_init.pending


@pytest.mark.parametrize(
    ("version", "var"),
    [
        ("2.3.1", "PYTORCH_CUDA_ALLOC_CONF"),
        ("2.8.0+cu126", "PYTORCH_CUDA_ALLOC_CONF"),
        ("2.9.0", "PYTORCH_ALLOC_CONF"),
        ("2.13.0+cpu", "PYTORCH_ALLOC_CONF"),
        ("3.0.0", "PYTORCH_ALLOC_CONF"),
        (None, "PYTORCH_CUDA_ALLOC_CONF"),
        ("nightly", "PYTORCH_CUDA_ALLOC_CONF"),
    ],
)
def test_allocator_conf_variable_follows_the_rename(version, var):
    assert torch_configure.conf_var(version) == var


# --- real torch in a fresh process --------------------------------------------------


@pytest.mark.covers("torch:allocator.expandable", "torch:allocator.async")
@pytest.mark.parametrize(
    ("user_env", "allocator", "wanted"),
    [
        pytest.param(
            {"PYTORCH_ALLOC_CONF": "max_split_size_mb:128"},
            "expandable",
            ["max_split_size_mb:128", "expandable_segments:True"],
            id="expandable-keeps-user-key",
        ),
        pytest.param({}, "async", ["backend:cudaMallocAsync"], id="async"),
        pytest.param(
            {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"},
            "expandable",
            ["max_split_size_mb:128", "expandable_segments:True"],
            id="expandable-with-legacy-variable-set",
        ),
    ],
)
@pytest.mark.slow
def test_torch_reads_the_allocator_config_unimem_wrote(pyjson, user_env, allocator, wanted):
    """torch's own allocator config (what the CUDA caching allocator is built from) holds
    unimem's keys, also when the user had set the pre-2.9 variable name."""
    out = pyjson(
        f"""
        import unimem
        unimem.configure(backend="torch", allocator={allocator!r})
        import torch
        emit(torch._C._accelerator_getAllocatorSettings())
        """,
        env=user_env,
    )
    assert sorted(out.split(",")) == sorted(wanted), f"torch reads {out!r}"


@pytest.mark.covers("torch:fraction", "torch:limit", "torch:preallocate")
@pytest.mark.slow
def test_cap_hook_lands_in_torchs_cuda_init_queue_and_is_skipped_without_cuda(pyjson):
    out = pyjson(
        """
        import warnings
        import unimem
        from unimem import registry
        from unimem.import_hooks import pending_hooks
        R = {}
        unimem.configure(backend="torch", fraction=0.5)
        unimem.configure(backend="torch", limit="3GiB", growth=False)
        import torch
        adapter = registry.get_backend("torch")
        R["hooks_left"] = pending_hooks("torch")
        R["queued"] = sum(1 for fn, _ in torch.cuda._queued_calls if fn == adapter.at_init._on_cuda_init)
        R["cuda_initialized"] = torch.cuda.is_initialized()
        R["works"] = float((torch.ones(3) * 2).sum())
        for kwargs in ({"fraction": 0.5}, {"limit": "3GiB"}, {"growth": False}):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                applied = unimem.configure(backend="torch", **kwargs)
            R[str(kwargs)] = {
                "actions": [[a.setting, a.status, a.note] for a in applied],
                "warnings": [w.category.__name__ for w in caught],
            }
        emit(R)
        """
    )
    assert out["hooks_left"] == []
    assert out["queued"] == 1, "the CUDA-init callback must be queued once, however often configure ran"
    assert out["cuda_initialized"] is False
    assert out["works"] == 6.0
    for kwargs, setting in (
        ("{'fraction': 0.5}", "fraction"),
        ("{'limit': '3GiB'}", "limit"),
        ("{'growth': False}", "growth"),
    ):
        [[name, status, note]] = out[kwargs]["actions"]
        assert (name, status) == (setting, "no-device")
        assert "no CUDA device" in note
        assert set(out[kwargs]["warnings"]) == {"UnimemWarning"}  # the limit also says it replaced the fraction


# --- the INITIALIZED branch, against a stand-in torch ------------------------------------


def test_phase_follows_torch_cuda_state(monkeypatch, fake_torch):
    adapter = registry.get_backend("torch")
    assert adapter.phase() is Phase.NOT_IMPORTED
    half = types.ModuleType("torch")  # torch while its own import is still running
    monkeypatch.setitem(sys.modules, "torch", half)
    assert adapter.phase() is Phase.IMPORTED
    fake_torch(initialized=False)
    assert adapter.phase() is Phase.IMPORTED
    fake_torch(initialized=True)
    assert adapter.phase() is Phase.INITIALIZED


def test_expandable_after_init_switches_through_the_allocator_settings_api(fake_torch):
    cuda = fake_torch(initialized=True, backend="native")
    applied = unimem.configure(backend="torch", allocator="expandable")
    [action] = applied.get("torch", "allocator")
    assert (action.method, action.status) == ("api", "applied")
    assert cuda.calls == [("settings", "expandable_segments:True")]


def test_async_when_already_async_is_unchanged(fake_torch):
    cuda = fake_torch(initialized=True, backend="cudaMallocAsync")
    applied = unimem.configure(backend="torch", allocator="async")
    assert [a.status for a in applied] == ["unchanged"]
    with pytest.raises(unimem.TooLateError):
        unimem.configure(backend="torch", allocator="expandable")
    assert cuda.calls == []


def test_cap_after_init_is_an_api_call_on_every_device_then_unchanged(fake_torch):
    cuda = fake_torch(initialized=True, count=2, total=80 << 30)
    applied = unimem.configure(backend="torch", limit="20GiB")
    [action] = applied.get("torch", "limit")
    assert (action.method, action.status) == ("api", "applied")
    assert cuda.calls == [("fraction", 0.25, 0), ("fraction", 0.25, 1)]
    again = unimem.configure(backend="torch", fraction=0.25)
    assert [a.status for a in again] == ["unchanged"]


def test_limit_above_the_device_after_init_is_a_config_error(fake_torch):
    cuda = fake_torch(initialized=True, total=16 << 30)
    with pytest.raises(unimem.ConfigError) as info:
        unimem.configure(backend="torch", limit="17GiB")
    assert info.value.parameter == "limit"
    assert "17.00 GiB (18253611008 B) is more than the device's 16.00 GiB (17179869184 B)" in str(info.value)
    assert cuda.calls == []


def test_devices_after_init_are_too_late_unless_unchanged(fake_torch):
    os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
    fake_torch(initialized=True)
    assert [a.status for a in unimem.configure(backend="torch", devices=[0, 1])] == ["unchanged"]
    with pytest.raises(unimem.TooLateError) as info:
        unimem.configure(backend="torch", devices=[1])
    assert info.value.setting == "devices"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_no_warning_for_pending_torch_settings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        applied = unimem.configure(backend="torch", allocator="async", fraction=0.5, devices=[0])
    assert applied.pending and not applied.skipped


@pytest.mark.slow
def test_at_first_forward_runs_once_when_the_gradients_are_gone(pyjson: Any) -> None:
    # find_batch_size's settle call empties torch's cache this way: at the first forward of
    # a step that set its gradients to None, so that the new ones leave the large segments.
    events = pyjson(
        """
        import torch
        from unimem.backends.torch.search import at_first_forward
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        events = []
        def step():
            model.zero_grad(set_to_none=True)
            events.append("zero_grad")
            model(torch.ones(2, 4)).sum().backward()
            events.append("backward")
        def action():
            gone = all(p.grad is None for p in model.parameters())
            events.append("action, gradients None" if gone else "action")
        step()  # gradients exist from here on, as in a training loop
        events.clear()
        with at_first_forward(action):
            step()
            step()
        step()  # the hook is gone after the block
        events.append(len(torch.nn.modules.module._global_forward_pre_hooks))
        emit(events)
        """
    )
    assert events == ["zero_grad", "action, gradients None", "backward"] + ["zero_grad", "backward"] * 2 + [0]
