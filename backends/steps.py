"""Plan steps: what ``Backend.plan()`` returns, and the helpers adapters build them with.

Configuration is two-step so that ``configure`` can validate everything before it
changes anything: ``plan()`` is pure and returns ``Step`` objects; the front runs
their ``run`` callables only once every backend's plan succeeded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from unimem.config import visible_entries
from unimem.errors import ConfigError
from unimem.support import Phase, When

__all__ = [
    "STATUS_APPLIED",
    "STATUS_NO_DEVICE",
    "STATUS_PENDING",
    "STATUS_SKIPPED",
    "STATUS_UNCHANGED",
    "Step",
    "devices_step",
    "env_step",
    "merge_conf",
    "visible_devices_value",
    "written_vars",
]

STATUS_APPLIED = "applied"  # took effect now
STATUS_PENDING = "pending"  # set; takes effect when the framework starts
STATUS_UNCHANGED = "unchanged"  # already so; nothing was done
STATUS_SKIPPED = "skipped"  # not applied (strict=False, or the framework cannot); see note
STATUS_NO_DEVICE = "no-device"  # the framework sees no GPU here: nothing to act on; see note


@dataclass
class Step:
    """One planned change: what, how, and the callable that makes it.

    ``Backend.plan()`` returns them; ``configure`` runs their ``run`` callables only once
    every backend's plan succeeded, and reports each as an ``unimem.Action``.

    Attributes:
        backend (str): The backend the change is for.
        setting (str): The setting (``"fraction"``, ``"growth"``, ...).
        value (object): The value asked for.
        method (str): ``"api"``, ``"env"``, ``"hook"`` (an API call made when the framework
            starts) or ``"none"``.
        target (str): The exact call or ``VAR=value``, for humans and for ``Applied``.
        run (Callable[[], None] | None): What makes the change; None when there is nothing
            to run.
        status (str): What it will be once run: ``"applied"`` (default), ``"pending"``,
            ``"unchanged"``, ``"no-device"`` (the framework sees no GPU here) or ``"skipped"``.
        too_late (str | None): Why it can no longer take effect, with the fix.
        unsupported (str | None): Why the framework can never do this, with an alternative.
        note (str): Anything else to know; shown in the ``Action``.
        when (When): By when it must be made.
    """

    backend: str
    setting: str
    value: object
    method: str  # "api", "env", "hook" (an API call made when the framework starts), "none"
    target: str  # the exact call or ``VAR=value``, for humans and for Applied
    run: Callable[[], None] | None = None
    status: str = STATUS_APPLIED  # what it will be once run
    too_late: str | None = None  # why it can no longer take effect, with the fix
    unsupported: str | None = None  # why the framework can never do this, with an alternative
    note: str = ""
    when: When = When.ANYTIME


# The value unimem last wrote into each variable: any other value there is the user's.
_written: dict[str, str] = {}


def env_step(
    backend: str,
    setting: str,
    value: object,
    var: str,
    new: str | None,
    *,
    phase: Phase,
    when: When,
    fix: str,
    note: str = "",
) -> Step:
    """A step that sets (or, with ``new=None``, removes) an environment variable.

    The variable counts only if set before ``when``; once that is past, a value
    that differs from the one in force is too late.
    """
    current = os.environ.get(var)
    target = f"{var}={new}" if new is not None else f"unset {var}"
    if current == new:
        return Step(backend, setting, value, "env", target, status=STATUS_UNCHANGED, note=note, when=when)
    if current is not None and current != _written.get(var):
        # A value unimem did not write is the user's: replacing it without a word would hide it.
        note = "; ".join(part for part in (note, f"replaces {var}={current!r} from the environment") if part)
    if not phase.allows(when):
        if when is When.BEFORE_IMPORT:
            reason = f"{var} is read only at import, and {backend} is already imported; {fix}"
        else:
            reason = f"{var} is read only when the device starts, and {backend} has already started it; {fix}"
        return Step(backend, setting, value, "env", target, too_late=reason, note=note, when=when)

    def run() -> None:
        if new is None:
            os.environ.pop(var, None)
            _written.pop(var, None)
        else:
            os.environ[var] = new
            _written[var] = new

    return Step(backend, setting, value, "env", target, run=run, status=STATUS_PENDING, note=note, when=when)


def written_vars(steps: list[Step]) -> set[str]:
    """The environment variables ``steps`` set or unset (those that will run)."""
    names: set[str] = set()
    for step in steps:
        if step.method != "env" or step.too_late or step.unsupported:
            continue
        target = step.target.removeprefix("unset ")
        names.add(target.partition("=")[0])
    return names


_visible: dict[str, str | None] = {"original": None, "written": None}


def _visible_base() -> str | None:
    """The CUDA_VISIBLE_DEVICES value indices count in: the one before unimem wrote the
    variable, unless the user has set it since (then theirs)."""
    current = os.environ.get("CUDA_VISIBLE_DEVICES")
    if current is None or current != _visible["written"]:
        return current
    return _visible["original"]


def visible_devices_value(devices: tuple[int, ...]) -> str:
    """The CUDA_VISIBLE_DEVICES value that shows ``devices``. Pure: changes nothing.

    Indices count among the devices this process can already see: under a scheduler's
    ``CUDA_VISIBLE_DEVICES=3,5``, ``devices=[1]`` means physical GPU 5 (value ``"5"``).
    The base is the value before unimem wrote it, so configuring twice gives the same
    answer; a value the user set since then becomes the new base.
    """
    base = _visible_base()
    if base is None:
        return ",".join(str(d) for d in devices)
    entries = visible_entries(base)
    hidden = [d for d in devices if d >= len(entries)]
    if hidden:
        raise ConfigError(
            "devices",
            f"device {hidden[0]} is not visible: CUDA_VISIBLE_DEVICES={base!r} shows {len(entries)} "
            "device(s), and indices count from 0 among those",
        )
    return ",".join(entries[d] for d in devices)


def devices_step(backend: str, devices: tuple[int, ...], *, phase: Phase, when: When, fix: str) -> Step:
    """The env step for ``devices``; the base it counted from is remembered only when it runs."""
    base = _visible_base()
    value = visible_devices_value(devices)
    step = env_step(backend, "devices", list(devices), "CUDA_VISIBLE_DEVICES", value, phase=phase, when=when, fix=fix)
    inner = step.run
    if inner is not None:

        def run() -> None:
            inner()
            _visible["original"], _visible["written"] = base, value

        step.run = run
    return step


def merge_conf(current: str | None, updates: dict[str, str | None]) -> str:
    """Merge ``key:value`` pairs into a comma-separated conf string such as
    PYTORCH_CUDA_ALLOC_CONF, keeping keys the user set that unimem does not own."""
    pairs: dict[str, str] = {}
    for part in (current or "").split(","):
        key, sep, value = part.strip().partition(":")
        if sep and key:
            pairs[key.strip()] = value.strip()
    for key, update in updates.items():
        if update is None:
            pairs.pop(key, None)
        else:
            pairs[key] = update
    return ",".join(f"{key}:{value}" for key, value in pairs.items())
