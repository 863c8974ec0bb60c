"""How ``configure`` reaches TensorFlow: ``tf.config`` before its runtime starts, variables before import.

tensorflow is read from ``sys.modules`` only. A cap asked before the import is made by a
hook right after it (``unimem.import_hooks``); once the runtime has started, its devices
are fixed until the process exits.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from unimem.backends import nvml_gate
from unimem.backends.steps import (
    STATUS_NO_DEVICE,
    STATUS_PENDING,
    STATUS_UNCHANGED,
    Step,
    devices_step,
    env_step,
    written_vars,
)

from unimem.config import Settings
from unimem.errors import ConfigError, UnimemWarning
from unimem.import_hooks import when_imported
from unimem.support import Phase, When

__all__ = ["ALLOCATOR_VAR", "FIX", "GROWTH_VAR", "check", "check_environment", "plan"]

GROWTH_VAR = "TF_FORCE_GPU_ALLOW_GROWTH"
ALLOCATOR_VAR = "TF_GPU_ALLOCATOR"
FIX = "configure before TensorFlow runs its first op, or restart the process"
_LATE = "TensorFlow's runtime already started (its devices are fixed until the process exits); " + FIX
_MIB = 1 << 20


def _gpus() -> list[Any]:
    return list(sys.modules["tensorflow"].config.list_physical_devices("GPU"))


def check(settings: Settings, phase: Phase) -> None:
    """Refuse growth with a cap: TensorFlow cannot combine them (a memory_limit device ignores growth)."""
    capped = settings.fraction is not None or settings.limit is not None
    if capped and settings.growth:
        raise ConfigError(
            "growth",
            "TensorFlow cannot combine memory growth with a memory limit (a logical device "
            "with memory_limit ignores growth); pass either growth=True or fraction/limit",
        )
    if capped and phase is not Phase.NOT_IMPORTED and settings.growth is None:
        tf = sys.modules["tensorflow"]
        if any(tf.config.experimental.get_memory_growth(gpu) for gpu in _gpus()):
            raise ConfigError(
                "fraction" if settings.fraction is not None else "limit",
                "memory growth is already on for a GPU, and TensorFlow ignores growth once a "
                "memory_limit is set; restart without growth to use a cap",
            )


def plan(settings: Settings, phase: Phase, limits: dict[int, int]) -> list[Step]:
    """The steps that apply ``settings`` in ``phase``; a cap made records its bytes per GPU in ``limits``."""
    check(settings, phase)
    _check_growth_override(settings.growth, phase)
    capped = settings.fraction is not None or settings.limit is not None
    steps: list[Step] = []
    if settings.devices is not None:
        steps.append(_devices(settings.devices, phase))
    if settings.growth is not None:
        steps.append(_growth(settings.growth, phase))
    if capped:
        steps.append(_cap(settings, phase, limits))
    if settings.allocator is not None:
        steps.append(_allocator(settings.allocator, phase))
    if phase is not Phase.INITIALIZED:
        check_environment(written_vars(steps))
    return steps


def _check_growth_override(growth: bool | None, phase: Phase) -> None:
    """Refuse growth made through ``set_memory_growth`` where the user's TF_FORCE_GPU_ALLOW_GROWTH says
    the opposite: TensorFlow reads the variable first when its GPUs start, and it would win unsaid."""
    theirs = os.environ.get(GROWTH_VAR)
    if growth is None or phase is not Phase.IMPORTED or theirs not in _GROWTH_VALUES or (theirs == "true") == growth:
        return
    if not _gpus():
        return  # no GPU: growth acts on nothing
    raise ConfigError(
        GROWTH_VAR,
        f"{GROWTH_VAR}={theirs} overrides set_memory_growth({growth}) when TensorFlow's GPUs start; "
        "unset it, or configure growth before importing TensorFlow (then unimem sets the variable)",
    )


# TensorFlow compares these variables to exact words when its GPU devices start.
_GROWTH_VALUES = ("true", "false")
_ALLOCATOR_VALUES = ("cuda_malloc_async", "cuda_malloc", "memory_guard")


def check_environment(written: set[str]) -> None:
    """Refuse a variable TensorFlow reads when its GPUs start, and this plan leaves as it is, when
    TensorFlow would not read it as written: it logs an error and ignores TF_FORCE_GPU_ALLOW_GROWTH
    other than true or false, and takes any TF_GPU_ALLOCATOR it does not know for its default
    allocator without a word. Changes nothing.

    Raises:
        ConfigError: Naming the variable.
    """
    growth = os.environ.get(GROWTH_VAR)
    if GROWTH_VAR not in written and growth is not None and growth not in _GROWTH_VALUES:
        raise ConfigError(
            GROWTH_VAR, f"TensorFlow reads only true or false (lower case) and ignores {growth!r}; fix or unset it"
        )
    allocator = os.environ.get(ALLOCATOR_VAR)
    if ALLOCATOR_VAR not in written and allocator and allocator not in _ALLOCATOR_VALUES:
        raise ConfigError(
            ALLOCATOR_VAR,
            f"TensorFlow knows {', '.join(_ALLOCATOR_VALUES)} and takes {allocator!r} for its default allocator "
            "without a word; fix or unset it",
        )


def _no_gpu(setting: str, value: object, target: str, phase: Phase) -> Step:
    """Nothing to act on while TensorFlow has not started; once it has, its devices are fixed, so a
    change is too late as on a GPU (one rule whatever the host: the fix is the same)."""
    if phase is Phase.INITIALIZED:
        return Step("tensorflow", setting, value, "api", target, too_late=_LATE)
    return Step(
        "tensorflow",
        setting,
        value,
        "api",
        target,
        status=STATUS_NO_DEVICE,
        note="TensorFlow sees no GPU here: nothing to configure",
    )


def _devices(devices: tuple[int, ...], phase: Phase) -> Step:
    if phase is Phase.NOT_IMPORTED:
        return devices_step("tensorflow", devices, phase=phase, when=When.BEFORE_IMPORT, fix=FIX)
    tf = sys.modules["tensorflow"]
    target = "tf.config.set_visible_devices(gpus, 'GPU')"
    gpus = _gpus()
    if not gpus:
        return _no_gpu("devices", list(devices), target, phase)
    missing = [d for d in devices if d >= len(gpus)]
    if missing:
        raise ConfigError("devices", f"TensorFlow sees {len(gpus)} GPU(s); there is no GPU {missing[0]}")
    wanted = [gpus[d] for d in devices]
    if phase is Phase.INITIALIZED:
        if list(tf.config.get_visible_devices("GPU")) == wanted:
            return Step("tensorflow", "devices", list(devices), "api", target, status=STATUS_UNCHANGED)
        return Step("tensorflow", "devices", list(devices), "api", target, too_late=_LATE)
    return Step(
        "tensorflow",
        "devices",
        list(devices),
        "api",
        target,
        run=lambda: tf.config.set_visible_devices(wanted, "GPU"),
    )


def _growth(growth: bool, phase: Phase) -> Step:
    if phase is Phase.NOT_IMPORTED:
        return env_step(
            "tensorflow",
            "growth",
            growth,
            GROWTH_VAR,
            "true" if growth else "false",
            phase=phase,
            when=When.BEFORE_IMPORT,
            fix=FIX,
        )
    tf = sys.modules["tensorflow"]
    target = f"tf.config.experimental.set_memory_growth(gpu, {growth})"
    gpus = _gpus()
    if not gpus:
        return _no_gpu("growth", growth, target, phase)
    current = [bool(tf.config.experimental.get_memory_growth(gpu)) for gpu in gpus]
    if all(c == growth for c in current):
        return Step("tensorflow", "growth", growth, "api", target, status=STATUS_UNCHANGED)
    if phase is Phase.INITIALIZED:
        return Step("tensorflow", "growth", growth, "api", target, too_late=_LATE)

    def run() -> None:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, growth)

    return Step("tensorflow", "growth", growth, "api", target, run=run)


def _memory_limits(settings: Settings, count: int) -> dict[int, int]:
    """memory_limit in bytes per GPU, rounded down to whole MiB as TF takes it."""
    limits = {}
    for index in range(count):
        if settings.limit is not None:
            size = settings.limit
        else:
            assert settings.fraction is not None
            total = nvml_gate.device_figures(index)[0]
            if total is None:
                raise ConfigError(
                    "fraction",
                    "TensorFlow takes a cap only in bytes and the device total is unknown here "
                    f"({nvml_gate.nvml_status()}); pass limit= instead, or install nvidia-ml-py",
                )
            size = int(settings.fraction * total)
        limits[index] = (size // _MIB) * _MIB
    return limits


def _cap(settings: Settings, phase: Phase, limits: dict[int, int]) -> Step:
    setting = "fraction" if settings.fraction is not None else "limit"
    value = settings.fraction if settings.fraction is not None else settings.limit
    target = "tf.config.set_logical_device_configuration(gpu, [LogicalDeviceConfiguration(memory_limit=...)])"
    if phase is Phase.NOT_IMPORTED:

        def run_later() -> None:
            when_imported("tensorflow", lambda tf: _apply_cap(tf, settings, limits), key="unimem.tf.cap")

        return Step(
            "tensorflow",
            setting,
            value,
            "hook",
            target + " right after import",
            run=run_later,
            status=STATUS_PENDING,
        )
    tf = sys.modules["tensorflow"]
    gpus = _gpus()
    if not gpus:
        return _no_gpu(setting, value, target, phase)
    limits = _memory_limits(settings, len(gpus))
    current = [tf.config.get_logical_device_configuration(gpu) for gpu in gpus]
    same = all(
        conf is not None and len(conf) == 1 and conf[0].memory_limit == limits[i] // _MIB
        for i, conf in enumerate(current)
    )
    target = ", ".join(f"memory_limit={limits[i] // _MIB} MiB on GPU {i}" for i in limits)
    if same:
        return Step("tensorflow", setting, value, "api", target, status=STATUS_UNCHANGED)
    if phase is Phase.INITIALIZED:
        return Step("tensorflow", setting, value, "api", target, too_late=_LATE)
    return Step("tensorflow", setting, value, "api", target, run=lambda: _apply_cap(tf, settings, limits))


def _apply_cap(tf: Any, settings: Settings, limits: dict[int, int]) -> None:
    gpus = list(tf.config.list_physical_devices("GPU"))
    if not gpus:
        return  # nothing to cap: TensorFlow sees no GPU
    try:
        wanted = _memory_limits(settings, len(gpus))
    except ConfigError as exc:
        # Runs inside the user's `import tensorflow` (a hook set before import): a
        # cap that cannot be computed is reported, not allowed to break the import.
        warnings.warn(f"tensorflow: cap not applied: {exc}", UnimemWarning, stacklevel=2)
        return
    for index, gpu in enumerate(gpus):
        tf.config.set_logical_device_configuration(
            gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=wanted[index] // _MIB)]
        )
        limits[index] = wanted[index]


def _allocator(allocator: str, phase: Phase) -> Step:
    if allocator in ("expandable", "uncached"):
        return Step(
            "tensorflow",
            "allocator",
            allocator,
            "none",
            ALLOCATOR_VAR,
            unsupported=f"TensorFlow has no {allocator} allocator; use 'async' or 'default'",
        )
    new = "cuda_malloc_async" if allocator == "async" else None
    return env_step(
        "tensorflow",
        "allocator",
        allocator,
        ALLOCATOR_VAR,
        new,
        phase=phase,
        when=When.BEFORE_INIT,
        fix=FIX,
    )
