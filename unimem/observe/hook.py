"""``MemoryHook``: memory per step for a hand-written torch or JAX training loop.

Call ``hook.step()`` once per training step, in the training thread: it reads the
allocator right there (no background thread, nothing fighting for the GIL) and
records, per step, the memory at the step's end and the peak during it (exact on
torch; on JAX a lower bound unless the process peak rose, see ``track``).

    hook = unimem.MemoryHook()
    for batch in data:
        train_step(batch)
        hook.step()
    hook.plot("memory.png")
"""

from __future__ import annotations

import time

from unimem import host_memory
from unimem.config import check_device
from unimem.errors import ConfigError
from unimem.observe.recording import Recorder, Recording
from unimem.observe.samples import SOURCE_STEP, BoundedSeries, Mark, Sample
from unimem.observe.track import Tracked

__all__ = ["MemoryHook"]


class MemoryHook(Recorder):
    """Per-step memory, recorded when ``step()`` is called.

    For a hand-written training loop: call ``hook.step()`` once per training step, in the
    training thread. It reads the allocator right there (no background thread, nothing
    fighting for the GIL) and records, per step, the memory at the step's end and the
    peak during it (exact on torch; on JAX a lower bound unless the process peak rose,
    see ``track``), and the same for host memory (``host_rss``, ``host_peak``: known
    without a GPU too).

    Each step's figures are also in ``last`` (a ``Tracked``: ``peak``, ``delta``,
    ``host_peak``, ``host_delta``, ``duration``, ``start``/``end`` stats). The first ``step()`` opens the first
    interval; it records nothing.

    Args:
        backend: A backend name or alias, or None (default) for the query rule of
            ``stats()``, resolved at the first ``step()``.
        device: The device index (default 0).
        every: Record one sample per ``every`` steps (default 1; the peak covers all of
            them); the steps in between cost one integer increment.
        max_samples: Bound on memory (at least 100, default 20000); past it the series
            is decimated, peaks kept.

    Attributes:
        every (int): Steps per recorded sample.
        steps (int): ``step()`` calls so far.
        last (Tracked | None): The figures of the last recorded step; None before one.

    Raises:
        ConfigError: ``every`` is not a positive int, ``max_samples`` is under 100,
            ``backend`` is unknown, or ``device`` is not an index of 0 or more.

    Example:
        ```python
        hook = unimem.MemoryHook()
        for batch in data:
            train_step(batch)
            hook.step()
        hook.plot("memory.png")
        ```
    """

    def __init__(
        self, backend: str | None = None, device: int = 0, *, every: int = 1, max_samples: int = 20_000
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError("every", f"expected a positive int, got {every!r}")
        if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 100:
            raise ConfigError("max_samples", f"expected an int of at least 100, got {max_samples!r}")
        self._tracked = Tracked(backend, check_device(device))
        self.every = every
        self.steps = 0
        self.last: Tracked | None = None
        self._series = BoundedSeries(max_samples)
        self._marks: list[Mark] = []
        self._open = False
        self._started: float | None = None

    def host_rss(self) -> int | None:
        """This process's resident host memory now, in bytes (None where it cannot be read)."""
        return host_memory.rss()

    def step(self) -> Tracked | None:
        """End of a training step. Returns the figures when this step recorded them.

        Returns:
            The step's figures (peak, delta, duration, end stats) when this step recorded
            a sample; None for the first call (it opens the first interval) and for the
            steps between samples.

        Raises:
            ConfigError: At the first call, with ``backend=None``, two frameworks are
                candidates: pass ``backend=``.
            BackendUnavailable: At the first call, the named backend's framework is not
                installed.
        """
        self.steps += 1
        if not self._open:
            self._started = time.time()
            self._tracked.__enter__()  # resolves the backend now: the framework is in use by the first step
            self._open = True
            return None
        if (self.steps - 1) % self.every:  # steps completed since the first call
            return None
        tracked = self._tracked.roll()
        end = tracked.end
        assert end is not None
        self._series.add(
            Sample(
                time=end.timestamp,
                source=SOURCE_STEP,
                allocated=end.allocated,
                reserved=end.reserved,
                peak=tracked.peak,
                peak_exact=tracked.peak_exact,
                process_used=end.process_used,
                device_used=None
                if end.device_total is None or end.device_free is None
                else end.device_total - end.device_free,
                device_total=end.device_total,
                host_rss=end.host_rss,
                host_peak=tracked.host_peak,
                step=self.steps,
            )
        )
        self.last = tracked
        return tracked

    def mark(self, label: str) -> None:
        """An event on the timeline (an epoch, an evaluation).

        Carries the figures of the last recorded step (None before one).

        Args:
            label: The event's name, drawn on the plot.

        Raises:
            ConfigError: ``label`` is not a string.
        """
        if not isinstance(label, str):
            raise ConfigError("label", f"expected a string, got {label!r}")
        end = self.last.end if self.last is not None else None
        self._marks.append(Mark(time.time(), label, end.allocated if end else None, end.reserved if end else None))

    def close(self) -> None:
        """Close the open interval (it is not recorded: it is not a whole step)."""
        if self._open:
            self._tracked.close()
            self._open = False

    @property
    def samples(self) -> list[Sample]:
        """The recorded steps' samples (source ``"step"``), in order."""
        return self._series.items()

    @property
    def recording(self) -> Recording:
        """The steps so far as a ``Recording``: samples, marks, and meta (backend, device,
        ``every``, cap, decimation, notes)."""
        meta = {
            "backend": self._tracked.backend,
            "device": self._tracked.device,
            "every": self.every,
            "started": self._started,
            "limit": self.last.end.limit if self.last is not None and self.last.end is not None else None,
            "decimation": {"step_stride": self._series.stride},
            "notes": [self.last.note] if self.last is not None and self.last.note else [],
        }
        return Recording(self.samples, list(self._marks), meta)
