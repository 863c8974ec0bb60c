"""torch's side of an out-of-memory diagnosis: its errors, its messages, its live tensors.

Recognition reads class names, modules and messages only, so it needs no torch import:
a torch that is not imported raised nothing. The rest reads ``sys.modules["torch"]``.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from unimem.backends.base import Diagnose, error_class_in

from unimem.live_memory import LiveMemory, LiveObject, Tally

# ``torch.cuda.OutOfMemoryError`` is the same class, defined in torch's own module.
_OOM_CLASSES = (("torch", "OutOfMemoryError"),)
# Allocator messages unique to an out-of-memory failure, whatever the error's type: the CPU
# allocator raises a plain RuntimeError, so its words are all there is.
_ALLOCATOR_PHRASES = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|DefaultCPUAllocator: can't allocate memory"
    r"|MPS backend out of memory|HIP out of memory|XPU out of memory|CUBLAS_STATUS_ALLOC_FAILED"
    r"|PT_DEVMEM Allocation failed",
)

# torch formats sizes with powers of 1024 whatever the spelling ("MB" on MPS, "MiB" on CUDA).
_UNITS = {"bytes": 1, "B": 1}
_UNITS |= {f"{prefix}{infix}B": 1 << (10 * (i + 1)) for i, prefix in enumerate("KMGTP") for infix in ("", "i")}
_TRIED = re.compile(r"Tried to allocate ([0-9.]+) ?(bytes|[KMGTP]i?B|B)\b")
_CPU_TRIED = re.compile(r"you tried to allocate (\d+) bytes")
_GPU_INDEX = re.compile(r"GPU (\d+) has a total capacity")


def _device_matches(tensor: Any, place: str | None) -> bool:
    if place is None:
        return True
    device = tensor.device
    kind, _, index = place.partition(":")
    if device.type != kind:
        return False
    return not index or device.index is None or device.index == int(index)


class TorchDiagnose(Diagnose):
    """torch's side of a diagnosis (``DiagnoseTopic``): its errors, its messages, its live tensors."""

    scan_needs_gc = True
    accumulation_code = (
        "for chunk in batch.split({micro}):  # {micro} × {steps} = {total}\n"
        "    (loss_fn(model(chunk)) / {steps}).backward()\n"
        "optimizer.step(); optimizer.zero_grad()"
    )
    checkpoint_code = "y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)"

    def recognises_oom(self, exc: BaseException, message: str) -> bool:
        """``torch.OutOfMemoryError`` (any module of torch), or an allocator's out-of-memory words."""
        return error_class_in(exc, _OOM_CLASSES) or bool(_ALLOCATOR_PHRASES.search(message))

    def requested_bytes(self, message: str) -> tuple[int, str] | None:
        """ "Tried to allocate 2.00 GiB" (exact to torch's two decimals) or, from the CPU
        allocator, "you tried to allocate N bytes"."""
        if match := _CPU_TRIED.search(message):
            return int(match.group(1)), match.group(0)
        if match := _TRIED.search(message):
            return int(float(match.group(1)) * _UNITS[match.group(2)]), match.group(0)
        return None

    def oom_place(self, exc: BaseException, device: int, message: str) -> str | None:
        """The CPU allocator and MPS say so; a CUDA message names its GPU; else the guard's device."""
        if "DefaultCPUAllocator" in message:
            return "cpu"
        if "MPS" in message:
            return "mps"
        if match := _GPU_INDEX.search(message):
            return f"cuda:{match.group(1)}"
        return f"cuda:{device}"

    def place_spelling(self, place: str) -> str | None:
        """torch's device names: ``cuda:N`` for any GPU, the rest as they are."""
        kind, _, index = place.partition(":")
        if kind in ("cuda", "gpu"):
            return f"cuda:{index or 0}"
        return place

    def precision_in_force(self) -> tuple[bool, str] | None:
        """On when autocast is on in this thread; off is not evidence (autocast may wrap only the step)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        try:
            if torch.is_autocast_enabled():
                return True, "torch autocast is on"
        except Exception:  # a half-imported torch must not break the report
            pass
        return None

    def live_memory(self, objects: list[object], place: str | None, top: int) -> LiveMemory | None:
        """The tensors among ``objects`` (and parameters' gradients) on ``place``, one per storage."""
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        tensor_type, parameter_type = torch.Tensor, torch.nn.Parameter
        seen: set[tuple[str, int]] = set()
        tally = Tally(top)

        def visit(tensor: Any, kind: str) -> None:
            try:
                if tensor.device.type == "meta" or not _device_matches(tensor, place):
                    return
                storage = tensor.untyped_storage()
                key = (str(tensor.device), storage.data_ptr())
                nbytes = int(storage.nbytes())
            except Exception:  # sparse, nested or functional tensors without one storage
                return
            if key in seen or nbytes == 0:
                return  # views share their base's storage: count it once
            seen.add(key)
            tally.add(LiveObject("torch", kind, tuple(tensor.shape), str(tensor.dtype), nbytes, str(tensor.device)))

        for obj in objects:
            if isinstance(obj, tensor_type):
                is_parameter = isinstance(obj, parameter_type)
                visit(obj, "parameter" if is_parameter else "tensor")
                grad = obj.grad if is_parameter else None
                if grad is not None:
                    visit(grad, "gradient")
        return tally.result("torch", place, "gc over torch.Tensor objects, one per storage")
