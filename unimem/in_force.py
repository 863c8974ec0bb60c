"""What ``configure()`` has put in force in this process, and the checks that span its calls.

Calls add up: a setting stays until a later call for the same backend replaces it, and a call is
checked against what is in force as one call is against itself. The rank's pin is kept beside the
settings, not as one of them. The rules a user sees: docs/guides/configure.md#calls-add-up.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from unimem import device_view, registry
from unimem.applied import Action, action_table, show_value
from unimem.config import Settings
from unimem.errors import BackendUnavailable, ConfigError, UnimemWarning
from unimem.support import Phase

if TYPE_CHECKING:
    from unimem.backends.steps import Step

__all__ = ["BackendConfiguration", "Configuration", "configuration"]

_CAP = ("fraction", "limit")  # one cap, given as either
# What a call gives; the rank's "pin" is in force beside them, made from the launcher's variables.
_SETTINGS = frozenset(field.name for field in dataclasses.fields(Settings))
_SHARE_SLACK = 1e-9  # float sums such as 0.7 + 0.2 + 0.1 must still fit the whole device


@dataclass
class _Entry:
    actions: tuple[Action, ...]  # the latest call's actions for the setting, not all skipped
    tentative: bool  # given by backend="auto" to every installed framework, none imported yet
    pinned: bool = False  # made by the rank's pin under a launcher (a "pin", or devices="per-rank")

    @property
    def setting(self) -> str:
        return self.actions[0].setting

    @property
    def value(self) -> Any:
        return self.actions[0].value

    def shown(self) -> str:
        return f"{self.setting}={show_value(self.setting, self.value)}"


# backend -> (the adapter that made the changes, setting -> entry). A record belongs to the
# adapter instance whose state it describes (torch's cap waiting for CUDA init lives there):
# an adapter made afresh starts with none.
_records: dict[str, tuple[object, dict[str, _Entry]]] = {}
_lock = threading.RLock()


def _key(setting: str) -> str:
    return "cap" if setting in _CAP else setting


def _message(exc: ConfigError) -> str:
    return str(exc).partition(": ")[2]


def _entries(name: str) -> dict[str, _Entry]:
    """``name``'s entries in force (empty if none); a record of a replaced adapter is dropped."""
    held = _records.get(name)
    if held is None:
        return {}
    try:
        adapter: object = registry.get_backend(name)
    except BackendUnavailable:
        adapter = None
    if held[0] is not adapter:
        del _records[name]
        return {}
    return held[1]


def settings_in_force(name: str) -> Settings:
    """The settings ``configure()`` put in force for ``name`` (None fields: never set).

    The rank's pin is left out: it is no setting a call gives, but the launcher's (``pin_in_force``).
    """
    values: dict[str, Any] = {}
    for entry in _entries(name).values():
        if entry.setting in _SETTINGS:
            values[entry.setting] = tuple(entry.value) if entry.setting == "devices" else entry.value
    return Settings(**values)


def pin_in_force(name: str) -> int | None:
    """The device ``name`` is pinned to for this rank, counted among the devices the launcher made
    visible; None when no call pinned it (a single process, devices chosen, or the pin skipped)."""
    entries = _entries(name)
    pin = entries.get("pin")
    if pin is not None:
        return pin.value if isinstance(pin.value, int) else None
    devices = entries.get("devices")
    if devices is not None and devices.pinned and devices.value:
        return int(devices.value[0])  # devices="per-rank": the rank's GPU, made its only visible one
    return None


def framework_pins() -> dict[str, int]:
    """Backends pinned by their own device call (not ``CUDA_VISIBLE_DEVICES``), and the device:
    a later ``devices`` numbers the devices afresh under such a pin."""
    with _lock:
        pins: dict[str, int] = {}
        for name in list(_records):
            entry = _entries(name).get("pin")
            if entry is not None and isinstance(entry.value, int):
                pins[name] = entry.value
        return pins


def devices_chosen(names: Sequence[str]) -> bool:
    """Whether an earlier call chose the devices (``devices=[...]``, not the rank's pin) for one of
    ``names``, or for the whole process (through ``CUDA_VISIBLE_DEVICES``): a later call then pins
    nothing, as that call did not."""
    with _lock:
        for name in list(_records):
            entry = _entries(name).get("devices")
            if entry is None or entry.pinned:
                continue
            if name in names or any(a.method == "env" for a in entry.actions):
                return True
        return False


def _merged(earlier: Settings, new: Settings) -> Settings:
    given = new.given()
    if any(setting in given for setting in _CAP):
        earlier = dataclasses.replace(earlier, fraction=None, limit=None)
    return dataclasses.replace(earlier, **given)


# --- the checks, before anything changes ----------------------------------------------------


def check_call(names: tuple[str, ...], settings: Mapping[str, Settings], *, spread: bool) -> None:
    """Refuse a call that the settings in force from earlier calls make invalid, from the
    settings alone (before any backend plans). Changes nothing.

    Raises:
        ConfigError: The shares of the device would add up to more than 1 (``fraction``), or
            ``devices`` differs from the value another backend wrote to the same process-wide
            variable (``devices``).
    """
    with _lock:
        _check_shares(names, settings, spread=spread)
        _check_devices(names, settings)


def check_combined(names: tuple[str, ...], settings: Mapping[str, Settings]) -> None:
    """Refuse a call whose settings no longer combine with those in force for the same backend,
    as ``Backend.check`` refuses them within one call. Runs after planning, so a backend's own
    answer to an earlier call (its plan's) comes first. Changes nothing.

    Raises:
        ConfigError: A backend cannot take this call's settings beside those it keeps; the
            parameter is one this call gave.
    """
    with _lock:
        for name in names:
            _check_combined(name, settings[name])


def _check_combined(name: str, new: Settings) -> None:
    earlier = settings_in_force(name)
    merged = _merged(earlier, new)
    if not earlier or not new or merged == new:
        return  # nothing kept, or nothing given: what is in force was accepted when it was given
    backend = registry.get_backend(name)
    try:
        backend.check(new)
    except ConfigError:
        return  # the call alone is refused: planning it says so, as for any single call
    try:
        backend.check(merged)
    except ConfigError as exc:
        given = list(new.given())
        kept = ", ".join(f"{k}={show_value(k, v)}" for k, v in merged.given().items() if k not in given)
        raise ConfigError(
            exc.parameter if exc.parameter in given else given[0],
            f"{_message(exc)} ({name} keeps {kept} from an earlier configure() call, which this call does not replace)",
        ) from None


def _check_shares(names: tuple[str, ...], settings: Mapping[str, Settings], *, spread: bool) -> None:
    """The shares of one device add up within a process, across calls as within one.

    A share given by ``backend="auto"`` to every installed framework before any was imported
    is meant for whichever one the script uses: it counts once that framework is imported.
    """
    if not any(settings[name].fraction is not None for name in names):
        return
    imported = set(registry.imported_frameworks())
    shares: dict[str, float] = {}
    earlier: set[str] = set()
    for name in [*_records, *(n for n in names if n not in _records)]:
        new = settings.get(name)
        if new is not None and (new.fraction is not None or new.limit is not None):
            fraction, tentative = new.fraction, spread
        else:
            entry = _entries(name).get("cap")
            if entry is None or entry.setting != "fraction":
                continue
            fraction, tentative = entry.value, entry.tentative
            earlier.add(name)
        if fraction is not None and not (tentative and name not in imported):
            shares[name] = fraction
    total = sum(shares.values())
    if total > 1.0 + _SHARE_SLACK:
        parts = ", ".join(
            f"{name} {share:g}" + (" from an earlier configure() call" if name in earlier else "")
            for name, share in shares.items()
        )
        raise ConfigError(
            "fraction",
            f"the shares of the device would add up to {total:.3g} ({parts}), more than the whole "
            "device (1.0); pass smaller shares (configuring a backend again replaces its own share)",
        )


def _check_devices(names: tuple[str, ...], settings: Mapping[str, Settings]) -> None:
    """``devices`` written to an environment variable is one value for the whole process."""
    for name in names:
        wanted = settings[name].devices
        if wanted is None:
            continue
        holders: list[str] = []
        variable = ""
        for other in list(_records):
            entry = _entries(other).get("devices")
            if other in names or entry is None or tuple(entry.value) == wanted:
                continue
            written = [a for a in entry.actions if a.method == "env"]
            if written:
                holders.append(other)
                variable = written[0].target.partition("=")[0]
        if holders:
            entry = _entries(holders[0])["devices"]
            held = "'per-rank'" if entry.pinned else entry.value  # the rank's pin, through the variable
            raise ConfigError(
                "devices",
                f"{', '.join(holders)} {'has' if len(holders) == 1 else 'have'} devices={held} in force from an "
                f"earlier configure() call, written to {variable}, one variable for the whole process; "
                f"pass the same devices, or set them for all in one call: backend={[*holders, name]!r}",
            )


# --- after the checks: what has a device to act on, and what is in force ----------------------


def gpu_count() -> tuple[int | None, str]:
    """GPUs on this host as NVML counts them, and how that was found; None when it cannot tell."""
    try:
        view = device_view.adapter()
    except BackendUnavailable as exc:
        return None, f"NVML cannot count GPUs here ({exc})"
    return view.gpu_count()


def mark_no_device(plans: list[Step]) -> str:
    """Mark the steps waiting for a framework to start as ``"no-device"`` where NVML counts no
    GPU on this host. Returns the call's note when NVML cannot tell (the steps stay pending)."""
    waiting = [
        step
        for step in plans
        if step.status == "pending" and not (step.unsupported or step.too_late) and registry.is_framework(step.backend)
    ]
    if not waiting:
        return ""
    count, how = gpu_count()
    if count is None:
        return f"{how}; a pending setting takes effect only if the framework finds a GPU when it starts"
    if count == 0:
        for step in waiting:
            step.status = "no-device"
            step.note = "; ".join(n for n in (step.note, f"{how}: there is nothing for it to act on") if n)
    return ""


def mark_repeats(plans: list[Step]) -> None:
    """A setting asked for again with the value a call already put in force is ``unchanged``:
    nothing is done, and nothing is too late (calling ``configure`` twice alike is a no-op).

    Only steps that do not read the world themselves: a variable's step compares the variable
    (the user may have changed it since), and a call made now compares the framework's state.
    What is left is a hook waiting for the framework to start, a step with nothing to do (torch's
    growth, its default), and a step too late now whose value the framework already took.
    """
    with _lock:
        for step in plans:
            waiting = step.status == "pending" and step.method == "hook"
            repeat = step.too_late is not None or waiting or (step.status == "applied" and step.method == "none")
            if not repeat or step.method == "env" or step.unsupported or not registry.is_framework(step.backend):
                continue
            entry = _entries(step.backend).get(_key(step.setting))
            if entry is None or (entry.setting, _plain(entry.value)) != (step.setting, _plain(step.value)):
                continue
            step.status, step.too_late = "unchanged", None
            step.note = "; ".join(n for n in (step.note, "in force from an earlier configure() call") if n)


def _plain(value: object) -> object:
    """A value as compared across calls: devices as a list, whether a step holds a list or a tuple."""
    return list(value) if isinstance(value, tuple) else value


def record(actions: list[Action], *, tentative: bool, pinned: int = 0) -> list[Action]:
    """Put the call's actions in force; each that replaces an earlier setting says so (and warns).

    Args:
        actions: The call's actions; a setting whose actions were all skipped leaves the earlier
            one in force.
        tentative: The call gave its settings to every installed framework, none imported yet.
        pinned: How many of the first actions pin the rank to its GPU (``ranks.pin_steps``).

    Returns:
        The actions, with ``replaced`` set where they replaced an earlier call's setting.
    """
    groups: dict[tuple[str, str], list[int]] = {}
    for index, action in enumerate(actions):
        groups.setdefault((action.backend, _key(action.setting)), []).append(index)
    result = list(actions)
    with _lock:
        for (name, key), indices in groups.items():
            group = [actions[i] for i in indices]
            if not registry.is_framework(name) or all(a.status == "skipped" for a in group):
                continue
            entries = _entries(name)
            previous = entries.get(key)
            new = group[0]
            same = previous is not None and (previous.setting, previous.value) == (new.setting, new.value)
            if previous is not None and not same:
                replaced = previous.shown()
                shown = f"{new.setting}={show_value(new.setting, new.value)}"
                warnings.warn(
                    f"{name}: {shown} replaces {replaced} from an earlier configure() call", UnimemWarning, stacklevel=3
                )
                for i in indices:
                    result[i] = dataclasses.replace(actions[i], replaced=replaced)
            if name not in _records:
                _records[name] = (registry.get_backend(name), entries)
            kept = [a for a in group if a.status != "skipped"]
            if same and previous is not None and all(a.status == "unchanged" for a in kept):
                # Asked again as it is: the actions that made it stay (configuration() says how it was made).
                entries[key] = dataclasses.replace(previous, tentative=tentative, pinned=indices[0] < pinned)
                continue
            entries[key] = _Entry(tuple(result[i] for i in indices), tentative, pinned=indices[0] < pinned)
    return result


# --- reading it back --------------------------------------------------------------------------


@dataclass(frozen=True)
class BackendConfiguration:
    """The settings ``configure()`` put in force for one backend, and how each was made.

    A setting no call gave is None: the framework's default, or what the environment says.
    See [Calls add up](../guides/configure.md#calls-add-up).

    Attributes:
        backend (str): The backend (``"torch"``, ``"jax"``, ...).
        fraction (float | None): The cap as a share of device memory; None when unset or a ``limit`` replaced it.
        limit (int | None): The cap in bytes; None when unset or a ``fraction`` replaced it.
        growth (bool | None): True allocates on demand, False preallocates.
        allocator (str | None): ``"default"``, ``"async"``, ``"expandable"`` or ``"uncached"``.
        devices (tuple[int, ...] | None): The device indices the framework may see.
        pin (int | None): Under a launcher, the device this rank is pinned to, among those the launcher made visible.
        actions (tuple[Action, ...]): How each setting was made, as the call that made it reported it; a
            ``pending`` one reads ``applied`` once the framework has started its device runtime.
        phase (str): How far the framework has got now: ``"not imported"``, ``"imported, device not started"``, ...
    """

    backend: str
    fraction: float | None = None
    limit: int | None = None
    growth: bool | None = None
    allocator: str | None = None
    devices: tuple[int, ...] | None = None
    pin: int | None = None
    actions: tuple[Action, ...] = ()
    phase: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The backend's configuration as plain data, JSON-ready.

        Returns:
            Every field, ``devices`` as a list and ``actions`` as dicts.
        """
        data = dataclasses.asdict(self)
        data["devices"] = None if self.devices is None else list(self.devices)
        return data


class Configuration(Mapping[str, BackendConfiguration]):
    """What ``configure()`` has put in force in this process: a read-only mapping of backend to its settings.

    ``str()`` prints a table; aliases (``"tf"``) work as keys.

    Example:
        ```python
        unimem.configure(backend="torch", fraction=0.5)
        in_force = unimem.configuration()
        in_force["torch"].fraction  # 0.5
        print(in_force)  # backend, setting, value, status, how
        ```
    """

    def __init__(self, backends: Mapping[str, BackendConfiguration]) -> None:
        self._backends = dict(backends)

    def __getitem__(self, backend: str) -> BackendConfiguration:
        if backend in self._backends:
            return self._backends[backend]
        try:
            name = registry.canonical_name(backend)  # an alias: "tf", "pytorch"
        except ConfigError:
            raise KeyError(backend) from None
        return self._backends[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._backends)

    def __len__(self) -> int:
        return len(self._backends)

    def as_dict(self) -> dict[str, Any]:
        """The configuration as plain data, JSON-ready.

        Returns:
            ``{backend: BackendConfiguration.as_dict()}``.
        """
        return {name: config.as_dict() for name, config in self._backends.items()}

    def __str__(self) -> str:
        if not self._backends:
            return "unimem.configuration(): nothing configured in this process"
        actions = [action for config in self._backends.values() for action in config.actions]
        phases = "; ".join(
            f"{name}: {config.phase}" + ("" if config.pin is None else f", this rank pinned to device {config.pin}")
            for name, config in self._backends.items()
        )
        return f"{action_table(actions)}\n({phases})"

    def __repr__(self) -> str:
        return f"Configuration({self._backends!r})"


def configuration() -> Configuration:
    """What ``configure()`` has put in force in this process, per backend, and how each setting was made.

    The latest setting given for each backend; variables set outside unimem are not included.
    See [Calls add up](../guides/configure.md#calls-add-up).

    Returns:
        A read-only mapping from backend name to ``BackendConfiguration``; empty when nothing is configured.

    Example:
        ```python
        unimem.configure(backend="torch", fraction=0.5)
        unimem.configure(backend="jax", fraction=0.3, growth=True)
        print(unimem.configuration())
        unimem.configuration()["jax"].growth  # True
        ```
    """
    with _lock:
        names = list(_records)
        backends = {}
        for name in names:
            entries = _entries(name)
            if not entries:
                continue
            settings = settings_in_force(name)
            phase = registry.get_backend(name).phase()
            actions = tuple(_as_of_now(a, phase) for entry in entries.values() for a in entry.actions)
            pin = pin_in_force(name)
            backends[name] = BackendConfiguration(
                name, **settings.given(), pin=pin, actions=actions, phase=phase.describe()
            )
    return Configuration(backends)


def _as_of_now(action: Action, phase: Phase) -> Action:
    """An action as it stands now: a ``pending`` one is ``applied`` once the framework has started
    its device runtime, the moment every pending setting is read or made. A variable changed since
    the call keeps its status, with a note: what the framework read is not known here."""
    if action.status != "pending" or phase is not Phase.INITIALIZED:
        return action
    if action.method == "env":
        var, _, value = action.target.removeprefix("unset ").partition("=")
        wanted = None if action.target.startswith("unset ") else value
        held = os.environ.get(var)
        if held != wanted:
            now = "unset" if held is None else f"{held!r}"
            changed = f"{var} is {now} now, changed after configure(): what {action.backend} read is unknown"
            return dataclasses.replace(action, note="; ".join(n for n in (action.note, changed) if n))
    started = f"in force since {action.backend} started its device runtime"
    return dataclasses.replace(action, status="applied", note="; ".join(n for n in (action.note, started) if n))
