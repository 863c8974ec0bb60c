"""Startup hook for ``unimem run``: applies UNIMEM_* settings in every Python the command starts.

``unimem run`` puts this folder first on PYTHONPATH, so Python imports this file before the script;
``configure_from_env()`` here makes the API-only settings, and an earlier ``sitecustomize`` still
runs afterwards. See docs/guides/frameworks.md#an-unmodified-script-unimem-run.
"""

from __future__ import annotations

import importlib
import os
import sys


def _apply() -> None:
    try:
        import unimem
    except ImportError as exc:
        sys.stderr.write(
            f"unimem run: unimem is not importable by {sys.executable} ({exc}); only the environment "
            "variables were applied, not API-only settings such as torch's fraction cap\n"
        )
        return
    import warnings

    from unimem.cli.run import one_line_warnings

    # unimem's warnings later in the command (a cap hook that fires at the framework's import)
    # print as one line: the source line Python would show is unimem's own, not the script's.
    one_line_warnings()
    try:
        with warnings.catch_warnings():
            # `unimem run` already printed these warnings when it applied the same settings.
            warnings.simplefilter("ignore", unimem.UnimemWarning)
            applied = unimem.configure_from_env()
    except unimem.ConfigError as exc:
        # Running the script without the settings it was started with would be running it uncapped.
        # os._exit: an exception here would only print "Error in sitecustomize" and run the script.
        sys.stderr.write(f"unimem run: {exc}; {sys.executable} did not run the command\n")
        sys.stderr.flush()
        os._exit(2)
    except unimem.UnimemError as exc:
        sys.stderr.write(f"unimem run: settings not applied in {sys.executable} (pid {os.getpid()}): {exc}\n")
        return
    if os.environ.get("UNIMEM_VERBOSE") == "1":
        sys.stderr.write(f"unimem run: in {sys.executable} (pid {os.getpid()}):\n{applied}\n")


def _chain_previous_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    saved_path = list(sys.path)
    saved_module = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved_path
        if saved_module is not None:
            sys.modules["sitecustomize"] = saved_module


if os.environ.get("UNIMEM_RUN") == "1":
    _apply()
_chain_previous_sitecustomize()
