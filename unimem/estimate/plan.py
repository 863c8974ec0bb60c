"""The plain types between ``unimem.estimate_memory`` and a framework's ``estimate`` topic: what to
estimate (``Plan``) and what the framework found for one batch size (``Measured``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from unimem.estimate.trace import Trace

__all__ = ["Measured", "Plan"]


@dataclass(frozen=True)
class Plan:
    """What to estimate, checked by the front.

    Attributes:
        precision (str | None): ``"bf16"``, ``"fp16"`` or ``"fp32"``: the step's forward pass runs under
            unimem's mixed-precision policy; None: as the step itself sets it.
        saver (str | None): ``"full"``, ``"matmuls"`` or ``"offload"``: the model's blocks that ``match``
            picks are saved as ``unimem.remat_model`` saves them; None: none.
        match (Any): Which blocks the saver picks (as ``unimem.remat_model``'s ``match``).
        device (str | None): The device type the step is planned for (``"cuda"``, ``"cpu"``, ``"gpu"``);
            None: the one the framework would use here.
    """

    precision: str | None = None
    saver: str | None = None
    match: Any = None
    device: str | None = None


@dataclass(frozen=True)
class Measured:
    """What a framework found for one batch size, without allocating the step's memory.

    Either ``trace`` (every allocation in order, replayed by the front through the device's allocator)
    or ``peak`` and ``parts`` (a compiler's own figures) are set.

    Attributes:
        size (int): The batch size.
        device (str): The device the figures are for, as the result shows it (``"cuda"``, ``"cpu"``).
        trace (Trace | None): The allocations, where the framework records them.
        peak (int | None): The predicted peak in bytes, where no trace is recorded.
        parts (dict[str, int]): Where no trace is recorded, the peak by part (``trace.PARTS``).
        notes (tuple[str, ...]): What was assumed or done to make the figures (a kernel chosen for the device).
        unseen (tuple[str, ...]): What the figures cannot see, each with how much it may change them.
    """

    size: int
    device: str
    trace: Trace | None = None
    peak: int | None = None
    parts: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    unseen: tuple[str, ...] = ()
