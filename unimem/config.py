"""The validated configuration model.

``Request.build`` checks every argument and raises ``ConfigError`` naming the
parameter before anything in the process is touched; it has no side effects.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from unimem.errors import ConfigError
from unimem.registry import canonical_name, is_framework
from unimem.sizes import parse_size

__all__ = [
    "ALLOCATORS",
    "ENV_VARS",
    "MAX_DEVICE_INDEX",
    "MIN_FRACTION",
    "RUN_VARS",
    "Request",
    "Settings",
    "check_env",
    "parse_env",
]

ALLOCATORS = ("default", "async", "expandable", "uncached")

ENV_VARS = {
    "backend": "UNIMEM_BACKEND",
    "fraction": "UNIMEM_FRACTION",
    "limit": "UNIMEM_LIMIT",
    "growth": "UNIMEM_GROWTH",
    "allocator": "UNIMEM_ALLOCATOR",
    "devices": "UNIMEM_DEVICES",
}
# Read by the startup hook ``unimem run`` installs: "1" on, anything else off.
RUN_VARS = ("UNIMEM_RUN", "UNIMEM_VERBOSE")


@dataclass(frozen=True)
class Settings:
    """What one backend is asked to do; ``None`` means "leave as it is"."""

    fraction: float | None = None
    limit: int | None = None
    growth: bool | None = None
    allocator: str | None = None
    devices: tuple[int, ...] | None = None

    def given(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def __bool__(self) -> bool:
        return bool(self.given())


# No device holds 2**50 bytes (1 PiB): a smaller share caps every device at 0 bytes.
MIN_FRACTION = 2.0**-50
# CUDA numbers devices with 32-bit ints: a larger index names no device.
MAX_DEVICE_INDEX = 2**31 - 1


def _check_fraction(value: object, parameter: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(parameter, f"expected a number in (0, 1], got {value!r}")
    number = float(value)
    if math.isnan(number) or not 0.0 < number <= 1.0:
        raise ConfigError(parameter, f"must be in (0, 1] (a share of device memory), got {value!r}")
    if number < MIN_FRACTION:
        raise ConfigError(
            parameter, f"{value!r} leaves less than one byte of any device; pass a share of at least {MIN_FRACTION:.3g}"
        )
    return number


VISIBLE_VAR = "CUDA_VISIBLE_DEVICES"


def visible_entries(raw: str) -> list[str]:
    """``CUDA_VISIBLE_DEVICES``'s entries as CUDA reads them: indices or UUIDs (``GPU-``, ``MIG-``), up to
    the first other entry, where CUDA stops reading (``-1`` or an empty value hides every GPU).

    Raises:
        ConfigError: A device follows an entry CUDA stops at (``"0,x,1"`` shows one GPU, not two), or one
            is listed twice: naming the variable.
    """
    parts = [part.strip() for part in raw.split(",")]
    entries: list[str] = []
    for index, part in enumerate(parts):
        if not (re.fullmatch(r"[0-9]+", part) or part.startswith(("GPU-", "MIG-"))):
            later = [p for p in parts[index + 1 :] if re.fullmatch(r"[0-9]+", p) or p.startswith(("GPU-", "MIG-"))]
            if later:
                raise ConfigError(
                    VISIBLE_VAR,
                    f"CUDA stops reading {raw!r} at {part!r}, so {', '.join(later)} stay hidden; fix or unset it",
                )
            break
        if part in entries:
            raise ConfigError(VISIBLE_VAR, f"{raw!r} lists {part} twice; list each device once")
        entries.append(part)
    return entries


def _per_backend(value: object, parameter: str) -> dict[str, object] | None:
    """A ``{"torch": x, "jax": y}`` split, with names made canonical; ``None`` if scalar."""
    if not isinstance(value, Mapping):
        return None
    if not value:
        raise ConfigError(parameter, "an empty per-backend mapping sets nothing; pass a value")
    split: dict[str, object] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise ConfigError(parameter, f"per-backend keys are backend names, got {key!r}")
        name = canonical_name(key, parameter=parameter)
        if not is_framework(name):
            raise ConfigError(parameter, f"{name} only reads memory; it takes no cap")
        if name in split:
            raise ConfigError(parameter, f"{key!r} names {name!r} twice")
        split[name] = item
    return split


def check_device(device: object) -> int:
    """A device index for a query: an int, 0 or more (a bool is no index)."""
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ConfigError("device", f"expected a device index (0 or more), got {device!r}")
    return device


def _check_devices(value: object, parameter: str = "devices") -> tuple[int, ...]:
    items: Iterable[object]
    if isinstance(value, bool):
        raise ConfigError(parameter, f"expected device indices such as [0, 1], got {value!r}")
    if isinstance(value, int):
        items = [value]
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise ConfigError(parameter, f"expected a list of device indices such as [0, 1], got {value!r}")
    devices: list[int] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int):
            raise ConfigError(parameter, f"device indices are ints, got {item!r} in {value!r}")
        if item < 0:
            raise ConfigError(parameter, f"device indices are 0 or more, got {item}")
        if item > MAX_DEVICE_INDEX:
            raise ConfigError(parameter, f"device {item} cannot exist: CUDA numbers devices up to {MAX_DEVICE_INDEX}")
        if item in devices:
            raise ConfigError(parameter, f"device {item} is listed twice in {value!r}")
        devices.append(item)
    if not devices:
        raise ConfigError(parameter, "an empty list would hide every GPU; pass None to leave devices as they are")
    return tuple(devices)


@dataclass(frozen=True)
class Request:
    """A whole ``configure`` call, validated: the backends and each one's settings."""

    backends: tuple[str, ...]
    settings: Mapping[str, Settings]

    @classmethod
    def build(
        cls,
        backends: tuple[str, ...],
        *,
        fraction: object = None,
        limit: object = None,
        growth: object = None,
        allocator: object = None,
        devices: object = None,
    ) -> Request:
        """Validate everything; ``backends`` are canonical names already resolved.

        When ``backends`` is empty the backends are taken from a per-backend split.
        """
        if fraction is not None and limit is not None:
            raise ConfigError("limit", "fraction and limit exclude each other; pass one of them")

        fraction_split = _per_backend(fraction, "fraction")
        limit_split = _per_backend(limit, "limit")
        split = fraction_split or limit_split
        if split is not None:
            split_parameter = "fraction" if fraction_split is not None else "limit"
            if not backends:
                backends = tuple(split)
            missing = [name for name in split if name not in backends]
            if missing:
                raise ConfigError(
                    split_parameter,
                    f"names {', '.join(missing)}, which is not among the backends configured "
                    f"({', '.join(backends)}); add it to backend=",
                )

        fractions: dict[str, float | None] = {}
        limits: dict[str, int | None] = {}
        for name in backends:
            if fraction_split is not None:
                item = fraction_split.get(name)
                fractions[name] = None if item is None else _check_fraction(item, "fraction")
            else:
                fractions[name] = None if fraction is None else _check_fraction(fraction, "fraction")
            if limit_split is not None:
                item = limit_split.get(name)
                limits[name] = None if item is None else parse_size(item, "limit")
            else:
                limits[name] = None if limit is None else parse_size(limit, "limit")
        if fraction_split is not None:
            total = sum(f for f in fractions.values() if f is not None)
            if total > 1.0 + 1e-9:
                raise ConfigError("fraction", f"the shares add up to {total:.3g}, more than the whole device (1.0)")

        if growth is not None and not isinstance(growth, bool):
            raise ConfigError("growth", f"expected True, False or None, got {growth!r}")
        if allocator is not None and (not isinstance(allocator, str) or allocator not in ALLOCATORS):
            raise ConfigError("allocator", f"unknown allocator {allocator!r}; choose one of {', '.join(ALLOCATORS)}")
        device_tuple = None if devices is None else _check_devices(devices)

        per_backend = {
            name: Settings(
                fraction=fractions.get(name),
                limit=limits.get(name),
                growth=growth,
                allocator=allocator,
                devices=device_tuple,
            )
            for name in backends
        }
        return cls(backends=backends, settings=per_backend)


def _parse_split(raw: str, var: str) -> str | dict[str, str]:
    """``"0.5"`` stays a scalar; ``"torch=0.6,jax=0.3"`` becomes a mapping, each backend once."""
    if "=" not in raw:
        return raw.strip()
    split: dict[str, str] = {}
    for part in raw.split(","):
        key, sep, value = (text.strip() for text in part.partition("="))
        if not sep or not key or not value:
            raise ConfigError(var, f"cannot read {part.strip()!r} in {raw!r}; write a value or 'torch=..,jax=..'")
        if key in split:
            raise ConfigError(var, f"{raw!r} names {key!r} twice; give each backend one value")
        split[key] = value
    _per_backend(split, var)  # known backends, an alias and its name not both
    return split


def _read_number(text: str, var: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(var, f"cannot read {text!r} as a number; write a share such as 0.5") from None


def _env_cap(env: Mapping[str, str], key: str) -> object:
    """``UNIMEM_FRACTION`` or ``UNIMEM_LIMIT``, checked as ``configure`` checks its argument (None: unset)."""
    var = ENV_VARS[key]
    raw = env.get(var, "").strip()
    if not raw:
        return None
    parsed = _parse_split(raw, var)

    def one(text: str) -> object:
        if key == "fraction":
            return _check_fraction(_read_number(text, var), var)
        return parse_size(text, var)

    if isinstance(parsed, dict):
        return {name: one(value) for name, value in parsed.items()}
    return one(parsed)


def _env_backends(env: Mapping[str, str]) -> list[str] | None:
    """``UNIMEM_BACKEND``'s names, each a known backend, once (None: unset)."""
    var = ENV_VARS["backend"]
    raw = env.get(var, "").strip()
    if not raw:
        return None
    if raw.lower() == "auto":
        return [raw]
    names = [part.strip() for part in raw.split(",")]
    if not all(names):
        raise ConfigError(var, f"an empty name in {raw!r}; write names such as 'torch' or 'torch,jax'")
    seen: list[str] = []
    for name in names:
        canonical = canonical_name(name, parameter=var)
        if canonical in seen:
            raise ConfigError(var, f"{raw!r} names {canonical!r} twice")
        seen.append(canonical)
    return names


def _env_devices(env: Mapping[str, str]) -> list[int] | str | None:
    """``UNIMEM_DEVICES``: ``"per-rank"`` or indices, checked as ``configure`` checks ``devices`` (None: unset)."""
    var = ENV_VARS["devices"]
    raw = env.get(var, "").strip()
    if raw.lower() == "per-rank":  # unimem.ranks.PER_RANK: each rank's own GPU, through CUDA_VISIBLE_DEVICES
        return "per-rank"
    if not raw:
        return None
    parts = [part.strip() for part in raw.split(",")]
    for part in parts:
        if not re.fullmatch(r"-?[0-9]+", part):
            raise ConfigError(var, f"expected indices such as '0,1' or 'per-rank', got {raw!r}")
    return list(_check_devices([int(part) for part in parts], var))


def parse_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Read ``UNIMEM_*`` variables into ``configure`` keyword arguments, each value checked as
    ``configure`` checks its argument; starts and changes nothing.

    Errors name the variable, e.g. ``ConfigError: UNIMEM_FRACTION: ...``.
    """
    env = os.environ if environ is None else environ
    kwargs: dict[str, Any] = {}
    names = _env_backends(env)
    if names is not None:
        kwargs["backend"] = names[0] if len(names) == 1 else names
    for key in ("fraction", "limit"):
        value = _env_cap(env, key)
        if value is not None:
            kwargs[key] = value
    if "fraction" in kwargs and "limit" in kwargs:
        raise ConfigError(
            ENV_VARS["limit"], f"{ENV_VARS['fraction']} and {ENV_VARS['limit']} exclude each other; set one"
        )
    raw = env.get(ENV_VARS["growth"], "").strip().lower()
    if raw:
        truthy, falsy = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
        if raw not in truthy | falsy:
            raise ConfigError(ENV_VARS["growth"], f"expected true or false, got {raw!r}")
        kwargs["growth"] = raw in truthy
    raw = env.get(ENV_VARS["allocator"], "").strip()
    if raw:
        if raw not in ALLOCATORS:
            raise ConfigError(
                ENV_VARS["allocator"], f"unknown allocator {raw!r}; choose one of {', '.join(ALLOCATORS)}"
            )
        kwargs["allocator"] = raw
    devices = _env_devices(env)
    if devices is not None:
        kwargs["devices"] = devices
    for var in RUN_VARS:
        if env.get(var, "") not in ("", "0", "1"):
            raise ConfigError(var, f"expected 1 (on) or 0 (off), got {env[var]!r}")
    return kwargs


def check_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``parse_env``, and the settings together checked as ``configure`` checks them (a split
    naming a backend ``UNIMEM_BACKEND`` leaves out); errors name the variable. Changes nothing."""
    kwargs = parse_env(environ)
    names = kwargs.get("backend", ())
    given_names = [names] if isinstance(names, str) else names
    backends = tuple(canonical_name(name) for name in given_names if name.lower() != "auto")
    given = {key: kwargs.get(key) for key in ("fraction", "limit", "growth", "allocator")}
    devices = kwargs.get("devices")
    try:
        Request.build(backends, **given, devices=None if devices == "per-rank" else devices)
    except ConfigError as exc:
        raise ConfigError(ENV_VARS.get(exc.parameter, exc.parameter), str(exc).partition(": ")[2]) from None
    return kwargs
