"""CuPy: the contract, plus its pool's variable, its allocators and its errors, checked against CuPy itself.

This machine has no GPU: ``import cupy`` works and every device call raises
``CUDARuntimeError``. What can be checked here is what unimem does before CuPy
starts (the variable CuPy's pool reads, the allocator installed at import), that
nothing starts CUDA on the way, that a failed device call leaves the figures None,
and that CuPy's real error classes are recognised. The test process never imports
CuPy (it would count as a framework the user imported): each check that needs it
runs in a fresh interpreter.

CuPy must be installed: these tests fail, never skip, without it (CI must not pass by
testing nothing).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
from unimem.backends.cupy import configure as cupy_configure
from unimem.backends.cupy import observe

import unimem
from unimem import registry
from unimem.import_hooks import pending_hooks
from unimem.memory_stats import MemoryStats
from unimem.support import Phase
from unimem.testing import BackendContract

CAP_VAR = cupy_configure.CAP_VAR
FIRST_KEY = "unimem.cupy.first_allocation"
# Ends a start that fails on a machine without a GPU (CUDARuntimeError) without failing the script.
START = "import cupy\ntry:\n    cupy.zeros(4) + 1\nexcept Exception as exc:\n    R['start_error'] = type(exc).__name__"


@pytest.fixture(autouse=True)
def _cupy_installed() -> None:
    if importlib.util.find_spec("cupy") is None:
        pytest.fail("cupy is not installed: pip install cupy-cuda12x (requirements-cpu.txt)", pytrace=False)


class TestCupyContract(BackendContract):
    backend = "cupy"
    module = "cupy"
    start = START
    starts_on_cpu = False  # every device call fails without a GPU: the pool never starts
    env_kwargs = {"devices": [0]}
    env_expect = {"CUDA_VISIBLE_DEVICES": "0"}

    @pytest.mark.covers("cupy:devices")
    def test_configure_before_import_sets_env_and_is_pending(self, run):
        super().test_configure_before_import_sets_env_and_is_pending(run)

    def test_late_configure_raises_too_late(self, monkeypatch):
        """CUDA's driver initialised by another library (CuPy not even imported): the visible
        devices are fixed, and setting them is refused with nothing changed."""
        monkeypatch.setattr(cupy_configure, "driver_initialised", lambda: True)
        before = dict(os.environ)
        with pytest.raises(unimem.TooLateError) as info:
            unimem.configure(backend="cupy", devices=[1])
        assert isinstance(info.value, RuntimeError)
        assert (info.value.backend, info.value.setting) == ("cupy", "devices")
        assert "restart" in str(info.value)
        assert dict(os.environ) == before

    def test_late_configure_lenient_warns_and_skips(self, monkeypatch):
        monkeypatch.setattr(cupy_configure, "driver_initialised", lambda: True)
        before = dict(os.environ)
        with pytest.warns(unimem.UnimemWarning, match="devices"):
            applied = unimem.configure(backend="cupy", devices=[1], strict=False)
        [action] = applied.get("cupy", "devices")
        assert action.status == "skipped" and action.note.startswith("too late")
        assert dict(os.environ) == before

    def test_a_failed_start_is_reported_and_leaves_the_phase(self, run):
        assert run.get("start_error") == "CUDARuntimeError", "a GPU here? the CPU checks assume none"
        assert run["phase_started"] == Phase.IMPORTED


# --- the cap: CuPy's own variable, read by its pool ----------------------------------------

_CAP_SCRIPT = """
import os, sys
import unimem
R = {}
R["applied"] = unimem.configure(backend="cupy", KWARGS).as_dict()
R["imported_at_configure"] = "cupy" in sys.modules
R["env"] = os.environ.get("CUPY_GPU_MEMORY_LIMIT")
import cupy
from cupy.cuda import memory
from unimem.backends.cupy import _pools as pools
R["cupy_reads"] = memory._parse_limit_string()  # what each device's pool passes to set_limit when made
R["phase"] = int(unimem.registry.get_backend("cupy").phase())
R["pools_made"] = pools.device_pools(cupy.get_default_memory_pool())
R["driver_initialised"] = pools.driver_initialised()
R["again"] = unimem.configure(backend="cupy", KWARGS).as_dict()
emit(R)
"""


@pytest.mark.covers("cupy:fraction")
def test_fraction_before_import_is_pending_and_cupys_pool_reads_it(pyjson):
    out = pyjson(_CAP_SCRIPT.replace("KWARGS", "fraction=0.25"))
    [action] = out["applied"]["actions"]
    assert (action["method"], action["status"], action["target"]) == ("env", "pending", f"{CAP_VAR}=25%")
    assert out["imported_at_configure"] is False
    assert out["cupy_reads"] == {"size": None, "fraction": 0.25}
    assert out["phase"] == Phase.IMPORTED, "importing CuPy must not start it"
    assert out["pools_made"] == {}, "the pool was made before any allocation"
    assert out["driver_initialised"] is False, "unimem or the import initialised CUDA's driver"
    assert {a["status"] for a in out["again"]["actions"]} == {"unchanged"}


@pytest.mark.covers("cupy:limit")
def test_limit_before_import_is_pending_in_bytes(pyjson):
    out = pyjson(_CAP_SCRIPT.replace("KWARGS", "limit='1GiB'"))
    [action] = out["applied"]["actions"]
    assert (action["status"], action["target"], action["value"]) == ("pending", f"{CAP_VAR}={1 << 30}", 1 << 30)
    assert out["cupy_reads"] == {"size": 1 << 30, "fraction": None}


def test_a_fraction_becomes_a_percentage_cupy_parses_back():
    applied = unimem.configure(backend="cupy", fraction=1 / 3)
    [action] = applied.get("cupy", "fraction")
    assert os.environ[CAP_VAR] == "33.3333%"
    assert action.status == "pending"
    assert "cupy" not in sys.modules


# --- allocators: set at import or at CuPy's first allocation ----------------------------------

_ALLOCATOR_SCRIPT = """
import sys
import unimem
from unimem import registry
from unimem.import_hooks import pending_hooks
adapter = registry.get_backend("cupy")
R = {}
def actions(applied):
    return [(a.method, a.status, a.target) for a in applied]
R["async_before_import"] = actions(unimem.configure(backend="cupy", allocator="async"))
R["hooks"] = pending_hooks("cupy")
import cupy
from unimem.backends.cupy import _pools as pools
first = cupy.cuda.get_allocator()
R["installed_at_import"] = type(first).__name__
R["reads_as"] = pools.allocator_in_use(cupy)[0]
R["phase_imported"] = int(adapter.phase())
try:
    cupy.zeros(4)
except Exception as exc:
    R["first_allocation_error"] = type(exc).__name__
R["still_waiting"] = cupy.cuda.get_allocator() is first and not first.done
R["phase_after_failure"] = int(adapter.phase())
R["uncached_while_waiting"] = actions(unimem.configure(backend="cupy", allocator="uncached"))
R["waiting_for"] = first.allocator
first.done = True  # as after a first allocation that succeeded: from here on configure sets the allocator
cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
R["uncached"] = actions(unimem.configure(backend="cupy", allocator="uncached"))
R["uncached_is_raw"] = pools.allocator_in_use(cupy)[0]
R["default"] = actions(unimem.configure(backend="cupy", allocator="default"))
R["default_is_the_pool"] = cupy.cuda.get_allocator() == cupy.get_default_memory_pool().malloc
R["default_again"] = actions(unimem.configure(backend="cupy", allocator="default"))
R["async_after_import"] = actions(unimem.configure(backend="cupy", allocator="async"))
R["stats"] = unimem.stats("cupy").as_dict()
emit(R)
"""


@pytest.mark.covers("cupy:allocator.async", "cupy:allocator.default", "cupy:allocator.uncached")
def test_allocators_are_set_through_cupys_set_allocator_without_starting_it(pyjson):
    out = pyjson(_ALLOCATOR_SCRIPT)
    [(method, status, target)] = out["async_before_import"]
    assert (method, status) == ("hook", "pending")
    assert target.startswith("cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)")
    assert out["hooks"] == [FIRST_KEY]
    assert out["installed_at_import"] == "FirstAllocation"
    assert out["reads_as"] == "async"
    assert out["phase_imported"] == out["phase_after_failure"] == Phase.IMPORTED
    # MemoryAsyncPool() fails without a GPU: the first allocation raises and nothing changed.
    assert out["first_allocation_error"] == "CUDARuntimeError"
    assert out["still_waiting"] is True
    assert [s for _, s, _ in out["uncached_while_waiting"]] == ["pending"]
    assert out["waiting_for"] == "uncached"
    assert out["uncached"] == [["api", "applied", "cupy.cuda.set_allocator(None)"]]
    assert out["uncached_is_raw"] == "raw"
    assert out["default"][0][:2] == ["api", "applied"]
    assert out["default_is_the_pool"] is True
    assert out["default_again"][0][1] == "unchanged"
    # Not started: MemoryAsyncPool() would start CUDA on every device now, so it waits.
    assert out["async_after_import"][0][:2] == ["hook", "pending"]
    assert all(out["stats"][k] is None for k in ("allocated", "reserved", "limit", "device_total"))


@pytest.mark.covers("cupy:allocator.expandable")
def test_expandable_is_unsupported_and_changes_nothing():
    assert not unimem.capabilities("cupy")["allocator.expandable"].supported
    before = dict(os.environ)
    with pytest.raises(unimem.UnsupportedFeature) as info:
        unimem.configure(backend="cupy", allocator="expandable")
    assert (info.value.backend, info.value.feature) == ("cupy", "allocator")
    assert "async" in str(info.value)
    assert dict(os.environ) == before
    assert pending_hooks("cupy") == []


# --- growth and preallocation ----------------------------------------------------------------


@pytest.mark.covers("cupy:preallocate", "cupy:growth")
def test_preallocation_waits_for_the_first_allocation_and_growth_cancels_it():
    applied = unimem.configure(backend="cupy", growth=False)
    [action] = applied.get("cupy", "growth")
    assert (action.method, action.status) == ("hook", "pending")
    assert "first allocation" in action.target
    assert pending_hooks("cupy") == [FIRST_KEY]
    first = registry.get_backend("cupy")._pending.waiting()
    assert first is not None and first.preallocate is True
    [again] = unimem.configure(backend="cupy", growth=False).get("cupy", "growth")
    assert again.status == "unchanged"
    [cancel] = unimem.configure(backend="cupy", growth=True).get("cupy", "growth")
    assert (cancel.status, cancel.method) == ("applied", "none")
    assert first.preallocate is False
    [plain] = unimem.configure(backend="cupy", growth=True).get("cupy", "growth")
    assert plain.status == "unchanged"
    assert "cupy" not in sys.modules


# --- bad input changes nothing ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"fraction": 1.5}, "fraction"),
        ({"allocator": "async", "fraction": 0.5}, "fraction"),
        ({"allocator": "uncached", "limit": "1GiB"}, "limit"),
        ({"allocator": "uncached", "growth": False}, "growth"),
        ({"allocator": "fast"}, "allocator"),
        ({"devices": [-1]}, "devices"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(kwargs, parameter):
    before = dict(os.environ)
    with pytest.raises(unimem.ConfigError) as info:
        unimem.configure(backend="cupy", **kwargs)
    assert info.value.parameter == parameter
    assert dict(os.environ) == before
    assert pending_hooks("cupy") == []
    assert registry.get_backend("cupy")._pending.waiting() is None


def test_preallocation_and_a_poolless_allocator_refuse_each_other_across_calls():
    unimem.configure(backend="cupy", allocator="async")
    with pytest.raises(unimem.ConfigError) as info:
        unimem.configure(backend="cupy", growth=False)
    assert info.value.parameter == "growth" and "MemoryPool" in str(info.value)
    unimem.configure(backend="cupy", allocator="default", growth=False)
    with pytest.raises(unimem.ConfigError) as info:
        unimem.configure(backend="cupy", allocator="uncached")
    assert info.value.parameter == "allocator" and "growth=True" in str(info.value)
    applied = unimem.configure(backend="cupy", allocator="uncached", growth=True)  # cancelled in the same call
    assert [a.status for a in applied] == ["pending", "applied"]


# --- out-of-memory errors: CuPy's real classes -----------------------------------------------------

_OOM_SCRIPT = """
import unimem
from unimem import registry
from cupy.cuda.memory import OutOfMemoryError
from cupy_backends.cuda.api.runtime import CUDARuntimeError
adapter = registry.get_backend("cupy").diagnose
capped = OutOfMemoryError(1024, 0, 4096)
uncapped = OutOfMemoryError(3 << 30, 5 << 30)
raw = CUDARuntimeError(2)  # cudaErrorMemoryAllocation: plain cudaMalloc, no pool
no_driver = CUDARuntimeError(35)  # cudaErrorInsufficientDriver: what this machine raises
R = {}
for name, exc in (("capped", capped), ("uncapped", uncapped), ("raw", raw), ("no_driver", no_driver)):
    R[name] = {
        "message": str(exc),
        "is_oom": unimem.is_oom(exc),
        "recognised": adapter.recognises_oom(exc, str(exc)),
        "owned": adapter.owns_error(exc),
        "requested": adapter.requested_bytes(str(exc)),
    }
try:
    raise RuntimeError("step failed") from capped
except RuntimeError as wrapped:
    R["wrapped_is_oom"] = unimem.is_oom(wrapped)
emit(R)
"""


@pytest.mark.covers("cupy:oom")
def test_cupys_out_of_memory_errors_are_recognised_and_others_are_not(pyjson):
    out = pyjson(_OOM_SCRIPT)
    assert out["capped"]["message"].startswith("Out of memory allocating 1,024 bytes")
    for name in ("capped", "uncapped", "raw"):
        assert out[name]["is_oom"] is True, name
        assert out[name]["recognised"] is True, name
        assert out[name]["owned"] is True, name
    assert out["capped"]["requested"] == [1024, "Out of memory allocating 1,024 bytes"]
    assert out["uncapped"]["requested"][0] == 3 << 30
    assert out["raw"]["requested"] is None
    assert out["no_driver"]["is_oom"] is False
    assert out["no_driver"]["recognised"] is False
    assert out["no_driver"]["owned"] is True
    assert out["wrapped_is_oom"] is True


def test_requested_bytes_reads_both_of_the_pools_messages():
    adapter = registry.get_backend("cupy").diagnose
    with_limit = (
        "Out of memory allocating 2,097,152 bytes (allocated so far: 1,024 bytes, limit set to: 1,048,576 bytes)."
    )
    without = "Out of memory allocating 512 bytes (allocated so far: 0 bytes)."
    assert adapter.requested_bytes(with_limit) == (2_097_152, "Out of memory allocating 2,097,152 bytes")
    assert adapter.requested_bytes(without) == (512, "Out of memory allocating 512 bytes")
    assert adapter.requested_bytes("cudaErrorMemoryAllocation: out of memory") is None


def test_recognition_needs_no_import_and_reads_classes_by_module():
    """Stand-in classes named as CuPy's: recognised by module and name, nothing imported."""
    oom = type("OutOfMemoryError", (MemoryError,), {"__module__": "cupy.cuda.memory"})
    runtime = type("CUDARuntimeError", (RuntimeError,), {"__module__": "cupy_backends.cuda.api.runtime"})
    cublas = type("CUBLASError", (RuntimeError,), {"__module__": "cupy_backends.cuda.libs.cublas"})
    elsewhere = type("OutOfMemoryError", (Exception,), {"__module__": "somewhere.else"})
    adapter = registry.get_backend("cupy").diagnose
    assert adapter.recognises_oom(oom("x"), "x")
    assert adapter.recognises_oom(runtime("m"), "cudaErrorMemoryAllocation: out of memory")
    assert adapter.recognises_oom(cublas("m"), "CUBLAS_STATUS_ALLOC_FAILED")
    assert not adapter.recognises_oom(runtime("m"), "cudaErrorIllegalAddress: an illegal memory access")
    assert not adapter.recognises_oom(elsewhere("x"), "Out of memory allocating 1 bytes")
    assert "cupy" not in sys.modules


# --- the rest of the adapter, as data ------------------------------------------------------------


def test_precision_is_unsupported_and_names_astype():
    caps = unimem.capabilities("cupy")
    for feature in ("precision.bf16", "precision.fp16", "precision.loss_scaling"):
        assert not caps[feature].supported and "astype" in caps[feature].note
    with pytest.raises(unimem.UnsupportedFeature) as info:
        registry.get_backend("cupy").precision.device()
    assert "astype" in str(info.value)


def test_the_cap_rows_say_what_the_pool_leaves_out():
    caps = unimem.capabilities("cupy")
    for feature in ("fraction", "limit"):
        assert "CUDA context" in caps[feature].note and "cuBLAS" in caps[feature].note
        assert CAP_VAR in caps[feature].api
    assert "MemoryHook" in caps["stats.peak"].api


def test_phase_and_stats_before_import_start_nothing():
    adapter = registry.get_backend("cupy")
    assert adapter.phase() is Phase.NOT_IMPORTED
    snapshot = adapter.stats(0, nvml=False)
    assert isinstance(snapshot, MemoryStats) and snapshot.allocated is None and snapshot.peak_allocated is None
    assert adapter.clear_cache() == 0
    assert adapter.fragmentation() is None
    assert adapter.device_uuid(0) is None
    reader, note = adapter.observe.counter_reader(0)
    assert reader is not None and reader() == (None, None) and note == ""
    assert "cupy" not in sys.modules


def test_device_uuid_is_spelled_as_nvml_spells_it():
    raw = bytes.fromhex("9cbe5d124e7c2cef794f5dcf7ce90968")
    assert observe.uuid_text(raw) == "GPU-9cbe5d12-4e7c-2cef-794f-5dcf7ce90968"
    assert observe.uuid_text(b"short") is None and observe.uuid_text(None) is None


def test_search_hooks_hold_the_pools_overhead_against_the_cap():
    adapter = registry.adapter_class("cupy")().search
    assert adapter.release_every_trial is True
    assert adapter.pool_overhead(100, 160) == 60
    assert adapter.pool_overhead(None, 160) == 0
    snapshot = MemoryStats("cupy", 0, reserved=1000, limit=5000, device_free=3000)
    assert adapter.search_capacity(snapshot) == 4000
