"""``Applied``: what ``configure`` did, per backend and setting, and how."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Action", "Applied"]


@dataclass(frozen=True)
class Action:
    """One setting for one backend.

    ``method`` is ``"api"`` (a framework call made now), ``"env"`` (an environment
    variable the framework reads), ``"hook"`` (an API call unimem makes when the
    framework starts) or ``"none"``. ``status`` is ``"applied"`` (in effect now),
    ``"pending"`` (takes effect when the framework starts), ``"unchanged"`` (it
    already was so) or ``"skipped"`` (not applied: see ``note``).
    """

    backend: str
    setting: str
    value: Any
    method: str
    target: str
    status: str
    note: str = ""


@dataclass(frozen=True)
class Applied:
    """The outcome of one ``configure`` call. ``str()`` prints a table."""

    actions: tuple[Action, ...]
    backends: tuple[str, ...]

    def __iter__(self) -> Iterator[Action]:
        return iter(self.actions)

    def __len__(self) -> int:
        return len(self.actions)

    def for_backend(self, backend: str) -> list[Action]:
        return [a for a in self.actions if a.backend == backend]

    def get(self, backend: str, setting: str) -> list[Action]:
        return [a for a in self.actions if a.backend == backend and a.setting == setting]

    @property
    def pending(self) -> list[Action]:
        return [a for a in self.actions if a.status == "pending"]

    @property
    def skipped(self) -> list[Action]:
        return [a for a in self.actions if a.status == "skipped"]

    def as_dict(self) -> dict[str, Any]:
        return {"backends": list(self.backends), "actions": [asdict(a) for a in self.actions]}

    def __str__(self) -> str:
        if not self.actions:
            return f"unimem.configure({', '.join(self.backends) or 'no backend'}): nothing to change"
        header = ("backend", "setting", "value", "status", "how")
        rows = [
            (
                a.backend,
                a.setting,
                _show(a.value),
                a.status,
                f"{a.method}: {a.target}" + (f"  ({a.note})" if a.note else ""),
            )
            for a in self.actions
        ]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
        lines = []
        for row in [header, *rows]:
            cells = [row[i].ljust(widths[i]) for i in range(4)]
            lines.append("  ".join([*cells, row[4]]).rstrip())
        return "\n".join(lines)


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
