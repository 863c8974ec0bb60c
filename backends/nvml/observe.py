"""NVML under observation: it has no memory profiler, and says where one is."""

from __future__ import annotations

from unimem.backends.base import Observe
from unimem.backends.topics import Profiler

from unimem.errors import UnsupportedFeature

__all__ = ["NvmlObserve"]


class NvmlObserve(Observe):
    """NVML's observe topic (``ObserveTopic``): no allocator counters, and a profiler refusal naming the fix."""

    def profiler(self) -> Profiler:
        raise UnsupportedFeature(
            "nvml",
            "profile",
            "NVML has no memory profiler; import the framework first or pass backend='torch', 'jax' or 'tf'",
        )
