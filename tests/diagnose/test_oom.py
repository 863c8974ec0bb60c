"""Out-of-memory errors: recognised in every framework, explained by ``oom_guard``.

Real OOMs come from each framework in a fresh subprocess (one per framework, shared by
that framework's tests): asking for ``1 << 58`` bytes fails at once on the CPU. Each run
also raises a non-OOM error of the same framework (a shape mismatch) that must not
count, wraps the OOM in other errors, and runs the guard over a step that holds a
tensor when it fails. The rules themselves (messages, chains, ranking) are tested here
in-process, without any framework, so they also prove ``is_oom`` imports none.
"""

from __future__ import annotations

import json
import weakref
from typing import Any

import pytest
from conftest import run_framework_script

import unimem
from unimem.diagnose.guard import find_oom, framework_of, requested_bytes
from unimem.diagnose.report import OOMReport, PoolUse, _suggest
from unimem.diagnose.rules import _accumulation
from unimem.memory_stats import MemoryStats
from unimem.pool_fragmentation import Fragmentation

GiB = 1 << 30

# --- the real thing, one subprocess per framework ---------------------------------------------

_FRAMEWORK_CODE = {
    "torch": """
import torch
def hold(): return torch.ones(256, 1024)
def boom(): torch.empty(1 << 58, dtype=torch.uint8)
def shape_error(): torch.ones(3, 4) @ torch.ones(5, 6)
""",
    "jax": """
import jax.numpy as jnp
def hold(): return jnp.ones((256, 1024)).block_until_ready()
def boom(): jnp.zeros(1 << 58, dtype=jnp.uint8).block_until_ready()
def shape_error(): jnp.ones((3, 4)) @ jnp.ones((5, 6))
""",
    "tensorflow": """
import tensorflow as tf
def hold(): return tf.ones((256, 1024))
def boom(): tf.zeros([1 << 58], tf.uint8)
def shape_error(): tf.matmul(tf.ones((3, 4)), tf.ones((5, 6)))
""",
}

_SCRIPT = r"""
import gc, json, sys, weakref
import unimem
from unimem.diagnose.guard import framework_of, requested_bytes
FW = FRAMEWORK
R = {}
# TensorFlow itself imports JAX when it is installed: compare with what the framework loaded.
R["loaded_by_framework"] = sorted(m for m in ("torch", "jax", "tensorflow") if m in sys.modules)

def caught(fn):
    try:
        fn()
    except BaseException as exc:
        return exc
    raise AssertionError(f"{fn.__name__} raised nothing")

def name(exc):
    return f"{type(exc).__module__}.{type(exc).__qualname__}"

oom = caught(boom)
R["oom_type"], R["oom_is_oom"], R["oom_framework"] = name(oom), unimem.is_oom(oom), framework_of(oom)
found = requested_bytes(str(oom))
R["oom_requested"] = None if found is None else found[0]
shape = caught(shape_error)
R["shape_type"], R["shape_is_oom"] = name(shape), unimem.is_oom(shape)
del oom

def raised_from():
    try:
        boom()
    except Exception as exc:
        raise RuntimeError("step 3 failed") from exc

def raised_during():
    try:
        boom()
    except Exception:
        raise KeyError("cleanup failed")

def raised_from_none():
    try:
        boom()
    except Exception:
        raise KeyError("cleanup failed") from None

def shape_wrapped():
    try:
        shape_error()
    except Exception as exc:
        raise RuntimeError("step 3 failed") from exc

R["wrapped_cause"] = unimem.is_oom(caught(raised_from))
R["wrapped_context"] = unimem.is_oom(caught(raised_during))
R["wrapped_from_none"] = unimem.is_oom(caught(raised_from_none))
R["wrapped_shape"] = unimem.is_oom(caught(shape_wrapped))
R["group"] = unimem.is_oom(ExceptionGroup("steps", [ValueError("x"), caught(boom)]))
R["group_shape"] = unimem.is_oom(ExceptionGroup("steps", [ValueError("x"), shape]))
del shape

refs = []
def step():
    activations = hold()
    refs.append(weakref.ref(activations))
    boom()

try:
    with unimem.oom_guard(batch_size=64):
        step()
except unimem.OutOfMemory as exc:
    R["cause_type"] = name(exc.__cause__)
    R["is_memory_error"] = isinstance(exc, MemoryError)
    R["message_is_report"] = str(exc) == str(exc.report)
    R["report"] = exc.report.as_dict()
    R["json"] = json.dumps(exc.report.as_dict()) is not None
    R["text"] = str(exc.report)
R["held_after_guard"] = sum(r() is not None for r in refs)

refs.clear()
try:
    with unimem.oom_guard(keep_frames=True):
        step()
except unimem.OutOfMemory as exc:
    kept = exc
R["held_with_keep_frames"] = sum(r() is not None for r in refs)
del kept
gc.collect()
R["held_after_keep_frames_released"] = sum(r() is not None for r in refs)

@unimem.oom_guard
def bare():
    boom()

@unimem.oom_guard(batch_size=8)
def with_args():
    boom()

R["decorator_bare"] = type(caught(bare)).__name__
R["decorator_args"] = type(caught(with_args)).__name__
R["decorator_keeps_name"] = bare.__name__

def guarded_shape():
    with unimem.oom_guard():
        shape_error()
R["guard_non_oom"] = name(caught(guarded_shape))

R["fragmentation"] = unimem.fragmentation(FW).as_dict()
R["summary"] = unimem.summary(FW)
R["frameworks_loaded"] = sorted(m for m in ("torch", "jax", "tensorflow") if m in sys.modules)
emit(R)
"""


@pytest.fixture(params=["torch", "jax", "tensorflow"])
def real(request: Any, need: Any) -> tuple[str, dict[str, Any]]:
    need(request.param)
    return request.param, run_framework_script(request.param, _FRAMEWORK_CODE, _SCRIPT)


_OOM_TYPES = {
    "torch": "builtins.RuntimeError",  # the CPU allocator's OOM is not torch.OutOfMemoryError
    "jax": "jax.errors.JaxRuntimeError",
    "tensorflow": "tensorflow.python.framework.errors_impl.ResourceExhaustedError",
}


@pytest.mark.covers("torch:oom", "jax:oom", "tensorflow:oom")
@pytest.mark.slow
def test_real_oom_of_each_framework_is_recognised(real: tuple[str, dict[str, Any]]) -> None:
    framework, run = real
    assert run["oom_type"] == _OOM_TYPES[framework]
    assert run["oom_is_oom"] is True
    assert run["oom_framework"] == framework
    assert framework in run["loaded_by_framework"]
    assert run["frameworks_loaded"] == run["loaded_by_framework"], "unimem imported another framework"


@pytest.mark.covers("torch:oom", "jax:oom", "tensorflow:oom")
@pytest.mark.slow
def test_a_shape_error_of_each_framework_is_not_an_oom(real: tuple[str, dict[str, Any]]) -> None:
    _, run = real
    assert run["shape_is_oom"] is False, run["shape_type"]
    assert run["wrapped_shape"] is False
    assert run["group_shape"] is False
    assert run["guard_non_oom"] == run["shape_type"], "the guard must let other errors through untouched"


@pytest.mark.covers("torch:oom", "jax:oom", "tensorflow:oom")
@pytest.mark.slow
def test_wrapped_real_ooms_are_recognised(real: tuple[str, dict[str, Any]]) -> None:
    _, run = real
    assert run["wrapped_cause"] is True  # raise ... from oom
    assert run["wrapped_context"] is True  # an error raised while handling the OOM
    assert run["group"] is True  # inside an ExceptionGroup
    assert run["wrapped_from_none"] is False  # raise ... from None hides the OOM on purpose


@pytest.mark.slow
def test_the_requested_bytes_are_read_from_each_real_message(real: tuple[str, dict[str, Any]]) -> None:
    _, run = real
    assert run["oom_requested"] == 1 << 58
    assert run["report"]["requested_bytes"] == 1 << 58


@pytest.mark.covers("torch:oom", "jax:oom", "tensorflow:oom")
@pytest.mark.slow
def test_guard_raises_out_of_memory_with_the_original_as_cause(real: tuple[str, dict[str, Any]]) -> None:
    _, run = real
    assert run["cause_type"] == run["oom_type"]
    assert run["is_memory_error"] is True
    assert run["message_is_report"] is True
    assert run["decorator_bare"] == "OutOfMemory" and run["decorator_args"] == "OutOfMemory"
    assert run["decorator_keeps_name"] == "bare"


@pytest.mark.slow
def test_report_names_the_live_tensor_and_ranks_suggestions(real: tuple[str, dict[str, Any]]) -> None:
    framework, run = real
    report = run["report"]
    assert report["framework"] == framework and report["place"] == "cpu"
    assert report["capacity"] and report["capacity"] < 1 << 58  # the machine's memory
    own = next(entry for entry in report["live"] if entry["framework"] == framework)
    shapes = [item["shape"] for item in own["largest"]]
    assert [256, 1024] in shapes, f"the failed step's tensor is missing from {shapes}"
    kinds = [s["kind"] for s in report["suggestions"]]
    assert kinds[0] == "too-large"  # 256 PiB is more than any machine: a shape is wrong
    assert "smaller-batch" in kinds and "checkpointing" in kinds
    smaller = next(s for s in report["suggestions"] if s["kind"] == "smaller-batch")
    assert "32 with 2" in smaller["action"] and "same global batch" in smaller["action"]
    assert [s["rank"] for s in report["suggestions"]] == list(range(1, len(kinds) + 1))
    assert run["json"] is True
    assert f"{framework} ran out of memory on cpu" in run["text"]
    assert "What to try, most promising first:" in run["text"]


@pytest.mark.slow
def test_guard_drops_the_failed_steps_tensors(real: tuple[str, dict[str, Any]]) -> None:
    _, run = real
    assert run["held_after_guard"] == 0, "the failed step's tensor outlived the guard"
    # The control: keeping the frames keeps the tensor, so the check above can fail.
    assert run["held_with_keep_frames"] == 1
    assert run["held_after_keep_frames_released"] == 0


@pytest.mark.covers("tensorflow:fragmentation")
@pytest.mark.slow
def test_fragmentation_on_the_cpu_is_unknown_not_zero(real: tuple[str, dict[str, Any]]) -> None:
    framework, run = real
    frag = run["fragmentation"]
    assert frag["backend"] == framework
    assert frag["free_in_pool"] is None and frag["largest_free_block"] is None and frag["share"] is None
    assert "fragmentation" in run["summary"] and "n/a" in run["summary"]


# --- the rules, without any framework ------------------------------------------------------------


def _stand_in(module: str, name: str, base: type[BaseException] = RuntimeError) -> type[BaseException]:
    """A class that looks like a framework's error (module and name): no framework is imported."""
    return type(name, (base,), {"__module__": module})


TORCH_CUDA = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
    "1.38 GiB is free. Including non-PyTorch memory, this process has 77.75 GiB memory in use. Of the allocated "
    "memory 75.12 GiB is allocated by PyTorch, and 1.98 GiB is reserved by PyTorch but unallocated. If reserved "
    "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation."
)
TORCH_MPS = (
    "MPS backend out of memory (MPS allocated: 1.20 GB, other allocations: 4.43 GB, max allowed: 9.07 GB). "
    "Tried to allocate 256.00 MB on private pool."
)
JAX_GPU = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes."
XLA_BFC = "RESOURCE_EXHAUSTED: Failed to allocate request for 2.00GiB (2147483648B) on device ordinal 0"
TF_GPU = (
    "OOM when allocating tensor with shape[64,1024,1024] and type float on "
    "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc"
)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (TORCH_CUDA, 2 * GiB),
        (TORCH_MPS, 256 << 20),
        ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 ...", 20 << 20),
        ("CUDA out of memory. Tried to allocate 512 bytes.", 512),
        ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4096 bytes. Error code 12", 4096),
        (JAX_GPU, 17179869184),
        (XLA_BFC, 2147483648),
        ("RESOURCE_EXHAUSTED: Out of memory allocating 1024 bytes.", 1024),
        # jaxlib 0.11.2 on an H200 (benchmarks/results/sharing-gpu.json): a rounded size
        (
            "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB with allocator GPU_0_bfc on device 0.",
            GiB,
        ),
        (TF_GPU, 64 * 1024 * 1024 * 4),
        (TF_GPU.replace("type float", "type half"), 64 * 1024 * 1024 * 2),
        (TF_GPU.replace("shape[64,1024,1024]", "shape[]"), 4),  # a scalar
        (TF_GPU.replace("type float", "type int4"), 64 * 1024 * 1024 // 2),
        (TF_GPU.replace("type float", "type string"), None),  # no fixed size: unknown, not a guess
        ("out of memory", None),
    ],
)
def test_requested_bytes_from_each_frameworks_message(message: str, expected: int | None) -> None:
    found = requested_bytes(message)
    assert (None if found is None else found[0]) == expected
    if found is not None:
        assert found[1] in message


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (MemoryError(), True),
        (unimem.OutOfMemory("x"), True),
        (RuntimeError(TORCH_CUDA), True),
        (RuntimeError(TORCH_MPS), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"), True),
        (_stand_in("torch", "OutOfMemoryError")("anything"), True),
        (_stand_in("torch.cuda", "OutOfMemoryError")("anything"), True),
        (_stand_in("jax.errors", "JaxRuntimeError")(JAX_GPU), True),
        (_stand_in("jaxlib.xla_extension", "XlaRuntimeError")(XLA_BFC), True),
        (_stand_in("tensorflow.python.framework.errors_impl", "ResourceExhaustedError", Exception)(TF_GPU), True),
        # RESOURCE_EXHAUSTED about something other than memory is not an OOM...
        (_stand_in("jax.errors", "JaxRuntimeError")("RESOURCE_EXHAUSTED: too many open files"), False),
        (
            _stand_in("tensorflow.python.framework.errors_impl", "ResourceExhaustedError", Exception)("quota"),
            False,
        ),
        # ...and neither is the status quoted in an error of another type.
        (RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8 bytes"), False),
        (_stand_in("jax.errors", "JaxRuntimeError")("INVALID_ARGUMENT: shapes"), False),
        (_stand_in("mylib", "OutOfMemoryError")("not torch's"), False),
        (RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED."), False),
        (ValueError("out of memory"), False),
        (KeyboardInterrupt(), False),
        (None, False),
        ("CUDA out of memory", False),  # a string is not an error
    ],
)
def test_is_oom_rules(error: object, expected: bool) -> None:
    assert unimem.is_oom(error) is expected


def test_chains_are_followed_and_cycles_end() -> None:
    outer = ValueError("outer")
    inner = KeyError("inner")
    outer.__context__ = inner
    inner.__context__ = outer  # a cycle
    assert unimem.is_oom(outer) is False
    inner.__cause__ = MemoryError()
    assert unimem.is_oom(outer) is True
    assert isinstance(find_oom(outer), MemoryError)


def test_an_interrupt_is_never_an_oom_even_while_handling_one() -> None:
    interrupt = KeyboardInterrupt()
    interrupt.__context__ = MemoryError()
    assert unimem.is_oom(interrupt) is False
    with pytest.raises(KeyboardInterrupt), unimem.oom_guard():
        try:
            raise MemoryError
        except MemoryError:
            raise KeyboardInterrupt  # noqa: B904 -- the OOM stays its __context__ on purpose


def test_framework_of_reads_the_class_module() -> None:
    assert framework_of(_stand_in("jax.errors", "JaxRuntimeError")("x")) == "jax"
    assert framework_of(_stand_in("tensorflow.python.framework.errors_impl", "ResourceExhaustedError")("x")) == (
        "tensorflow"
    )
    assert framework_of(RuntimeError(TORCH_CUDA)) == "torch"
    assert framework_of(MemoryError()) is None


class _Held:
    """A stand-in for a tensor: something a step's frame holds, that a weakref can watch."""


def test_guard_in_python_clears_the_frames_and_keeps_them_on_request() -> None:
    refs: list[weakref.ref[_Held]] = []

    def step() -> None:
        held = _Held()
        refs.append(weakref.ref(held))
        raise MemoryError

    with pytest.raises(unimem.OutOfMemory) as info, unimem.oom_guard(batch_size=6):
        step()
    assert isinstance(info.value.__cause__, MemoryError)
    report = info.value.report
    assert isinstance(report, OOMReport)
    assert report.framework is None and report.place == "cpu" and report.batch_size == 6
    assert refs[0]() is None
    with pytest.raises(unimem.OutOfMemory) as info, unimem.oom_guard(keep_frames=True):
        step()
    assert refs[1]() is not None  # alive while the exception (and its frames) is


def test_guard_lets_other_errors_and_inner_guards_through() -> None:
    error = ValueError("not memory")
    with pytest.raises(ValueError) as info, unimem.oom_guard():
        raise error
    assert info.value is error
    with pytest.raises(unimem.OutOfMemory) as outer, unimem.oom_guard(), unimem.oom_guard(batch_size=4):
        raise MemoryError
    assert outer.value.report.batch_size == 4  # the inner guard's report, not wrapped again
    with unimem.oom_guard():
        pass  # no error: nothing happens


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"backend": "nope"}, "backend"),
        ({"device": -1}, "device"),
        ({"device": True}, "device"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"mixed_precision": "yes"}, "mixed_precision"),
        ({"top": -1}, "top"),
        ({"keep_frames": 1}, "keep_frames"),
    ],
)
def test_guard_rejects_bad_arguments(kwargs: dict[str, Any], parameter: str) -> None:
    with pytest.raises(unimem.ConfigError) as info:
        unimem.oom_guard(**kwargs)
    assert info.value.parameter == parameter


# --- ranking, from figures a GPU failure would give ------------------------------------------------


def _gpu_stats(**figures: int) -> MemoryStats:
    base = {"allocated": 30 * GiB, "reserved": 33 * GiB, "limit": 35 * GiB, "device_total": 140 * GiB}
    base.update(figures)
    return MemoryStats("torch", 0, **base)  # type: ignore[arg-type]


def _kinds(**overrides: Any) -> list[str]:
    args: dict[str, Any] = {
        "framework": "torch",
        "requested": 1 * GiB,
        "capacity": 35 * GiB,
        "snapshot": _gpu_stats(),
        "frag": None,
        "live": [],
        "pools": [],
        "batch_size": 64,
        "precision": (None, "unknown"),
        "place": "cuda:0",
    }
    args.update(overrides)
    return [s.kind for s in _suggest(**args)]


def test_fragmentation_with_room_ranks_the_allocator_first() -> None:
    frag = Fragmentation("torch", 0, free_in_pool=3 * GiB, largest_free_block=512 << 20, free_blocks=40)
    assert _kinds(frag=frag)[0] == "allocator"
    # TF has no expandable segments: no allocator suggestion whatever the figures.
    assert "allocator" not in _kinds(framework="tensorflow", frag=frag)
    # Little fragmentation: nothing to gain from the allocator.
    calm = Fragmentation("torch", 0, free_in_pool=3 * GiB, largest_free_block=3 * GiB - 1, free_blocks=2)
    assert "allocator" not in _kinds(frag=calm)


def test_another_frameworks_idle_pool_ranks_first() -> None:
    jax_pool = PoolUse("jax", allocated=1 * GiB, reserved=100 * GiB, limit=105 * GiB)
    suggestions = _suggest(
        "torch", 2 * GiB, 35 * GiB, _gpu_stats(), None, [], [jax_pool], 64, (None, "unknown"), "cuda:0"
    )
    assert suggestions[0].kind == "free-other-pool"
    assert suggestions[0].code == 'unimem.configure(backend="jax", growth=True)'
    torch_pool = PoolUse("torch", allocated=1 * GiB, reserved=20 * GiB, limit=None)
    assert _kinds(framework="jax", pools=[torch_pool])[0] == "free-other-pool"


def test_a_request_larger_than_everything_ranks_first() -> None:
    assert _kinds(requested=200 * GiB)[0] == "too-large"


def test_a_request_of_petabytes_reads_in_petabytes() -> None:
    """The CPU's OOM asks for 2**58 bytes: 256 PiB, not 262144 TiB."""
    args: dict[str, Any] = {"framework": "torch", "capacity": 24 * GiB, "snapshot": None, "frag": None, "live": []}
    args.update(pools=[], batch_size=None, precision=(None, "unknown"), place="cpu")
    too_large = _suggest(requested=1 << 58, **args)[0]
    report = OOMReport("torch", 0, "cpu", "RuntimeError", "no room", requested_bytes=1 << 58, suggestions=(too_large,))
    text = str(report)
    assert "asking for 256.00 PiB" in text and "TiB" not in text
    assert too_large.kind == "too-large" and "256.00 PiB" in too_large.why


def test_smaller_batch_keeps_the_global_batch() -> None:
    suggestions = _suggest("torch", 4 * GiB, 32 * GiB, _gpu_stats(), None, [], [], 64, (None, "?"), "cuda:0")
    smaller = next(s for s in suggestions if s.kind == "smaller-batch")
    assert smaller.action.startswith("Use micro-batches of 32 with 2 ")
    assert smaller.code is not None and "batch.split(32)" in smaller.code
    prime = next(
        s
        for s in _suggest("torch", 4 * GiB, 32 * GiB, _gpu_stats(), None, [], [], 67, (None, "?"), "cuda:0")
        if s.kind == "smaller-batch"
    )
    assert "a global batch of 68 (was 67)" in prime.action


def test_mixed_precision_ranks_by_what_is_known() -> None:
    assert "mixed-precision" not in _kinds(precision=(True, "autocast"))
    # Known off, it ranks above checkpointing; unknown, below (allocated >> live: checkpointing is strong).
    off = _kinds(precision=(False, "float32"))
    unknown = _kinds(precision=(None, "?"))
    assert off.index("mixed-precision") < off.index("checkpointing")
    assert unknown.index("mixed-precision") > unknown.index("checkpointing")


def test_jax_on_a_gpu_says_to_retry_in_a_fresh_process() -> None:
    # XLA keeps a failed step's outputs in use: a retry in the same process fits less.
    kinds = _kinds(framework="jax", snapshot=_gpu_stats(limit=140 * GiB), place="gpu:0")
    assert kinds.index("smaller-batch") < kinds.index("fresh-process") < kinds.index("mixed-precision")
    assert "fresh-process" not in _kinds(framework="jax", place="cpu:0")
    assert "fresh-process" not in _kinds(framework="torch")


def test_a_raised_cap_is_suggested_when_the_device_has_room() -> None:
    capped = _gpu_stats(limit=35 * GiB, device_free=90 * GiB)
    assert "raise-cap" in _kinds(snapshot=capped)
    assert "raise-cap" not in _kinds(snapshot=_gpu_stats(limit=140 * GiB, device_free=90 * GiB))


@pytest.mark.parametrize(
    ("batch", "at_least", "expected"),
    [(64, 2, (32, 2)), (64, 3, (16, 4)), (96, 5, (16, 6)), (67, 2, (34, 2)), (2, 9, (1, 2)), (12, 2, (6, 2))],
)
def test_accumulation_prefers_an_exact_split(batch: int, at_least: int, expected: tuple[int, int]) -> None:
    assert _accumulation(batch, at_least) == expected


def test_report_reads_well_and_is_json_ready() -> None:
    with pytest.raises(unimem.OutOfMemory) as info, unimem.oom_guard(batch_size=10, mixed_precision=False):
        raise MemoryError("no room")
    report = info.value.report
    data = report.as_dict()
    assert json.loads(json.dumps(data))["batch_size"] == 10
    assert data["mixed_precision"] is False and data["suggestions"][0]["rank"] == 1
    text = str(report)
    assert text.startswith("Python ran out of memory on cpu.")
    assert "micro-batches of 5 with 2" in text
