"""The batch search's settings: ``find_batch_size``'s arguments, each checked before any trial
runs (a bad one is a ``ConfigError`` naming it), kept in one frozen record."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from unimem import registry
from unimem.errors import ConfigError
from unimem.estimate.result import MemoryEstimate
from unimem.sizes import parse_size

if TYPE_CHECKING:
    from unimem.search.ranks import Ranks

__all__ = ["DEFAULT_TIMEOUT", "Settings", "aimed", "check", "measured"]

# Seconds each rank waits for the others at each agreement, from its own arrival: a trial can
# take minutes on a slow rank (a first compilation), and a rank that never comes must not hang the job.
DEFAULT_TIMEOUT = 600.0


@dataclass(frozen=True)
class Settings:
    start: int
    backend: str | None
    device: int
    max_size: int | None
    margin: float
    measure: Callable[[], int | None] | None
    limit: int | None
    baseline: int | None
    max_trials: int
    return_trials: bool
    confirm: bool = True
    lower: Callable[[int], Any] | MemoryEstimate | None = None
    progress: bool | None = None
    model: Any = None
    target_global_batch: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    collective: bool | None = None
    time_limit: float | None = None

    def fingerprint(self) -> dict[str, Any]:
        """What every rank of a collective search must pass alike (the device may differ)."""
        return {
            "start": self.start,
            "backend": self.backend,
            "max_size": self.max_size,
            "margin": self.margin,
            "measure": self.measure is not None,
            "limit": self.limit,
            "baseline": self.baseline,
            "max_trials": self.max_trials,
            "confirm": self.confirm,
            "lower": self.lower is not None,
            "model": self.model is not None,
            "target_global_batch": self.target_global_batch,
            "time_limit": self.time_limit,
        }


def measured(value: object) -> int | None:
    """What ``measure()`` returned, as bytes (None: unknown). Anything but None or a finite number
    of 0 or more is a ``ConfigError`` naming ``measure``: a NaN or a string would otherwise place
    the next size from garbage."""
    if value is None:
        return None
    if not isinstance(value, bool) and isinstance(value, numbers.Real):
        number = float(value)
        if math.isfinite(number) and number >= 0:
            return int(number) if isinstance(value, float) else int(math.trunc(value))
    raise ConfigError(
        "measure",
        f"measure() must return the last trial's peak bytes (a finite number of 0 or more) or None, got {value!r}",
    )


def _check_ranks(target_global_batch: object, timeout: object, collective: object) -> float:
    """The arguments of a search over ranks; returns ``timeout`` as a float."""
    if target_global_batch is not None and (
        isinstance(target_global_batch, bool) or not isinstance(target_global_batch, int) or target_global_batch < 1
    ):
        raise ConfigError(
            "target_global_batch",
            f"expected None or the samples per optimizer step over all ranks (an int of 1 or more), "
            f"got {target_global_batch!r}",
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise ConfigError("timeout", f"expected the seconds to wait for the other ranks (above 0), got {timeout!r}")
    if collective is not None and not isinstance(collective, bool):
        raise ConfigError(
            "collective", f"expected None (agree when ranks run), True (must agree) or False, got {collective!r}"
        )
    return float(timeout)


def _check_time_limit(time_limit: object) -> float | None:
    """``time_limit`` as seconds (None: no bound)."""
    if time_limit is None:
        return None
    if (
        isinstance(time_limit, bool)
        or not isinstance(time_limit, (int, float))
        or not math.isfinite(time_limit)
        or time_limit <= 0
    ):
        raise ConfigError(
            "time_limit", f"expected None or the seconds the whole search may take (above 0), got {time_limit!r}"
        )
    return float(time_limit)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_start(start: object) -> int:
    if not _whole(start) or start < 1:  # type: ignore[operator]
        raise ConfigError("start", f"expected the first batch size to try (an int of 1 or more), got {start!r}")
    assert isinstance(start, int)
    return start


def _check_device(device: object, max_size: object, start: int) -> tuple[int, int | None]:
    """``device`` and ``max_size`` (at least ``start``)."""
    if not _whole(device) or device < 0:  # type: ignore[operator]
        raise ConfigError("device", f"expected a device index (0 or more), got {device!r}")
    if max_size is not None and (not _whole(max_size) or max_size < start):  # type: ignore[operator]
        raise ConfigError("max_size", f"expected None or an int of at least start={start}, got {max_size!r}")
    assert isinstance(device, int) and (max_size is None or isinstance(max_size, int))
    return device, max_size


def _check_margin(margin: object) -> float:
    if (
        isinstance(margin, bool)
        or not isinstance(margin, (int, float))
        or not math.isfinite(margin)
        or not 0 <= margin < 1
    ):
        raise ConfigError("margin", f"expected a share in [0, 1), such as 0.05, got {margin!r}")
    return float(margin)


def _optional_callable(value: object, parameter: str, expected: str) -> Callable[..., Any] | None:
    if value is not None and not callable(value):
        raise ConfigError(parameter, f"expected None or {expected}, got {value!r}")
    return value


def _check_lower(lower: object) -> Callable[[int], Any] | MemoryEstimate | None:
    """``lower``: None, an estimate, or a callable returning the lowered step or its peak bytes."""
    if lower is not None and not callable(lower) and not isinstance(lower, MemoryEstimate):
        raise ConfigError(
            "lower",
            "expected None, an estimate (unimem.estimate_memory's result) or a callable lower(batch_size) "
            f"returning the lowered step or its peak bytes, got {lower!r}",
        )
    return cast("Callable[[int], Any] | MemoryEstimate | None", lower)


def _check_bytes(limit: object, baseline: object) -> tuple[int | None, int | None]:
    """``limit`` and ``baseline`` as bytes (``"8GiB"`` or an int; None: not given)."""
    size = None if limit is None else parse_size(limit, "limit")
    base: int | None = None
    if baseline is not None:
        base = 0 if baseline == 0 and not isinstance(baseline, bool) else parse_size(baseline, "baseline")
    return size, base


def _check_calls(max_trials: object, return_trials: object, confirm: object) -> int:
    """``max_trials``, and the switches that say what the search returns and re-runs."""
    if not _whole(max_trials) or max_trials < 1:  # type: ignore[operator]
        raise ConfigError("max_trials", f"expected an int of 1 or more, got {max_trials!r}")
    if not isinstance(return_trials, bool):
        raise ConfigError("return_trials", f"expected True or False, got {return_trials!r}")
    if not isinstance(confirm, bool):
        raise ConfigError("confirm", f"expected True or False, got {confirm!r}")
    assert isinstance(max_trials, int)
    return max_trials


def check(
    start: object,
    backend: object,
    device: object,
    max_size: object,
    margin: object,
    measure: object,
    limit: object,
    baseline: object,
    max_trials: object,
    return_trials: object,
    confirm: object = True,
    lower: object = None,
    progress: object = None,
    model: object = None,
    target_global_batch: object = None,
    timeout: object = DEFAULT_TIMEOUT,
    collective: object = None,
    time_limit: object = None,
) -> Settings:
    """``find_batch_size``'s arguments, each checked before any trial in the order it names them: a
    bad one is a ``ConfigError`` naming it."""
    first = _check_start(start)
    name = registry.canonical_name(backend) if backend is not None else None
    index, most = _check_device(device, max_size, first)
    share = _check_margin(margin)
    reads = _optional_callable(measure, "measure", "a callable returning the last trial's peak bytes")
    size, base = _check_bytes(limit, baseline)
    calls = _check_calls(max_trials, return_trials, confirm)
    lowers = _check_lower(lower)
    if progress is not None and not isinstance(progress, bool):
        raise ConfigError("progress", f"expected None (on a terminal), True or False, got {progress!r}")
    wait = _check_ranks(target_global_batch, timeout, collective)
    bound = _check_time_limit(time_limit)
    assert isinstance(return_trials, bool) and isinstance(confirm, bool)
    assert target_global_batch is None or isinstance(target_global_batch, int)
    assert collective is None or isinstance(collective, bool)
    return Settings(
        first,
        name,
        index,
        most,
        share,
        reads,
        size,
        base,
        calls,
        return_trials,
        confirm,
        lowers,
        progress,
        model,
        target_global_batch,
        wait,
        collective,
        bound,
    )


def aimed(settings: Settings, over: Ranks | None) -> Settings:
    """With ``target_global_batch``: no size above the target's share per rank is tried (no
    micro-batch of the plan would be larger). Checked against the world size before any trial."""
    target = settings.target_global_batch
    if target is None:
        return settings
    world = 1 if over is None else over.world_size
    if target < world:
        raise ConfigError(
            "target_global_batch",
            f"{world} ranks cannot share a global batch of {target}: pass at least the world size",
        )
    share = max(settings.start, math.ceil(target / world))
    return replace(settings, max_size=share if settings.max_size is None else min(settings.max_size, share))
