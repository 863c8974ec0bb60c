"""The one module of the batch search that talks to the frameworks' adapters; every other part asks
through it.

``Framework`` is the framework whose figures a search reads: its snapshots, the capacity and the
largest buffer its allocator can hand out, each trial's peak and what a failure left in use, the
release of its pool, and what its adapter says the search does differently for it
(``adapter.search``). The functions below it answer for any framework imported: the ranks' store
(``distributed_store``), the context a trial runs in (``trial_context``), what caused a step's own
error (``step_error_note``), the figures of a lowered step (``size_lowered``). Snapshots are read as
``stats()`` reads them, through ``unimem.snapshots`` (the adapter is resolved once, here).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from unimem import registry, snapshots
from unimem.errors import ConfigError, UnimemWarning
from unimem.memory_stats import MemoryStats
from unimem.search.rules import SATURATION_CAUSE

if TYPE_CHECKING:
    from unimem.backends.base import Backend, CompiledProgram, KeyValueStore
    from unimem.search.settings import Settings

__all__ = [
    "Framework",
    "Sizing",
    "distributed_store",
    "framework_free_view",
    "resolve",
    "size_lowered",
    "step_error_note",
    "trial_context",
]

# The fit uses the peak bytes in use (smooth in the batch size). torch's cap bounds the
# bytes its caching allocator reserves, which at small batches move in 2 and 20 MiB
# segments: the prediction holds the peak in use against the cap less the pool's
# overhead (peak reserved - peak in use) seen at the largest trial that fit.
_PEAK_FIELD = "peak_allocated"


def resolve(settings: Settings, step: object = None) -> str | None:
    """The framework whose figures to read: the one named (None for ``"nvml"``, the framework-free
    view: figures from ``measure=`` or the host), else that of ``model=`` or of the step where either
    is a framework object (a torch Module, a Keras layer, a bound method of one), else the one an
    action means (``registry.resolve``): none configured or imported, or several, is a
    ``ConfigError`` listing the candidates, before any trial."""
    if settings.backend is not None:
        return settings.backend if registry.is_framework(settings.backend) else None
    for obj in (settings.model, step):
        owner = registry.framework_of_object(obj)
        if owner is not None:
            return owner
    try:
        return registry.resolve(None, "action")
    except ConfigError as exc:
        if registry.imported_frameworks() or registry.configured():
            raise  # several in use: unimem never guesses
        raise ConfigError(
            "backend",
            f"{exc}; or backend='nvml' for a step that uses no framework (its peaks then come from measure=, "
            "else on a host without a GPU from the host's memory)",
        ) from None


@dataclass(frozen=True)
class Framework:
    """The framework whose figures a search reads (``name`` None: none, ``backend="nvml"``) on
    ``device``, and its adapter. Without one every question answers "nothing known"."""

    name: str | None
    device: int = 0
    adapter: Backend | None = None

    @classmethod
    def named(cls, name: str | None, device: int) -> Framework:
        return cls(name, device, None if name is None else registry.get_backend(name))

    # --- the figures -------------------------------------------------------------------------------

    def snapshot(self) -> MemoryStats | None:
        """What ``stats()`` says of the framework (None: none in use)."""
        return None if self.adapter is None else snapshots.adapter_stats(self.adapter, self.device)

    def capacity(self, snapshot: MemoryStats | None, predicted_buffers: bool = False) -> int | None:
        """Bytes the measured peak may reach, as the framework reads its snapshot (its cap by
        default). ``predicted_buffers``: with predictions of each size's largest buffer and a largest
        buffer the allocator can hand out, the cap: the pool's pieces are then held against each
        size's largest buffer (``Scale.room``)."""
        if snapshot is None or self.adapter is None:
            return None
        search = self.adapter.search
        if predicted_buffers and search.search_largest_buffer(snapshot) is not None:
            return snapshot.limit
        return search.search_capacity(snapshot)

    def largest_buffer(self, snapshot: MemoryStats | None) -> int | None:
        """The largest buffer the allocator can hand out as ``snapshot`` shows it (None: unknown)."""
        if snapshot is None or self.adapter is None:
            return None
        return self.adapter.search.search_largest_buffer(snapshot)

    def room_after_region(self, snapshot: MemoryStats | None) -> int | None:
        """The largest buffer it could hand out after one more compilation took a region from a pool
        grown on demand; None where compilations take nothing from it (or nothing is known)."""
        if snapshot is None or self.adapter is None:
            return None
        return self.adapter.search.search_room_after_region(snapshot)

    def search_notes(self) -> list[str]:
        """What the framework says of the search that just ended (none where no framework's)."""
        return [] if self.adapter is None else self.adapter.search.search_notes()

    def make_room(self, peak: int | None = None) -> None:
        """Before a call predicted to reach ``peak`` bytes: one region that holds what it adds to the bytes
        in use; without ``peak``, one region of all the room left under the limit (every later call's
        buffers are then cut from one piece). In a pool grown in regions (``search_make_room``); nothing
        elsewhere. One reading of the framework's figures, without NVML's."""
        if self.adapter is None:
            return
        snapshot = self.adapter.stats(self.device, nvml=False)
        if peak is None:
            adds = None if snapshot.limit is None or snapshot.reserved is None else snapshot.limit - snapshot.reserved
        else:
            adds = None if snapshot.allocated is None else peak - snapshot.allocated
        if adds is not None and adds > 0:
            self.adapter.search.search_make_room(snapshot, adds, self.device)

    def compiled_call(self) -> contextlib.AbstractContextManager[list[CompiledProgram] | None]:
        """The context a measured call runs in (``search_compiled_call``): each program compiled elsewhere
        during it (``CompiledProgram``), or None."""
        if self.adapter is None:
            return contextlib.nullcontext(None)
        return self.adapter.search.search_compiled_call()

    def restart_peak(self) -> int | None:
        """Restart the peak before a call; the bytes in use then (None: unknown)."""
        if self.adapter is None:
            return None
        self.adapter.reset_peak(self.device)
        return self.adapter.stats(self.device, nvml=False).allocated

    def in_use(self) -> int | None:
        """The bytes in use now (None: unknown)."""
        return None if self.adapter is None else self.adapter.stats(self.device, nvml=False).allocated

    def peak(self) -> tuple[int | None, int | None, int | None]:
        """The peak since ``restart_peak``, the pool's peak, and the pool's overhead (None: unknown)."""
        if self.adapter is None:
            return None, None, None
        figures = self.adapter.stats(self.device, nvml=False)
        peak, peak_reserved = figures.peak_allocated, figures.peak_reserved
        overhead = None
        if peak is not None and peak_reserved is not None:
            overhead = self.adapter.search.pool_overhead(peak, peak_reserved)
        return peak, peak_reserved, overhead

    def release(self, final: bool = False) -> None:
        """Give the pool back: after every trial where that is cheap, so the next peak is measured
        from a clean pool; elsewhere at the end only (clearing may drop compiled steps, or cannot free).
        At the end the framework also lets go of what it kept for the search (``search_done``)."""
        if self.adapter is not None and final:
            self.adapter.search.search_done()
        if self.adapter is None or not (self.adapter.search.release_every_trial or final):
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnimemWarning)
            self.adapter.clear_cache(self.device)

    # --- what the search does differently for it ----------------------------------------------------

    @property
    def measured_by(self) -> str:
        """Where its peaks come from, as the result says it."""
        return f"stats({self.name!r}).{_PEAK_FIELD}"

    @property
    def rematerializes(self) -> bool:
        """Whether it saves memory to fit near its limit (XLA recomputes): peaks then flatten."""
        return self.adapter is not None and self.adapter.search.rematerializes

    @property
    def remat_share(self) -> float | None:
        """The share of the pool's limit past which its compiler rematerializes (None: unknown, or never)."""
        return None if self.adapter is None else self.adapter.search.remat_share

    @property
    def keeps_failed_outputs(self) -> bool:
        """Whether a failed execution keeps its outputs in use for good (XLA)."""
        return self.adapter is not None and self.adapter.failed_step_keeps_outputs

    @property
    def settle_call(self) -> bool:
        """Whether one call at ``start`` after the answer re-ran lets the pool shrink back."""
        return self.adapter is not None and self.adapter.search.settle_call

    def settling(self, release: Callable[[], None]) -> contextlib.AbstractContextManager[None]:
        """The context that releases the pool at the framework's better moment during the settle call."""
        return contextlib.nullcontext() if self.adapter is None else self.adapter.search.settle(release)

    @property
    def kept_outputs_note(self) -> str | None:
        """What the framework says of the bytes failed trials left in use (None: no framework's)."""
        return None if self.adapter is None else self.adapter.search.kept_outputs_note

    @property
    def fresh_process_advice(self) -> str | None:
        """What the framework says a fresh process needs to fit more (None: nothing, or no framework's)."""
        return None if self.adapter is None else self.adapter.search.fresh_process_advice

    @property
    def saturation_cause(self) -> str | None:
        """How the framework saves memory near its limit, in its own words; the neutral words where no
        framework's figures are read; None for a framework that never does (no note then)."""
        if self.adapter is None:
            return SATURATION_CAUSE
        return self.adapter.search.saturation_cause if self.adapter.search.rematerializes else None

    def _and_imported(self) -> Iterator[Backend]:
        """This framework's adapter, then each imported framework's (the step may run one whose figures
        the search does not read)."""
        adapters = [self.adapter] if self.adapter is not None else []
        adapters += [registry.get_backend(name) for name in registry.imported_frameworks()]
        yield from dict.fromkeys(adapters)


def framework_free_view(device: int) -> MemoryStats:
    """The framework-free view of ``device`` (NVML; on a host without a GPU, the host's figure alone)."""
    return snapshots.framework_free_stats(device)


def distributed_store() -> tuple[str, KeyValueStore] | None:
    """The first imported framework whose distributed runtime runs several ranks, and its key-value
    store (``adapter.distributed``); None: no such runtime."""
    for name in registry.imported_frameworks():
        store = registry.get_backend(name).distributed.distributed_store()
        if store is not None and store.world_size > 1:
            return name, store
    return None


def trial_context(model: Any) -> Callable[[], contextlib.AbstractContextManager[None]] | None:
    """The context the model's framework gives each trial, in which the model makes no collective of
    its own (DDP's ``no_sync()``); None where no imported framework knows the model."""
    for name in registry.imported_frameworks():
        enter = registry.get_backend(name).search.trial_context(model)
        if enter is not None:
            return enter
    return None


def step_error_note(framework: Framework | None, exc: BaseException, after_oom: bool) -> str | None:
    """What a framework says caused a step's own error: the search's framework first, then each one
    imported."""
    for adapter in (framework or Framework(None))._and_imported():
        note = adapter.search.explain_step_error(exc, after_oom)
        if note is not None:
            return note
    return None


@dataclass(frozen=True)
class Sizing:
    """What the framework that sized a lowered step says of it and of its own predictions."""

    peak: int
    largest: int | None  # its largest single buffer
    rematerialized: bool | None
    concurrent: bool  # sizes may be compiled in threads (``predicts_concurrently``)
    remat_share: float | None  # the share of the pool's limit past which its compiler rematerializes


def size_lowered(framework: Framework, lowered: Any) -> Sizing | None:
    """The predicted figures of what ``lower(n)`` returned, from the search's framework, else the
    first imported one that can size it (``adapter.search.predict_peak``); None: none can."""
    for adapter in framework._and_imported():
        search = adapter.search
        value = search.predict_peak(lowered)
        if value is not None:
            return Sizing(
                value,
                search.predict_largest_buffer(lowered),
                search.predict_rematerialized(lowered),
                search.predicts_concurrently,
                search.remat_share,
            )
    return None
