"""The ``unimem`` command run as a user runs it: a fresh ``python -m unimem`` with a clean environment."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import subprocess_env


def run_cli(
    *args: str, env: dict[str, str | None] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m unimem ARGS`` in a fresh interpreter; its exit status, stdout and stderr (text)."""
    return subprocess.run(
        [sys.executable, "-m", "unimem", *args],
        capture_output=True,
        text=True,
        env=subprocess_env(env),
        timeout=timeout,
    )
