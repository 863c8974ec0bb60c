"""``unimem.estimate_memory``: will the step fit? Every argument is checked first, then each batch
size is sized by the step's framework without allocating it (its ``estimate`` topic), and the
figures are held against the target."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from unimem import device_view, host_memory, in_force, registry
from unimem.errors import ConfigError
from unimem.estimate.largest import largest_fitting
from unimem.estimate.result import MemoryEstimate, SizeEstimate, size_estimate
from unimem.sizes import parse_size
from unimem.step_estimates import Plan
from unimem.training.precision import PRECISIONS
from unimem.training.savers import POLICIES

__all__ = ["estimate_memory"]

# "cuda:0", "gpu:1", "device:0": a device's memory as the target.
_DEVICE = re.compile(r"^\s*(?:cuda|gpu|device)\s*:\s*([0-9]+)\s*$", re.IGNORECASE)


def _sizes(batch: object) -> list[int]:
    values = [batch] if isinstance(batch, int) and not isinstance(batch, bool) else batch
    if not isinstance(values, Sequence) or isinstance(values, str) or not values:
        raise ConfigError("batch", f"expected a batch size or a list of them, got {batch!r}")
    for value in values:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError("batch", f"batch sizes are whole numbers from 1, got {value!r}")
    return list(dict.fromkeys(values))


def _precision(precision: object) -> str | None:
    if precision is None:
        return None
    key = precision.strip().lower() if isinstance(precision, str) else None
    for name, spec in PRECISIONS.items():
        if key in (name, spec.compute_dtype):
            return name
    raise ConfigError("precision", f"expected 'bf16', 'fp16', 'fp32' or None, got {precision!r}")


def _saver(saver: object, match: object) -> str | None:
    if saver is None:
        if match is not None:
            raise ConfigError("match", "match= picks the blocks a saver saves: pass saver= too, or leave match out")
        return None
    choices = ", ".join(repr(name) for name in POLICIES)
    if not isinstance(saver, str) or saver.strip().lower() not in POLICIES:
        raise ConfigError("saver", f"expected one of {choices} or None, got {saver!r}")
    if match is None:
        raise ConfigError(
            "match", f"saver={saver!r} needs match=, the blocks to save (as unimem.remat_model's): a class, its name"
        )
    return saver.strip().lower()


def _device_target(index: int, backend: str) -> tuple[int, str]:
    """The bytes device ``index`` gives a process: its total as NVML reads it, or the cap ``configure()``
    put in force for ``backend`` where that is less."""
    view, status = device_view.usable()
    if view is None:
        raise ConfigError(
            "target", f"device {index}'s memory cannot be read here ({status}); pass its size, such as '80GiB'"
        )
    total = view.stats(index).device_total
    if total is None:
        raise ConfigError("target", f"device {index}'s total memory is unknown; pass its size, such as '80GiB'")
    settings = in_force.settings_in_force(backend)
    cap = settings.limit if settings.limit is not None else None
    if cap is None and settings.fraction is not None:
        cap = int(settings.fraction * total)
    if cap is not None and cap < total:
        return cap, f"the cap configure() set for {backend} on device {index}"
    return total, f"device {index}'s total memory"


def _target(target: object, backend: str) -> tuple[int | None, str]:
    if target is None:
        return None, "none"
    if isinstance(target, str):
        found = _DEVICE.match(target)
        if found:
            return _device_target(int(found.group(1)), backend)
    return parse_size(target, "target"), "given"


def _resolve(backend: object) -> str:
    name = registry.resolve(backend, "action")
    if name is None or not registry.is_framework(name):
        raise ConfigError("backend", f"pass the framework the step is written in, got {backend!r}")
    return name


def _runs(max_runs: object) -> int:
    if not isinstance(max_runs, int) or isinstance(max_runs, bool) or max_runs < 0:
        raise ConfigError("max_runs", f"expected a whole number of estimates, 0 or more, got {max_runs!r}")
    return max_runs


def _measurer(topic: Any, step: Any, plan: Plan, limit: int | None) -> Callable[[int], SizeEstimate]:
    """One size estimated, timed, and its host memory read (the process's high-water mark, reset first)."""

    def measure(size: int) -> SizeEstimate:
        before = host_memory.rss()
        reset = host_memory.reset_peak()
        wall, cpu = time.perf_counter(), time.process_time()
        measured = topic.estimate_size(step, size, plan)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        high = host_memory.peak()
        rose = high - before if reset and high is not None and before is not None else None
        return size_estimate(measured, limit, (wall, cpu, rose))

    return measure


def estimate_memory(
    step: Any,
    batch: int | Sequence[int],
    *,
    target: int | str | None = None,
    precision: str | None = None,
    saver: str | None = None,
    match: Any = None,
    device: str | None = None,
    backend: str | None = None,
    max_runs: int = 6,
) -> MemoryEstimate:
    """Predict a training step's peak memory at each batch size, without allocating it: will it fit?

    The step is written as its framework's users write one, and sized the way that framework can
    without running it ([Will it fit?](../guides/will-it-fit.md)):

    - torch: ``step`` is ``build()``, which makes the model and the optimizer and returns ``step(n)``,
      one training step at batch size ``n``. Both run under fake tensors: nothing is allocated and
      CUDA is never started (a CUDA device is planned on the host). The second call of ``step(n)`` is
      measured, as a real run's second step; its allocations are replayed through a model of torch's
      CUDA caching allocator, so both ``max_memory_allocated`` (``peak``) and ``max_memory_reserved``
      (``reserved``) are predicted.
    - JAX: ``step`` is ``n -> the jitted step lowered for batch size n`` (``train.lower(params,
      jax.ShapeDtypeStruct(...))``), the callable ``find_batch_size(..., lower=)`` takes; XLA compiles
      it in a fresh process (no memory is taken from this process's pool) and its memory analysis
      gives the peak.
    - TensorFlow: ``step`` is ``n -> (function, args)``: a ``tf.function(jit_compile=True)`` and the
      ``tf.TensorSpec`` arguments of batch size ``n``.

    With ``target``, each size says whether it fits, and the largest batch size that fits is searched
    (a line through two estimates, then the sizes at and past the boundary checked).

    Args:
        step: The step, as above for its framework.
        batch: A batch size, or a list of them, each 1 or more.
        target: Bytes the step must fit in: a size (``"24GiB"``, bytes as an int), or a device
            (``"cuda:0"``: its total memory as NVML reads it, or the cap ``configure()`` set if less).
            None (default): no target, nothing searched.
        precision: ``"bf16"``, ``"fp16"`` or ``"fp32"``: the forward pass runs under unimem's
            mixed-precision policy (torch: autocast, as CUDA's autocast casts where CUDA is planned); None
            (default): as the step sets it. torch only.
        saver: ``"full"``, ``"matmuls"`` or ``"offload"``: the blocks ``match`` picks are saved as
            ``unimem.remat_model`` saves them, in every model ``build()`` makes. torch only.
        match: Which blocks the saver saves (a class, a tuple of classes, a class name or a predicate).
        device: The device type planned for (torch: ``"cuda"`` or ``"cpu"``); None (default): the one the
            framework would use here.
        backend: The step's framework; None (default): the one configured, else the one imported.
        max_runs: Sizes the search for the largest batch may estimate beyond ``batch`` (default 6).

    Returns:
        The estimate: per size the peak and its parts and whether it fits; the largest size that fits.

    Raises:
        ConfigError: An argument is invalid (the error names it), or ``step`` is not a step of its framework.
        UnsupportedFeature: The framework cannot size a step without running it, or cannot here (the
            message says what is missing).
        BackendUnavailable: The framework is not installed.

    Example:
        ```python
        estimate = unimem.estimate_memory(build, [8, 16], target="80GiB", device="cuda", backend="torch")
        print(estimate)            # the table: peak, reserved, fits, and the parts of each
        estimate.largest           # the largest batch size that fits 80 GiB
        ```
    """
    sizes = _sizes(batch)
    chosen_precision = _precision(precision)
    chosen_saver = _saver(saver, match)
    if device is not None and (not isinstance(device, str) or not device.strip()):
        raise ConfigError("device", f"expected a device type such as 'cuda' or 'cpu', got {device!r}")
    runs = _runs(max_runs)
    name = _resolve(backend)
    limit, source = _target(target, name)
    plan = Plan(
        chosen_precision,
        chosen_saver,
        match,
        device.strip().lower() if device else None,
        _save_blocks(chosen_saver, match, name),
    )
    topic = registry.get_backend(name).estimate
    measure = _measurer(topic, step, plan, limit)
    known = {size: measure(size) for size in sizes}
    first = known[sizes[0]]
    result = MemoryEstimate(name, first.device, limit, source, asked=sizes, _measure=measure)
    if limit is not None:
        result.largest, result.above = largest_fitting(measure, known, limit, runs)
    result.sizes.update(known)
    return result


def _save_blocks(saver: str | None, match: Any, backend: str) -> Callable[[Any], int] | None:
    """``remat_model`` with the estimate's saver bound, for the adapter to apply to the models the step builds."""
    if saver is None:
        return None
    from unimem.training.savers import remat_model

    return lambda model: remat_model(model, saver, match=match, backend=backend)
