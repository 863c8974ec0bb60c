"""Whether JAX's backend (the XLA client) has started, read without starting it.

Shared by the adapter's ``phase()`` and the precision helpers, which must not start the
backend (starting it preallocates most of the GPU before ``configure()`` had its say).
"""

from __future__ import annotations

import sys

__all__ = ["started"]


def started() -> bool:
    """True once JAX created its backends; False before, or when jax is not imported."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is None:
        return False
    initialized = getattr(bridge, "backends_are_initialized", None)
    if initialized is not None:
        return bool(initialized())
    return bool(getattr(bridge, "_backends", None))  # older JAX: the cache of created backends
