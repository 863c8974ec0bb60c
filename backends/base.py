"""What every backend adapter is: a small core, and one accessor per topic.

The core: identity (``name``, ``module``, ``distributions``, ``version()``, ...), the
capability table (``CAPABILITIES``) and the traits several parts of the front read, the
phase, ``check``/``plan``, and the queries (``stats``, ``reset_peak``, ``clear_cache``,
``fragmentation``, ``device_uuid``). Everything else is a topic (``diagnose``, ``observe``,
``precision``, ``savers``, ``accumulation``, ``search``, ``distributed``, ``workloads``):
one accessor each, typed by its Protocol in ``unimem.backends.topics``. The defaults here
(``Diagnose``, ``Observe``, ...) answer "this framework cannot", as the capability table's
unsupported rows say; an adapter returns its own object for a topic its framework has
(``backends/<name>/<topic>.py``), made on first use.

Plan steps live in ``unimem.backends.steps``, the post-import hooks in ``unimem.import_hooks``;
``Step``, ``env_step``, ``when_imported`` and ``pending_hooks`` stay importable from here.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import sys
import types
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from unimem.backends.steps import STATUS_SKIPPED, STATUS_UNCHANGED, Step, devices_step, env_step
from unimem.backends.topics import (
    AccumulationTopic,
    Counters,
    DiagnoseTopic,
    DistributedTopic,
    EstimateTopic,
    KeyValueStore,
    ObserveTopic,
    PrecisionHelpers,
    PrecisionTopic,
    Profiler,
    SaversTopic,
    SearchTopic,
    WorkloadsTopic,
)

from unimem.config import Settings
from unimem.errors import ConfigError, UnimemWarning, UnsupportedFeature
from unimem.import_hooks import pending_hooks, when_imported
from unimem.memory_stats import MemoryStats
from unimem.support import Phase, Support, When

if TYPE_CHECKING:
    from unimem.live_memory import LiveMemory
    from unimem.loss_scaling import LossScaler, ScalerConfig
    from unimem.step_estimates import Measured, Plan

__all__ = [
    "Accumulation",
    "Backend",
    "CompiledProgram",
    "Counters",
    "Diagnose",
    "Distributed",
    "Estimate",
    "KeyValueStore",
    "Observe",
    "Precision",
    "PrecisionHelpers",
    "Profiler",
    "Savers",
    "Search",
    "Step",
    "Workloads",
    "env_step",
    "error_class_in",
    "no_such_device",
    "pending_hooks",
    "when_imported",
]


# Members an adapter class had before the topics, and the topic that holds each now: a subclass
# that still defines one would be ignored without a word, so it is told where the member went.
_MOVED = {
    **dict.fromkeys(
        ("owns_error", "recognises_oom", "requested_bytes", "oom_place", "place_spelling", "precision_in_force"),
        "diagnose",
    ),
    **dict.fromkeys(("live_memory", "scan_needs_gc", "accumulation_code", "checkpoint_code"), "diagnose"),
    **dict.fromkeys(("counter_reader", "profiler", "peak_reset_exact"), "observe"),
    "precision_state_per_thread": "precision",
    **dict.fromkeys(("remat", "offload"), "savers"),
    **dict.fromkeys(("no_sync", "add_gradients"), "accumulation"),
    **dict.fromkeys(
        ("release_every_trial", "settle_call", "rematerializes", "saturation_cause", "predicts_concurrently"),
        "search",
    ),
    **dict.fromkeys(("kept_outputs_note", "search_capacity", "pool_overhead", "settle", "predict_peak"), "search"),
    **dict.fromkeys(
        ("predict_largest_buffer", "search_largest_buffer", "trial_context", "explain_step_error"), "search"
    ),
    **dict.fromkeys(("plan_pin", "distributed_store"), "distributed"),
    **dict.fromkeys(("start_device", "workload_step"), "workloads"),
}


class Backend(ABC):
    """Base of every adapter: the core every backend answers, and one accessor per topic.

    A subclass must set ``name``, ``module``, ``distributions`` and ``CAPABILITIES`` (one
    ``Support`` per feature of ``unimem.support.FEATURES``, unsupported ones included),
    and implement ``phase``, ``plan``, ``stats``, ``reset_peak`` and ``clear_cache``.
    Everything else is optional: a topic its framework has is an accessor returning the
    topic's object (a ``cached_property`` that imports ``backends/<name>/<topic>.py`` on
    first use); the base's default answers "cannot". The class is data and methods:
    importing it must not import the framework (import it inside methods, never at module
    top), and it is instantiated without arguments.

    Attributes:
        name (str): The backend's name, as users pass it to ``backend=``.
        module (str): The framework's top-level module; unimem checks it is installed
            without importing it.
        distributions (tuple[str, ...]): pip distributions that carry the framework, first
            found wins (for ``version()``).
        CAPABILITIES (dict[str, Support]): The capability table: one entry per feature.
        error_modules (tuple[str, ...]): Top-level modules whose exception classes are this
            framework's (default none); names of the framework, read from the class.
        preallocation_var (str | None): The variable with which a user states
            preallocation; None (default): the framework allocates on demand.
        failed_step_keeps_outputs (bool): A failed execution keeps its outputs in use until
            the process ends (XLA does); default False. The search and the OOM report read it.
        runs_workloads (bool): Its ``workloads`` topic runs the reference workloads, so
            ``unimem compare`` runs it; default False. Read from the class: compare lists
            the frameworks that would run them before any is installed.
        workload_env (dict[str, str]): Variables a fresh process running its workload
            starts with unless the user set them (quieter logs).

    Example:
        ```python
        from functools import cached_property

        from unimem.backends.base import Backend, Step
        from unimem.backends.topics import SearchTopic
        from unimem.support import Phase

        class MyBackend(Backend):
            name = "mine"
            module = "myframework"
            distributions = ("myframework",)
            CAPABILITIES = {...}  # one Support per feature of unimem.support.FEATURES

            def phase(self) -> Phase: ...
            def plan(self, settings) -> list[Step]: ...
            def stats(self, device=0, *, nvml=True): ...
            def reset_peak(self, device=0) -> None: ...
            def clear_cache(self, device=0) -> int: ...

            @cached_property
            def search(self) -> SearchTopic:
                from .search import MySearch  # a subclass of unimem.backends.base.Search

                return MySearch(self)
        ```
    """

    name: ClassVar[str]
    module: ClassVar[str]  # top-level module of the framework
    distributions: ClassVar[tuple[str, ...]]  # pip distributions that carry it, first found wins
    CAPABILITIES: ClassVar[dict[str, Support]]

    # --- traits several parts of the front read (data, read from the class) -----------
    # Top-level modules whose exception classes are this framework's.
    error_modules: ClassVar[tuple[str, ...]] = ()
    # The variable with which a user states preallocation; None: allocates on demand.
    preallocation_var: ClassVar[str | None] = None
    # A failed execution keeps its outputs in use until the process ends (XLA does).
    failed_step_keeps_outputs: ClassVar[bool] = False
    # Its workloads topic runs the reference workloads (``unimem compare`` runs it).
    runs_workloads: ClassVar[bool] = False
    # Variables a fresh process running its workload starts with unless the user set them (quieter logs).
    workload_env: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Warn of members an adapter written before the topics defines, which unimem no longer reads."""
        super().__init_subclass__(**kwargs)
        advice = [
            f"{cls.__name__}.{name} is not read: unimem reads it from the {topic!r} topic; move it to a subclass "
            f"of unimem.backends.base.{topic.capitalize()} that {cls.__name__}.{topic} returns"
            for name, topic in _MOVED.items()
            if name in vars(cls)
        ]
        if isinstance(vars(cls).get("precision"), types.FunctionType):  # a method where the accessor is
            advice.append(
                f"{cls.__name__}.precision is a method: make it a @cached_property returning the helpers "
                "(with precision_state_per_thread), as unimem.mixed_precision reads it without calling it"
            )
        for text in advice:
            warnings.warn(f"{text} (docs/api/backends.md)", UnimemWarning, stacklevel=2)

    # --- identity ---------------------------------------------------------
    def version(self) -> str | None:
        """Installed version, read from package metadata without importing.

        Returns:
            The version of the first of ``distributions`` installed; None if none is.
        """
        for dist in self.distributions:
            try:
                return importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
        return None

    def imported(self) -> bool:
        """Whether the framework's module is already imported in this process (imports nothing)."""
        return self.module in sys.modules

    def framework(self) -> Any:
        """The framework module, imported on demand (explicit backend calls only).

        Returns:
            The module named by ``module``.
        """
        return sys.modules.get(self.module) or importlib.import_module(self.module)

    @abstractmethod
    def phase(self) -> Phase:
        """How far the framework has got; must not import or start it.

        Returns:
            ``Phase.NOT_IMPORTED``, ``Phase.IMPORTED`` or ``Phase.INITIALIZED`` (device
            runtime started: allocator and visible devices are fixed).
        """

    # --- configuration ----------------------------------------------------
    def check(self, settings: Settings) -> None:
        """Refuse combinations this framework cannot take, from the settings alone.

        Runs for every backend of a ``configure`` call before any ``plan()``, so a
        refusal comes before anything (NVML included) is asked.

        Args:
            settings: What this backend is asked to do; a None field means "leave as it is".

        Raises:
            ConfigError: The combination cannot be taken by this framework (naming the
                parameter and what to pass instead).
        """
        return None  # most frameworks take any combination the config model allows

    @abstractmethod
    def plan(self, settings: Settings) -> list[Step]:
        """Steps that apply ``settings``. Pure: reads state, changes nothing.

        Raises ``ConfigError`` for combinations the framework cannot take and
        ``UnsupportedFeature`` for settings it can never do; marks ``too_late``
        on steps whose moment has passed.

        Args:
            settings: What this backend is asked to do; a None field means "leave as it is".

        Returns:
            One step per change (or per setting already so, with status ``"unchanged"``).

        Raises:
            ConfigError: A combination the framework cannot take.
            UnsupportedFeature: A setting the framework can never make.
        """

    def takes_safe_growth(self, settings: Settings) -> bool:
        """Whether growth may be switched on for it when frameworks share a process and the
        user said nothing about growth (only a preallocating framework needs it).

        Args:
            settings: What this backend is asked to do.

        Returns:
            By default: True when ``preallocation_var`` is set on the class and the user has
            not set that variable.
        """
        return self.preallocation_var is not None and os.environ.get(self.preallocation_var) is None

    # --- queries ------------------------------------------------------------
    @abstractmethod
    def stats(self, device: int = 0, *, nvml: bool = True) -> MemoryStats:
        """A snapshot; never starts the framework's device runtime.

        ``nvml=False`` skips the NVML queries (device and process figures are then None):
        the framework's own counters only, for hot loops.

        Args:
            device: The device index, as the framework counts devices.
            nvml: Whether to add NVML's device and per-process figures.

        Returns:
            The snapshot; every figure the framework does not keep, or cannot give yet
            (runtime not started, no GPU), is None, never 0.

        Raises:
            ConfigError: The started framework has no such device (see ``no_such_device``).
        """

    @abstractmethod
    def reset_peak(self, device: int = 0) -> None:
        """Start the peak figures afresh (natively, or emulated as the capability table says).

        Args:
            device: The device index.

        Raises:
            UnsupportedFeature: The backend keeps no peak.
        """

    @abstractmethod
    def clear_cache(self, device: int = 0) -> int:
        """Give cached memory back to the device; return the bytes measured going back.

        Args:
            device: The device index.

        Returns:
            The bytes measured going back, 0 or more (0 where the framework cannot: warn
            with ``UnimemWarning`` saying what to do instead).

        Raises:
            UnsupportedFeature: The backend has no pool to give back.
        """

    def fragmentation(self, device: int = 0) -> dict[str, int | None] | None:
        """``free_in_pool``, ``largest_free_block``, ``free_blocks`` of the pool, or None if
        the framework exposes none (or its runtime has not started). May be slow: on request only.

        Args:
            device: The device index.

        Returns:
            ``{"free_in_pool": ..., "largest_free_block": ..., "free_blocks": ...}`` (bytes,
            bytes, a count; each None where unknown), or None (the default: unknown).
        """
        return None

    def device_uuid(self, device: int) -> str | None:
        """The device's UUID when the framework already knows it (maps to NVML exactly); never starts it.

        Args:
            device: The device index, as the framework counts devices.

        Returns:
            The UUID (``"GPU-..."``), or None (the default) when it is not known.
        """
        return None

    # --- topics: one accessor each, typed by its protocol (unimem.backends.topics) -------
    @cached_property
    def diagnose(self) -> DiagnoseTopic:
        """Its part in ``is_oom`` and the out-of-memory report; by default it recognises nothing."""
        return Diagnose(self)

    @cached_property
    def observe(self) -> ObserveTopic:
        """The monitor's counters and the memory profiler; by default neither."""
        return Observe(self)

    @cached_property
    def precision(self) -> PrecisionTopic:
        """The mixed-precision helpers; by default each raises ``UnsupportedFeature``."""
        return Precision(self)

    @cached_property
    def savers(self) -> SaversTopic:
        """``remat`` and ``offload``; by default both raise ``UnsupportedFeature``."""
        return Savers(self)

    @cached_property
    def accumulation(self) -> AccumulationTopic:
        """``no_sync`` and ``add_gradients``; by default both raise ``UnsupportedFeature``."""
        return Accumulation(self)

    @cached_property
    def search(self) -> SearchTopic:
        """What the batch-size search asks; by default the cap, nothing predicted."""
        return Search(self)

    @cached_property
    def distributed(self) -> DistributedTopic:
        """The rank's pin and the distributed runtime's store; by default ``CUDA_VISIBLE_DEVICES`` only."""
        return Distributed(self)

    @cached_property
    def workloads(self) -> WorkloadsTopic:
        """The reference workloads of ``unimem compare``; by default none."""
        return Workloads(self)

    @cached_property
    def estimate(self) -> EstimateTopic:
        """A step's peak predicted without allocating it; by default ``UnsupportedFeature``."""
        return Estimate(self)


def _cannot(backend: Backend, feature: str, otherwise: str) -> str:
    """Why ``backend`` cannot do ``feature``: its row's note when the row says unsupported, else ``otherwise``."""
    support = backend.CAPABILITIES.get(feature)
    return support.note if support is not None and not support.supported else otherwise


# --- the topics' defaults: "this framework cannot" ------------------------------------
# Each takes the adapter, and is the base class of an adapter's own topic object, which
# overrides what its framework can. Their members are documented on the protocols.


class Diagnose:
    """The diagnose topic (``DiagnoseTopic``) of a framework that recognises and scans nothing."""

    scan_needs_gc: ClassVar[bool] = False
    accumulation_code: ClassVar[str] = ""
    checkpoint_code: ClassVar[str] = ""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def owns_error(self, exc: BaseException) -> bool:
        for klass in type(exc).__mro__:
            module = getattr(klass, "__module__", "") or ""
            if module.split(".")[0] in self.backend.error_modules:
                return True
        return False

    def recognises_oom(self, exc: BaseException, message: str) -> bool:
        return False

    def requested_bytes(self, message: str) -> tuple[int, str] | None:
        return None

    def oom_place(self, exc: BaseException, device: int, message: str) -> str | None:
        return None

    def place_spelling(self, place: str) -> str | None:
        return place

    def precision_in_force(self) -> tuple[bool, str] | None:
        return None

    def live_memory(self, objects: list[object], place: str | None, top: int) -> LiveMemory | None:
        return None


class Observe:
    """The observe topic (``ObserveTopic``) of a framework with no allocator counters and no profiler."""

    peak_reset_exact: ClassVar[bool] = False

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def counter_reader(self, device: int) -> tuple[Callable[[], Counters] | None, str]:
        return None, f"{self.backend.name}: no allocator counters"

    def profiler(self) -> Profiler:
        name = self.backend.name
        raise UnsupportedFeature(name, "profile", f"{name} has no memory profiler unimem can drive")


class Precision:
    """The precision topic (``PrecisionTopic``) of a framework with no precision to set: every helper raises."""

    precision_state_per_thread: ClassVar[bool] = False

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def _refuse(self) -> UnsupportedFeature:
        name = self.backend.name
        otherwise = f"{name} runs no computation to set a precision for"
        return UnsupportedFeature(name, "precision", _cannot(self.backend, "precision.bf16", otherwise))

    def device(self) -> str:
        raise self._refuse()

    def dtype(self, name: str) -> Any:
        raise self._refuse()

    def check(self, precision: str, compute_dtype: str, device: str) -> None:
        raise self._refuse()

    def cast(self, tree: Any, name: str) -> Any:
        raise self._refuse()

    def enable(self, precision: str, compute_dtype: str, device: str) -> Callable[[], None]:
        raise self._refuse()

    def loss_scaler(self, config: ScalerConfig, enabled: bool) -> LossScaler:
        raise self._refuse()


class Savers:
    """The savers topic (``SaversTopic``) of a framework that can neither recompute nor offload."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def _refusal(self, policy: str) -> UnsupportedFeature:
        name, feature = self.backend.name, f"remat.{policy}"
        return UnsupportedFeature(name, feature, _cannot(self.backend, feature, f"{name} cannot recompute activations"))

    def remat(self, fn: Callable[..., Any], policy: str) -> Callable[..., Any]:
        raise self._refusal(policy)

    def offload(self) -> contextlib.AbstractContextManager[None]:
        # Where the row says supported, offload exists only as a policy: remat says how.
        name = self.backend.name
        otherwise = f"{name} keeps saved activations on the host only through unimem.remat(fn, policy='offload')"
        raise UnsupportedFeature(name, "offload", _cannot(self.backend, "remat.offload", otherwise))

    def remat_model(self, model: Any, policy: str, matches: Callable[[Any], bool]) -> int:
        raise self._refusal(policy)


class Accumulation:
    """The accumulation topic (``AccumulationTopic``) of a framework with no no_sync and no gradients to add."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager[None]:
        name = self.backend.name
        otherwise = (
            f"{name} synchronises gradients where the script applies them: pass no model= to "
            "unimem.accumulate, and sum the gradients with unimem.accumulate_grads"
        )
        raise UnsupportedFeature(name, "accumulate", _cannot(self.backend, "accumulate", otherwise))

    def add_gradients(self, total: Any, grads: Any, weight: float) -> Any:
        name = self.backend.name
        otherwise = f"{name} computes no gradients to accumulate"
        raise UnsupportedFeature(name, "accumulate", _cannot(self.backend, "accumulate", otherwise))


class CompiledProgram(NamedTuple):
    """A program a measured call of the step compiled elsewhere, as the framework sized it
    (``Search.search_compiled_call``): its peak and argument bytes, whether the compiler rematerialized it,
    and whether it was refused before it ran (it could not fit: nothing ran, nothing was kept)."""

    peak: int
    arguments: int
    rematerialized: bool
    refused: bool = False


class Search:
    """The search topic (``SearchTopic``) of a framework measured trial by trial against its cap, nothing predicted."""

    release_every_trial: ClassVar[bool] = False
    settle_call: ClassVar[bool] = False
    rematerializes: ClassVar[bool] = False
    saturation_cause: ClassVar[str] = "the framework saves memory to fit near its limit (recomputing or swapping)"
    predicts_concurrently: ClassVar[bool] = False
    remat_share: ClassVar[float | None] = None
    fresh_process_advice: ClassVar[str | None] = None
    kept_outputs_note: ClassVar[str] = (
        "something still references what the failed steps allocated (gradients set in a failed backward, "
        "which the next step reuses, or a caught exception, a list of outputs)"
    )

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def search_done(self) -> None:
        return None

    def search_capacity(self, snapshot: MemoryStats) -> int | None:
        return snapshot.limit

    def pool_overhead(self, peak: int | None, peak_reserved: int | None) -> int:
        return 0

    def settle(self, release: Callable[[], None]) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def predict_peak(self, lowered: Any) -> int | None:
        return None

    def predict_largest_buffer(self, lowered: Any) -> int | None:
        return None

    def search_largest_buffer(self, snapshot: MemoryStats) -> int | None:
        return None

    def predict_rematerialized(self, lowered: Any) -> bool | None:
        return None

    def search_room_after_region(self, snapshot: MemoryStats) -> int | None:
        return None

    def search_notes(self) -> list[str]:
        return []

    def search_make_room(self, snapshot: MemoryStats, adds: int, device: int) -> None:
        return None

    def search_compiled_call(self) -> contextlib.AbstractContextManager[list[CompiledProgram] | None]:
        return contextlib.nullcontext(None)

    def trial_context(self, model: Any) -> Callable[[], contextlib.AbstractContextManager[None]] | None:
        return None

    def explain_step_error(self, exc: BaseException, after_oom: bool) -> str | None:
        return None


class Distributed:
    """The distributed topic (``DistributedTopic``) of a framework with no device call and no runtime store:
    a pin is ``CUDA_VISIBLE_DEVICES`` per rank or nothing."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def plan_pin(self, device: int | None, *, per_rank: bool, note: str) -> list[Step]:
        name = self.backend.name
        if device is None:
            return [Step(name, "pin", None, "none", "(nothing to pin)", status=STATUS_UNCHANGED, note=note)]
        if per_rank:
            fix = "pass devices='per-rank' before the framework's first GPU operation, or restart the process"
            step = devices_step(name, (device,), phase=self.backend.phase(), when=When.BEFORE_INIT, fix=fix)
            step.note = note
            return [step]
        return [
            Step(
                name,
                "pin",
                device,
                "none",
                "(no device call)",
                status=STATUS_SKIPPED,
                note=f"{note}; {name} has no device call unimem can make: pass devices='per-rank' "
                "(CUDA_VISIBLE_DEVICES per rank) or select the device in the script",
            )
        ]

    def distributed_store(self) -> KeyValueStore | None:
        return None


class Workloads:
    """The workloads topic (``WorkloadsTopic``) of a framework that runs no reference workload."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def start_device(self) -> str:
        name = self.backend.name
        raise UnsupportedFeature(name, "compare", f"{name} runs no workload")

    def workload_step(self, workload: str, shapes: Any, dtype: str) -> tuple[Callable[[], None], int]:
        name = self.backend.name
        raise UnsupportedFeature(name, "compare", f"{name} runs no workload")


class Estimate:
    """The estimate topic (``EstimateTopic``) of a framework that cannot size a step without running it."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def estimate_size(self, step: Any, size: int, plan: Plan) -> Measured:
        name = self.backend.name
        raise UnsupportedFeature(
            name, "estimate", f"{name} cannot predict a step's peak without running it; measure it with unimem.track"
        )


def no_such_device(backend: str, device: int, count: int) -> ConfigError:
    """The error for a query on a device index the started framework does not have."""
    return ConfigError("device", f"{backend} sees {count} device(s), numbered from 0; there is no device {device}")


def error_class_in(exc: BaseException, classes: tuple[tuple[str, str], ...]) -> bool:
    """Whether a class in ``exc``'s MRO is one of ``(top-level module, class name)``; imports nothing."""
    for klass in type(exc).__mro__:
        module = getattr(klass, "__module__", "") or ""
        for prefix, name in classes:
            if klass.__name__ == name and (module == prefix or module.startswith(prefix + ".")):
                return True
    return False
