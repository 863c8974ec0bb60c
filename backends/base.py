"""What every backend adapter is: a capability table, a phase, a plan, queries, and the
per-framework behaviour the front asks for by name (OOM recognition, live objects,
monitor counters, profiler, precision helpers, batch-search hooks, compare workloads).

Plan steps live in ``unimem.backends.steps``, the post-import hooks in ``unimem.import_hooks``,
the topics' small types in ``unimem.backends.topics``; the names plug-ins import from here
(``Backend``, ``Step``, ``env_step``, ``when_imported``, ``pending_hooks``) stay importable here.

Every optional behaviour has a default here that means "this framework cannot", and a
row in the capability table (``CAPABILITIES``) that says so; an adapter overrides what
its framework can do. The front never names a framework: it calls these methods.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from unimem.backends.steps import STATUS_SKIPPED, STATUS_UNCHANGED, Step, devices_step, env_step
from unimem.backends.topics import Counters, KeyValueStore, PrecisionHelpers, Profiler

from unimem.config import Settings
from unimem.errors import ConfigError, UnsupportedFeature
from unimem.import_hooks import pending_hooks, when_imported
from unimem.memory_stats import MemoryStats
from unimem.support import Phase, Support, When

if TYPE_CHECKING:
    from unimem.diagnose.live_objects import LiveMemory

__all__ = [
    "Backend",
    "Counters",
    "KeyValueStore",
    "PrecisionHelpers",
    "Profiler",
    "Step",
    "env_step",
    "pending_hooks",
    "when_imported",
]


class Backend(ABC):
    """Base of every adapter. Subclasses fill the class attributes and the methods their
    framework supports; the defaults below mean "cannot" and match an UNSUPPORTED row.

    A subclass must set ``name``, ``module``, ``distributions`` and ``CAPABILITIES`` (one
    ``Support`` per feature of ``unimem.support.FEATURES``, unsupported ones included),
    and implement ``phase``, ``plan``, ``stats``, ``reset_peak`` and ``clear_cache``.
    Everything else is optional. The class is data and methods: importing it must not
    import the framework (import it inside methods, never at module top), and it is
    instantiated without arguments.

    Attributes:
        name (str): The backend's name, as users pass it to ``backend=``.
        module (str): The framework's top-level module; unimem checks it is installed
            without importing it.
        distributions (tuple[str, ...]): pip distributions that carry the framework, first
            found wins (for ``version()``).
        CAPABILITIES (dict[str, Support]): The capability table: one entry per feature.
        error_modules (tuple[str, ...]): Top-level modules whose exception classes are this
            framework's (default none).
        preallocation_var (str | None): The variable with which a user states
            preallocation; None (default): the framework allocates on demand.
        failed_step_keeps_outputs (bool): A failed execution keeps its outputs in use until
            the process ends (XLA does); default False.
        peak_reset_exact (bool): ``reset_peak()`` restarts the peak exactly though unimem
            does the counting, so ``track()`` may reset it per block; default False.
        accumulation_code (str): The gradient-accumulation snippet an OOM report offers,
            formatted with ``{micro}``, ``{steps}``, ``{total}``; empty: none.
        checkpoint_code (str): The activation-checkpointing snippet an OOM report offers;
            empty: none.
        scan_needs_gc (bool): Its live scan walks every object the garbage collector
            tracks (``live_memory`` then gets ``gc.get_objects()``); default False.
        precision_state_per_thread (bool): An enabled precision policy belongs to the
            thread that enabled it (torch's autocast), so only that thread may disable
            it; default False.
        release_every_trial (bool): The batch-size search gives the cache back after every
            trial (cheap, and peaks start clean); default False.
        kept_outputs_note (str): Why bytes stay in use after a failed trial, as the
            search's note says it.
        saturation_cause (str): How the framework saves memory near its limit, as the
            search's note on peaks that stopped growing names it (where ``rematerializes``).
        runs_workloads (bool): It overrides ``start_device`` and ``workload_step``, so
            ``unimem compare`` runs it; default False.
        workload_env (dict[str, str]): Variables a fresh process running its workload
            starts with unless the user set them (quieter logs).

    Example:
        ```python
        from unimem.backends.base import Backend, Step
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
        ```
    """

    name: ClassVar[str]
    module: ClassVar[str]  # top-level module of the framework
    distributions: ClassVar[tuple[str, ...]]  # pip distributions that carry it, first found wins
    CAPABILITIES: ClassVar[dict[str, Support]]

    # --- traits the front reads (data, so a newcomer reads them in one place) ----------
    # Top-level modules whose exception classes are this framework's.
    error_modules: ClassVar[tuple[str, ...]] = ()
    # The variable with which a user states preallocation; None: allocates on demand.
    preallocation_var: ClassVar[str | None] = None
    # A failed execution keeps its outputs in use until the process ends (XLA does).
    failed_step_keeps_outputs: ClassVar[bool] = False
    # reset_peak() restarts the peak exactly, though unimem does the counting (a memory hook):
    # track() may then reset it per block, as it does where the framework's own reset is native.
    peak_reset_exact: ClassVar[bool] = False
    # Snippets an OOM report offers, formatted with {micro}, {steps}, {total}.
    accumulation_code: ClassVar[str] = ""
    checkpoint_code: ClassVar[str] = ""

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

    # --- diagnosis: out-of-memory errors --------------------------------------
    @classmethod
    def owns_error(cls, exc: BaseException) -> bool:
        """Whether ``exc``'s class comes from this framework. Imports nothing.

        Args:
            exc: Any exception.

        Returns:
            By default: True when a class in its MRO comes from one of ``error_modules``.
        """
        for klass in type(exc).__mro__:
            module = getattr(klass, "__module__", "") or ""
            if module.split(".")[0] in cls.error_modules:
                return True
        return False

    @classmethod
    def recognises_oom(cls, exc: BaseException, message: str) -> bool:
        """Whether ``exc`` (whose text is ``message``) is this framework's out-of-memory error.
        Imports nothing: class names and modules through the MRO, and the message.

        Args:
            exc: Any exception (one link of a chain: ``is_oom`` walks causes and contexts).
            message: ``str(exc)``, read once.

        Returns:
            True for this framework's out-of-memory error; False (the default) otherwise.
        """
        return False

    @classmethod
    def requested_bytes(cls, message: str) -> tuple[int, str] | None:
        """``(bytes, how it was read)`` of the failed request, from the error's text.

        Args:
            message: An out-of-memory error's text.

        Returns:
            The bytes asked for and the words they were read from, when this framework's
            message says; None (the default) otherwise.
        """
        return None

    def oom_place(self, exc: BaseException, device: int, message: str) -> str | None:
        """Where the failed allocation was: ``"cuda:N"``/``"gpu:N"``, ``"cpu"``, ``"mps"``; None if unknown.

        Args:
            exc: The out-of-memory error.
            device: The device index the report is for.
            message: ``str(exc)``.

        Returns:
            The place, or None (the default) when it cannot be told.
        """
        return None

    def place_spelling(self, place: str) -> str | None:
        """``place`` (``"cuda:0"``, ``"gpu:0"``, ``"cpu"``) spelled as this framework's live scan matches it.

        Args:
            place: Where an allocation failed, as ``oom_place`` spells it.

        Returns:
            The same device in this framework's spelling (by default ``place`` itself);
            None to scan every device.
        """
        return place

    def precision_in_force(self) -> tuple[bool, str] | None:
        """Whether the framework's own mixed-precision switch is on, and how that was read;
        None when it has none or it cannot be read.

        Returns:
            ``(on, how it was read)``, or None (the default).
        """
        return None

    def live_memory(self, objects: list[object], place: str | None, top: int) -> LiveMemory | None:
        """The live arrays of this framework on ``place`` (None: all), the ``top`` largest kept.
        ``objects`` is ``gc.get_objects()`` when ``scan_needs_gc``, else empty. None if it cannot scan.

        Args:
            objects: ``gc.get_objects()`` when ``scan_needs_gc``, else an empty list.
            place: The device to look at, in this framework's spelling; None: every device.
            top: How many of the largest to keep.

        Returns:
            The count, total bytes and largest live objects, described (never referenced);
            None (the default) when the framework cannot be scanned.
        """
        return None

    scan_needs_gc: ClassVar[bool] = False  # its live scan walks every object the garbage collector tracks

    # --- observation ------------------------------------------------------------
    def counter_reader(self, device: int) -> tuple[Callable[[], Counters] | None, str]:
        """A cheap ``() -> (allocated, reserved)`` for a monitor's thread, and a note saying why
        there is none. Reads ``(None, None)`` until the runtime has started; never starts it.

        A reader may raise ``unimem.errors.NoFigures`` once it knows it never will have
        figures here (a CPU device): the monitor then stops asking.

        Args:
            device: The device index.

        Returns:
            ``(reader, note)``; by default ``(None, "<name>: no allocator counters")``.
        """
        return None, f"{self.name}: no allocator counters"

    def profiler(self) -> Profiler:
        """This framework's memory profiler; ``UnsupportedFeature`` when it has none usable here.

        Returns:
            An object with ``start(path, max_entries)``, ``stop(path)`` and
            ``snapshot(path, stem, running)``, driven by ``unimem.profile``.

        Raises:
            UnsupportedFeature: The framework has no memory profiler usable here (the default).
        """
        raise UnsupportedFeature(self.name, "profile", f"{self.name} has no memory profiler unimem can drive")

    # --- mixed precision ----------------------------------------------------------
    # An enabled policy belongs to the thread that enabled it (torch's autocast state is
    # per thread), so only that thread may disable it.
    precision_state_per_thread: ClassVar[bool] = False

    def precision(self) -> PrecisionHelpers:
        """The precision helpers (imports the framework); ``UnsupportedFeature`` if none.

        Returns:
            The helpers ``unimem.mixed_precision`` drives: ``device``, ``dtype``, ``check``,
            ``cast``, ``enable``, ``loss_scaler`` (and, for Keras, ``wrap_optimizer``).

        Raises:
            UnsupportedFeature: The backend runs no computation to set a precision for
                (the default).
        """
        raise UnsupportedFeature(self.name, "precision", f"{self.name} runs no computation to set a precision for")

    # --- memory savers ----------------------------------------------------------------
    def remat(self, fn: Callable[..., Any], policy: str) -> Callable[..., Any]:
        """``fn`` wrapped so its backward pass recomputes (or fetches from the host) what it would keep.

        Args:
            fn: The block to wrap; called as the framework calls a function it differentiates.
            policy: ``"full"``, ``"matmuls"`` or ``"offload"`` (``unimem.training.savers.POLICIES``),
                already validated by the front.

        Returns:
            A callable with ``fn``'s signature and results.

        Raises:
            UnsupportedFeature: The framework cannot do ``policy`` (the default), with the
                note of its ``remat.<policy>`` row.
        """
        feature = f"remat.{policy}"
        raise UnsupportedFeature(self.name, feature, self._cannot(feature, f"{self.name} cannot recompute activations"))

    def offload(self) -> contextlib.AbstractContextManager[None]:
        """A context in which the tensors autograd saves for the backward pass are kept on the host.

        Returns:
            A context manager.

        Raises:
            UnsupportedFeature: The framework has no such context (the default); the message
                names the nearest alternative.
        """
        # Where the row says supported, offload exists only as a policy: remat says how.
        otherwise = f"{self.name} keeps saved activations on the host only through unimem.remat(fn, policy='offload')"
        raise UnsupportedFeature(self.name, "offload", self._cannot("remat.offload", otherwise))

    def _cannot(self, feature: str, otherwise: str) -> str:
        """Why this backend cannot do ``feature``: its row's note when the row says unsupported, else ``otherwise``."""
        support = self.CAPABILITIES.get(feature)
        return support.note if support is not None and not support.supported else otherwise

    # --- gradient accumulation (unimem.accumulate, accumulate_grads) ---------------------
    def no_sync(self, model: Any) -> contextlib.AbstractContextManager[None]:
        """A context in which backward passes through ``model`` keep their gradients local, for
        ``unimem.accumulate`` to skip the synchronisation on all but the last micro-batch.

        Args:
            model: The module the script wrapped for data parallelism (or a plain one).

        Returns:
            A context manager.

        Raises:
            UnsupportedFeature: The framework has no such context (the default).
        """
        raise UnsupportedFeature(
            self.name,
            "accumulate",
            self._cannot(
                "accumulate",
                f"{self.name} synchronises gradients where the script applies them: pass no model= to "
                "unimem.accumulate, and sum the gradients with unimem.accumulate_grads",
            ),
        )

    def add_gradients(self, total: Any, grads: Any, weight: float) -> Any:
        """``total + weight * grads`` leaf by leaf (``total`` None: ``weight * grads``), for
        ``unimem.accumulate_grads``; a None leaf stays None.

        Args:
            total: The running sum, or None.
            grads: One micro-batch's gradients, in the framework's nesting.
            weight: Their factor.

        Returns:
            The new sum.

        Raises:
            UnsupportedFeature: The framework has no gradients to add (the default).
        """
        raise UnsupportedFeature(
            self.name, "accumulate", self._cannot("accumulate", f"{self.name} computes no gradients to accumulate")
        )

    # --- batch-size search hooks ----------------------------------------------------
    release_every_trial: ClassVar[bool] = False  # give the cache back after every trial (cheap, and peaks start clean)
    # After the answer is re-run, one call at ``start`` inside ``settle`` lets the pool shrink back
    # (torch: state the step keeps sits in the answer's large segments until then).
    settle_call: ClassVar[bool] = False
    # The framework may trade compute for memory near its limit (XLA rematerializes), so a step's
    # peak can stop growing with the batch there: peaks measured below it bound nothing above.
    rematerializes: ClassVar[bool] = False
    # How it saves memory there, as the search's note on peaks that stopped growing names it
    # (said only where ``rematerializes``).
    saturation_cause: ClassVar[str] = "the framework saves memory to fit near its limit (recomputing or swapping)"
    # ``predict_peak`` and ``predict_largest_buffer`` may run in several threads at once, each on
    # its own lowered step: the search then compiles two sizes at a time.
    predicts_concurrently: ClassVar[bool] = False

    def search_capacity(self, snapshot: MemoryStats) -> int | None:
        """Bytes a trial's measured peak may reach: the cap by default.

        Args:
            snapshot: ``stats()`` before the search.

        Returns:
            The bytes (by default ``snapshot.limit``); None when unknown.
        """
        return snapshot.limit

    def pool_overhead(self, peak: int | None, peak_reserved: int | None) -> int:
        """Bytes the pool holds beyond those in use at a trial's peak, which the cap must also hold.

        Args:
            peak: The trial's peak bytes in use; None if unknown.
            peak_reserved: The pool's peak bytes in the same trial; None if unknown.

        Returns:
            The overhead in bytes (0 by default).
        """
        return 0

    def settle(self, release: Callable[[], None]) -> contextlib.AbstractContextManager[None]:
        """A context around the search's last call that may run ``release`` at a better moment.

        Args:
            release: Gives the pool back, as the search does between trials.

        Returns:
            A context manager (by default one that does nothing).
        """
        return contextlib.nullcontext()

    def predict_peak(self, lowered: Any) -> int | None:
        """The peak bytes a step will reach, read from its compiled form without running it.

        Args:
            lowered: What ``find_batch_size``'s ``lower(n)`` returned for one batch size.

        Returns:
            The bytes; None (the default) when this framework cannot size ``lowered``.
        """
        return None

    def predict_largest_buffer(self, lowered: Any) -> int | None:
        """The largest single buffer a step will allocate as it runs, read from its compiled form.

        Args:
            lowered: What ``find_batch_size``'s ``lower(n)`` returned for one batch size.

        Returns:
            The bytes; None (the default) when unknown.
        """
        return None

    def search_largest_buffer(self, snapshot: MemoryStats) -> int | None:
        """The largest single buffer the allocator can hand out now (a pool grown on demand keeps
        its regions, so its free bytes are not one piece). Where this and
        ``predict_largest_buffer`` are known, the batch search holds each size's peak against
        the cap and its largest buffer against this.

        Args:
            snapshot: ``stats()`` now.

        Returns:
            The bytes; None (the default) when unknown or not a bound.
        """
        return None

    def trial_context(self, model: Any) -> Callable[[], contextlib.AbstractContextManager[None]] | None:
        """What each trial of ``find_batch_size(..., model=model)`` runs inside so that it makes no
        collective of its own: under a distributed runtime one rank's out-of-memory error must not
        leave the others waiting in a gradient all-reduce.

        Args:
            model: What the user passed as ``model=``.

        Returns:
            A callable returning a fresh context per trial; None (the default) when ``model`` is
            not this framework's.

        Raises:
            ConfigError: ``model`` communicates inside its forward pass (sharded parameters),
                so no context can keep a trial to one rank (``exc.parameter == "model"``).
        """
        return None

    # Why bytes stay in use after a failed trial, as the search's note says it.
    kept_outputs_note: ClassVar[str] = (
        "something still references what the failed steps allocated (gradients set in a failed backward, "
        "which the next step reuses, or a caught exception, a list of outputs)"
    )

    @classmethod
    def explain_step_error(cls, exc: BaseException, after_oom: bool) -> str | None:
        """A note naming the cause of a step's own (not out-of-memory) error; ``after_oom``: a trial failed before.

        Args:
            exc: The error the step raised, which stops the search.
            after_oom: Whether a trial failed with an out-of-memory error before it.

        Returns:
            The note, or None (the default) when there is nothing to add.
        """
        return None

    # --- many processes ----------------------------------------------------------------
    def plan_pin(self, device: int | None, *, per_rank: bool, note: str) -> list[Step]:
        """Steps that make CUDA device ``device`` this rank's own (``configure`` under a launcher).

        Pure, like ``plan()``. A pin is automatic: it never refuses, so what cannot be done is
        a ``"skipped"`` step with the reason in its note.

        Args:
            device: The device index among those the launcher made visible; None: there is
                nothing to pin (the step only says so).
            per_rank: Pin through ``CUDA_VISIBLE_DEVICES`` (the user passed ``devices="per-rank"``);
                False: through the framework's own device call.
            note: Why this device, for the step's note.

        Returns:
            By default: with ``per_rank``, a ``"devices"`` step setting ``CUDA_VISIBLE_DEVICES``
            before the framework starts; else one ``"pin"`` step, skipped: this framework has
            no device call unimem can make.
        """
        if device is None:
            return [Step(self.name, "pin", None, "none", "(nothing to pin)", status=STATUS_UNCHANGED, note=note)]
        if per_rank:
            fix = "pass devices='per-rank' before the framework's first GPU operation, or restart the process"
            step = devices_step(self.name, (device,), phase=self.phase(), when=When.BEFORE_INIT, fix=fix)
            step.note = note
            return [step]
        return [
            Step(
                self.name,
                "pin",
                device,
                "none",
                "(no device call)",
                status=STATUS_SKIPPED,
                note=f"{note}; {self.name} has no device call unimem can make: pass devices='per-rank' "
                "(CUDA_VISIBLE_DEVICES per rank) or select the device in the script",
            )
        ]

    def distributed_store(self) -> KeyValueStore | None:
        """The key-value store of this framework's distributed runtime, when the script has
        initialised it; never initialises it.

        Returns:
            The store, with this process's rank and the world size; None (the default) when
            the runtime is not initialised or the framework has none.
        """
        return None

    # --- compare workloads ----------------------------------------------------------
    runs_workloads: ClassVar[bool] = False  # overrides start_device and workload_step (``unimem compare`` runs it)
    # Variables a fresh process running its workload starts with unless the user set them (quieter logs).
    workload_env: ClassVar[dict[str, str]] = {}

    def start_device(self) -> str:
        """Start the device runtime with a tiny op; returns the device's name ("cpu" without a GPU).

        Returns:
            The device's name.

        Raises:
            UnsupportedFeature: The backend runs no workload (the default).
        """
        raise UnsupportedFeature(self.name, "compare", f"{self.name} runs no workload")

    def workload_step(self, workload: str, shapes: Any, dtype: str) -> tuple[Callable[[], None], int]:
        """``(step, parameter_count)`` of a reference workload (``unimem.compare.workloads``) in this framework.

        Args:
            workload: The workload's name, as ``unimem.compare.workloads`` defines it.
            shapes: The workload's shapes.
            dtype: The dtype name to run it in.

        Returns:
            A callable running one step, and the model's parameter count.

        Raises:
            UnsupportedFeature: The backend runs no workload (the default).
        """
        raise UnsupportedFeature(self.name, "compare", f"{self.name} runs no workload")


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
