"""The errors unimem raises.

Each one also subclasses the builtin a user already catches, so ``except ValueError``
around a bad setting or ``except MemoryError`` around a training step keeps working.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BackendUnavailable",
    "ClusterError",
    "ConfigError",
    "NoFigures",
    "OutOfMemory",
    "SearchError",
    "TooLateError",
    "UnimemError",
    "UnimemWarning",
    "UnsupportedFeature",
]


def _prefixed(message: str, *names: str) -> str:
    """``"a: b: message"``, each name once: a message that already starts with the last names
    (a reason passed on from another error) keeps them and gets only the ones before."""
    for start in range(len(names)):
        tail = "".join(f"{name}: " for name in names[start:])
        if message.startswith(tail):
            return "".join(f"{name}: " for name in names[:start]) + message
    return "".join(f"{name}: " for name in names) + message


class UnimemError(Exception):
    """Base class of every error unimem raises.

    Catch it to handle any unimem error at once; each subclass is also the builtin
    exception a user already catches (``ValueError``, ``RuntimeError``, ...).
    """


class ConfigError(UnimemError, ValueError):
    """A setting is invalid. Raised before anything is changed.

    Also a ``ValueError``. The message reads ``"<parameter>: <what is wrong>"``, the
    parameter once even when the message handed in already starts with it; for
    ``configure_from_env`` the parameter is the environment variable
    (``"UNIMEM_FRACTION: ..."``).

    Args:
        parameter: The offending argument (``"fraction"``, ``"limit"``, ...).
        message: What is wrong with it and what to pass instead.

    Attributes:
        parameter (str): The offending argument (``"fraction"``, ``"limit"``, ...).

    Example:
        ```python
        try:
            unimem.configure(backend="torch", fraction=1.5)
        except unimem.ConfigError as exc:
            print(exc.parameter)  # "fraction"; nothing was changed
        ```
    """

    def __init__(self, parameter: str, message: str) -> None:
        self.parameter = parameter
        super().__init__(_prefixed(message, parameter))


class TooLateError(UnimemError, RuntimeError):
    """A setting can no longer take effect because the framework already started.

    Also a ``RuntimeError``. Raised by ``configure`` with ``strict=True`` (the default);
    with ``strict=False`` the setting is skipped with a ``UnimemWarning`` instead. The
    message, ``"<backend>: <setting>: <why>"`` with each name once, says what to do instead
    (usually: call ``unimem.configure`` before the framework's import or first op, or
    restart the process).

    Args:
        backend: The backend the setting was for.
        setting: The setting (``"fraction"``, ``"growth"``, ...).
        message: Why it is too late, and the fix.

    Attributes:
        backend (str): The backend the setting was for.
        setting (str): The setting that can no longer take effect.
    """

    def __init__(self, backend: str, setting: str, message: str) -> None:
        self.backend = backend
        self.setting = setting
        super().__init__(_prefixed(message, backend, setting))


class BackendUnavailable(UnimemError, ImportError):
    """A backend's framework (or NVML) is not installed or cannot be loaded.

    Also an ``ImportError``. The message names the missing module and what to install
    (``pip install 'unimem[torch]'``, ...), or, for NVML, why the driver library could
    not be loaded.
    """


class UnsupportedFeature(UnimemError, NotImplementedError):
    """The backend cannot do this at all, in any phase.

    Also a ``NotImplementedError``. ``unimem.capabilities(backend)`` lists what each
    backend supports; the message names an alternative where there is one. From
    ``configure`` with ``strict=False`` the setting is skipped with a ``UnimemWarning``
    instead.

    Args:
        backend: The backend that cannot do it.
        feature: The feature or setting (``"allocator"``, ``"reset_peak"``, ...).
        message: Why not, and what to use instead.

    Attributes:
        backend (str): The backend that cannot do it.
        feature (str): The feature or setting it cannot do.
    """

    def __init__(self, backend: str, feature: str, message: str) -> None:
        self.backend = backend
        self.feature = feature
        super().__init__(_prefixed(message, backend, feature))


class OutOfMemory(UnimemError, MemoryError):
    """A framework ran out of memory; ``report`` says what held it.

    Also a ``MemoryError``. Raised by ``oom_guard`` (with the message ``str(report)``)
    and by ``find_batch_size`` when no batch size fits. The framework's own error is
    chained as ``__cause__``.

    Args:
        message: The error's text.
        report: The ``OOMReport`` explaining the failure, or None.

    Attributes:
        report (OOMReport | None): What the failed allocation asked for, what held memory,
            and ranked suggestions; None where no report could be made.
    """

    def __init__(self, message: str, report: Any = None) -> None:
        self.report = report
        super().__init__(message)


class ClusterError(UnimemError, RuntimeError):
    """The ranks of a job cannot work together.

    Also a ``RuntimeError``. Raised by ``cluster_stats`` when the environment says there are
    several ranks but no distributed runtime is initialised in this process to gather through,
    and by ``find_batch_size`` over ranks when a rank does not answer in time, its step raised,
    or the ranks are at different points of the search. The message says what to initialise,
    or which rank failed and where to look.
    """


class SearchError(UnimemError, RuntimeError):
    """``find_batch_size`` cannot give an answer that its trials support.

    Also a ``RuntimeError``. Raised when the step's peaks did not grow with the batch size (a size
    ran that could not fit at one byte a sample: the figures read do not see the step's memory, or
    it does not depend on the batch size), and when the answer failed its re-check while the memory
    in use grew from call to call at the same size (a leak). The message says what the trials
    showed, the sizes tried, and what to do.
    """


class NoFigures(Exception):
    """Raised by a backend's counter reader that will never have figures here (a CPU device):
    the monitor stops asking, and keeps the message as a note."""


class UnimemWarning(UserWarning):
    """A setting was not applied (``strict=False``) or has nothing to act on.

    A ``UserWarning``, issued through ``warnings.warn``: for example a ``configure``
    setting skipped as too late or unsupported under ``strict=False``, a
    ``clear_cache`` the framework cannot do, or a ``find_batch_size`` search that ran
    out of trials. Turn it into an error with
    ``warnings.simplefilter("error", unimem.UnimemWarning)``.
    """
