"""The validated configuration model.

``Request.build`` checks every argument and raises ``ConfigError`` naming the
parameter before anything in the process is touched; it has no side effects.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from unimem.errors import ConfigError
from unimem.registry import canonical_name, is_framework
from unimem.sizes import parse_size

__all__ = ["ALLOCATORS", "ENV_VARS", "Request", "Settings", "parse_env"]

ALLOCATORS = ("default", "async", "expandable", "uncached")

ENV_VARS = {
    "backend": "UNIMEM_BACKEND",
    "fraction": "UNIMEM_FRACTION",
    "limit": "UNIMEM_LIMIT",
    "growth": "UNIMEM_GROWTH",
    "allocator": "UNIMEM_ALLOCATOR",
    "devices": "UNIMEM_DEVICES",
}


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


def _check_fraction(value: object, parameter: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(parameter, f"expected a number in (0, 1], got {value!r}")
    number = float(value)
    if math.isnan(number) or not 0.0 < number <= 1.0:
        raise ConfigError(parameter, f"must be in (0, 1] (a share of device memory), got {value!r}")
    return number


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


def _check_devices(value: object) -> tuple[int, ...]:
    items: Iterable[object]
    if isinstance(value, bool):
        raise ConfigError("devices", f"expected device indices such as [0, 1], got {value!r}")
    if isinstance(value, int):
        items = [value]
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise ConfigError("devices", f"expected a list of device indices such as [0, 1], got {value!r}")
    devices: list[int] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int):
            raise ConfigError("devices", f"device indices are ints, got {item!r} in {value!r}")
        if item < 0:
            raise ConfigError("devices", f"device indices are 0 or more, got {item}")
        if item in devices:
            raise ConfigError("devices", f"device {item} is listed twice in {value!r}")
        devices.append(item)
    if not devices:
        raise ConfigError("devices", "an empty list would hide every GPU; pass None to leave devices as they are")
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


def _parse_split(raw: str) -> str | dict[str, str]:
    """``"0.5"`` stays a scalar; ``"torch=0.6,jax=0.3"`` becomes a mapping."""
    if "=" not in raw:
        return raw.strip()
    split: dict[str, str] = {}
    for part in raw.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(part)
        split[key.strip()] = value.strip()
    return split


def parse_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Read ``UNIMEM_*`` variables into ``configure`` keyword arguments.

    Errors name the variable, e.g. ``ConfigError: UNIMEM_FRACTION: ...``.
    """
    env = os.environ if environ is None else environ
    kwargs: dict[str, Any] = {}
    raw = env.get(ENV_VARS["backend"], "").strip()
    if raw:
        names = [part.strip() for part in raw.split(",") if part.strip()]
        kwargs["backend"] = names[0] if len(names) == 1 else names
    for key, cast in (("fraction", float), ("limit", str)):
        var = ENV_VARS[key]
        raw = env.get(var, "").strip()
        if not raw:
            continue
        try:
            parsed = _parse_split(raw)
            if isinstance(parsed, dict):
                kwargs[key] = {name: cast(value) for name, value in parsed.items()}
            else:
                kwargs[key] = cast(parsed)
        except ValueError:
            raise ConfigError(var, f"cannot read {raw!r}; write a value or 'torch=..,jax=..'") from None
    raw = env.get(ENV_VARS["growth"], "").strip().lower()
    if raw:
        truthy, falsy = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
        if raw not in truthy | falsy:
            raise ConfigError(ENV_VARS["growth"], f"expected true or false, got {raw!r}")
        kwargs["growth"] = raw in truthy
    raw = env.get(ENV_VARS["allocator"], "").strip()
    if raw:
        kwargs["allocator"] = raw
    raw = env.get(ENV_VARS["devices"], "").strip()
    if raw.lower() == "per-rank":  # unimem.ranks.PER_RANK: each rank's own GPU, through CUDA_VISIBLE_DEVICES
        kwargs["devices"] = "per-rank"
    elif raw:
        try:
            kwargs["devices"] = [int(part) for part in raw.split(",")]
        except ValueError:
            raise ConfigError(ENV_VARS["devices"], f"expected indices such as '0,1', got {raw!r}") from None
    return kwargs
