"""``OOMReport``: what an out-of-memory failure asked for, what held memory, what to change.

Made by ``oom_guard`` (and ``find_batch_size`` when even the smallest batch fails) at
the moment of failure. Gathering never raises: a figure that cannot be read is None
and ``notes`` says why, so the user always gets the framework's error with a report.
The report holds descriptions and numbers only, never a tensor.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from . import api, registry
from .live_objects import LiveMemory, LiveObject, scan
from .oom import _message, framework_of, requested_bytes
from .pool_fragmentation import Fragmentation, _read
from .sizes import format_bytes
from .stats import MemoryStats

__all__ = ["LiveMemory", "LiveObject", "OOMReport", "PoolUse", "Suggestion", "build_report"]

# Fragmentation above this share, with enough free bytes in the pool for the request,
# means the memory was there but in pieces: an allocator setting helps more than a
# smaller batch.
HIGH_FRAGMENTATION = 0.3
# Another framework's idle pool worth mentioning when the request size is unknown.
_IDLE_POOL_WORTH = 1 << 30
_HALF_DTYPES = ("float16", "bfloat16", "half")
_FULL_DTYPES = ("float32", "float64", "double", "float")


@dataclass(frozen=True)
class Suggestion:
    """One thing to change, with the evidence for it from this failure."""

    kind: str  # stable id: "too-large", "free-other-pool", "allocator", "raise-cap", "smaller-batch", ...
    action: str
    why: str
    code: str | None = None


@dataclass(frozen=True)
class PoolUse:
    """Memory another framework in this process holds on the same device."""

    framework: str
    allocated: int | None
    reserved: int | None
    limit: int | None

    @property
    def idle(self) -> int | None:
        """Bytes its pool holds that none of its arrays use."""
        if self.reserved is None or self.allocated is None:
            return None
        return max(0, self.reserved - self.allocated)


@dataclass(frozen=True)
class OOMReport:
    """An out-of-memory failure explained. ``str()`` reads as a report; ``as_dict()`` is JSON-ready.

    - ``framework``/``device``/``place``: who failed, where (``"cuda:0"``, ``"gpu:0"``, ``"cpu"``).
    - ``requested_bytes``: what the failed allocation asked for, when the message says
      (``requested_from`` quotes the words); None otherwise.
    - ``stats``: ``unimem.stats`` at the failure; ``fragmentation``: the pool's free pieces.
    - ``live``: the largest live tensors/arrays per framework on that device.
    - ``other_pools``: what other frameworks in this process hold on the device.
    - ``suggestions``: most promising first.
    - ``notes``: what could not be read, and why.
    """

    framework: str | None
    device: int
    place: str | None
    error_type: str
    message: str
    requested_bytes: int | None = None
    requested_from: str | None = None
    capacity: int | None = None
    stats: MemoryStats | None = None
    fragmentation: Fragmentation | None = None
    live: tuple[LiveMemory, ...] = ()
    other_pools: tuple[PoolUse, ...] = ()
    batch_size: int | None = None
    mixed_precision: bool | None = None
    suggestions: tuple[Suggestion, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["stats"] = None if self.stats is None else self.stats.as_dict()
        data["fragmentation"] = None if self.fragmentation is None else self.fragmentation.as_dict()
        data["other_pools"] = [{**dataclasses.asdict(pool), "idle": pool.idle} for pool in self.other_pools]
        data["suggestions"] = [{"rank": i + 1, **dataclasses.asdict(s)} for i, s in enumerate(self.suggestions)]
        for entry in data["live"]:
            entry["largest"] = [{**item, "shape": list(item["shape"])} for item in entry["largest"]]
        return data

    def __str__(self) -> str:
        where = self.place or f"device {self.device}"
        asked = f", asking for {format_bytes(self.requested_bytes)}" if self.requested_bytes is not None else ""
        lines = [f"{self.framework or 'Python'} ran out of memory on {where}{asked}."]
        first_line = self.message.strip().splitlines()[0] if self.message.strip() else ""
        if first_line:
            lines.append(f"  error: {self.error_type}: {_shorten(first_line, 300)}")
        figures: list[tuple[str, str]] = []
        if self.stats is not None:
            snap = self.stats
            for label, value in (
                ("allocated", snap.allocated),
                ("reserved", snap.reserved),
                ("peak allocated", snap.peak_allocated),
                ("limit", snap.limit),
                ("device free", snap.device_free),
                ("process used (NVML)", snap.process_used),
            ):
                if value is not None:
                    figures.append((label, format_bytes(value)))
        if self.capacity is not None:
            figures.append(("capacity", format_bytes(self.capacity)))
        frag = self.fragmentation
        if frag is not None and frag.share is not None:
            figures.append(
                (
                    "fragmentation",
                    f"{frag.share:.1%} (largest free block {format_bytes(frag.largest_free_block)} "
                    f"of {format_bytes(frag.free_in_pool)} free in the pool)",
                )
            )
        if figures:
            width = max(len(label) for label, _ in figures)
            lines.append("Memory at the failure:")
            lines += [f"  {label.ljust(width)}  {value}" for label, value in figures]
        for memory in self.live:
            if memory.count == 0 and memory.framework != self.framework:
                continue  # another framework with nothing here: noise
            on = memory.device or "every device"
            lines.append(
                f"Live {memory.framework} objects on {on}: {memory.count}, {format_bytes(memory.total_bytes)} in all"
                + (f"; largest {len(memory.largest)}:" if memory.largest else "")
            )
            lines += [f"  {item}" for item in memory.largest]
        for pool in self.other_pools:
            known = [
                f"{label} {format_bytes(value)}"
                for label, value in (("reserved", pool.reserved), ("allocated", pool.allocated), ("limit", pool.limit))
                if value is not None
            ]
            if known:
                lines.append(f"{pool.framework} in this process: " + ", ".join(known))
        if self.suggestions:
            lines.append("What to try, most promising first:")
            for rank, suggestion in enumerate(self.suggestions, 1):
                lines.append(f"  {rank}. {suggestion.action}")
                lines.append(f"     why: {suggestion.why}")
                if suggestion.code:
                    lines += [f"     {line}" for line in suggestion.code.splitlines()]
        if self.notes:
            lines.append("Not known: " + "; ".join(self.notes))
        return "\n".join(lines)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- where it failed --------------------------------------------------------------------

_TORCH_GPU_INDEX = re.compile(r"GPU (\d+) has a total capacity")
_TF_DEVICE = re.compile(r"device:(GPU|CPU):(\d+)")


def _place(oom: BaseException, framework: str | None, device: int, message: str) -> str | None:
    """Where the failed allocation was: ``"cuda:N"``/``"gpu:N"``, ``"cpu"``, ``"mps"``; None if unknown."""
    if framework is None:
        return "cpu" if isinstance(oom, MemoryError) else None
    if framework == "torch":
        if "DefaultCPUAllocator" in message:
            return "cpu"
        if "MPS" in message:
            return "mps"
        if match := _TORCH_GPU_INDEX.search(message):
            return f"cuda:{match.group(1)}"
        return f"cuda:{device}"
    if framework == "tensorflow":
        if match := _TF_DEVICE.search(message):
            return "cpu" if match.group(1) == "CPU" else f"gpu:{match.group(2)}"
        return None
    if framework == "jax":
        jax = sys.modules.get("jax")
        try:
            platform = jax.default_backend() if jax is not None else None
        except Exception:
            platform = None
        if platform is None:
            return None
        return "cpu" if platform == "cpu" else f"gpu:{device}"
    return None


def _place_for(framework: str, place: str | None) -> str | None:
    """The same device spelled the way ``framework``'s live scan matches it."""
    if place is None:
        return None
    kind, _, index = place.partition(":")
    if kind == "cpu":
        return "cpu"
    if kind in ("cuda", "gpu"):
        return f"cuda:{index or 0}" if framework == "torch" else f"gpu:{index or 0}"
    return place if framework == "torch" else None


def _host_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not on every platform
        return None


# --- mixed precision already on? --------------------------------------------------------


def _precision_on(framework: str | None, live: list[LiveMemory]) -> tuple[bool | None, str]:
    """Whether mixed precision is on, and how that was found; (None, reason) if unknown."""
    precision = sys.modules.get("unimem.precision")
    enabled = getattr(precision, "_enabled", None)
    if framework is not None and isinstance(enabled, dict) and enabled.get(framework):
        return True, "a unimem.mixed_precision policy is enabled"
    if framework == "tensorflow" and "keras" in sys.modules:
        try:
            name = str(sys.modules["keras"].mixed_precision.global_policy().name)
        except Exception:
            name = ""
        if name:
            return name.startswith("mixed"), f"the Keras global dtype policy is {name!r}"
    if framework == "torch" and "torch" in sys.modules:
        try:
            if sys.modules["torch"].is_autocast_enabled():
                return True, "torch autocast is on"
        except Exception:
            pass
    # Otherwise judge by the live activations (parameters stay float32 under mixed precision).
    half = full = 0
    for memory in live:
        if memory.framework != framework:
            continue
        for item in memory.largest:
            if item.kind in ("parameter", "gradient", "variable"):
                continue
            if item.dtype.split(".")[-1] in _HALF_DTYPES:
                half += item.nbytes
            elif item.dtype.split(".")[-1] in _FULL_DTYPES:
                full += item.nbytes
    if half + full == 0:
        return None, "no live floating-point activations to judge by"
    share = full / (half + full)
    if share >= 0.5:
        return False, f"{share:.0%} of the largest live tensors' bytes (parameters aside) are float32/64"
    return True, f"{1 - share:.0%} of the largest live tensors' bytes (parameters aside) are 16-bit"


# --- suggestions --------------------------------------------------------------------------

_ACCUMULATION_CODE = {
    "torch": (
        "for chunk in batch.split({micro}):  # {micro} × {steps} = {total}\n"
        "    (loss_fn(model(chunk)) / {steps}).backward()\n"
        "optimizer.step(); optimizer.zero_grad()"
    ),
    "jax": "optimizer = optax.MultiSteps(optimizer, every_k_schedule={steps})  # micro-batch {micro} × {steps}",
    "tensorflow": (
        "optimizer = keras.optimizers.Adam(gradient_accumulation_steps={steps})  # micro-batch {micro} × {steps}"
    ),
}
_CHECKPOINT_CODE = {
    "torch": "y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)",
    "jax": "block = jax.checkpoint(block)  # recompute its activations in the backward pass",
    "tensorflow": "block = tf.recompute_grad(block)",
}


def _accumulation(batch_size: int, at_least: int) -> tuple[int, int]:
    """``(micro_batch, steps)`` with ``steps >= at_least``, preferring an exact split of
    ``batch_size`` (same global batch) unless that needs far more steps."""
    at_least = max(2, min(at_least, batch_size))
    for steps in range(at_least, min(batch_size, 2 * at_least) + 1):
        if batch_size % steps == 0:
            return batch_size // steps, steps
    return math.ceil(batch_size / at_least), at_least


def _suggest(
    framework: str | None,
    requested: int | None,
    capacity: int | None,
    snapshot: MemoryStats | None,
    frag: Fragmentation | None,
    live: list[LiveMemory],
    pools: list[PoolUse],
    batch_size: int | None,
    precision: tuple[bool | None, str],
    place: str | None,
) -> list[Suggestion]:
    scored: list[tuple[int, Suggestion]] = []
    fw = framework or "torch"
    on_gpu = place is not None and place.split(":")[0] in ("cuda", "gpu")

    if requested is not None and capacity is not None and requested > capacity:
        scored.append(
            (
                100,
                Suggestion(
                    "too-large",
                    "Check the shapes: one allocation is larger than all the memory there is",
                    f"it asked for {format_bytes(requested)}, and {place or 'the device'} has "
                    f"{format_bytes(capacity)} in all; no setting makes that fit, a wrong shape or a batch "
                    "orders of magnitude too big does that",
                ),
            )
        )

    for pool in pools:
        idle = pool.idle
        if idle is None or idle <= 0:
            continue
        enough = requested is not None and idle >= requested
        if not enough and idle < _IDLE_POOL_WORTH:
            continue
        if pool.framework == "torch":
            action, code = "Give torch's cached memory back", 'unimem.clear_cache("torch")'
        else:
            action = f"Stop {pool.framework} from preallocating (set before its first operation)"
            code = f'unimem.configure(backend="{pool.framework}", growth=True)'
        fit = f", enough for the {format_bytes(requested)} asked for" if enough else ""
        scored.append(
            (
                90 if enough else 60,
                Suggestion(
                    "free-other-pool",
                    action,
                    f"{pool.framework} in this process holds {format_bytes(pool.reserved)} and uses "
                    f"{format_bytes(pool.allocated)} of it: {format_bytes(idle)} idle{fit}",
                    code,
                ),
            )
        )

    share = None if frag is None else frag.share
    if share is not None and share >= HIGH_FRAGMENTATION and framework is not None:
        expandable = registry.capability_table(framework).get("allocator.expandable")
        had_room = requested is not None and frag is not None and (frag.free_in_pool or 0) >= requested
        if expandable is not None and expandable.supported:
            scored.append(
                (
                    85 if had_room else 40,
                    Suggestion(
                        "allocator",
                        "Use expandable segments so free pieces of the pool can be joined",
                        f"the pool is {share:.0%} fragmented: {format_bytes(frag.free_in_pool if frag else None)} "
                        f"free but the largest block is {format_bytes(frag.largest_free_block if frag else None)}"
                        + (f", too small for {format_bytes(requested)}" if had_room else ""),
                        f'unimem.configure(backend="{framework}", allocator="expandable")',
                    ),
                )
            )

    if snapshot is not None and snapshot.limit is not None and on_gpu:
        total, free = snapshot.device_total, snapshot.device_free
        if total is not None and free is not None and snapshot.limit < 0.95 * total:
            wanted = requested or 0
            if free > wanted:
                scored.append(
                    (
                        70 if requested is not None else 30,
                        Suggestion(
                            "raise-cap",
                            f"Raise {framework}'s memory cap",
                            f"it may use {format_bytes(snapshot.limit)} of the device's {format_bytes(total)}, "
                            f"and {format_bytes(free)} of the device is free",
                            f'unimem.configure(backend="{framework}", fraction=...)  # larger; before start for JAX/TF',
                        ),
                    )
                )

    if batch_size is not None and batch_size > 1:
        at_least = 2
        allocated = snapshot.allocated if snapshot is not None else None
        if allocated is not None and requested is not None and capacity:
            at_least = max(2, math.ceil((allocated + requested) / capacity))
        micro, steps = _accumulation(batch_size, at_least)
        total = micro * steps
        same = "the same global batch" if total == batch_size else f"a global batch of {total} (was {batch_size})"
        scored.append(
            (
                80,
                Suggestion(
                    "smaller-batch",
                    f"Use micro-batches of {micro} with {steps} gradient-accumulation steps ({same})",
                    f"batch {batch_size} does not fit"
                    + (
                        f"; it needed at least {format_bytes(allocated + requested)} of {format_bytes(capacity)}"
                        if allocated is not None and requested is not None and capacity
                        else ""
                    )
                    + "; unimem.find_batch_size(step, start=...) finds the largest that fits",
                    _ACCUMULATION_CODE.get(fw, "").format(micro=micro, steps=steps, total=total) or None,
                ),
            )
        )
    elif batch_size is None:
        scored.append(
            (
                50,
                Suggestion(
                    "smaller-batch",
                    "Use a smaller batch with gradient accumulation to keep the global batch",
                    "the batch size is not known here: pass oom_guard(batch_size=N) for exact numbers, or let "
                    "unimem.find_batch_size(step, start=...) find the largest that fits",
                ),
            )
        )

    if framework == "jax" and on_gpu:
        # Measured on an H200 (JAX 0.11.2, benchmarks/scripts/jax_failed_execution_leak.py):
        # each failed execution kept exactly its outputs' bytes in use, freed by neither
        # gc.collect() nor jax.clear_caches(); a retry in this process has that much less.
        scored.append(
            (
                75,
                Suggestion(
                    "fresh-process",
                    "Retry with the new settings in a fresh process",
                    "XLA does not free a failed step's output buffers: they stay in use until the process ends, "
                    "so this process now fits less than a fresh one (for a training step, a copy of the "
                    "parameters and optimizer state per failure)",
                ),
            )
        )

    on, how = precision
    if on is not True:
        scored.append(
            (
                65 if on is False else 45,
                Suggestion(
                    "mixed-precision",
                    "Turn on mixed precision (bf16): activations take half the memory",
                    how if on is False else f"not known whether it is on ({how})",
                    f'with unimem.mixed_precision("bf16", backend="{fw}"):  # around the step',
                ),
            )
        )

    seen_bytes = sum(memory.total_bytes for memory in live if memory.framework == framework)
    allocated = snapshot.allocated if snapshot is not None else None
    hidden = allocated is not None and allocated > 2 * seen_bytes
    scored.append(
        (
            58 if hidden else 35,
            Suggestion(
                "checkpointing",
                "Checkpoint activations: recompute them in the backward pass instead of keeping them",
                (
                    f"live tensors Python sees hold {format_bytes(seen_bytes)} of {format_bytes(allocated)} allocated: "
                    "the rest is mostly activations saved for the backward pass"
                    if hidden
                    else "trades about a third more compute for most of the activation memory"
                ),
                _CHECKPOINT_CODE.get(fw),
            ),
        )
    )
    scored.sort(key=lambda pair: -pair[0])  # stable: ties keep the order above
    return [suggestion for _, suggestion in scored]


# --- building it ------------------------------------------------------------------------------


def build_report(
    oom: BaseException,
    *,
    backend: str | None = None,
    device: int = 0,
    batch_size: int | None = None,
    mixed_precision: bool | None = None,
    top: int = 10,
) -> OOMReport:
    """An ``OOMReport`` for ``oom`` (the out-of-memory error itself, not a wrapper)."""
    notes: list[str] = []
    message = _message(oom)
    framework = backend or framework_of(oom)
    found = requested_bytes(message)
    place = _place(oom, framework, device, message)
    in_use = registry.imported_frameworks()

    snapshot: MemoryStats | None = None
    frag: Fragmentation | None = None
    if place == "cpu":
        notes.append("device figures: the failure was in host memory, where frameworks keep no pool figures")
    elif framework in registry.FRAMEWORKS:
        try:
            snapshot = api.stats(framework, device)
        except Exception as exc:
            notes.append(f"stats: {exc}")
        try:
            frag = _read(framework, device)
        except Exception as exc:
            notes.append(f"fragmentation: {exc}")
        if frag is not None and frag.share is None:
            notes.append(
                f"fragmentation: {framework} exposes no free-block figures"
                + (" before its device runtime starts" if frag.source is None and framework != "tensorflow" else "")
            )

    capacity: int | None = None
    if place == "cpu":
        capacity = _host_memory()
    elif snapshot is not None:
        capacity = snapshot.limit if snapshot.limit is not None else snapshot.device_total
    if capacity is None:
        notes.append("capacity: neither a cap nor the device's total is known")

    live: list[LiveMemory] = []
    # Scanned even with top=0: the counts and totals are worth having without a listing.
    order = ([framework] if framework in in_use else []) + [name for name in in_use if name != framework]
    try:
        live = scan(order, {name: _place_for(name, place) for name in order}, top)
    except Exception as exc:
        notes.append(f"live tensors: {exc}")

    pools: list[PoolUse] = []
    for name in in_use:
        if name == framework:
            continue
        try:
            other = api.stats(name, device)
        except Exception as exc:
            notes.append(f"{name} stats: {exc}")
            continue
        pools.append(PoolUse(name, other.allocated, other.reserved, other.limit))

    precision = (mixed_precision, "as told") if mixed_precision is not None else _precision_on(framework, live)
    if found is None:
        notes.append("requested bytes: the error message does not say")
    suggestions = _suggest(
        framework,
        found[0] if found else None,
        capacity,
        snapshot,
        frag,
        live,
        pools,
        batch_size,
        precision,
        place,
    )
    return OOMReport(
        framework=framework,
        device=device,
        place=place,
        error_type=f"{type(oom).__module__}.{type(oom).__qualname__}",
        message=_shorten(message, 2000),
        requested_bytes=found[0] if found else None,
        requested_from=found[1] if found else None,
        capacity=capacity,
        stats=snapshot,
        fragmentation=frag,
        live=tuple(live),
        other_pools=tuple(pools),
        batch_size=batch_size,
        mixed_precision=precision[0],
        suggestions=tuple(suggestions),
        notes=tuple(notes),
    )
