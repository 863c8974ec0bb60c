"""The topics a backend answers beyond its core, one Protocol each, and their small types.

The front reaches a topic through one accessor of the adapter (``adapter.search``,
``adapter.diagnose``, ...) and calls that topic's members; an adapter's author reads one
protocol per topic. ``unimem.backends.base`` holds, for every topic, a default that answers
"this framework cannot" (``Diagnose``, ``Observe``, ...): a topic's object subclasses it and
overrides what its framework can, or is any object with the protocol's members (torch, JAX and
TensorFlow return their ``precision`` module). A topic object never imports its framework when
it is made: it imports it inside the members that need it.

Members that are data (``scan_needs_gc``, ``release_every_trial``, ...) are read-only
properties here so that a class attribute or a module constant satisfies them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from unimem.backends.base import CompiledProgram
    from unimem.backends.steps import Step

    from unimem.live_memory import LiveMemory
    from unimem.loss_scaling import LossScaler, ScalerConfig
    from unimem.memory_stats import MemoryStats
    from unimem.step_estimates import Measured, Plan

__all__ = [
    "TOPICS",
    "AccumulationTopic",
    "Counters",
    "DiagnoseTopic",
    "DistributedTopic",
    "EstimateTopic",
    "KeyValueStore",
    "ObserveTopic",
    "PrecisionHelpers",
    "PrecisionTopic",
    "Profiler",
    "SaversTopic",
    "SearchTopic",
    "WorkloadsTopic",
    "members",
]

Counters = tuple[int | None, int | None]  # (allocated, reserved) as a monitor samples them


class Profiler(Protocol):
    """A framework's own memory profiler, driven by ``unimem.profile``."""

    def start(self, path: Path, max_entries: int) -> None: ...
    def stop(self, path: Path) -> None: ...
    def snapshot(self, path: Path, stem: str, running: bool) -> Path: ...


class KeyValueStore(Protocol):
    """The key-value store of a framework's initialised distributed runtime, as
    ``unimem.cluster_stats`` gathers through it: every rank sets its key, then reads the others'
    with a bounded wait, so a rank that never calls cannot hang the others.

    Attributes:
        rank (int): This process's rank in the runtime.
        world_size (int): The runtime's process count.
    """

    rank: int
    world_size: int

    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str, timeout: float) -> str | None: ...  # None: not set within ``timeout`` seconds


class DiagnoseTopic(Protocol):
    """How a framework takes part in ``unimem.is_oom`` and an out-of-memory report (``adapter.diagnose``).

    Recognition (``owns_error``, ``recognises_oom``, ``requested_bytes``) imports nothing: class
    names, modules and messages only, since a framework that is not imported raised nothing.
    """

    @property
    def scan_needs_gc(self) -> bool:
        """Its live scan walks every object the garbage collector tracks (``live_memory`` then gets
        ``gc.get_objects()``)."""
        ...

    @property
    def accumulation_code(self) -> str:
        """The gradient-accumulation snippet a report offers, formatted with ``{micro}``, ``{steps}``,
        ``{total}``; empty: none."""
        ...

    @property
    def checkpoint_code(self) -> str:
        """The activation-checkpointing snippet a report offers; empty: none."""
        ...

    def owns_error(self, exc: BaseException) -> bool:
        """Whether ``exc``'s class comes from this framework (the default reads the adapter's
        ``error_modules`` in its MRO)."""
        ...

    def recognises_oom(self, exc: BaseException, message: str) -> bool:
        """Whether ``exc`` (one link of a chain; ``message`` is ``str(exc)``) is this framework's
        out-of-memory error."""
        ...

    def requested_bytes(self, message: str) -> tuple[int, str] | None:
        """``(bytes, the words they were read from)`` of the failed request, when this framework's
        message says; None otherwise."""
        ...

    def oom_place(self, exc: BaseException, device: int, message: str) -> str | None:
        """Where the failed allocation was (``"cuda:N"``, ``"gpu:N"``, ``"cpu"``, ``"mps"``) for the
        report on ``device``; None when it cannot be told."""
        ...

    def place_spelling(self, place: str) -> str | None:
        """``place`` (as ``oom_place`` spells it) spelled as this framework's live scan matches it;
        None to scan every device."""
        ...

    def precision_in_force(self) -> tuple[bool, str] | None:
        """Whether the framework's own mixed-precision switch is on, and how that was read; None when
        it has none or it cannot be read."""
        ...

    def live_memory(self, objects: list[object], place: str | None, top: int) -> LiveMemory | None:
        """The live arrays on ``place`` (None: every device), the ``top`` largest described (never
        referenced); ``objects`` is ``gc.get_objects()`` when ``scan_needs_gc``, else empty. None when
        the framework cannot be scanned."""
        ...


class ObserveTopic(Protocol):
    """What the monitor, ``track`` and ``unimem.profile`` read of a framework (``adapter.observe``)."""

    @property
    def peak_reset_exact(self) -> bool:
        """``reset_peak()`` restarts the peak exactly though unimem does the counting (an emulated
        ``reset_peak`` row), so ``track()`` may reset it per block."""
        ...

    def counter_reader(self, device: int) -> tuple[Callable[[], Counters] | None, str]:
        """A cheap ``() -> (allocated, reserved)`` for a monitor's thread, and a note saying why there
        is none. The reader answers ``(None, None)`` until the runtime has started and never starts
        it; it may raise ``unimem.errors.NoFigures`` once it knows it never will have figures here."""
        ...

    def profiler(self) -> Profiler:
        """The framework's memory profiler; ``UnsupportedFeature`` when it has none usable here."""
        ...


class PrecisionHelpers(Protocol):
    """What ``unimem.mixed_precision`` drives; a backend's ``precision`` module offers it. These
    members import the framework."""

    def device(self) -> str: ...
    def dtype(self, name: str) -> Any: ...
    def check(self, precision: str, compute_dtype: str, device: str) -> None: ...
    def cast(self, tree: Any, name: str) -> Any: ...
    def enable(self, precision: str, compute_dtype: str, device: str) -> Callable[[], None]: ...
    def loss_scaler(self, config: ScalerConfig, enabled: bool) -> LossScaler: ...


class PrecisionTopic(PrecisionHelpers, Protocol):
    """Mixed precision (``adapter.precision``): the helpers, and whose a policy's state is. A
    framework that runs no computation raises ``UnsupportedFeature`` from every helper."""

    @property
    def precision_state_per_thread(self) -> bool:
        """An enabled policy belongs to the thread that enabled it (torch's autocast), so only that
        thread may disable it."""
        ...


class SaversTopic(Protocol):
    """Memory savers (``adapter.savers``): ``unimem.remat``, ``unimem.remat_model`` and ``unimem.offload``."""

    def remat(self, fn: Callable[..., Any], policy: str) -> Callable[..., Any]:
        """``fn`` wrapped so its backward pass recomputes (``"full"``, ``"matmuls"``) or fetches from
        the host (``"offload"``) what it would keep, a framework object as the same kind of object;
        ``policy`` is already validated. Raises ``UnsupportedFeature`` with the note of the
        ``remat.<policy>`` row where it cannot."""
        ...

    def offload(self) -> contextlib.AbstractContextManager[None]:
        """A context in which the tensors autograd saves are kept on the host; ``UnsupportedFeature``
        naming the nearest alternative where there is none."""
        ...

    def remat_model(self, model: Any, policy: str, matches: Callable[[Any], bool]) -> int:
        """Every submodule of ``model`` (not ``model`` itself) that ``matches``, saved in place with ``policy``,
        nothing below a saved one looked at; how many distinct submodules are saved (0 changes nothing).
        ``ConfigError`` naming ``model`` when it is not the framework's model; ``UnsupportedFeature`` where
        the framework cannot change a model in place."""
        ...


class AccumulationTopic(Protocol):
    """Gradient accumulation (``adapter.accumulation``): ``unimem.accumulate`` and ``accumulate_grads``."""

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager[None]:
        """A context in which backward passes through ``model`` keep their gradients local (all but
        the last micro-batch); ``UnsupportedFeature`` where the framework has none."""
        ...

    def add_gradients(self, total: Any, grads: Any, weight: float) -> Any:
        """``total + weight * grads`` leaf by leaf (``total`` None: ``weight * grads``); a None leaf
        stays None. ``UnsupportedFeature`` where the framework computes no gradients."""
        ...


class SearchTopic(Protocol):
    """What ``unimem.find_batch_size`` asks of a framework (``adapter.search``)."""

    @property
    def release_every_trial(self) -> bool:
        """Give the cache back after every trial (cheap, and each peak starts clean)."""
        ...

    @property
    def settle_call(self) -> bool:
        """After the answer is re-run, one call at ``start`` inside ``settle`` lets the pool shrink back."""
        ...

    @property
    def rematerializes(self) -> bool:
        """The framework may trade compute for memory near its limit, so a step's peak can stop
        growing with the batch there: peaks measured below it bound nothing above."""
        ...

    @property
    def saturation_cause(self) -> str:
        """How it saves memory there, as the search's note names it (said only where ``rematerializes``)."""
        ...

    @property
    def predicts_concurrently(self) -> bool:
        """``predict_peak`` and ``predict_largest_buffer`` may run in several threads at once, each on
        its own lowered step."""
        ...

    @property
    def kept_outputs_note(self) -> str:
        """Why bytes stay in use after a failed trial, as the search's note says it."""
        ...

    @property
    def fresh_process_advice(self) -> str | None:
        """What a fresh process needs to fit the more that the search's notes predict for it, in the
        framework's words; None: nothing beyond starting one."""
        ...

    @property
    def remat_share(self) -> float | None:
        """The share of the pool's limit past which the framework's compiler rematerializes a step (recomputes
        to fit, and runs slower), as the predicted peak reads; None where it never does or it is unknown."""
        ...

    def search_done(self) -> None:
        """The search ended: let go of what it kept for its own use (processes, caches)."""
        ...

    def search_capacity(self, snapshot: MemoryStats) -> int | None:
        """Bytes a trial's measured peak may reach, from ``stats()`` before the search (the cap by
        default); None when unknown."""
        ...

    def pool_overhead(self, peak: int | None, peak_reserved: int | None) -> int:
        """Bytes the pool holds beyond those in use at a trial's peak, which the cap must also hold."""
        ...

    def settle(self, release: Callable[[], None]) -> contextlib.AbstractContextManager[None]:
        """A context around the search's last call that may run ``release`` (give the pool back) at a
        better moment."""
        ...

    def predict_peak(self, lowered: Any) -> int | None:
        """The peak bytes a step will reach, read from what ``lower(n)`` returned without running it;
        None when the framework cannot size it."""
        ...

    def predict_largest_buffer(self, lowered: Any) -> int | None:
        """The largest single buffer the step will allocate, read from its compiled form; None when unknown."""
        ...

    def search_largest_buffer(self, snapshot: MemoryStats) -> int | None:
        """The largest single buffer the allocator can hand out now (``snapshot`` is ``stats()``); None
        when unknown or not a bound."""
        ...

    def predict_rematerialized(self, lowered: Any) -> bool | None:
        """Whether the compiled form of what ``lower(n)`` returned was rematerialized to fit under the
        compiler's limit (or could not be brought under it); None when the framework cannot tell."""
        ...

    def search_room_after_region(self, snapshot: MemoryStats) -> int | None:
        """The largest single buffer the allocator could still hand out after a compilation took one more
        region from a pool grown on demand (compilers that tune on real buffers take some); None where
        compilations take nothing from the pool, or the figures are unknown."""
        ...

    def search_notes(self) -> list[str]:
        """What the framework has to say of the search that just ended (``search_done`` ran), for its notes."""
        ...

    def search_make_room(self, snapshot: MemoryStats, adds: int, device: int) -> None:
        """Before a call predicted to add ``adds`` bytes to what is in use (as ``snapshot`` shows it), in a
        pool grown on demand in regions: grow the pool by one region that holds all of them, so that the
        call's buffers are cut from it rather than each taking a region of its own. Nothing elsewhere."""
        ...

    def search_compiled_call(self) -> contextlib.AbstractContextManager[list[CompiledProgram] | None]:
        """The context a measured call of the step runs in: where the framework compiles what the call
        compiles elsewhere (taking nothing from this process's pool) and reads its figures, the list it
        fills with each program compiled during the call; None inside where it does not."""
        ...

    def trial_context(self, model: Any) -> Callable[[], contextlib.AbstractContextManager[None]] | None:
        """A callable returning a fresh context per trial of ``find_batch_size(..., model=model)`` in
        which the trial makes no collective; None when ``model`` is not this framework's. Raises
        ``ConfigError("model")`` for a model that communicates inside its forward pass."""
        ...

    def explain_step_error(self, exc: BaseException, after_oom: bool) -> str | None:
        """A note naming the cause of a step's own (not out-of-memory) error, ``after_oom`` when a
        trial failed before it; None when there is nothing to add."""
        ...


class DistributedTopic(Protocol):
    """The framework under a launcher (``adapter.distributed``): the rank's device pin, and the
    key-value store of its distributed runtime."""

    def plan_pin(self, device: int | None, *, per_rank: bool, note: str) -> list[Step]:
        """Steps that make device ``device`` (None: nothing to pin) this rank's own, pure like
        ``plan()``; through ``CUDA_VISIBLE_DEVICES`` with ``per_rank``, else through the framework's
        own device call. A pin never refuses: what cannot be done is a ``"skipped"`` step saying why."""
        ...

    def distributed_store(self) -> KeyValueStore | None:
        """The key-value store of the framework's distributed runtime once the script initialised it
        (never initialises it); None otherwise."""
        ...


class WorkloadsTopic(Protocol):
    """The reference workloads ``unimem compare`` runs (``adapter.workloads``; the adapter's
    ``runs_workloads`` says there are some)."""

    def start_device(self) -> str:
        """Start the device runtime with a tiny op; returns the device's name (``"cpu"`` without a GPU)."""
        ...

    def workload_step(self, workload: str, shapes: Any, dtype: str) -> tuple[Callable[[], None], int]:
        """``(step, parameter_count)`` of reference workload ``workload`` (``unimem.workload_specs``)
        at ``shapes`` in ``dtype``; with ``shapes.saver`` set, every block runs through ``shapes.wrap``
        (``unimem.workload_specs.loss_function`` builds the loss either way)."""
        ...


class EstimateTopic(Protocol):
    """A step's peak predicted without allocating it, for ``unimem.estimate_memory`` (``adapter.estimate``)."""

    def estimate_size(self, step: Any, size: int, plan: Plan) -> Measured:
        """What ``step`` (as this framework's users write one: ``unimem.estimate_memory`` says which) needs at
        batch size ``size`` under ``plan``, found without allocating it: a trace of its allocations or the
        compiler's figures. ``ConfigError("step")`` when ``step`` is not such a step; ``UnsupportedFeature``
        (feature ``"estimate"``) naming what is missing where the framework cannot size it."""
        ...


# Each accessor of ``Backend`` and the protocol its object keeps, in the order the reference lists them.
TOPICS: dict[str, type] = {
    "diagnose": DiagnoseTopic,
    "observe": ObserveTopic,
    "precision": PrecisionTopic,
    "savers": SaversTopic,
    "accumulation": AccumulationTopic,
    "search": SearchTopic,
    "distributed": DistributedTopic,
    "workloads": WorkloadsTopic,
    "estimate": EstimateTopic,
}


def members(protocol: type) -> list[str]:
    """The names a topic object must have for ``protocol`` (its methods and data, inherited ones included)."""
    names: list[str] = []
    for klass in reversed(protocol.__mro__):
        if klass is object or klass is Protocol or not getattr(klass, "_is_protocol", False):
            continue
        names += [n for n in vars(klass) if not n.startswith("_") and n not in names]
    return names
