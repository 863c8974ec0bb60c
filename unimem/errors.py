"""The errors unimem raises.

Each one also subclasses the builtin a user already catches, so ``except ValueError``
around a bad setting or ``except MemoryError`` around a training step keeps working.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BackendUnavailable",
    "ConfigError",
    "OutOfMemory",
    "TooLateError",
    "UnimemError",
    "UnimemWarning",
    "UnsupportedFeature",
]


class UnimemError(Exception):
    """Base class of every error unimem raises."""


class ConfigError(UnimemError, ValueError):
    """A setting is invalid. Raised before anything is changed.

    ``parameter`` names the offending argument (``"fraction"``, ``"limit"``, ...).
    """

    def __init__(self, parameter: str, message: str) -> None:
        self.parameter = parameter
        super().__init__(f"{parameter}: {message}")


class TooLateError(UnimemError, RuntimeError):
    """A setting can no longer take effect because the framework already started.

    ``backend`` and ``setting`` say which; the message says what to do instead.
    """

    def __init__(self, backend: str, setting: str, message: str) -> None:
        self.backend = backend
        self.setting = setting
        super().__init__(f"{backend}: {setting}: {message}")


class BackendUnavailable(UnimemError, ImportError):
    """A backend's framework (or NVML) is not installed or cannot be loaded."""


class UnsupportedFeature(UnimemError, NotImplementedError):
    """The backend cannot do this at all, in any phase."""

    def __init__(self, backend: str, feature: str, message: str) -> None:
        self.backend = backend
        self.feature = feature
        super().__init__(f"{backend}: {feature}: {message}")


class OutOfMemory(UnimemError, MemoryError):
    """A framework ran out of memory; ``report`` says what held it.

    The framework's own error is chained as ``__cause__``.
    """

    def __init__(self, message: str, report: Any = None) -> None:
        self.report = report
        super().__init__(message)


class UnimemWarning(UserWarning):
    """A setting was not applied (``strict=False``) or has nothing to act on."""
