"""Plots are an extra: matplotlib (and numpy, pillow, fonttools with it) stays out of
training environments that never draw. A plot request without it says what to install."""

from __future__ import annotations

from .errors import BackendUnavailable

__all__ = ["PLOT_EXTRA", "require_matplotlib"]

PLOT_EXTRA = "pip install 'unimem[plot]'"


def require_matplotlib(what: str = "plot") -> None:
    """Raise ``BackendUnavailable`` naming the extra when matplotlib is not installed."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise BackendUnavailable(f"{what}: matplotlib is not installed; {PLOT_EXTRA}")
