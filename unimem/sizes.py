"""Byte sizes: parse ``"8GiB"``, ``"512MB"``, ``"1.5 GB"``; format for humans."""

from __future__ import annotations

import math
import re
from decimal import Decimal

from .errors import ConfigError

__all__ = ["format_bytes", "parse_size"]

# Decimal units are powers of 1000, binary units powers of 1024, as the SI/IEC
# prefixes say; a bare "G" is read as GiB because that is what GPU tools print.
_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(value: object, parameter: str = "limit") -> int:
    """Return ``value`` as a positive number of bytes.

    Accepts an int (bytes) or a string with a unit. Raises ``ConfigError`` naming
    ``parameter`` for anything else: negatives, zero, NaN, bools, unknown units.
    """
    if isinstance(value, bool):
        raise ConfigError(parameter, f"expected bytes or a size such as '8GiB', got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ConfigError(parameter, f"expected a whole number of bytes or a size string, got {value!r}")
        size = int(value)
    elif isinstance(value, str):
        match = _SIZE.match(value)
        if match is None:
            raise ConfigError(
                parameter,
                f"cannot read {value!r} as a size; write bytes or a number with a unit, "
                "such as '8GiB', '512MB' or '1.5 GB'",
            )
        number, unit = match.groups()
        multiplier = _UNITS.get(unit.lower())
        if multiplier is None:
            known = "B, KB, KiB, MB, MiB, GB, GiB, TB, TiB"
            raise ConfigError(parameter, f"unknown unit {unit!r} in {value!r}; use one of {known}")
        size = int(Decimal(number) * multiplier)  # float would turn "4.1 GB" into 4099999999
    else:
        raise ConfigError(parameter, f"expected bytes (int) or a size string, got {type(value).__name__}")
    if size <= 0:
        raise ConfigError(parameter, f"must be more than 0 bytes, got {value!r}")
    return size


def format_bytes(value: int | None) -> str:
    """``1536 * 2**20`` -> ``'1.50 GiB'``; ``None`` -> ``'n/a'``."""
    if value is None:
        return "n/a"
    magnitude = float(abs(value))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if magnitude < 1024 or unit == "TiB":
            sign = "-" if value < 0 else ""
            return f"{sign}{magnitude:.0f} {unit}" if unit == "B" else f"{sign}{magnitude:.2f} {unit}"
        magnitude /= 1024
    raise AssertionError("unreachable")
