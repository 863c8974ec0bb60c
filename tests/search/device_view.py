"""What the in-process search tests patch so that a simulated step is searched as on a device."""

from __future__ import annotations

import types

import pytest

import unimem
from unimem import snapshots
from unimem.search import state


def show_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The framework-free view shows a device: the search never holds a simulated step to this
    machine's host memory (test_search_host.py does that)."""
    monkeypatch.setattr(
        snapshots, "framework_free_stats", lambda device: unimem.MemoryStats("nvml", device, device_total=1)
    )


def no_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    """No garbage collection per failure: nothing real is allocated, and it costs time over many searches."""
    monkeypatch.setattr(state, "gc", types.SimpleNamespace(collect=lambda: 0))
