"""CuPy's side of an out-of-memory diagnosis: its errors and its messages.

Recognition reads class names, modules and messages only, so it needs no CuPy import:
a CuPy that is not imported raised nothing.
"""

from __future__ import annotations

import re

from unimem.backends.base import Diagnose, error_class_in

# The pool's error (a MemoryError): "Out of memory allocating 1,024 bytes (allocated so far: ...".
_OOM_CLASSES = (("cupy", "OutOfMemoryError"),)
# Errors of CUDA and its libraries, raised as such when no pool stands between: plain
# cudaMalloc (set_allocator(None)) and the workspaces of cuBLAS, cuSOLVER, cuFFT, ...
_LIBRARY_ERRORS = (
    ("cupy_backends", "CUDARuntimeError"),
    ("cupy_backends", "CUBLASError"),
    ("cupy_backends", "CUSOLVERError"),
    ("cupy_backends", "CuSparseError"),
    ("cupy", "CuFFTError"),
)
_LIBRARY_OOM = re.compile(r"cudaErrorMemoryAllocation|STATUS_ALLOC_FAILED|CUFFT_ALLOC_FAILED")
_REQUESTED = re.compile(r"Out of memory allocating ([0-9,]+) bytes")


class CupyDiagnose(Diagnose):
    """CuPy's side of a diagnosis (``DiagnoseTopic``): the pool's error and CUDA's allocation failures."""

    def recognises_oom(self, exc: BaseException, message: str) -> bool:
        """The pool's ``OutOfMemoryError``, or a CUDA/library error whose status is an allocation failure."""
        if error_class_in(exc, _OOM_CLASSES):
            return True
        return error_class_in(exc, _LIBRARY_ERRORS) and bool(_LIBRARY_OOM.search(message))

    def requested_bytes(self, message: str) -> tuple[int, str] | None:
        """The pool's message gives the request exactly, with thousands separators."""
        if match := _REQUESTED.search(message):
            return int(match.group(1).replace(",", "")), match.group(0)
        return None

    def oom_place(self, exc: BaseException, device: int, message: str) -> str | None:
        """The report's device: CuPy allocates on CUDA devices only, and its errors name none."""
        return f"cuda:{device}"

    def place_spelling(self, place: str) -> str | None:
        """CuPy's arrays live on CUDA devices: ``cuda:N`` for any GPU."""
        kind, _, index = place.partition(":")
        if kind in ("cuda", "gpu"):
            return f"cuda:{index or 0}"
        return place
