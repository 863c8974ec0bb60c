"""TensorFlow's side of an out-of-memory diagnosis: its errors, its messages, its live tensors.

Recognition reads class names, modules and messages only, so it needs no TensorFlow
import. The rest reads the modules TensorFlow already loaded, through ``sys.modules``.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any

from unimem.backends.base import Diagnose, error_class_in

from unimem.live_memory import LiveMemory, LiveObject, Tally

_EXHAUSTED = (("tensorflow", "ResourceExhaustedError"),)
# What makes a RESOURCE_EXHAUSTED status about memory: the status also reports quotas and
# file systems, which a smaller batch does not fix.
_MEMORY_PHRASES = re.compile(
    r"\bOOM\b|out of memory|ran out of memory|failed to allocate|trying to allocate|allocating",
    re.IGNORECASE,
)
_SHAPE = re.compile(r"OOM when allocating tensor with shape\[([0-9,\s]*)\] and type (\w+)")
_DEVICE = re.compile(r"device:(GPU|CPU):(\d+)")
# Bytes per element of the dtype names TF prints (DataTypeString); 4-bit types round up.
_DTYPE_BYTES: dict[str, float] = {
    "float": 4,
    "double": 8,
    "half": 2,
    "bfloat16": 2,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
    "qint8": 1,
    "quint8": 1,
    "qint16": 2,
    "quint16": 2,
    "qint32": 4,
    "float8_e5m2": 1,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "float8_e4m3b11fnuz": 1,
    "int4": 0.5,
    "uint4": 0.5,
}


def _device_matches(name: str, place: str | None) -> bool:
    if place is None:
        return True
    kind, _, index = place.partition(":")
    return f"device:{kind.upper()}:{index or 0}" in name


def _kinds() -> list[tuple[type, str]]:
    ops = sys.modules.get("tensorflow.python.framework.ops")
    variables = sys.modules.get("tensorflow.python.ops.resource_variable_ops")
    kinds: list[tuple[type, str]] = []
    if ops is not None and hasattr(ops, "EagerTensor"):
        kinds.append((ops.EagerTensor, "tensor"))
    if variables is not None and hasattr(variables, "BaseResourceVariable"):
        kinds.append((variables.BaseResourceVariable, "variable"))
    return kinds


class TensorFlowDiagnose(Diagnose):
    """TensorFlow's side of a diagnosis (``DiagnoseTopic``): its errors, its messages, its live tensors."""

    scan_needs_gc = True
    accumulation_code = (
        "optimizer = keras.optimizers.Adam(gradient_accumulation_steps={steps})  # micro-batch {micro} × {steps}"
    )
    checkpoint_code = "block = tf.recompute_grad(block)"

    def recognises_oom(self, exc: BaseException, message: str) -> bool:
        """``ResourceExhaustedError`` whose message is about memory."""
        return error_class_in(exc, _EXHAUSTED) and bool(_MEMORY_PHRASES.search(message))

    def requested_bytes(self, message: str) -> tuple[int, str] | None:
        """ "OOM when allocating tensor with shape[64,1024] and type float": elements × dtype
        size; a dtype without a fixed size (string) gives None, not a guess."""
        match = _SHAPE.search(message)
        if match is None:
            return None
        size = _DTYPE_BYTES.get(match.group(2))
        if size is None:
            return None
        dims = [part.strip() for part in match.group(1).split(",") if part.strip()]
        return math.ceil(math.prod(int(d) for d in dims) * size), match.group(0)

    def oom_place(self, exc: BaseException, device: int, message: str) -> str | None:
        """The device the message names (``.../device:GPU:0``); None if it names none."""
        if match := _DEVICE.search(message):
            return "cpu" if match.group(1) == "CPU" else f"gpu:{match.group(2)}"
        return None

    def place_spelling(self, place: str) -> str | None:
        """``gpu:N`` for any GPU, ``cpu``; TF has no name for other devices."""
        kind, _, index = place.partition(":")
        if kind == "cpu":
            return "cpu"
        if kind in ("cuda", "gpu"):
            return f"gpu:{index or 0}"
        return None

    def precision_in_force(self) -> tuple[bool, str] | None:
        """Keras's global dtype policy, when Keras is imported: ``mixed_*`` is on, anything else off."""
        keras = sys.modules.get("keras")
        if keras is None:
            return None
        try:
            name = str(keras.mixed_precision.global_policy().name)
        except Exception:  # an old or half-imported Keras: unknown, not off
            return None
        return (name.startswith("mixed"), f"the Keras global dtype policy is {name!r}") if name else None

    def live_memory(self, objects: list[object], place: str | None, top: int) -> LiveMemory | None:
        """The eager tensors and variables among ``objects`` on ``place``."""
        if "tensorflow" not in sys.modules:
            return None
        kinds = _kinds()
        if not kinds:
            return None
        types_ = tuple(cls for cls, _ in kinds)
        tally = Tally(top)
        for candidate in objects:
            if not isinstance(candidate, types_):
                continue
            obj: Any = candidate
            kind = next(name for cls, name in kinds if isinstance(obj, cls))
            try:
                device = str(obj.device)
                if not _device_matches(device, place):
                    continue
                elements = obj.shape.num_elements()
                if elements is None:
                    continue
                nbytes = int(elements * obj.dtype.size)
                shape = tuple(int(d) for d in obj.shape)
                dtype = obj.dtype.name
            except Exception:  # string tensors have no byte size
                continue
            if nbytes == 0:
                continue  # resource handles and empty tensors hold no tensor memory
            tally.add(LiveObject("tensorflow", kind, shape, dtype, nbytes, device))
        return tally.result("tensorflow", place, "gc over EagerTensor and tf.Variable objects")
