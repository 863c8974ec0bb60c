"""Mixed precision: one policy for every framework, made and switched on through its adapter.

Each framework's helpers (``unimem.backends.<framework>.precision``, the same function names in
each) do the framework's part; this module keeps the policy stack and the rules. What each
framework turns on, and why parameters stay float32: docs/guides/mixed-precision.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from unimem import registry
from unimem.errors import ConfigError, UnimemError, UnsupportedFeature
from unimem.loss_scaling import LossScaler, ScalerConfig
from unimem.trees import map_leaves as map_leaves  # kept importable from here
from unimem.trees import tree_leaves as tree_leaves

if TYPE_CHECKING:
    from unimem.backends.topics import PrecisionHelpers

__all__ = ["PRECISIONS", "Policy", "enabled_backends", "mixed_precision"]


@dataclass(frozen=True)
class Precision:
    name: str  # "bf16"
    compute_dtype: str  # dtype name every framework spells the same way
    loss_scaling: bool
    feature: str  # the FEATURES row in compat_matrix.md


PRECISIONS: dict[str, Precision] = {
    "bf16": Precision("bf16", "bfloat16", False, "precision.bf16"),
    "fp16": Precision("fp16", "float16", True, "precision.fp16"),
    "fp32": Precision("fp32", "float32", False, ""),  # no row: every backend computes in float32
}
# The dtype names are accepted too: they say the same thing.
_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
PARAM_DTYPE = "float32"
OUTPUT_DTYPE = "float32"  # losses and metrics are reduced in float32 whatever the compute dtype


@dataclass(eq=False)
class _Frame:
    """One level of a framework's precision stack: the policy in force, how to undo it,
    and how many holders keep it (``enable()`` and each open ``with`` block)."""

    policy: Policy
    restore: Callable[[], None]
    key: tuple[str, int | None]
    thread: int
    holds: int = 1


# What is in force per framework, innermost last. A stack, so that leaving a policy
# restores the one outside it; per-thread state (the backend's trait) has one per thread.
_stacks: dict[tuple[str, int | None], list[_Frame]] = {}
_lock = threading.Lock()


def _parse_precision(precision: object) -> Precision:
    if not isinstance(precision, str):
        raise ConfigError("precision", f"expected 'bf16', 'fp16' or 'fp32', got {precision!r}")
    key = precision.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in PRECISIONS:
        raise ConfigError("precision", f"unknown precision {precision!r}; expected 'bf16', 'fp16' or 'fp32'")
    return PRECISIONS[key]


def _takes_policy(name: str) -> bool:
    """Whether the capability table of ``name`` says it runs a mixed-precision policy."""
    try:
        support = registry.capability_table(name).get("precision.bf16")
    except ImportError:  # an adapter this install does not ship
        return False
    return support is not None and support.supported


def _choices() -> str:
    """``backend='a', 'b' or 'c'``: the frameworks a policy can be for, read from the registry."""
    names = [f"'{name}'" for name in registry.FRAMEWORKS if _takes_policy(name)]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    return f"backend={listed}"


def _resolve_backend(backend: object) -> str:
    """The framework a policy is for (an action: configured, else the one imported); never
    guesses between several and imports nothing."""
    if backend is None and not registry.configured() and not registry.imported_frameworks():
        raise ConfigError(
            "backend",
            f"no framework is configured or imported yet, so there is nothing to set a precision for; "
            f"pass {_choices()}",
        )
    name = registry.resolve(backend, "action")
    if name is None:  # an action always names one or raises; kept for the type checker
        raise ConfigError("backend", f"pass {_choices()}")
    return name


def enabled_backends() -> list[str]:
    """Frameworks with a unimem mixed-precision policy enabled now, in registry order."""
    with _lock:
        on = {backend for (backend, _), stack in _stacks.items() if stack}
        return [name for name in registry.FRAMEWORKS if name in on]


class Policy:
    """A mixed-precision policy for one framework; ``unimem.mixed_precision()`` makes one.

    ``enable()`` or ``with policy:`` turns it on, ``disable()`` restores what was before; policies
    nest. Each framework's loop, nesting and threads: [Mixed precision](../guides/mixed-precision.md).

    Attributes:
        backend (str): The framework the policy is for.
        device (str): Where computations run: ``"cuda"``, ``"cpu"``, ``"gpu"``, ...
    """

    def __init__(
        self, precision: Precision, backend: str, helpers: PrecisionHelpers, device: str, *, per_thread: bool = False
    ) -> None:
        self._precision = precision
        self._helpers = helpers
        self._per_thread = per_thread  # only the enabling thread may disable it (the backend's trait)
        self._enabled_frame: _Frame | None = None  # the frame enable() holds
        self._with_frames: list[_Frame] = []  # the frames open `with` blocks hold, innermost last
        self.backend = backend
        self.device = device  # where computations run: "cuda", "cpu", "gpu", ...

    # --- what the policy is -------------------------------------------------------
    @property
    def precision(self) -> str:
        """The precision's short name: ``"bf16"``, ``"fp16"`` or ``"fp32"``."""
        return self._precision.name

    @property
    def compute_dtype(self) -> str:
        """The dtype name computations run in: ``"bfloat16"``, ``"float16"`` or ``"float32"``."""
        return self._precision.compute_dtype

    @property
    def param_dtype(self) -> str:
        """The dtype name parameters are kept in: always ``"float32"``."""
        return PARAM_DTYPE

    @property
    def output_dtype(self) -> str:
        """The dtype name outputs (the loss) come back in: always ``"float32"``."""
        return OUTPUT_DTYPE

    @property
    def loss_scaling(self) -> bool:
        """Whether the loss is scaled: True for fp16 only."""
        return self._precision.loss_scaling

    @property
    def active(self) -> bool:
        """Whether the policy is enabled now (by ``enable()`` or an open ``with`` block)."""
        return self._enabled_frame is not None or bool(self._with_frames)

    def dtype(self, which: str = "compute") -> Any:
        """The framework's dtype object for ``"compute"``, ``"param"`` or ``"output"``.

        Args:
            which: ``"compute"`` (default), ``"param"`` or ``"output"``.

        Returns:
            The framework's dtype object (``torch.bfloat16``, ``jnp.bfloat16``, ...).

        Raises:
            ConfigError: ``which`` is none of the three.
        """
        names = {"compute": self.compute_dtype, "param": self.param_dtype, "output": self.output_dtype}
        if which not in names:
            raise ConfigError("which", f"expected 'compute', 'param' or 'output', got {which!r}")
        return self._helpers.dtype(names[which])

    # --- casting (the whole policy in JAX; explicit control in torch and TF) --------
    def cast_to_compute(self, tree: Any) -> Any:
        """Floating-point leaves of ``tree`` in the compute dtype; integer and boolean leaves untouched.

        Args:
            tree: An array or tensor, or any nesting of lists, tuples and dicts of them.

        Returns:
            The same structure with its floating-point leaves cast.
        """
        return self._helpers.cast(tree, self.compute_dtype)

    def cast_to_param(self, tree: Any) -> Any:
        """Floating-point leaves of ``tree`` in the parameter dtype (float32).

        Args:
            tree: An array or tensor, or any nesting of lists, tuples and dicts of them.

        Returns:
            The same structure with its floating-point leaves cast.
        """
        return self._helpers.cast(tree, self.param_dtype)

    def cast_to_output(self, tree: Any) -> Any:
        """Floating-point leaves of ``tree`` in the output dtype (float32): model outputs, before the loss.

        Args:
            tree: An array or tensor, or any nesting of lists, tuples and dicts of them.

        Returns:
            The same structure with its floating-point leaves cast.
        """
        return self._helpers.cast(tree, self.output_dtype)

    # --- on and off --------------------------------------------------------------------
    def enable(self) -> Policy:
        """Turn the policy on (no-op if ``enable()`` already did).

        torch: autocast in this thread; TensorFlow: layers built afterwards take it; JAX: the casts
        do the work ([On and off](../guides/mixed-precision.md#details)).

        Returns:
            The policy itself.
        """
        with _lock:
            if self._enabled_frame is None:
                self._enabled_frame = self._hold()
        return self

    def disable(self) -> None:
        """Undo ``enable()``: restore what was before, unless an open ``with`` block keeps it on.

        Raises:
            UnimemError: A policy turned on after this one is still on, or (torch) this is not the
                thread that enabled it; nothing is changed.
        """
        with _lock:
            frame = self._enabled_frame
            if frame is None:
                return
            if self._per_thread and frame.thread != threading.get_ident():
                raise UnimemError(
                    f"{self.backend}: the precision state belongs to the thread that enabled it; "
                    "disable the policy in that thread"
                )
            self._release(frame)
            self._enabled_frame = None

    def __enter__(self) -> Policy:
        with _lock:
            self._with_frames.append(self._hold())
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            here = threading.get_ident()
            index = max(i for i, frame in enumerate(self._with_frames) if frame.thread == here)
            self._release(self._with_frames[index])
            del self._with_frames[index]

    def _hold(self) -> _Frame:
        """Keep the policy in force (under ``_lock``): one more holder of the frame on top
        when that is this policy's, else a new frame that puts it in force."""
        key = (self.backend, threading.get_ident() if self._per_thread else None)
        stack = _stacks.setdefault(key, [])
        if stack and stack[-1].policy is self:
            stack[-1].holds += 1
            return stack[-1]
        restore = self._helpers.enable(self.precision, self.compute_dtype, self.device)
        stack.append(_Frame(self, restore, key, threading.get_ident()))
        return stack[-1]

    def _release(self, frame: _Frame) -> None:
        """One holder fewer (under ``_lock``); the last one restores what was before, which
        only the top frame may do: otherwise refused, nothing changed."""
        stack = _stacks[frame.key]
        if frame.holds == 1 and stack[-1] is not frame:
            raise UnimemError(
                f"{self.backend}: this {self.precision} policy was enabled before the "
                f"{stack[-1].policy.precision} policy still on; disable that one first "
                "(or leave its with block): policies nest"
            )
        frame.holds -= 1
        if frame.holds == 0:
            stack.pop()
            if not stack:
                del _stacks[frame.key]
            frame.restore()

    # --- loss scaling ----------------------------------------------------------------
    def loss_scaler(
        self,
        initial_scale: float = 2.0**15,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        *,
        enabled: bool | None = None,
    ) -> LossScaler:
        """The dynamic loss scaler: on under fp16, a no-op with scale 1 under bf16 and fp32.

        How the scale moves, and each framework's loop: [The loss scale](../guides/mixed-precision.md#the-loss-scale).

        Args:
            initial_scale: The scale to start at (default ``2**15``), more than 0.
            growth_factor: The scale's factor after ``growth_interval`` finite steps in a row (default 2), more than 1.
            backoff_factor: The scale's factor after a step that overflowed (default 0.5), between 0 and 1.
            growth_interval: Finite steps in a row before the scale grows (default 2000).
            enabled: None (default): scale under fp16 only; True: always; False: never.

        Returns:
            The framework's scaler: ``scale``, ``unscale``, ``update``, and torch's ``step``, Keras's ``wrap``
            or JAX's ``step``.

        Raises:
            ConfigError: A number is out of range or not a number (the error names it), or ``enabled`` is not a bool.
        """
        config = ScalerConfig.build(initial_scale, growth_factor, backoff_factor, growth_interval)
        if enabled is not None and not isinstance(enabled, bool):
            raise ConfigError("enabled", f"expected True, False or None, got {enabled!r}")
        scaler: LossScaler = self._helpers.loss_scaler(config, self.loss_scaling if enabled is None else enabled)
        return scaler

    def wrap_optimizer(self, optimizer: Any, *, initial_scale: float = 2.0**15, growth_interval: int = 2000) -> Any:
        """Keras only: under fp16 a ``LossScaleOptimizer`` around ``optimizer``, else ``optimizer`` itself.

        The same as ``policy.loss_scaler(...).wrap(optimizer)``.

        Args:
            optimizer: A Keras optimizer.
            initial_scale: The scale to start at (default ``2**15``), more than 0.
            growth_interval: Finite steps in a row before the scale grows (default 2000).

        Returns:
            The wrapped optimizer under fp16; ``optimizer`` unchanged otherwise.

        Raises:
            UnsupportedFeature: torch, JAX: no optimizer scales the loss itself; use ``policy.loss_scaler()``.
            ConfigError: ``initial_scale`` or ``growth_interval`` is out of range.
        """
        wrap = getattr(self._helpers, "wrap_optimizer", None)
        if wrap is None:
            raise UnsupportedFeature(
                self.backend,
                "wrap_optimizer",
                f"{self.backend} has no optimizer that scales the loss itself; "
                "use policy.loss_scaler() in the training loop",
            )
        config = ScalerConfig.build(initial_scale, 2.0, 0.5, growth_interval)
        return optimizer if not self.loss_scaling else wrap(optimizer, config)

    def __repr__(self) -> str:
        return (
            f"Policy(precision={self.precision!r}, backend={self.backend!r}, device={self.device!r}, "
            f"compute_dtype={self.compute_dtype!r}, param_dtype={self.param_dtype!r}, "
            f"output_dtype={self.output_dtype!r}, loss_scaling={self.loss_scaling}, active={self.active})"
        )


def mixed_precision(precision: str, backend: str | None = None) -> Policy:
    """A mixed-precision policy (``"bf16"``, ``"fp16"`` or ``"fp32"``) for ``backend``, not yet switched on.

    Parameters stay float32; the loss is scaled under fp16 only. Each framework's loop, and what
    the device must support: [Mixed precision](../guides/mixed-precision.md).

    Args:
        precision: ``"bf16"``, ``"fp16"`` or ``"fp32"`` (or ``"bfloat16"``, ``"float16"``, ``"float32"``).
        backend: A framework name or alias, or None (default): the one configured, else the one imported.

    Returns:
        The policy, not yet enabled.

    Raises:
        ConfigError: ``precision`` is unknown or the device cannot run it, or ``backend`` is unknown or undecided.
        UnsupportedFeature: The backend has no mixed-precision policy (``"nvml"``, CuPy); the message lists those
            that do.
        BackendUnavailable: The framework is not installed; the message says what to install.

    Example:
        ```python
        policy = unimem.mixed_precision("bf16", backend="torch")
        with policy:  # torch.autocast in this thread
            loss = model(batch)
        ```
    """
    chosen = _parse_precision(precision)
    name = _resolve_backend(backend)
    if not registry.is_framework(name):
        raise UnsupportedFeature(
            name, "precision", f"{name} observes memory and runs no computation; pass {_choices()}"
        )
    if chosen.feature:
        support = registry.capability_table(name).get(chosen.feature)
        if support is None or not support.supported:
            note = support.note if support is not None else "no capability entry"
            raise UnsupportedFeature(name, chosen.feature, f"{note}; pass {_choices()}")
    adapter = registry.get_backend(name)  # BackendUnavailable with the install hint when it is missing
    helpers = adapter.precision
    device = helpers.device()
    helpers.check(chosen.name, chosen.compute_dtype, device)  # ConfigError("precision", reason)
    return Policy(chosen, name, helpers, device, per_thread=helpers.precision_state_per_thread)
