"""How ``configure`` reaches torch: the caching allocator's settings, the cap, preallocation, devices.

torch is read from ``sys.modules`` only, never imported here. Caps and preallocation made
before CUDA starts are deferred to CUDA's lazy init with ``torch.cuda._lazy_call``
(``AtCudaInit``), because ``set_per_process_memory_fraction`` would otherwise start CUDA
itself (and fix the allocator settings) at configure time.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import types
from typing import Any

from unimem.backends import nvml_gate
from unimem.backends.steps import (
    STATUS_APPLIED,
    STATUS_NO_DEVICE,
    STATUS_PENDING,
    STATUS_UNCHANGED,
    Step,
    devices_step,
    env_step,
    merge_conf,
    written_vars,
)

from unimem.config import Settings
from unimem.errors import ConfigError
from unimem.import_hooks import when_imported
from unimem.sizes import exact_bytes
from unimem.support import Phase, When

__all__ = [
    "CONF_VARS",
    "UNCACHED_VAR",
    "AtCudaInit",
    "allowance_fraction",
    "check_environment",
    "conf_var",
    "cuda_available",
    "plan",
    "preallocate",
]

# Left free when preallocating without a cap: cuBLAS/cuDNN handles and kernels
# loaded later take device memory outside the caching allocator.
_UNCAPPED_HEADROOM = 1 << 30
# Kept out of a capped preallocation: requests under 1 MiB come from a separate
# small pool of 2 MiB segments; with the cap full of one large block their first
# cudaMalloc would fail and torch would free the whole preallocation to retry.
_SMALL_POOL_HEADROOM = 64 << 20

_CONF_ALLOCATOR: dict[str, dict[str, str | None]] = {
    "default": {"backend": None, "expandable_segments": None},
    "async": {"backend": "cudaMallocAsync", "expandable_segments": None},
    "expandable": {"backend": None, "expandable_segments": "True"},
    "uncached": {"backend": None, "expandable_segments": None},
}
UNCACHED_VAR = "PYTORCH_NO_CUDA_MEMORY_CACHING"


def conf_var(version: str | None) -> str:
    """torch 2.9 renamed PYTORCH_CUDA_ALLOC_CONF to PYTORCH_ALLOC_CONF (the old name
    still works, with a deprecation warning)."""
    if version is None:
        return "PYTORCH_CUDA_ALLOC_CONF"
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return "PYTORCH_CUDA_ALLOC_CONF"
    return "PYTORCH_ALLOC_CONF" if (major, minor) >= (2, 9) else "PYTORCH_CUDA_ALLOC_CONF"


class AtCudaInit:
    """What to do at CUDA's lazy init for settings made before it, and the rank's own device.

    Attributes:
        pending (dict[str, Any]): ``"cap"`` (the Settings), ``"preallocate"`` (True), ``"pin"``
            (a device): read and emptied when the hook fires.
        pinned (int | None): The rank's own device once pinned: caps and preallocation touch it
            alone, since a call on another device starts a CUDA context there.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending: dict[str, Any] = {}
        self.pinned: int | None = None

    def defer(self, key: str, value: Any) -> None:
        """Do ``key`` at CUDA init (registering the hook once torch is imported)."""
        with self._lock:
            self.pending[key] = value
        self._register()

    def cancel(self, key: str) -> None:
        """Do not do ``key`` at CUDA init after all."""
        with self._lock:
            self.pending.pop(key, None)

    def pin(self, device: int) -> None:
        """Make ``device`` this process's own at CUDA init (before any tensor)."""
        with self._lock:
            self.pinned = device
            self.pending["pin"] = device
        self._register()

    def _register(self) -> None:
        def on_import(torch: types.ModuleType) -> None:
            torch.cuda._lazy_call(self._on_cuda_init)

        when_imported("torch", on_import, key="unimem.torch.at_init")

    def _on_cuda_init(self) -> None:
        """Runs inside torch's lazy CUDA init: the pin first, then on every visible device (the pinned one alone)."""
        torch = sys.modules["torch"]
        with self._lock:
            pending = dict(self.pending)
            self.pending.clear()
        if pending.get("pin") is not None:
            torch.cuda.set_device(pending["pin"])
        cap: Settings | None = pending.get("cap")
        for device in range(torch.cuda.device_count()) if self.pinned is None else [self.pinned]:
            if cap is not None:
                total = torch.cuda.get_device_properties(device).total_memory
                fraction = allowance_fraction(cap, total)
                torch.cuda.set_per_process_memory_fraction(fraction, device)
            if pending.get("preallocate"):
                preallocate(torch, device)


def cuda_available() -> bool | None:
    """Whether torch sees CUDA; None while torch is not imported: unknown without importing it."""
    torch = sys.modules.get("torch")
    if torch is None or getattr(torch, "cuda", None) is None:
        return None
    return bool(torch.cuda.is_available())


def plan(settings: Settings, phase: Phase, version: str | None, at_init: AtCudaInit) -> list[Step]:
    """The steps that apply ``settings`` to torch in ``phase`` (torch ``version`` names the conf variable)."""
    steps: list[Step] = []
    if settings.devices is not None:
        steps.append(
            devices_step(
                "torch",
                settings.devices,
                phase=phase,
                when=When.BEFORE_INIT,
                fix="set devices before the first CUDA call, or restart the process",
            )
        )
    if settings.allocator is not None:
        steps.extend(_allocator(settings.allocator, phase, version))
    if settings.fraction is not None or settings.limit is not None:
        steps.append(_cap(settings, phase, at_init))
    if settings.growth is not None:
        steps.append(_growth(settings.growth, phase, at_init))
    if phase is not Phase.INITIALIZED:
        check_environment(written_vars(steps))
    return steps


CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
_CONF_BOOLS = (
    "expandable_segments",
    "pinned_use_background_threads",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "graph_capture_record_stream_reuse",
)
_CONF_BACKENDS = ("native", "cudaMallocAsync", "hipMallocAsync")
_MAX_REGISTER_THREADS = 128


def _power_of_two(text: str) -> bool:
    return text.isdigit() and int(text) > 0 and int(text) & (int(text) - 1) == 0


def _conf_tokens(raw: str) -> list[str]:
    """The conf split as torch's ConfigTokenizer splits it: words and the marks , : [ ], no whitespace."""
    return [token for token in re.split(r"([,:\[\]])|\s+", raw) if token]


def _conf_entries(raw: str) -> list[tuple[str, list[str]]]:
    """``key:value`` and ``key:[a:b,...]`` entries, each value as its tokens; ValueError names what is wrong."""
    tokens, entries, i = _conf_tokens(raw), [], 0
    while i < len(tokens):
        key = tokens[i]
        if key in ",:[]" or tokens[i + 1 : i + 2] != [":"] or i + 2 >= len(tokens):
            raise ValueError(f"expected key:value at {' '.join(tokens[i : i + 3])!r}")
        i += 2
        if tokens[i] == "[":
            if "]" not in tokens[i:]:
                raise ValueError(f"{key}'s list has no closing ']'")
            end = tokens.index("]", i)
            entries.append((key, tokens[i + 1 : end]))
            i = end + 1
        elif tokens[i] in ",:]":
            raise ValueError(f"{key} has no value")
        else:
            entries.append((key, [tokens[i]]))
            i += 1
        if i < len(tokens):
            if tokens[i] != ",":
                raise ValueError(f"expected ',' after {key}'s value, got {tokens[i]!r}")
            i += 1
    return entries


def _conf_value_problem(key: str, value: list[str]) -> str | None:
    """What torch refuses (or misreads) in ``key``'s value; None for a good one, or a key unimem does not know
    (torch names an unknown key itself when CUDA starts)."""
    one = value[0] if len(value) == 1 else None
    if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
        if one is None or not one.isdigit() or int(one) < 20:
            return f"{key} takes a whole number of MiB of at least 20"
    elif key == "garbage_collection_threshold":
        try:
            ok = one is not None and 0.0 < float(one) < 1.0
        except ValueError:
            ok = False
        if not ok:
            return f"{key} takes a number between 0 and 1"
    elif key == "roundup_power2_divisions":
        if one is not None and not _power_of_two(one):
            return f"{key} takes a power of 2, or a list such as [256:4,>:1]"
        pairs = "".join(value).split(",") if one is None else []
        for pair in pairs:
            size, _, divisions = pair.partition(":")
            if not (size == ">" or _power_of_two(size)) or not (divisions == "0" or _power_of_two(divisions)):
                return f"{key}'s list pairs a power of 2 (or >) with 0 or a power of 2, such as [256:4,>:1]"
    elif key == "backend":
        if one not in _CONF_BACKENDS:
            return f"backend is one of {', '.join(_CONF_BACKENDS)}"
    elif key in _CONF_BOOLS:
        if one not in ("True", "False"):
            return f"{key} takes True or False, capitalised"
    elif key == "pinned_num_register_threads":
        if one is None or not _power_of_two(one) or int(one) > _MAX_REGISTER_THREADS:
            return f"{key} takes a power of 2 up to {_MAX_REGISTER_THREADS}"
    elif key == "pinned_reserve_segment_size_mb" and (one is None or not one.isdigit() or int(one) == 0):
        return f"{key} takes a whole number of MiB above 0"
    return None


def check_environment(written: set[str]) -> None:
    """Refuse an allocator variable torch reads when CUDA starts that torch would refuse there (a
    cryptic error at the first CUDA call) or read other than it says. A conf unimem merges its keys
    into is checked too: the user's other keys stay in it. Changes nothing.

    Raises:
        ConfigError: Naming the variable.
    """
    for var in CONF_VARS:
        raw = os.environ.get(var)
        if raw is None:
            continue
        try:
            entries = _conf_entries(raw)
        except ValueError as exc:
            raise ConfigError(
                var, f"torch cannot read {raw!r}: {exc}; write key:value pairs, comma-separated"
            ) from None
        for key, value in entries:
            problem = _conf_value_problem(key, value)
            if problem is not None:
                raise ConfigError(var, f"torch refuses {raw!r} when CUDA starts: {problem}")
    uncached = os.environ.get(UNCACHED_VAR)
    if UNCACHED_VAR not in written and uncached is not None and uncached != "1":
        raise ConfigError(
            UNCACHED_VAR,
            f"torch versions read {uncached!r} differently (older ones turn caching off for any value, newer "
            "ones only for 1): write 1, or unset it",
        )


def _allocator(allocator: str, phase: Phase, version: str | None) -> list[Step]:
    var = conf_var(version)
    if phase is Phase.INITIALIZED:
        return [_allocator_after_init(allocator, var)]
    if phase is Phase.IMPORTED:
        fixed = _backend_fixed_at_import(allocator, var)
        if fixed is not None:
            return [fixed]
    # A user's own variable wins where torch reads both names (the legacy one does in
    # torch 2.13: tests/test_backend_torch.py), so unimem writes into whichever is set.
    present = [name for name in (var, "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF") if name in os.environ]
    targets = list(dict.fromkeys(present)) or [var]
    fix = "configure the allocator before the first CUDA call"
    steps = [
        env_step(
            "torch",
            "allocator",
            allocator,
            name,
            merge_conf(os.environ.get(name), _CONF_ALLOCATOR[allocator]) or None,
            phase=phase,
            when=When.BEFORE_INIT,
            fix=fix,
        )
        for name in targets
    ]
    uncached_value = "1" if allocator == "uncached" else None
    if os.environ.get(UNCACHED_VAR) != uncached_value:
        steps.append(
            env_step(
                "torch",
                "allocator",
                allocator,
                UNCACHED_VAR,
                uncached_value,
                phase=phase,
                when=When.BEFORE_INIT,
                fix=fix,
            )
        )
    return steps


def _allocator_after_init(allocator: str, var: str) -> Step:
    """The allocator once CUDA runs: unchanged, expandable segments switched for new
    segments, or too late (the backend and the uncached switch are read at init)."""
    torch = sys.modules["torch"]
    backend = torch.cuda.get_allocator_backend()
    uncached = os.environ.get(UNCACHED_VAR) == "1"
    if allocator == "async" and backend == "cudaMallocAsync":
        target = f"{var}=backend:cudaMallocAsync"
        return Step("torch", "allocator", allocator, "env", target, status=STATUS_UNCHANGED)
    if allocator == "uncached" and uncached:
        return Step("torch", "allocator", allocator, "env", f"{UNCACHED_VAR}=1", status=STATUS_UNCHANGED)
    if allocator not in ("async", "uncached") and backend == "native" and not uncached:
        # expandable_segments can be switched for segments made from now on.
        value = "True" if allocator == "expandable" else "False"
        # torch 2.11 deprecates torch.cuda.memory._set_allocator_settings with a
        # FutureWarning that names this call as its replacement.
        setter = getattr(getattr(torch, "_C", None), "_accelerator_setAllocatorSettings", None)
        name = "torch._C._accelerator_setAllocatorSettings"
        if setter is None:
            setter = torch.cuda.memory._set_allocator_settings
            name = "torch.cuda.memory._set_allocator_settings"

        def run() -> None:
            setter(f"expandable_segments:{value}")

        call = f"{name}('expandable_segments:{value}')"
        note = "applies to segments allocated from now on"
        return Step("torch", "allocator", allocator, "api", call, run=run, note=note)
    too_late = (
        f"CUDA is already initialised with the {'uncached' if uncached else backend} allocator, "
        "which cannot change in a running process; configure the allocator before the first "
        "CUDA call, or start the script with `unimem run --allocator ...`"
    )
    return Step("torch", "allocator", allocator, "env", var, too_late=too_late)


def _backend_fixed_at_import(allocator: str, var: str) -> Step | None:
    """torch picks its allocator backend (native or cudaMallocAsync) when it is imported: the CUDA
    library's static initialiser reads ``backend:`` from the conf variable as it loads, and the
    other allocator keys are read at CUDA init. A backend set after the import makes the first
    CUDA call fail ("Allocator backend parsed at runtime != allocator backend parsed at load
    time"; the GPU suite's allocator test shows it), so a different one is too late.

    A build without CUDA (torch's CPU wheel) has no allocator backend to ask: the one it was
    imported with is what the variables said, and the rule is the same, so that a script moved
    to a GPU machine fails the same way it did on a laptop.
    """
    torch = sys.modules["torch"]
    try:
        loaded = torch.cuda.get_allocator_backend()  # names the import-time choice; starts no CUDA
    except (AttributeError, RuntimeError):  # a CPU-only build has no CUDA allocator
        loaded = _conf_backend()
    wanted = "cudaMallocAsync" if allocator == "async" else "native"
    if loaded == wanted:
        return None
    return Step(
        "torch",
        "allocator",
        allocator,
        "env",
        var,
        too_late=(
            f"torch chose its {loaded} allocator backend when it was imported and does not read it again; "
            f"configure allocator={allocator!r} before `import torch`, or start the script with "
            "`unimem run --allocator ...`"
        ),
        when=When.BEFORE_IMPORT,
    )


def _conf_backend() -> str:
    """The allocator backend the conf variables name (``native`` when none does)."""
    for name in CONF_VARS:
        try:
            entries = _conf_entries(os.environ.get(name, ""))
        except ValueError:
            continue  # check_environment names a malformed conf
        for key, value in entries:
            if key == "backend" and value == ["cudaMallocAsync"]:
                return "cudaMallocAsync"
    return "native"


def allowance_fraction(settings: Settings, total: int) -> float:
    if settings.fraction is not None:
        return settings.fraction
    assert settings.limit is not None
    if settings.limit > total:
        raise ConfigError(
            "limit",
            f"{exact_bytes(settings.limit)} is more than the device's {exact_bytes(total)}; pass a smaller limit",
        )
    return settings.limit / total


def _cap(settings: Settings, phase: Phase, at_init: AtCudaInit) -> Step:
    setting = "fraction" if settings.fraction is not None else "limit"
    value = settings.fraction if settings.fraction is not None else settings.limit
    if phase is Phase.INITIALIZED:
        torch = sys.modules["torch"]
        count = torch.cuda.device_count()
        fractions = {}
        for device in range(count):
            total = torch.cuda.get_device_properties(device).total_memory
            fractions[device] = allowance_fraction(settings, total)
        current = {d: torch.cuda.get_per_process_memory_fraction(d) for d in range(count)}
        call = ", ".join(
            f"torch.cuda.set_per_process_memory_fraction({f:.6g}, device={d})" for d, f in fractions.items()
        )
        if all(abs(current[d] - f) < 1e-9 for d, f in fractions.items()):
            return Step("torch", setting, value, "api", call, status=STATUS_UNCHANGED)

        def run_now() -> None:
            for device, fraction in fractions.items():
                torch.cuda.set_per_process_memory_fraction(fraction, device)

        return Step("torch", setting, value, "api", call, run=run_now)

    if cuda_available() is False:
        return Step(
            "torch",
            setting,
            value,
            "api",
            "torch.cuda.set_per_process_memory_fraction",
            status=STATUS_NO_DEVICE,
            note="torch sees no CUDA device here: there is no GPU memory to cap",
        )
    if settings.limit is not None:
        # Check against the device now when NVML can tell, so a bad limit fails
        # at configure time rather than at the first CUDA call.
        total = nvml_gate.device_figures(0)[0]
        if total is not None:
            allowance_fraction(settings, total)

    def run_later() -> None:
        at_init.defer("cap", settings)

    target = (
        f"torch.cuda.set_per_process_memory_fraction({settings.fraction})"
        if settings.fraction is not None
        else f"torch.cuda.set_per_process_memory_fraction({settings.limit} / total_memory)"
    )
    return Step("torch", setting, value, "hook", target + " at CUDA init", run=run_later, status=STATUS_PENDING)


def _growth(growth: bool, phase: Phase, at_init: AtCudaInit) -> Step:
    if growth:

        def cancel() -> None:
            at_init.cancel("preallocate")

        return Step(
            "torch",
            "growth",
            True,
            "none",
            "(torch default)",
            run=cancel,
            status=STATUS_APPLIED,
            note="torch's caching allocator allocates on demand; nothing to change",
        )
    if phase is Phase.INITIALIZED:
        torch = sys.modules["torch"]

        def run_now() -> None:
            for device in range(torch.cuda.device_count()):
                preallocate(torch, device)

        return Step("torch", "growth", False, "api", "torch.empty(allowance) freed into the cache", run=run_now)
    if cuda_available() is False:
        return Step(
            "torch",
            "growth",
            False,
            "api",
            "torch.empty(allowance)",
            status=STATUS_NO_DEVICE,
            note="torch sees no CUDA device here: nothing to preallocate",
        )

    def run_later() -> None:
        at_init.defer("preallocate", True)

    return Step(
        "torch",
        "growth",
        False,
        "hook",
        "torch.empty(allowance) freed into the cache at CUDA init",
        run=run_later,
        status=STATUS_PENDING,
    )


def preallocate(torch: Any, device: int) -> None:
    """The allowance taken from the device and freed into the cache: the cap less what is reserved, or
    the free memory less headroom for the libraries' workspaces."""
    free, total = torch.cuda.mem_get_info(device)
    fraction = torch.cuda.get_per_process_memory_fraction(device)
    reserved = torch.cuda.memory_reserved(device)
    size = int(total * fraction) - reserved - _SMALL_POOL_HEADROOM if fraction < 1.0 else free - _UNCAPPED_HEADROOM
    size = min(size, free - _SMALL_POOL_HEADROOM)
    if size <= 0:
        return
    block = torch.empty(size, dtype=torch.uint8, device=f"cuda:{device}")
    del block  # back to the cache, not to the device: that is the preallocation
