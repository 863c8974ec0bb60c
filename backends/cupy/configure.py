"""How ``configure`` reaches CuPy: its pool's limit, preallocation, the allocator, visible devices.

- The cap is the limit of CuPy's ``MemoryPool``. Before the pool has made its per-device
  pools it is CuPy's own variable ``CUPY_GPU_MEMORY_LIMIT`` ("25%" or bytes), which each
  device's pool reads when CuPy makes it (at the first allocation); after, ``set_limit``
  on every device's pool, and the variable for pools made later.
- The allocator is ``cupy.cuda.set_allocator``, a plain Python call that starts nothing.
  ``MemoryAsyncPool()`` starts CUDA on every device when it is made, and CuPy has no
  hook at its CUDA start, so before CuPy's first allocation unimem installs an allocator
  of its own (``FirstAllocation``) that makes and installs the configured one there.
- Preallocation (``growth=False``) is emulated: the allowance is taken from the pool and
  freed back into it, at once when the pool has started, else at the first allocation.

cupy is never imported here: steps act on the module ``sys.modules`` holds, or at its import.
"""

from __future__ import annotations

import os
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any

from unimem.backends import nvml_gate
from unimem.backends.steps import (
    STATUS_APPLIED,
    STATUS_PENDING,
    STATUS_UNCHANGED,
    Step,
    devices_step,
    env_step,
    written_vars,
)

from unimem.config import Settings
from unimem.errors import ConfigError
from unimem.import_hooks import when_imported
from unimem.sizes import exact_bytes
from unimem.support import Phase, When

from ._pools import ASYNC, POOL, RAW, driver_initialised

__all__ = [
    "CAP_VAR",
    "FirstAllocation",
    "Pending",
    "State",
    "check",
    "check_environment",
    "make_allocator",
    "plan",
    "preallocate",
]

CAP_VAR = "CUPY_GPU_MEMORY_LIMIT"
# Left free by a preallocation: cuBLAS/cuFFT workspaces and kernels loaded later take
# device memory outside the pool.
HEADROOM = 1 << 30
_ALIGN = 512  # CuPy rounds every request up to 512 bytes: a preallocation rounds down to stay under the cap
_FIRST_KEY = "unimem.cupy.first_allocation"
_KINDS = {"default": POOL, "async": ASYNC, "uncached": RAW}
_TARGETS = {
    "default": "cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)",
    "async": "cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)",
    "uncached": "cupy.cuda.set_allocator(None)",
}
_FIX_DEVICES = "set devices before CuPy's first CUDA call (cupy.cuda.is_available() is one), or restart the process"
_NO_POOL = "CuPy's cap and preallocation act on its MemoryPool, and allocator={allocator!r} has none"


@dataclass
class State:
    """What a plan reads of CuPy once: ``cupy`` is None until it is imported."""

    cupy: types.ModuleType | None
    phase: Phase
    kind: str = POOL  # the allocator in use (CuPy's default pool until imported)
    pool: Any = None  # the MemoryPool in use, for POOL
    pools: dict[int, Any] = field(default_factory=dict)  # its per-device pools made so far


class FirstAllocation:
    """CuPy's allocator until its first allocation, which makes and installs the configured
    allocator and preallocates if asked; later allocations go straight to that one."""

    def __init__(self) -> None:
        self.allocator: str | None = None  # "default", "async", "uncached"; None: keep the one in use
        self.preallocate = False
        self.previous: Any = None  # the allocator in use when this was installed
        self.done = False
        self._lock = threading.Lock()

    @property
    def unimem_pending(self) -> tuple[str, Any]:
        """What ``pools.allocator_in_use`` reports while this stands in."""
        cupy = sys.modules["cupy"]
        if self.allocator is not None:
            kind = _KINDS[self.allocator]
            return kind, cupy.get_default_memory_pool() if kind == POOL else None
        owner = getattr(self.previous, "__self__", None)
        return POOL, owner if isinstance(owner, cupy.cuda.MemoryPool) else cupy.get_default_memory_pool()

    def __call__(self, size: int) -> Any:
        cupy = sys.modules["cupy"]
        with self._lock:
            if not self.done:
                final = self._make(cupy)  # may raise: then nothing changed, and the next call tries again
                cupy.cuda.set_allocator(final)
                self.done = True
                owner = getattr(final, "__self__", None)
                if self.preallocate and isinstance(owner, cupy.cuda.MemoryPool):
                    preallocate(cupy, owner, cupy.cuda.runtime.getDevice())
        return cupy.cuda.alloc(size)

    def _make(self, cupy: types.ModuleType) -> Any:
        if self.allocator is None and self.previous is not None:
            return self.previous
        return make_allocator(cupy, self.allocator or "default")


def make_allocator(cupy: types.ModuleType, allocator: str) -> Any:
    """What ``cupy.cuda.set_allocator`` takes for ``allocator`` (None: plain cudaMalloc)."""
    if allocator == "async":
        return cupy.cuda.MemoryAsyncPool().malloc  # starts CUDA on every device
    if allocator == "uncached":
        return None
    return cupy.get_default_memory_pool().malloc


class Pending:
    """The adapter's ``FirstAllocation``, installed in CuPy now or at its import."""

    def __init__(self) -> None:
        self.first: FirstAllocation | None = None
        self._lock = threading.Lock()

    def waiting(self) -> FirstAllocation | None:
        first = self.first
        return first if first is not None and not first.done else None

    def update(self, allocator: str | None = None, preallocate: bool | None = None) -> None:
        with self._lock:
            first = self.waiting()
            if first is None:
                first = self.first = FirstAllocation()
            if allocator is not None:
                first.allocator = allocator
            if preallocate is not None:
                first.preallocate = preallocate

        def install(cupy: types.ModuleType) -> None:
            current = cupy.cuda.get_allocator()
            if current is not first:
                first.previous = current
                cupy.cuda.set_allocator(first)

        when_imported("cupy", install, key=_FIRST_KEY)


def preallocate(cupy: types.ModuleType, pool: Any, device: int) -> None:
    """Take the allowance from ``pool`` on ``device`` and free it back: the pool keeps it."""
    with cupy.cuda.Device(device):
        limit, held = int(pool.get_limit()), int(pool.total_bytes())
        free = int(cupy.cuda.runtime.memGetInfo()[0])
        size = min(limit - held if limit else free, free - HEADROOM)
        size -= size % _ALIGN
        if size <= 0:
            return
        block = pool.malloc(size)
        del block  # back to the pool, not to the device: that is the preallocation


def check(settings: Settings) -> None:
    """A cap or a preallocation needs CuPy's MemoryPool, which 'async' and 'uncached' replace."""
    if settings.allocator not in ("async", "uncached"):
        return
    if settings.fraction is not None or settings.limit is not None:
        setting = "fraction" if settings.fraction is not None else "limit"
        raise ConfigError(
            setting,
            _NO_POOL.format(allocator=settings.allocator)
            + " (MemoryAsyncPool takes a limit as its release threshold, not a cap); "
            "use allocator='default' with a cap",
        )
    if settings.growth is False:
        raise ConfigError("growth", _NO_POOL.format(allocator=settings.allocator) + "; use allocator='default'")


def plan(settings: Settings, state: State, pending: Pending) -> list[Step]:
    steps: list[Step] = []
    if settings.devices is not None:
        fixed = Phase.INITIALIZED if driver_initialised() else state.phase
        steps.append(devices_step("cupy", settings.devices, phase=fixed, when=When.BEFORE_INIT, fix=_FIX_DEVICES))
    if settings.allocator is not None:
        steps.append(_allocator(settings.allocator, settings.growth is True, state, pending))
    if settings.fraction is not None or settings.limit is not None:
        steps.extend(_cap(settings, state))
    if settings.growth is not None:
        steps.append(_growth(settings.growth, settings.allocator, state, pending))
    check_environment(written_vars(steps))
    return steps


def check_environment(written: set[str]) -> None:
    """Refuse ``CUPY_GPU_MEMORY_LIMIT``, when this plan leaves it as it is, where CuPy would refuse
    it when it makes a device's pool (at that device's first allocation): ``"N%"`` with N in
    [0, 100], or whole bytes. Changes nothing.

    Raises:
        ConfigError: Naming the variable.
    """
    raw = os.environ.get(CAP_VAR)
    if CAP_VAR in written or raw is None:
        return
    text = raw.strip()
    try:
        good = 0.0 <= float(text[:-1]) <= 100.0 if text.endswith("%") else int(text) >= 0
    except ValueError:
        good = False
    if not good:
        raise ConfigError(
            CAP_VAR,
            f"CuPy refuses {raw!r} when it makes a device's pool; write a share such as '25%' or whole bytes",
        )


def _allocator(allocator: str, cancels_preallocation: bool, state: State, pending: Pending) -> Step:
    if allocator == "expandable":
        return Step(
            "cupy",
            "allocator",
            allocator,
            "none",
            "cupy.cuda.set_allocator",
            unsupported="CuPy has no expandable-segments allocator; use 'async' (cudaMallocAsync)",
        )
    target = _TARGETS[allocator]
    waiting = pending.waiting()
    if waiting is not None and waiting.preallocate and _KINDS[allocator] != POOL and not cancels_preallocation:
        raise ConfigError(
            "allocator",
            _NO_POOL.format(allocator=allocator) + ", and a preallocation is pending: configure growth=True",
        )
    cupy = state.cupy
    if waiting is not None or cupy is None:
        current = waiting.allocator if waiting is not None else None
        status = STATUS_UNCHANGED if current == allocator else STATUS_PENDING
        return Step(
            "cupy",
            "allocator",
            allocator,
            "hook",
            f"{target} at CuPy's first allocation",
            run=lambda: pending.update(allocator=allocator),
            status=status,
        )
    kind, owner = state.kind, state.pool
    same = kind == _KINDS[allocator] and (kind != POOL or owner is cupy.get_default_memory_pool())
    if same:
        return Step("cupy", "allocator", allocator, "api", target, status=STATUS_UNCHANGED)
    if allocator == "async" and state.phase is not Phase.INITIALIZED:
        # MemoryAsyncPool() would start CUDA on every device now: make it at the first allocation.
        return Step(
            "cupy",
            "allocator",
            allocator,
            "hook",
            f"{target} at CuPy's first allocation",
            run=lambda: pending.update(allocator=allocator),
            status=STATUS_PENDING,
        )

    def run() -> None:
        cupy.cuda.set_allocator(make_allocator(cupy, allocator))

    return Step("cupy", "allocator", allocator, "api", target, run=run, note="for allocations from now on")


def _cap(settings: Settings, state: State) -> list[Step]:
    setting = "fraction" if settings.fraction is not None else "limit"
    value = settings.fraction if settings.fraction is not None else settings.limit
    text = f"{settings.fraction * 100:.6g}%" if settings.fraction is not None else str(settings.limit)
    fix = "restart the process"  # the variable always counts for pools made later: never too late
    env = env_step("cupy", setting, value, CAP_VAR, text, phase=Phase.IMPORTED, when=When.BEFORE_INIT, fix=fix)
    if not state.pools:
        if settings.limit is not None:
            # Checked against the device now when NVML can tell, so a bad limit fails here.
            _check_limit(settings.limit, nvml_gate.device_figures(0)[0])
        env.note = "; ".join(
            n for n in ("read by each device's pool when CuPy makes it, at its first allocation", env.note) if n
        )
        return [env]
    env.note = "; ".join(n for n in ("for pools CuPy makes later", env.note) if n)
    cupy = state.cupy
    assert cupy is not None
    sizes = {}
    for device in state.pools:
        total = int(cupy.cuda.runtime.getDeviceProperties(device)["totalGlobalMem"])  # starts no context
        if settings.limit is not None:
            sizes[device] = _check_limit(settings.limit, total)
        else:
            assert settings.fraction is not None
            sizes[device] = int(settings.fraction * total)  # what set_limit(fraction=) computes
    target = "; ".join(f"device {d}: MemoryPool.set_limit(size={size})" for d, size in sizes.items())
    if all(int(pool.get_limit()) == sizes[d] for d, pool in state.pools.items()):
        return [env, Step("cupy", setting, value, "api", target, status=STATUS_UNCHANGED)]
    pools = dict(state.pools)

    def run() -> None:
        for device, pool in pools.items():
            pool.set_limit(size=sizes[device])  # each device's own pool: no device switch, no new context

    return [env, Step("cupy", setting, value, "api", target, run=run)]


def _check_limit(limit: int, total: int | None) -> int:
    if total is not None and limit > total:
        raise ConfigError(
            "limit", f"{exact_bytes(limit)} is more than the device's {exact_bytes(total)}; pass a smaller limit"
        )
    return limit


def _growth(growth: bool, allocator: str | None, state: State, pending: Pending) -> Step:
    """``allocator``: the one configured in the same call (``check`` took the pair)."""
    waiting = pending.waiting()
    if growth:
        if waiting is None or not waiting.preallocate:
            return Step("cupy", "growth", True, "none", "(CuPy default)", status=STATUS_UNCHANGED)
        return Step(
            "cupy",
            "growth",
            True,
            "none",
            "(CuPy default)",
            run=lambda: pending.update(preallocate=False),
            status=STATUS_APPLIED,
            note="the preallocation configured earlier is cancelled",
        )
    if allocator is None and waiting is not None:
        allocator = waiting.allocator
    kind = state.kind if allocator is None else _KINDS.get(allocator, POOL)
    if kind != POOL:
        raise ConfigError("growth", _NO_POOL.format(allocator=_allocator_name(kind)))
    target = "MemoryPool.malloc(allowance) freed into the pool"
    cupy, pool = state.cupy, state.pool
    if state.pools and cupy is not None and waiting is None:
        devices = list(state.pools)

        def run() -> None:
            for device in devices:
                preallocate(cupy, pool, device)

        return Step("cupy", "growth", False, "api", f"{target}, on every device", run=run)
    status = STATUS_UNCHANGED if waiting is not None and waiting.preallocate else STATUS_PENDING
    return Step(
        "cupy",
        "growth",
        False,
        "hook",
        f"{target} at CuPy's first allocation, on its device",
        run=lambda: pending.update(preallocate=True),
        status=status,
    )


def _allocator_name(kind: str) -> str:
    return next((name for name, k in _KINDS.items() if k == kind), "one of the user's own")
