"""Byte sizes: parse ``"8GiB"``, ``"512MB"``, ``"1.5 GB"``; format them, and counts, for humans."""

from __future__ import annotations

import math
import re
from decimal import Decimal

from unimem.errors import ConfigError

__all__ = ["counted", "exact_bytes", "format_bytes", "parse_size"]

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
    "p": 1024**5,
    "pb": 1000**5,
    "pib": 1024**5,
    "e": 1024**6,
    "eb": 1000**6,
    "eib": 1024**6,
}
# What format_bytes prints in: a request as absurd as 2**58 bytes (256 PiB) still reads as one.
_FORMAT_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(value: object, parameter: str = "limit") -> int:
    """Return ``value`` as a positive number of bytes.

    Accepts an int (bytes), a float with no fractional part, or a string with a unit.
    Decimal units (``KB`` ... ``EB``) are powers of 1000, binary units (``KiB`` ...
    ``EiB``) powers of 1024; a bare ``K``/``M``/``G``/``T``/``P``/``E`` is read as
    binary, as GPU tools print it, so whatever ``format_bytes`` prints reads back.
    Units are case-insensitive, and a space between number and unit is allowed. The result is exact (``"4.1 GB"`` is
    4100000000, not a float's rounding of it).

    Args:
        value: Bytes as an ``int``, or a size such as ``"8GiB"``, ``"512MB"``,
            ``"1.5 GB"``.
        parameter: The argument name the error names (default ``"limit"``).

    Returns:
        The size in bytes, more than 0.

    Raises:
        ConfigError: For anything else: negatives, zero, NaN, non-whole floats, bools,
            unknown units, other types. ``exc.parameter`` is ``parameter``; pass bytes or
            a number with a known unit.

    Example:
        ```python
        unimem.parse_size("8GiB")    # 8589934592
        unimem.parse_size("512MB")   # 512000000
        unimem.parse_size("1.5 GB")  # 1500000000
        ```
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
            known = "B, KB, KiB, MB, MiB, GB, GiB, TB, TiB, PB, PiB, EB, EiB"
            raise ConfigError(parameter, f"unknown unit {unit!r} in {value!r}; use one of {known}")
        size = int(Decimal(number) * multiplier)  # float would turn "4.1 GB" into 4099999999
    else:
        raise ConfigError(parameter, f"expected bytes (int) or a size string, got {type(value).__name__}")
    if size <= 0:
        raise ConfigError(parameter, f"must be more than 0 bytes, got {value!r}")
    return size


def format_bytes(value: int | None) -> str:
    """Format a byte count for humans, in binary units: ``1536 * 2**20`` -> ``'1.50 GiB'``.

    Args:
        value: Bytes (a negative count keeps its sign), or None for an unknown figure.

    Returns:
        ``"100 B"`` below 1 KiB, else two decimals in the largest unit up to EiB
        (``"1.50 GiB"``, ``"256.00 PiB"``); ``"n/a"`` for None.
    """
    if value is None:
        return "n/a"
    magnitude = float(abs(value))
    for unit in _FORMAT_UNITS:
        if magnitude < 1024 or unit == _FORMAT_UNITS[-1]:
            sign = "-" if value < 0 else ""
            return f"{sign}{magnitude:.0f} {unit}" if unit == "B" else f"{sign}{magnitude:.2f} {unit}"
        magnitude /= 1024
    raise AssertionError("unreachable")


def exact_bytes(value: int) -> str:
    """A size for people with its exact count, where rounding could hide it: ``'7.45 GiB (8000000000 B)'``;
    ``'100 B'`` below 1 KiB, where the two are one."""
    shown = format_bytes(value)
    return shown if shown.endswith(" B") else f"{shown} ({value} B)"


def counted(count: int, noun: str) -> str:
    """``"1 sample"``, ``"3 samples"``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
