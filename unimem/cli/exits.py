"""One exit-status rule for every ``unimem`` command (docs/guides/command-line.md#exit-status).

- 0: the command did what was asked, and also when the reader of its output went away
  first (``unimem watch | head``): nothing is left to tell anyone.
- 2: the command line is wrong (an unknown option, a value of the wrong form or out of range,
  a file named that does not exist): click's usage error, naming the option.
- 1: the command could not do what was asked: any ``UnimemError`` or ``OSError`` that reaches
  the top is one line on stderr, ``unimem COMMAND: <why>``, never a traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import click

from unimem.errors import ConfigError, UnimemError

__all__ = ["UnimemGroup", "fail", "option_error", "stdout_gone"]


def option_error(exc: ConfigError, option: str) -> click.BadParameter:
    """``exc`` as click's error for ``option`` (exit 2): click names the option, so the message drops the parameter."""
    return click.BadParameter(str(exc).removeprefix(f"{exc.parameter}: "), param_hint=option)


def fail(command: str, exc: BaseException) -> NoReturn:
    """``unimem COMMAND: <why>`` on stderr, exit status 1; the command is named once."""
    click.echo(f"unimem {command}: {_reason(command, exc)}", err=True)
    sys.exit(1)


def _reason(command: str, exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        # A file's error names the file: "memory.png: Permission denied".
        files = [str(name) for name in (exc.filename, exc.filename2) if name is not None]
        return ": ".join([*files, exc.strerror])
    text = " ".join(str(exc).split()) or type(exc).__name__  # one line, whatever the message held
    return text.removeprefix(f"unimem {command}: ").removeprefix(f"{command}: ")


def stdout_gone() -> NoReturn:
    """The reader of stdout has gone (``unimem watch | head``): end quietly, status 0."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's flush at exit would fail on the closed pipe
    except (OSError, ValueError, AttributeError):  # no real file behind stdout (a test runner's buffer)
        pass
    sys.exit(0)


class UnimemGroup(click.Group):
    """The ``unimem`` group: every command's errors end the way the module's rule says."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        ctx.meta["unimem_command"] = command.name if command is not None else name
        return name, command, rest

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            stdout_gone()
        except (UnimemError, OSError) as exc:
            fail(str(ctx.meta.get("unimem_command") or "error"), exc)
