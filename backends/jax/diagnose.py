"""JAX's side of an out-of-memory diagnosis: its errors, XLA's messages, its live arrays.

Recognition reads class names, modules and messages only, so it needs no JAX import.
The rest reads ``sys.modules["jax"]``.
"""

from __future__ import annotations

import re
import sys

from unimem.backends.base import Diagnose, error_class_in

from unimem.live_memory import LiveMemory, LiveObject, Tally

_RUNTIME_ERRORS = (("jax", "JaxRuntimeError"), ("jaxlib", "XlaRuntimeError"), ("jax", "XlaRuntimeError"))
# What makes a RESOURCE_EXHAUSTED status about memory: the status also reports quotas and
# file systems, which a smaller batch does not fix.
_MEMORY_PHRASES = re.compile(
    r"\bOOM\b|out of memory|ran out of memory|failed to allocate|trying to allocate|allocating",
    re.IGNORECASE,
)
_BYTES = re.compile(r"(?:trying to allocate|allocating) (\d+) bytes|\((\d+)B\)|rounded to (\d+)\)")
# XLA on a GPU may print a rounded size: "Out of memory while trying to allocate 1.00GiB".
_SIZE = re.compile(r"trying to allocate ([0-9.]+) ?([KMGTP]i?B)\b")
_UNITS = {f"{prefix}{infix}B": 1 << (10 * (i + 1)) for i, prefix in enumerate("KMGTP") for infix in ("", "i")}
_PLATFORM_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def _place_matches(name: str, place: str) -> bool:
    platform, _, index = name.partition(":")
    kind, _, wanted = place.partition(":")
    same = _PLATFORM_ALIASES.get(platform, platform) == _PLATFORM_ALIASES.get(kind, kind)
    return same and (not wanted or index == wanted)


class JaxDiagnose(Diagnose):
    """JAX's side of a diagnosis (``DiagnoseTopic``): its runtime errors, XLA's messages, ``jax.live_arrays()``."""

    accumulation_code = (
        "optimizer = optax.MultiSteps(optimizer, every_k_schedule={steps})  # micro-batch {micro} × {steps}"
    )
    checkpoint_code = "block = jax.checkpoint(block)  # recompute its activations in the backward pass"

    def recognises_oom(self, exc: BaseException, message: str) -> bool:
        """A runtime error with status RESOURCE_EXHAUSTED whose message is about memory."""
        return (
            error_class_in(exc, _RUNTIME_ERRORS)
            and "RESOURCE_EXHAUSTED" in message
            and bool(_MEMORY_PHRASES.search(message))
        )

    def requested_bytes(self, message: str) -> tuple[int, str] | None:
        """ "while trying to allocate N bytes", "allocating N bytes", "(NB)", or a size XLA
        rounded to two decimals ("trying to allocate 1.00GiB")."""
        if match := _BYTES.search(message):
            number = next(group for group in match.groups() if group is not None)
            return int(number), match.group(0)
        if match := _SIZE.search(message):
            return int(float(match.group(1)) * _UNITS[match.group(2)]), match.group(0)
        return None

    def oom_place(self, exc: BaseException, device: int, message: str) -> str | None:
        """JAX's default platform: ``cpu``, else the guard's GPU; None when JAX cannot say."""
        jax = sys.modules.get("jax")
        if jax is None:
            return None
        try:
            platform = jax.default_backend()
        except Exception:  # no usable backend: the place is unknown
            return None
        return "cpu" if platform == "cpu" else f"gpu:{device}"

    def place_spelling(self, place: str) -> str | None:
        """``gpu:N`` for any GPU, ``cpu``; JAX's arrays live on no other device this matches."""
        kind, _, index = place.partition(":")
        if kind == "cpu":
            return "cpu"
        if kind in ("cuda", "gpu"):
            return f"gpu:{index or 0}"
        return None

    def live_memory(self, objects: list[object], place: str | None, top: int) -> LiveMemory | None:
        """``jax.live_arrays()`` on ``place``: JAX lists its own, no walk over the heap."""
        jax = sys.modules.get("jax")
        if jax is None or not hasattr(jax, "live_arrays"):
            return None
        tally = Tally(top)
        for array in jax.live_arrays():
            try:
                if array.is_deleted():
                    continue
                devices = sorted(array.devices(), key=lambda d: d.id)
                names = [f"{d.platform}:{d.id}" for d in devices]
                if place is not None and not any(_place_matches(name, place) for name in names):
                    continue
                nbytes = int(array.nbytes)
                shape = tuple(int(d) for d in array.shape)
                dtype = str(array.dtype)
            except Exception:  # an array deleted while we looked
                continue
            tally.add(LiveObject("jax", "array", shape, dtype, nbytes, ",".join(names)))
        return tally.result("jax", place, "jax.live_arrays()")
