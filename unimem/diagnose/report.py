"""``OOMReport``: what an out-of-memory failure asked for, what held memory, what to change.

Made by ``oom_guard`` (and ``find_batch_size`` when even the smallest batch fails) at
the moment of failure. Gathering never raises: a figure that cannot be read is None
and ``notes`` says why, so the user always gets the framework's error with a report.
The report holds descriptions and numbers only, never a tensor.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from unimem import registry
from unimem.diagnose.live_objects import scan
from unimem.diagnose.recognise import error_text, framework_of, requested_bytes
from unimem.diagnose.rules import HIGH_FRAGMENTATION, Context, PoolUse, Suggestion, Traits, suggest
from unimem.live_memory import LiveMemory, LiveObject
from unimem.memory_stats import MemoryStats
from unimem.pool_fragmentation import Fragmentation, read
from unimem.sizes import format_bytes
from unimem.snapshots import read_snapshot
from unimem.training.precision import enabled_backends

__all__ = [
    "HIGH_FRAGMENTATION",
    "LiveMemory",
    "LiveObject",
    "OOMReport",
    "PoolUse",
    "Suggestion",
    "build_report",
]

_HALF_DTYPES = ("float16", "bfloat16", "half")
_FULL_DTYPES = ("float32", "float64", "double", "float")


@dataclass(frozen=True)
class OOMReport:
    """An out-of-memory failure explained. ``str()`` reads as a report; ``as_dict()`` is JSON-ready.

    Made by ``oom_guard`` (as ``OutOfMemory.report``) and by ``find_batch_size`` when even
    batch size 1 does not fit, at the moment of failure. Gathering never raises: a figure
    that cannot be read is None and ``notes`` says why. The report holds descriptions and
    numbers only, never a tensor. Byte counts are ``int`` bytes.

    Attributes:
        framework (str | None): The backend that failed; None for an error no framework
            raised (a plain ``MemoryError``).
        device (int): The device index the report's figures are for.
        place (str | None): Where the failed allocation was (``"cuda:0"``, ``"gpu:0"``,
            ``"cpu"``, ``"mps"``); None if unknown.
        error_type (str): The error's class, as ``module.QualifiedName``.
        message (str): The error's text (shortened past 2000 characters).
        requested_bytes (int | None): What the failed allocation asked for, when the
            message says; None otherwise.
        requested_from (str | None): The words ``requested_bytes`` was read from.
        capacity (int | None): The most the failed allocation could have had: the cap
            (``stats.limit``), else the device's total; host memory for a failure on the
            CPU. None when neither is known.
        stats (MemoryStats | None): ``unimem.stats`` at the failure.
        fragmentation (Fragmentation | None): The pool's free pieces at the failure.
        live (tuple[LiveMemory, ...]): The largest live tensors/arrays per framework on
            that device, with counts and totals.
        other_pools (tuple[PoolUse, ...]): What other frameworks in this process hold on
            the device.
        batch_size (int | None): The step's batch size, as given to ``oom_guard``.
        mixed_precision (bool | None): Whether mixed precision was on (as told, or as
            found); None if unknown.
        suggestions (tuple[Suggestion, ...]): What to change, most promising first.
        notes (tuple[str, ...]): What could not be read, and why.
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
        """The report as plain data, JSON-ready.

        Returns:
            Every field; ``stats`` and ``fragmentation`` as their own ``as_dict()``,
            ``other_pools`` with each pool's idle bytes, ``suggestions`` with their rank
            (1 first), shapes as lists.
        """
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


def _place(oom: BaseException, framework: str | None, device: int, message: str) -> str | None:
    """Where the failed allocation was: ``"cuda:N"``/``"gpu:N"``, ``"cpu"``, ``"mps"``; None if unknown."""
    if framework is None:
        return "cpu" if isinstance(oom, MemoryError) else None
    try:
        return registry.get_backend(framework).diagnose.oom_place(oom, device, message)
    except Exception:  # an adapter that cannot be had or cannot tell: unknown
        return None


def _place_for(framework: str, place: str | None) -> str | None:
    """The same device spelled the way ``framework``'s live scan matches it."""
    if place is None:
        return None
    try:
        return registry.get_backend(framework).diagnose.place_spelling(place)
    except Exception:  # an adapter that cannot be had: scan every device
        return None


def _host_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not on every platform
        return None


# --- mixed precision already on? --------------------------------------------------------


def _precision_on(framework: str | None, live: list[LiveMemory]) -> tuple[bool | None, str]:
    """Whether mixed precision is on, and how that was found; (None, reason) if unknown."""
    if framework is not None:
        if framework in enabled_backends():
            return True, "a unimem.mixed_precision policy is enabled"
        try:
            told = registry.get_backend(framework).diagnose.precision_in_force()
        except Exception:  # the framework's own switch cannot be read: judge by the tensors
            told = None
        if told is not None:
            return told
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
    """The ranked suggestions (``unimem.diagnose.rules``) for these figures."""
    # An error no framework raised (a plain MemoryError) still gets code examples: the
    # first framework's, since an example in some framework beats none.
    traits = Traits.of(framework or registry.FRAMEWORKS[0])
    context = Context(
        framework=framework,
        requested=requested,
        capacity=capacity,
        snapshot=snapshot,
        frag=frag,
        live=live,
        pools=pools,
        batch_size=batch_size,
        precision=precision,
        place=place,
        on_gpu=place is not None and place.split(":")[0] in ("cuda", "gpu"),
        traits=traits,
        pool_traits={pool.framework: Traits.of(pool.framework) for pool in pools},
    )
    return suggest(context)


# --- building it ------------------------------------------------------------------------------


def _pool_figures(
    framework: str | None, device: int, place: str | None, notes: list[str]
) -> tuple[MemoryStats | None, Fragmentation | None]:
    """The failing framework's stats and fragmentation on ``device`` (none for host memory)."""
    snapshot: MemoryStats | None = None
    frag: Fragmentation | None = None
    if place == "cpu":
        notes.append("device figures: the failure was in host memory, where frameworks keep no pool figures")
        return None, None
    if framework is None or not registry.is_framework(framework):
        return None, None
    try:
        snapshot = read_snapshot(framework, device)
    except Exception as exc:
        notes.append(f"stats: {exc}")
    try:
        frag = read(framework, device)
    except Exception as exc:
        notes.append(f"fragmentation: {exc}")
    if frag is not None and frag.share is None:
        exposes = _exposes_fragmentation(framework)  # it would, once its runtime runs
        notes.append(
            f"fragmentation: {framework} exposes no free-block figures"
            + (" before its device runtime starts" if frag.source is None and exposes else "")
        )
    return snapshot, frag


def _exposes_fragmentation(framework: str) -> bool:
    try:
        support = registry.capability_table(framework).get("fragmentation")
    except Exception:  # an adapter that cannot be had: it exposes nothing
        return False
    return support is not None and support.supported


def _other_pools(framework: str | None, device: int, in_use: list[str], notes: list[str]) -> list[PoolUse]:
    """What the other imported frameworks hold on ``device``."""
    pools: list[PoolUse] = []
    for name in in_use:
        if name == framework:
            continue
        try:
            other = read_snapshot(name, device)
        except Exception as exc:
            notes.append(f"{name} stats: {exc}")
            continue
        pools.append(PoolUse(name, other.allocated, other.reserved, other.limit))
    return pools


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
    message = error_text(oom)
    framework = backend or framework_of(oom)
    found = requested_bytes(message)
    place = _place(oom, framework, device, message)
    in_use = registry.imported_frameworks()
    snapshot, frag = _pool_figures(framework, device, place, notes)

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

    pools = _other_pools(framework, device, in_use, notes)
    precision_found = (mixed_precision, "as told") if mixed_precision is not None else _precision_on(framework, live)
    if found is None:
        notes.append("requested bytes: the error message does not say")
    requested = found[0] if found else None
    suggestions = _suggest(
        framework, requested, capacity, snapshot, frag, live, pools, batch_size, precision_found, place
    )
    return OOMReport(
        framework=framework,
        device=device,
        place=place,
        error_type=f"{type(oom).__module__}.{type(oom).__qualname__}",
        message=_shorten(message, 2000),
        requested_bytes=requested,
        requested_from=found[1] if found else None,
        capacity=capacity,
        stats=snapshot,
        fragmentation=frag,
        live=tuple(live),
        other_pools=tuple(pools),
        batch_size=batch_size,
        mixed_precision=precision_found[0],
        suggestions=tuple(suggestions),
        notes=tuple(notes),
    )
