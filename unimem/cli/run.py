"""``unimem run``: apply a configuration to a command that was not written for unimem.

Configure this process, put UNIMEM_* variables and the ``sitecustomize`` startup hook into the
command's environment, then become the command (``execvpe``). What the user sees:
docs/guides/frameworks.md#an-unmodified-script-unimem-run.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from unimem.applied import Applied
from unimem.config import ENV_VARS, check_env
from unimem.errors import ConfigError, UnimemWarning

__all__ = ["child_environment", "exec_command", "one_line_warnings"]

BOOTSTRAP = Path(__file__).resolve().parent.parent / "_bootstrap"


def _encode(key: str, value: Any) -> str:
    if isinstance(value, Mapping):
        return ",".join(f"{name}={_encode(key, item)}" for name, item in value.items())
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(item) for item in value)
    return str(value)


def child_environment(settings: Mapping[str, Any], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment, already configured) plus UNIMEM_*
    variables for ``settings`` and the startup hook on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    for key, value in settings.items():
        if value is not None:
            env[ENV_VARS[key]] = _encode(key, value)
    env["UNIMEM_RUN"] = "1"
    previous = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(BOOTSTRAP) + (os.pathsep + previous if previous else "")
    return env


def one_line_warnings() -> None:
    """Print each ``UnimemWarning`` as one line, ``unimem: <message>``; other warnings as before.

    Python's default format shows the file and source line that called ``warnings.warn``:
    under ``unimem run`` that is unimem's own code, which tells the user nothing. Installed
    once per process (a second call changes nothing).
    """
    previous = warnings.showwarning
    if getattr(previous, "unimem_one_line", False):
        return

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if not issubclass(category, UnimemWarning):
            previous(message, category, filename, lineno, file, line)
            return
        stream = sys.stderr if file is None else file
        # No stderr (pythonw) or a closed one: the warning is lost, as Python's own format does.
        with contextlib.suppress(OSError, AttributeError, ValueError):
            stream.write(f"unimem: {message}\n")

    show.unimem_one_line = True  # type: ignore[attr-defined]
    warnings.showwarning = show


def _named_by_option(exc: ConfigError, settings: Mapping[str, Any]) -> ConfigError:
    """An error in a variable that one of the command's options set names the option (``fraction``),
    as the user wrote it; one in a variable of the user's own environment keeps its name."""
    for key, variable in ENV_VARS.items():
        if exc.parameter == variable and settings.get(key) is not None:
            return ConfigError(key, str(exc).removeprefix(f"{variable}: "))
    return exc


def exec_command(command: Sequence[str], settings: Mapping[str, Any], *, verbose: bool = False) -> None:
    """Configure this process, then replace it with ``command``. Returns only on failure.

    Raises:
        ConfigError: ``command`` is empty or its program is an empty name (checked before any
            setting is applied), or a setting is invalid.
        OSError: The program cannot be run (``FileNotFoundError``: not found).
    """
    import unimem

    if not command or not command[0]:
        raise ConfigError(
            "command", f"no program to run (got {list(command)!r}); name it after --, e.g. -- python train.py"
        )
    one_line_warnings()
    # The command's startup hook reads its UNIMEM_* (the options and the user's own) and refuses bad ones.
    try:
        check_env(child_environment(settings))
    except ConfigError as exc:
        raise _named_by_option(exc, settings) from None
    applied: Applied = unimem.configure(**{k: v for k, v in settings.items() if v is not None})
    if verbose:
        sys.stderr.write(f"unimem run: {' '.join(command)}\n{applied}\n")
    env = child_environment(settings)
    if verbose:
        env["UNIMEM_VERBOSE"] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(command[0], list(command), env)
