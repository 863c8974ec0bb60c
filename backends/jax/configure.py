"""How ``configure`` reaches JAX: XLA's client variables, read once when its backend starts.

JAX reads ``XLA_*`` variables once, when its backend starts (the first op or
``jax.devices()``), and silently ignores them afterwards; a step whose moment has
passed is marked too late instead of setting a variable nobody reads.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

from unimem.backends import nvml_gate
from unimem.backends.steps import STATUS_NO_DEVICE, Step, devices_step, env_step, written_vars

from unimem.config import Settings
from unimem.errors import ConfigError
from unimem.sizes import exact_bytes
from unimem.support import Phase, When

__all__ = [
    "ALLOCATOR",
    "FIX",
    "FRACTION_NEW",
    "FRACTION_OLD",
    "PREALLOCATE",
    "check_environment",
    "fraction_variable",
    "plan",
]

PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
ALLOCATOR = "XLA_PYTHON_CLIENT_ALLOCATOR"
FRACTION_NEW = "XLA_CLIENT_MEM_FRACTION"
FRACTION_OLD = "XLA_PYTHON_CLIENT_MEM_FRACTION"
_ALLOCATOR_VALUES = {"default": None, "async": "cuda_async", "uncached": "platform"}
FIX = "set it before JAX's first operation (or jax.devices()), or restart the process"


def fraction_variable() -> str:
    """The memory-fraction variable the installed jaxlib reads.

    jaxlib renamed XLA_PYTHON_CLIENT_MEM_FRACTION to XLA_CLIENT_MEM_FRACTION and
    raises if both are set. Ask the installed jaxlib's own source, without importing it.
    """
    try:
        spec = importlib.util.find_spec("jaxlib")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            source = Path(location) / "xla_client.py"
            try:
                if FRACTION_NEW in source.read_text(encoding="utf-8", errors="replace"):
                    return FRACTION_NEW
            except OSError:
                continue
    return FRACTION_OLD


def _cuda_plugin_installed() -> bool:
    """Whether this JAX can see an NVIDIA GPU at all (a CUDA PJRT plugin is installed)."""
    for name in (
        "jax_plugins.xla_cuda13",
        "jax_plugins.xla_cuda12",
        "jax_cuda13_plugin",
        "jax_cuda12_plugin",
    ):
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def plan(settings: Settings, phase: Phase) -> list[Step]:
    """The steps that apply ``settings`` to JAX in ``phase``: environment variables, all read at its start."""
    steps: list[Step] = []

    def env(setting: str, value: object, var: str, new: str | None, note: str = "") -> Step:
        return env_step("jax", setting, value, var, new, phase=phase, when=When.BEFORE_INIT, fix=FIX, note=note)

    if settings.devices is not None:
        steps.append(devices_step("jax", settings.devices, phase=phase, when=When.BEFORE_INIT, fix=FIX))
    if settings.fraction is not None or settings.limit is not None:
        steps.extend(_cap(settings, env, phase))
    if settings.growth is not None:
        steps.append(env("growth", settings.growth, PREALLOCATE, "false" if settings.growth else "true"))
    if settings.allocator is not None:
        if settings.allocator == "expandable":
            steps.append(
                Step(
                    "jax",
                    "allocator",
                    "expandable",
                    "none",
                    ALLOCATOR,
                    unsupported="XLA has no expandable-segments allocator; use 'async' or 'default'",
                )
            )
        else:
            steps.append(env("allocator", settings.allocator, ALLOCATOR, _ALLOCATOR_VALUES[settings.allocator]))
    if phase is not Phase.INITIALIZED:
        check_environment(written_vars(steps))
    return steps


# What jaxlib's generate_pjrt_gpu_plugin_options accepts when the backend starts.
_JAXLIB_ALLOCATORS = ("default", "platform", "bfc", "cuda_async", "vmm")
_PREALLOCATE_VALUES = ("true", "True", "1", "false", "False", "0")


def check_environment(written: set[str]) -> None:
    """Refuse a variable jaxlib reads at its start, and this plan leaves as it is, when jaxlib would
    refuse it there (a ValueError at the first operation) or read it other than it says. Changes nothing.

    Raises:
        ConfigError: Naming the variable.
    """
    fix = "fix or unset it"
    allocator = os.environ.get(ALLOCATOR)
    if ALLOCATOR not in written and allocator is not None and allocator.lower() not in _JAXLIB_ALLOCATORS:
        raise ConfigError(
            ALLOCATOR, f"jaxlib accepts {', '.join(_JAXLIB_ALLOCATORS)} and refuses {allocator!r} at its start; {fix}"
        )
    preallocate = os.environ.get(PREALLOCATE)
    if PREALLOCATE not in written and preallocate and preallocate not in _PREALLOCATE_VALUES:
        raise ConfigError(
            PREALLOCATE,
            f"jaxlib reads {preallocate!r} as true (only false, False and 0 turn preallocation off); "
            "write true or false",
        )
    fractions = [name for name in (FRACTION_NEW, FRACTION_OLD) if name not in written and os.environ.get(name)]
    for name in fractions:
        raw = os.environ[name]
        try:
            share = float(raw)
        except ValueError:
            raise ConfigError(
                name, f"jaxlib cannot read {raw!r} as a number and refuses it at its start; {fix}"
            ) from None
        if not 0.0 < share <= 1.0:
            raise ConfigError(name, f"{raw!r} is no share of device memory: write one in (0, 1], or unset it")
    if len(fractions) == 2:
        raise ConfigError(
            FRACTION_OLD, f"jaxlib refuses {FRACTION_NEW} and {FRACTION_OLD} set together at its start; unset one"
        )


def _cap(settings: Settings, env: Callable[..., Step], phase: Phase) -> list[Step]:
    var = fraction_variable()
    other = FRACTION_OLD if var == FRACTION_NEW else FRACTION_NEW
    if settings.fraction is not None:
        setting, value, fraction = "fraction", settings.fraction, settings.fraction
        note = ""
    else:
        assert settings.limit is not None
        setting, value = "limit", settings.limit
        total = nvml_gate.device_figures(0)[0]
        if total is None:
            if not _cuda_plugin_installed():
                if phase is Phase.INITIALIZED:  # started: too late, as a fraction is (one rule, GPU or not)
                    late = f"JAX has already started its backend and reads {var} only then; {FIX}"
                    return [Step("jax", "limit", value, "env", var, too_late=late, when=When.BEFORE_INIT)]
                return [
                    Step(
                        "jax",
                        "limit",
                        value,
                        "env",
                        var,
                        status=STATUS_NO_DEVICE,
                        note="this JAX has no CUDA plugin: there is no GPU memory to cap",
                    )
                ]
            raise ConfigError(
                "limit",
                "JAX takes a cap only as a fraction of device memory and the device total is "
                f"unknown here ({nvml_gate.nvml_status()}); pass fraction= instead, "
                "or install nvidia-ml-py",
            )
        if settings.limit > total:
            raise ConfigError("limit", f"{exact_bytes(settings.limit)} is more than the device's {exact_bytes(total)}")
        fraction = settings.limit / total
        note = f"{settings.limit} / {total} bytes (NVML device total)"
    steps = [env(setting, value, var, f"{fraction:.6g}", note)]
    if os.environ.get(other) is not None:
        # Both names set makes newer jaxlib raise at backend start.
        steps.append(env(setting, value, other, None, f"{other} is the other name for {var}"))
    return steps
