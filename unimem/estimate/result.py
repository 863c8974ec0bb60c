"""What ``unimem.estimate_memory`` returns: per batch size, the predicted peak and its parts, and
whether it fits the target; the largest batch that fits; what the figures could not see."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from unimem.estimate.trace import replay
from unimem.sizes import format_bytes
from unimem.step_estimates import PARTS, Measured

__all__ = ["MemoryEstimate", "SizeEstimate", "size_estimate"]


@dataclass(frozen=True)
class SizeEstimate:
    """The prediction for one batch size.

    Attributes:
        batch (int): The batch size.
        device (str): The device the figures are for (``"cuda"``, ``"cpu"``).
        peak (int): Predicted peak of bytes in use during the measured step (torch on CUDA: what
            ``max_memory_allocated`` reports for it; JAX: the compiled program's peak).
        reserved (int | None): Predicted peak of bytes the allocator holds from the device (torch on CUDA:
            ``max_memory_reserved``); None where no caching allocator is modelled.
        required (int): The least memory the step runs in: where a caching allocator is modelled, the
            smallest limit under which it does not run out (it gives its cache back before failing, as
            torch's does, and the step then runs slower); else ``peak``. ``fits`` holds it to the target.
        parts (dict[str, int]): The peak by part (``parameters``, ``gradients``, ``optimizer``,
            ``activations``, ``temporaries``, ``workspace``, ``rounding``) adding up to ``peak``, and
            ``cache`` (``reserved - peak``) where ``reserved`` is known.
        fits (bool | None): Whether ``required`` is within the target; None without a target.
        notes (tuple[str, ...]): What was assumed to make the figures.
        unseen (tuple[str, ...]): What the figures cannot see, and when it matters.
        seconds (float): Wall time this size's estimate took.
        cpu_seconds (float): CPU time this size's estimate took (the process, every thread).
        host_peak (int | None): How far the process's resident memory rose above its size before the
            estimate, at its highest during it; None where the high-water mark cannot be reset.
    """

    batch: int
    device: str
    peak: int
    reserved: int | None
    required: int
    parts: dict[str, int]
    fits: bool | None
    notes: tuple[str, ...] = ()
    unseen: tuple[str, ...] = ()
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    host_peak: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain data (JSON-ready)."""
        return {
            "batch": self.batch,
            "device": self.device,
            "peak": self.peak,
            "reserved": self.reserved,
            "required": self.required,
            "parts": dict(self.parts),
            "fits": self.fits,
            "notes": list(self.notes),
            "unseen": list(self.unseen),
            "seconds": round(self.seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "host_peak": self.host_peak,
        }


def size_estimate(measured: Measured, limit: int | None, timing: tuple[float, float, int | None]) -> SizeEstimate:
    """A size's prediction from what its framework measured: a trace replayed through the device's
    allocator (with ``limit`` as its limit, for ``fits``), or the compiler's own figures."""
    seconds, cpu_seconds, host_peak = timing
    notes = list(measured.notes)
    if measured.trace is not None:
        replayed = replay(measured.trace)
        parts = dict(replayed.parts)
        if replayed.reserved is not None:
            parts["cache"] = replayed.cache
        peak, reserved, required = replayed.peak, replayed.reserved, replayed.required
        if limit is not None and reserved is not None and required <= limit < reserved:
            notes.append(
                "fits only with the allocator giving its cached blocks back to the device (it waits for the device "
                "each time: the step runs slower); a size whose reserved peak is within the target runs at full speed"
            )
    else:
        peak, reserved, parts = measured.peak or 0, None, dict(measured.parts)
        required = peak
    fits = None if limit is None else required <= limit
    return SizeEstimate(
        measured.size,
        measured.device,
        peak,
        reserved,
        required,
        parts,
        fits,
        tuple(notes),
        measured.unseen,
        seconds,
        cpu_seconds,
        host_peak,
    )


@dataclass
class MemoryEstimate:
    """Predicted peaks of a training step, per batch size, found without allocating them.

    ``str()`` is a table; in a rich console the same table renders as one. ``peak_at(n)`` predicts
    any other size. ``unimem.find_batch_size(..., lower=estimate)`` sizes the batch search from it:
    for torch, two calls at the largest size it says fits confirm it.

    Attributes:
        backend (str): The framework that sized the step.
        device (str): The device the figures are for (``"cuda"``, ``"cpu"``).
        target (int | None): Bytes the step must fit in; None when none was given.
        target_source (str): Where ``target`` came from (``"given"``, or the device and how it was read).
        sizes (dict[int, SizeEstimate]): Every batch size estimated, the asked ones and those the search for
            the largest tried, by size.
        asked (list[int]): The batch sizes asked for, in order.
        largest (int | None): The largest batch size that fits ``target``; None without a target, or when
            no size fits.
        above (int | None): The smallest size above ``largest`` seen not to fit: ``largest + 1``, or within
            half a percent of it (the search stops there); None when the search ran out of runs first.
    """

    backend: str
    device: str
    target: int | None
    target_source: str
    sizes: dict[int, SizeEstimate] = field(default_factory=dict)
    asked: list[int] = field(default_factory=list)
    largest: int | None = None
    above: int | None = None
    _measure: Callable[[int], SizeEstimate] | None = field(default=None, repr=False, compare=False)

    def __getitem__(self, batch: int) -> SizeEstimate:
        return self.sizes[batch]

    @property
    def notes(self) -> list[str]:
        """What was assumed, over every size (each once)."""
        return list(dict.fromkeys(note for size in self.sizes.values() for note in size.notes))

    @property
    def unseen(self) -> list[str]:
        """What the figures cannot see, over every size (each once)."""
        return list(dict.fromkeys(item for size in self.sizes.values() for item in size.unseen))

    @property
    def seconds(self) -> float:
        """Wall time of every size's estimate."""
        return sum(size.seconds for size in self.sizes.values())

    @property
    def cpu_seconds(self) -> float:
        """CPU time of every size's estimate."""
        return sum(size.cpu_seconds for size in self.sizes.values())

    def peak_at(self, batch: int, *, reserved: bool = True) -> int:
        """The predicted peak at ``batch``, estimated now if it was not yet (each size once).

        Args:
            batch: A batch size, 1 or more.
            reserved: The least memory the step runs in (default: ``required``); False: the bytes in use
                (``peak``).

        Returns:
            Bytes.
        """
        found = self.sizes.get(batch)
        if found is None:
            if self._measure is None:
                raise KeyError(batch)
            found = self._measure(batch)
            self.sizes[batch] = found
        return found.required if reserved else found.peak

    def as_dict(self) -> dict[str, Any]:
        """Everything as plain data (JSON-ready), sizes in ascending order."""
        return {
            "backend": self.backend,
            "device": self.device,
            "target": self.target,
            "target_source": self.target_source,
            "asked": list(self.asked),
            "largest": self.largest,
            "above": self.above,
            "sizes": [self.sizes[n].as_dict() for n in sorted(self.sizes)],
            "notes": self.notes,
            "unseen": self.unseen,
            "seconds": round(self.seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
        }

    # --- the table ---------------------------------------------------------------------
    def _columns(self) -> list[str]:
        parts = [name for name in PARTS if any(name in size.parts for size in self.sizes.values())]
        return ["batch", "peak", "reserved", "required", "fits", *parts]

    def _rows(self) -> list[list[str]]:
        rows = []
        for n in sorted(self.sizes):
            size = self.sizes[n]
            fits = "-" if size.fits is None else "yes" if size.fits else "no"
            mark = "" if n in self.asked else "*"
            cells = [f"{n}{mark}", format_bytes(size.peak), format_bytes(size.reserved), format_bytes(size.required)]
            cells += [fits] + [format_bytes(size.parts.get(name)) for name in self._columns()[5:]]
            rows.append(cells)
        return rows

    def _title(self) -> str:
        target = "no target" if self.target is None else f"target {format_bytes(self.target)} ({self.target_source})"
        return f"unimem.estimate_memory: {self.backend} on {self.device}, {target}"

    def _summary(self) -> list[str]:
        lines = []
        if self.target is not None:
            if self.largest is None:
                lines.append(f"no batch size tried fits {format_bytes(self.target)}")
            else:
                above = " (the search ran out of runs)" if self.above is None else f" ({self.above} does not)"
                lines.append(f"largest batch that fits {format_bytes(self.target)}: {self.largest}{above}")
        if any(n not in self.asked for n in self.sizes):
            lines.append("* tried by the search for the largest batch that fits")
        lines += [f"note: {note}" for note in self.notes]
        lines += [f"not counted: {item}" for item in self.unseen]
        hosts = [size.host_peak for size in self.sizes.values() if size.host_peak is not None]
        host = f", host memory +{format_bytes(max(hosts))} at most" if hosts else ""
        lines.append(f"estimated in {self.seconds:.1f} s ({self.cpu_seconds:.1f} CPU s){host}; nothing allocated")
        return lines

    def __str__(self) -> str:
        columns, rows = self._columns(), self._rows()
        widths = [max(len(column), *(len(row[i]) for row in rows)) for i, column in enumerate(columns)]
        lines = [self._title(), "  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
        lines += ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
        return "\n".join(lines + self._summary())

    def __rich__(self) -> Any:
        """The same table for a rich console."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        table = Table(title=self._title())
        for column in self._columns():
            table.add_column(column, justify="right")
        for row in self._rows():
            table.add_row(*row)
        return Group(table, *(Text(line) for line in self._summary()))
