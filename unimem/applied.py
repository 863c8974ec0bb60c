"""``Applied``: what ``configure`` did, per backend and setting, and how."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from unimem.sizes import exact_bytes

__all__ = ["Action", "Applied", "action_table", "show_value"]


@dataclass(frozen=True)
class Action:
    """One setting for one backend, as ``configure`` applied it.

    Attributes:
        backend (str): The backend the setting was for (``"torch"``, ``"jax"``, ...).
        setting (str): The setting (``"fraction"``, ``"limit"``, ``"growth"``,
            ``"allocator"``, ``"devices"``).
        value (Any): The value asked for (a limit in bytes).
        method (str): ``"api"`` (a framework call made now), ``"env"`` (an environment
            variable the framework reads), ``"hook"`` (an API call unimem makes when the
            framework starts) or ``"none"``.
        target (str): The exact call or ``VAR=value`` it was made with.
        status (str): ``"applied"`` (in effect now), ``"pending"`` (takes effect when the
            framework starts), ``"unchanged"`` (it already was so), ``"no-device"`` (this
            host has no GPU for it to act on: the framework sees none, or NVML counts none;
            nothing takes effect) or ``"skipped"`` (not applied: see ``note``).
        note (str): Why it was skipped, or what else to know; empty if nothing.
        replaced (str): What it replaced from an earlier ``configure`` call, as
            ``"setting=value"`` (``"fraction=0.5"``); empty if nothing was replaced.
    """

    backend: str
    setting: str
    value: Any
    method: str
    target: str
    status: str
    note: str = ""
    replaced: str = ""


@dataclass(frozen=True)
class Applied:
    """The outcome of one ``configure`` call. ``str()`` prints a table.

    Iterating gives the ``Action`` objects in order; ``len()`` counts them.

    Attributes:
        actions (tuple[Action, ...]): One entry per backend and setting, in order.
        backends (tuple[str, ...]): The backends the call configured.
        note (str): What holds for the whole call, e.g. that NVML cannot count GPUs here, so
            a ``"pending"`` setting takes effect only if the framework finds a GPU when it
            starts; empty if nothing.

    Example:
        ```python
        applied = unimem.configure(backend="jax", fraction=0.3, growth=True)
        print(applied)  # backend, setting, value, status, how
        for action in applied.pending:
            print(action.target)  # e.g. XLA_CLIENT_MEM_FRACTION=0.3
        ```
    """

    actions: tuple[Action, ...]
    backends: tuple[str, ...]
    note: str = ""

    def __iter__(self) -> Iterator[Action]:
        return iter(self.actions)

    def __len__(self) -> int:
        return len(self.actions)

    def for_backend(self, backend: str) -> list[Action]:
        """The actions for one backend.

        Args:
            backend: A canonical backend name (``"tensorflow"``, not ``"tf"``).

        Returns:
            Its actions, in order; empty if the call did not configure it.
        """
        return [a for a in self.actions if a.backend == backend]

    def get(self, backend: str, setting: str) -> list[Action]:
        """The actions for one backend and setting.

        Args:
            backend: A canonical backend name (``"tensorflow"``, not ``"tf"``).
            setting: The setting (``"fraction"``, ``"growth"``, ...).

        Returns:
            Its actions (one setting may take several, e.g. a variable set and its other
            name unset); empty if there are none.
        """
        return [a for a in self.actions if a.backend == backend and a.setting == setting]

    @property
    def pending(self) -> list[Action]:
        """The actions that take effect when the framework starts (status ``"pending"``)."""
        return [a for a in self.actions if a.status == "pending"]

    @property
    def skipped(self) -> list[Action]:
        """The actions not applied (status ``"skipped"``); each ``note`` says why."""
        return [a for a in self.actions if a.status == "skipped"]

    @property
    def no_device(self) -> list[Action]:
        """The actions with nothing to act on: this host has no GPU (status ``"no-device"``)."""
        return [a for a in self.actions if a.status == "no-device"]

    @property
    def replaced(self) -> list[Action]:
        """The actions that replaced a setting of an earlier ``configure`` call."""
        return [a for a in self.actions if a.replaced]

    def as_dict(self) -> dict[str, Any]:
        """The outcome as plain data, JSON-ready.

        Returns:
            ``{"backends": [...], "actions": [{"backend": ..., "setting": ..., ...}, ...],
            "note": ...}``.
        """
        return {"backends": list(self.backends), "actions": [asdict(a) for a in self.actions], "note": self.note}

    def __str__(self) -> str:
        text = action_table(self.actions)
        if not self.actions:
            text = f"unimem.configure({', '.join(self.backends) or 'no backend'}): nothing to change"
        return f"{text}\n({self.note})" if self.note else text


def action_table(actions: tuple[Action, ...] | list[Action]) -> str:
    """Actions as a table: backend, setting, value, status, and how (with the note and what
    was replaced); empty for none."""
    if not actions:
        return ""
    header = ("backend", "setting", "value", "status", "how")
    rows = [
        (
            a.backend,
            a.setting,
            show_value(a.setting, a.value),
            a.status,
            f"{a.method}: {a.target}" + _remarks(a),
        )
        for a in actions
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    lines = []
    for row in [header, *rows]:
        cells = [row[i].ljust(widths[i]) for i in range(4)]
        lines.append("  ".join([*cells, row[4]]).rstrip())
    return "\n".join(lines)


def _remarks(action: Action) -> str:
    remarks = [r for r in (action.note, f"replaces {action.replaced}" if action.replaced else "") if r]
    return f"  ({'; '.join(remarks)})" if remarks else ""


def show_value(setting: str, value: Any) -> str:
    """A setting's value for people: a limit in binary units with its exact bytes
    (``7.45 GiB (8000000000 B)``), a share as ``0.25``, anything else as ``str()``."""
    if setting == "limit" and isinstance(value, int) and not isinstance(value, bool):
        return exact_bytes(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
