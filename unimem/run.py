"""``unimem run``: apply a configuration to a command that was not written for unimem.

The configuration is validated and applied in this process first (a bad value fails
before the command starts). Variables the frameworks read go into the environment;
UNIMEM_* variables and a ``sitecustomize`` startup hook on PYTHONPATH carry the
API-only settings into every Python the command starts. Then this process *becomes*
the command (``execvpe``): its argv arrives verbatim (no shell), and its exit status
and signals are the command's own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .applied import Applied
from .config import ENV_VARS

__all__ = ["child_environment", "exec_command"]

BOOTSTRAP = Path(__file__).resolve().parent / "_bootstrap"


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


def exec_command(command: Sequence[str], settings: Mapping[str, Any], *, verbose: bool = False) -> None:
    """Configure this process, then replace it with ``command``. Returns only on failure."""
    import unimem

    applied: Applied = unimem.configure(**{k: v for k, v in settings.items() if v is not None})
    if verbose:
        sys.stderr.write(f"unimem run: {' '.join(command)}\n{applied}\n")
    env = child_environment(settings)
    if verbose:
        env["UNIMEM_VERBOSE"] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(command[0], list(command), env)
