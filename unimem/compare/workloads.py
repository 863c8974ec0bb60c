"""The reference workloads as ``unimem compare`` runs them: its sizes, and each step built by the
framework's adapter (its ``workloads`` topic), reached through the registry.

The shapes and the math every framework shares are in ``unimem.workload_specs``; this module
hands them to the adapter, with the saver each block runs under (``unimem.remat``) for the
``remat`` and ``offload`` configurations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from unimem import registry
from unimem.workload_specs import Shapes, parameter_shapes

__all__ = ["SIZES", "build_step", "saver_wrap"]


SIZES: dict[str, Shapes] = {
    # small: seconds per run on a laptop CPU; large: enough to matter on a datacenter GPU
    "small": Shapes(batch=32, width=128, hidden=512, depth=3, seq=32, heads=4),
    "large": Shapes(batch=256, width=2048, hidden=8192, depth=4, seq=512, heads=16),
}


def saver_wrap(framework: str, policy: str) -> Callable[[Callable[..., Any]], Any]:
    """What each block is called through for ``policy``: ``unimem.remat(block, policy)`` in ``framework``.

    Raises:
        UnsupportedFeature: ``framework`` cannot do ``policy``; raised here, before anything runs.
    """
    from unimem.training.savers import remat

    remat(lambda: None, policy, backend=framework)  # refuses a policy the backend cannot do, now

    def wrap(block: Callable[..., Any]) -> Any:
        return remat(block, policy, backend=framework)

    return wrap


def build_step(framework: str, workload: str, s: Shapes, dtype: str) -> tuple[Callable[[], None], int]:
    """``(step, parameter_count)``: ``step()`` runs one training step and waits for it."""
    parameter_shapes(workload, s)  # an unknown workload is a ValueError before any framework is imported
    if s.saver is not None:
        s = replace(s, wrap=saver_wrap(framework, s.saver))
    return registry.get_backend(framework).workloads.workload_step(workload, s, dtype)
