"""The public functions: configure, stats, reset_peak, clear_cache, summary, capabilities."""

from __future__ import annotations

import dataclasses
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from unimem import in_force, ranks, registry
from unimem.applied import Action, Applied
from unimem.config import ENV_VARS, Request, Settings, check_device, parse_env
from unimem.errors import BackendUnavailable, ConfigError, TooLateError, UnimemWarning, UnsupportedFeature
from unimem.memory_stats import MemoryStats
from unimem.snapshots import read_snapshot
from unimem.support import Support

if TYPE_CHECKING:
    from unimem.backends.steps import Step

__all__ = [
    "capabilities",
    "clear_cache",
    "configure",
    "configure_from_env",
    "configured_backends",
    "reset_peak",
    "stats",
    "summary",
]

_lock = threading.RLock()


def configured_backends() -> list[str]:
    """Frameworks named to ``configure()`` in this process, in order."""
    return registry.configured()


def _resolve_for_configure(backend: object, fraction: object, limit: object) -> tuple[str, ...]:
    if isinstance(backend, str) and backend.strip().lower() == "auto":
        split = fraction if isinstance(fraction, dict) else limit if isinstance(limit, dict) else None
        if split is not None:
            return ()  # the split's keys name the backends; Request.build checks them
        imported = registry.imported_frameworks()
        if imported:
            return tuple(imported)
        # Nothing imported yet (configure at the top of a script): every installed
        # framework gets the settings it can take before import. Still imports nothing.
        installed = registry.installed_frameworks()
        if not installed:
            raise BackendUnavailable(
                "no framework is installed: pip install 'unimem[torch]', 'unimem[jax]' or 'unimem[tensorflow]'"
            )
        return tuple(installed)
    if isinstance(backend, str):
        return (registry.canonical_name(backend),)
    if isinstance(backend, Sequence) and backend:
        names: list[str] = []
        for item in backend:
            name = registry.canonical_name(item)
            if name in names:
                raise ConfigError("backend", f"{name!r} is listed twice")
            names.append(name)
        return tuple(names)
    raise ConfigError("backend", f"expected 'auto', a backend name or a list of names, got {backend!r}")


def configure(
    backend: str | Sequence[str] = "auto",
    *,
    fraction: float | dict[str, float] | None = None,
    limit: int | str | dict[str, int | str] | None = None,
    growth: bool | None = None,
    allocator: str | None = None,
    devices: Sequence[int] | int | str | None = None,
    strict: bool = True,
) -> Applied:
    """Say what memory behaviour you want; unimem makes each framework do it.

    Call it before the framework's import or first operation. Everything is validated before anything
    changes; an argument left None keeps what is in force, and calls add up. How to use it:
    [Configure](../guides/configure.md); why the moment matters:
    [When each framework reads its settings](../explanation/settings-timing.md).

    Args:
        backend: ``"auto"`` (default: the imported frameworks, else every installed one), a name or alias, or a list.
        fraction: The cap as a share of device memory in (0, 1], or per backend: ``{"torch": 0.5, "jax": 0.3}``.
        limit: The cap in bytes, or a size such as ``"8GiB"``, or per backend; excludes ``fraction``.
        growth: True allocates on demand, False preallocates ([frameworks sharing a process](../guides/frameworks.md)).
        allocator: ``"default"``, ``"async"``, ``"expandable"`` or ``"uncached"``.
        devices: The device indices the framework may see, or ``"per-rank"`` under a launcher.
        strict: True (default) raises for a setting too late or unsupported; False skips it with a warning.

    Returns:
        An ``Action`` per backend and setting, with its method and status; ``str()`` is a table.

    Raises:
        ConfigError: An argument is invalid, alone or beside the settings in force (``exc.parameter`` names it).
        BackendUnavailable: A named framework is not installed, or ``"auto"`` finds none.
        UnsupportedFeature: With ``strict=True``, a backend can never make a setting; ``"nvml"`` takes none.
        TooLateError: With ``strict=True``, a setting's moment has passed: call ``configure`` earlier.

    Warns:
        UnimemWarning: A setting skipped, with no device to act on, or replacing one of an earlier call.

    Example:
        ```python
        unimem.configure(backend="torch", fraction=0.25, allocator="expandable")
        import torch  # the cap is made at CUDA init, so CUDA is not started early
        ```
    """
    if not isinstance(strict, bool):
        raise ConfigError("strict", f"expected True or False, got {strict!r}")
    with _lock:
        names = _resolve_for_configure(backend, fraction, limit)
        devices_asked = ranks.configure_devices(devices)  # "per-rank" is made by pin_steps, not the model
        request = Request.build(
            names, fraction=fraction, limit=limit, growth=growth, allocator=allocator, devices=devices_asked
        )
        auto = isinstance(backend, str) and backend.strip().lower() == "auto"
        split = isinstance(fraction, dict) or isinstance(limit, dict)
        settings = dict(request.settings)
        defaulted = _safe_growth_default(backend, request.backends, settings, growth, fraction, limit)
        spread = auto and not registry.imported_frameworks()
        pins = ranks.pin_steps(request.backends, settings, devices=devices, spread=spread)  # may split a fraction
        in_force.check_call(request.backends, settings, spread=spread)  # against earlier calls
        plans = pins + _plan(request.backends, settings, spread=spread)
        in_force.mark_repeats(plans)  # asked again as it is in force: unchanged, never too late
        in_force.check_combined(request.backends, settings)
        ranks.check_pins_kept(plans)
        _explain_defaults(plans, defaulted)
        _refuse(plans, strict)
        note = in_force.mark_no_device(plans)
        actions = in_force.record(_apply(plans, spread=spread), tentative=spread, pinned=len(pins))
        # Only backends the user named (or that were in use) make stats() unambiguous;
        # "auto" spreading settings over every installed framework must not.
        in_use = registry.imported_frameworks()
        registry.note_configured([name for name in request.backends if split or not auto or name in in_use])
        return Applied(tuple(actions), request.backends, note)


def _plan(names: tuple[str, ...], settings: dict[str, Settings], *, spread: bool) -> list[Step]:
    """Every backend's steps; nothing changes. All ``check()``s run before any ``plan()``.

    ``spread``: the settings go to every installed framework because none is imported
    yet; they are meant for whichever one the script will use.
    """
    plans: list[Step] = []
    for stage in ("check", "plan"):
        for name in names:
            try:
                if stage == "check":
                    registry.get_backend(name).check(settings[name])
                else:
                    plans.extend(registry.get_backend(name).plan(settings[name]))
            except ConfigError as exc:
                if not spread:
                    raise
                raise ConfigError(
                    exc.parameter,
                    f"{str(exc).partition(': ')[2]} (backend='auto' chose every installed framework "
                    f"because none is imported yet: {', '.join(names)}; name the one you use)",
                ) from None
    if spread:
        # A framework that cannot take a setting is skipped, as long as another can.
        for step in plans:
            if step.unsupported and any(
                o.setting == step.setting and not o.unsupported for o in plans if o is not step
            ):
                step.status, step.note, step.unsupported = "skipped", f"unsupported: {step.unsupported}", None
    return plans


def _explain_defaults(plans: list[Step], defaulted: dict[str, list[str]]) -> None:
    """Say why growth changed where unimem chose it; never raise for a default."""
    for step in plans:
        if step.backend not in defaulted or step.setting != "growth":
            continue
        if step.too_late:
            step.status, step.too_late = "skipped", None
            step.note = (
                f"safe default not applied: {step.backend} already preallocated before unimem was "
                f"configured; call unimem.configure before {step.backend}'s first op"
            )
        else:
            others = ", ".join(n for n in defaulted[step.backend] if n != step.backend)
            step.note = (
                f"safe default: {step.backend} shares this process with {others}, so it allocates on "
                "demand instead of preallocating; pass growth=False to keep preallocation"
            )
            # logging is imported here, not at the top: it was a fifth of `import unimem`
            # (55 -> 44 ms on the 2-core CPU machine).
            import logging

            logging.getLogger("unimem").info("%s: %s", step.backend, step.note)


def _refuse(plans: list[Step], strict: bool) -> None:
    """With ``strict``, a step that can no longer (or never) take effect stops everything."""
    refused = [s for s in plans if s.unsupported or s.too_late]
    if not refused or not strict:
        return
    first = refused[0]
    more = ""
    if len(refused) > 1:
        more = f" (and {len(refused) - 1} more: {', '.join(f'{s.backend}.{s.setting}' for s in refused[1:])})"
    if first.unsupported:
        raise UnsupportedFeature(first.backend, first.setting, first.unsupported + more)
    raise TooLateError(first.backend, first.setting, f"{first.too_late}{more}")


def _apply(plans: list[Step], *, spread: bool) -> list[Action]:
    """Run the steps; what is not applied is warned about and recorded as skipped.

    With ``spread`` (the settings went to every installed framework, none imported yet), what
    is said of a framework waits until the script imports it: a torch script hears nothing of
    JAX's allocator.
    """
    actions: list[Action] = []
    later: dict[str, list[tuple[str, str]]] = {}

    def warn(step: Step, message: str) -> None:
        if spread and registry.is_framework(step.backend):
            later.setdefault(step.backend, []).append((step.setting, message))
        else:
            warnings.warn(message, UnimemWarning, stacklevel=4)

    for step in plans:
        status, note = step.status, step.note
        if step.unsupported or step.too_late:
            reason = step.unsupported or step.too_late
            warn(step, f"{step.backend}: {step.setting} not applied: {reason}")
            status, note = "skipped", f"{'unsupported' if step.unsupported else 'too late'}: {reason}"
        elif step.status == "skipped":
            warn(step, f"{step.backend}: {step.setting} not applied: {step.note}")
        elif step.run is not None and step.status != "unchanged":
            step.run()  # a "no-device" step too: it is made, though nothing here takes it
        if status == "no-device":
            warn(step, f"{step.backend}: {step.setting} has nothing to act on: {step.note}")
        actions.append(Action(step.backend, step.setting, step.value, step.method, step.target, status, note))
    for name, said in later.items():
        _warn_at_import(name, said)
    return actions


def _warn_at_import(name: str, said: list[tuple[str, str]]) -> None:
    """Warn ``said`` (``(setting, message)``) once the script imports framework ``name``.

    Not when a framework that imports ``name`` itself is loaded (TensorFlow imports JAX): the
    script does not use it; and not for a setting a later ``configure()`` call has made since.
    A later call warning of the same framework replaces these warnings.
    """
    from unimem.import_hooks import when_imported  # the import hook the cap hooks use; imports no framework

    entry = registry.BACKENDS.get(name)
    brought_by = entry.imported_by if entry is not None else ()
    before = in_force.settings_in_force(name).given()

    def show(_module: object) -> None:
        if any(module in sys.modules for module in brought_by):
            return
        now = in_force.settings_in_force(name).given()
        for setting, message in said:
            related = ("fraction", "limit") if setting in ("fraction", "limit") else (setting,)
            if any(now.get(key) != before.get(key) for key in related):
                continue  # a later call made it
            warnings.warn(message, UnimemWarning, stacklevel=2)

    when_imported(registry.get_backend(name).module, show, key=f"unimem.{name}.not-applied")


def _safe_growth_default(
    backend: object,
    names: tuple[str, ...],
    settings: dict[str, Settings],
    growth: object,
    fraction: object,
    limit: object,
) -> dict[str, list[str]]:
    """Turn growth on for preallocating frameworks when several frameworks share the process.

    A framework that preallocates (most of the device at its first op) starves the
    others. Applies only where the user said nothing about growth, and where the
    backend takes it (``Backend.takes_safe_growth``: no preallocation variable set, and
    no cap the framework cannot combine with growth). Returns ``{backend: frameworks
    sharing}`` for those changed.
    """
    if growth is not None:
        return {}
    auto = isinstance(backend, str) and backend.strip().lower() == "auto"
    split = isinstance(fraction, dict) or isinstance(limit, dict)
    # In use = named by the user (now or in an earlier configure) or device runtime
    # started. Imported alone does not count: one framework may import another and never run it.
    sharing = registry.configured()
    sharing += [n for n in registry.started_frameworks() if n not in sharing]
    if not auto or split:
        sharing += [n for n in names if registry.is_framework(n) and n not in sharing]
    if len(sharing) < 2:
        return {}
    changed: dict[str, list[str]] = {}
    for name in names:
        if name not in sharing or not registry.get_backend(name).takes_safe_growth(settings[name]):
            continue
        if in_force.settings_in_force(name).growth is not None:
            continue  # growth given in an earlier call stays: a default never replaces it
        settings[name] = dataclasses.replace(settings[name], growth=True)
        changed[name] = sharing
    return changed


def configure_from_env() -> Applied:
    """Run ``configure`` with the settings in ``UNIMEM_*`` environment variables (``strict=True``).

    The variables and how to write them: [From the environment](../guides/configure.md#from-the-environment).

    Returns:
        What was done, as ``configure`` returns it.

    Raises:
        ConfigError: A variable cannot be read or holds an invalid setting; the error names the variable.
        BackendUnavailable: As from ``configure``: a named framework is not installed.
        UnsupportedFeature: As from ``configure``: a backend can never make a setting.
        TooLateError: As from ``configure``: a setting's moment has passed.

    Example:
        ```python
        # UNIMEM_BACKEND=jax UNIMEM_FRACTION=0.3 python train.py
        import unimem

        unimem.configure_from_env()
        ```
    """
    kwargs = parse_env()
    try:
        return configure(**kwargs)
    except ConfigError as exc:
        var = ENV_VARS.get(exc.parameter, exc.parameter)
        message = str(exc).partition(": ")[2]
        raise ConfigError(var, message) from None


def stats(backend: str | None = None, device: int = 0, *, nvml: bool = True) -> MemoryStats:
    """Memory of ``device`` as ``backend`` and NVML see it; unknown figures are None, never 0.

    Starts no framework's device runtime. The fields, and what ``nvml=False`` leaves out:
    [The figures now](../guides/observing-memory.md#the-figures-now-stats); which backend ``None`` reads:
    [the ``backend=None`` rule](../explanation/backend-rule.md).

    Args:
        backend: A backend name or alias (``"torch"``, ``"tf"``, ``"jax"``, ``"cupy"``, ``"nvml"``), or None (default).
        device: The device index, as the backend counts devices (default 0).
        nvml: True (default) adds NVML's figures and ``host_rss``; False reads the framework's counters only.

    Returns:
        The snapshot: byte counts as ``int``, or None where unknown.

    Raises:
        ConfigError: ``device``, ``nvml`` or ``backend`` is invalid, or ``backend=None`` finds two candidates.
        BackendUnavailable: The named framework is not installed, or ``"nvml"`` was named and cannot be loaded.

    Example:
        ```python
        snapshot = unimem.stats("torch")
        print(snapshot.allocated, snapshot.peak_allocated, snapshot.process_used)
        in_loop = unimem.stats("torch", nvml=False)  # framework counters only
        ```
    """
    device = check_device(device)
    if not isinstance(nvml, bool):
        raise ConfigError("nvml", f"expected True or False, got {nvml!r}")
    return read_snapshot(registry.resolve(backend, "query"), device, nvml=nvml)


def _query_backend(backend: str | None) -> str:
    """The backend a pool action (reset_peak, clear_cache) acts on: the query rule, and the
    framework-free view (which has no pool, so it refuses with the reason)."""
    name = registry.resolve(backend, "query")
    return registry.FRAMEWORK_FREE if name is None else name


def reset_peak(backend: str | None = None, device: int = 0) -> None:
    """Start the peak figures afresh (see ``capabilities(b)['reset_peak']`` for limits).

    Afterwards ``stats().peak_allocated`` and ``peak_reserved`` count from now. Where
    the framework cannot reset its peak, unimem emulates it (JAX: the peak is known
    only once it passes the old one, and reads None until then).

    Args:
        backend: A backend name or alias, or None (default) for the query rule of
            ``stats()``.
        device: The device index (default 0).

    Raises:
        ConfigError: ``device`` is not an index of 0 or more, ``backend`` is unknown, or,
            with ``backend=None``, two frameworks are candidates: pass ``backend=``.
        BackendUnavailable: The named backend's framework is not installed.
        UnsupportedFeature: The backend keeps no peak: NVML, which ``backend=None``
            means while no framework is configured or started; name a framework backend.
    """
    device = check_device(device)
    registry.get_backend(_query_backend(backend)).reset_peak(device)


def clear_cache(backend: str | None = None, device: int = 0) -> int:
    """Give the framework's cached, unused memory back to the device.

    Returns the bytes measured going back (0 if none, or if the framework cannot:
    it then warns with ``UnimemWarning`` saying what to do instead).

    Args:
        backend: A backend name or alias, or None (default) for the query rule of
            ``stats()``.
        device: The device index (default 0).

    Returns:
        The bytes measured going back to the device, 0 or more (0 when nothing was
        cached, on the CPU, or where the framework's pool never shrinks).

    Raises:
        ConfigError: ``device`` is not an index of 0 or more, ``backend`` is unknown, or,
            with ``backend=None``, two frameworks are candidates: pass ``backend=``.
        BackendUnavailable: The named backend's framework is not installed.
        UnsupportedFeature: The backend has no pool: NVML, which ``backend=None`` means
            while no framework is configured or started; name a framework backend.

    Warns:
        UnimemWarning: The framework cannot give its pool back (TensorFlow); the
            message says what to do instead.

    Example:
        ```python
        del activations
        freed = unimem.clear_cache("torch")
        print(unimem.format_bytes(freed))
        ```
    """
    device = check_device(device)
    return registry.get_backend(_query_backend(backend)).clear_cache(device)


def capabilities(backend: str) -> dict[str, Support]:
    """What ``backend`` supports, feature by feature. Imports no framework.

    The table is data in the backend's adapter, the same that ``compat_matrix.md`` is
    generated from; it can be read whether or not the framework is installed.

    Args:
        backend: A backend name or alias (``"torch"``, ``"tf"``, ``"jax"``, ``"cupy"``,
            ``"nvml"``, a plug-in's name).

    Returns:
        ``{feature: Support}`` for every feature (``"fraction"``, ``"growth"``,
        ``"allocator.async"``, ``"stats.peak"``, ``"reset_peak"``, ``"clear_cache"``,
        ``"precision.bf16"``, ``"oom"``, ``"batch_size"``, ...), unsupported ones
        included, each with its level, API, when it must be asked for, and a note.

    Raises:
        ConfigError: ``backend`` is not a known backend name.

    Example:
        ```python
        for feature, support in unimem.capabilities("tensorflow").items():
            print(feature, support.level, support.when, support.api)
        ```
    """
    return registry.capability_table(backend)


def summary(backend: str | None = None, device: int = 0) -> str:
    """``stats()`` as a readable table, with fragmentation where the backend can tell
    (torch's comes from its memory snapshot, too slow for ``stats()`` itself).

    Args:
        backend: A backend name or alias, or None (default) for the query rule of
            ``stats()``.
        device: The device index (default 0).

    Returns:
        A title line naming the backend, the device and the framework's phase, then one
        line per figure; unknown figures read ``n/a``.

    Raises:
        ConfigError: As from ``stats()``: a bad device index, an unknown backend, or two
            candidates for ``backend=None``.
        BackendUnavailable: As from ``stats()``: the named framework (or, named
            explicitly, NVML) is not available.

    Example:
        ```python
        print(unimem.summary("torch"))
        ```
    """
    from unimem.pool_fragmentation import with_fragmentation

    snapshot = with_fragmentation(stats(backend, device))
    backend_obj = registry.get_backend(snapshot.backend)
    title = f"unimem: {snapshot.backend} on device {device} ({backend_obj.phase().describe()})"
    rows = snapshot.rows()
    width = max(len(label) for label, _ in rows)
    lines = [title, "-" * len(title)]
    lines += [f"{label.ljust(width)}  {value}" for label, value in rows]
    return "\n".join(lines)
