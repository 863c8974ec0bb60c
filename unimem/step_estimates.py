"""The plain types between ``unimem.estimate_memory`` and a framework's ``estimate`` topic, below
the adapters that fill them: what to estimate (``Plan``), the allocations a step made in order
(``Trace``) and what the framework found for one batch size (``Measured``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ALLOCATED_PARTS", "PARTS", "Measured", "Plan", "Trace"]

# The parts of a peak, in the order a breakdown lists them; each allocation is one of the first six.
PARTS: dict[str, str] = {
    "parameters": "the model's parameters and buffers",
    "gradients": "gradients the backward pass leaves on the parameters",
    "optimizer": "the optimizer's state (moments, step counts)",
    "activations": "what the forward pass keeps for the backward pass (and the step's inputs)",
    "temporaries": "intermediate results freed within the pass that made them",
    "workspace": "buffers libraries keep for their kernels (cuBLAS workspaces)",
    "rounding": "the allocator's rounding: whole blocks handed out for smaller requests",
    "cache": "free blocks the allocator keeps reserved at its peak (reserved less allocated)",
    "arguments": "a compiled step's inputs (parameters, optimizer state, the batch)",
    "outputs": "a compiled step's outputs not written over its (donated) inputs",
}
ALLOCATED_PARTS = tuple(PARTS)[:7]  # the parts of the allocated peak


@dataclass
class Trace:
    """Allocations and frees in the order the step made them.

    Attributes:
        events (list[tuple[int, int]]): ``(allocation id, bytes)``: bytes above 0 allocate, 0 frees
            the allocation with that id.
        categories (dict[int, str]): The part of the breakdown each allocation id is (a key of ``PARTS``).
        window (int): Index of the first event of the measured step (its peak is the one predicted).
        caching (bool): Replay through the CUDA caching allocator's model; False: exact bytes (host memory).
    """

    events: list[tuple[int, int]] = field(default_factory=list)
    categories: dict[int, str] = field(default_factory=dict)
    window: int = 0
    caching: bool = True


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
        save_blocks (Callable | None): Applies ``saver`` to one model as ``unimem.remat_model`` does and
            returns the blocks it saved; None without a saver.
    """

    precision: str | None = None
    saver: str | None = None
    match: Any = None
    device: str | None = None
    # The front's remat_model with saver and match bound: ``(model) -> blocks saved``. A callable
    # handed down, so an adapter applies the saver without importing a feature of the front.
    save_blocks: Callable[[Any], int] | None = None


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
