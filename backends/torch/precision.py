"""Mixed precision for PyTorch: ``torch.autocast`` and a dynamic loss scaler.

This module is the torch adapter's ``precision`` topic, imported only once a policy is
asked for torch. Every framework's ``precision`` module has the same members (the
``PrecisionTopic`` protocol of ``unimem.backends.topics``): ``device``, ``check``,
``dtype``, ``cast``, ``enable``, ``loss_scaler``, ``precision_state_per_thread``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

from unimem.errors import ConfigError, UnimemError, UnsupportedFeature
from unimem.loss_scaling import LossScaler, ScalerConfig, next_scale
from unimem.trees import map_leaves, tree_leaves

__all__ = [
    "TorchLossScaler",
    "cast",
    "check",
    "device",
    "dtype",
    "enable",
    "loss_scaler",
    "precision_state_per_thread",
]

# A policy belongs to the thread that enabled it, which alone may disable it: autocast state is per thread.
precision_state_per_thread = True


def _torch() -> Any:
    import torch

    return torch


def device() -> str:
    """The device autocast acts on: CUDA when torch can use it, else the CPU.

    ``torch.cuda.is_available()`` asks the driver for a device count; it does not
    start CUDA, so allocator settings made later by ``configure()`` still count.
    """
    return "cuda" if _torch().cuda.is_available() else "cpu"


def dtype(name: str) -> Any:
    return getattr(_torch(), name)


def _nvml_compute_capability(index: int) -> tuple[int, int] | None:
    """The GPU's compute capability from NVML, which (unlike torch) does not start CUDA."""
    from unimem.backends import nvml_gate as gate

    try:
        pynvml = gate.load()
        handle = gate.handle(index)  # CUDA ordinal -> NVML device through CUDA_VISIBLE_DEVICES
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    except Exception:  # no NVML, no driver, or an old one: ask torch instead
        return None
    return int(major), int(minor)


def _cuda_bf16_supported(torch: Any) -> bool:
    if not torch.cuda.is_initialized():
        capability = _nvml_compute_capability(0)
        if capability is not None and capability >= (8, 0):
            return True
    # Starts CUDA if it is not started yet: reached only when CUDA already runs, or on a
    # pre-Ampere GPU (or one NVML cannot see) where torch's own test is the only answer.
    return bool(torch.cuda.is_bf16_supported())


def check(precision: str, compute_dtype: str, device: str) -> None:
    """``ConfigError("precision", reason)`` if autocast cannot run ``compute_dtype`` on ``device``."""
    if precision == "fp32":
        return
    torch = _torch()
    if not torch.amp.autocast_mode.is_autocast_available(device):
        raise ConfigError("precision", f"torch {torch.__version__} has no autocast for device {device!r}")
    if device == "cuda":
        if compute_dtype == "bfloat16" and not _cuda_bf16_supported(torch):
            raise ConfigError(
                "precision",
                "this GPU does not support bfloat16 (torch.cuda.is_bf16_supported() is False: it needs "
                "compute capability 8.0 or later); use 'fp16'",
            )
        return
    # Constructing an autocast context only validates (entering it changes state). Where
    # the dtype is not supported, torch warns and silently disables autocast: refuse instead.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        context = torch.autocast(device, dtype=dtype(compute_dtype))
    if not getattr(context, "_enabled", True) or caught:
        reason = "; ".join(str(w.message).splitlines()[0] for w in caught) or "autocast disabled itself"
        raise ConfigError(
            "precision",
            f"torch {torch.__version__} cannot autocast to {compute_dtype} on {device} ({reason}); "
            "use 'bf16' or 'fp32', or a newer torch",
        )


def cast(tree: Any, name: str) -> Any:
    torch = _torch()
    target = dtype(name)

    def one(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.dtype != target:
            return leaf.to(target)
        return leaf

    return map_leaves(one, tree)


def enable(precision: str, compute_dtype: str, device: str) -> Callable[[], None]:
    """Enter autocast on ``device`` (fp32: autocast explicitly off); return the way back.

    Exiting the very context object entered restores the previous autocast state
    (enabled flag, dtype, cache setting) as ``with torch.autocast(...)`` would.
    """
    torch = _torch()
    if precision == "fp32":
        context = torch.autocast(device, enabled=False)
    else:
        # No weight-cast cache: autocast keeps the low-precision copy of each weight until
        # its outermost context exits, so a policy left on across steps would compute
        # with the weights of the first step forever (the cache only pays off when one
        # forward uses a weight many times).
        context = torch.autocast(device, dtype=dtype(compute_dtype), cache_enabled=False)
    context.__enter__()

    def restore() -> None:
        context.__exit__(None, None, None)

    return restore


class TorchLossScaler(LossScaler):
    """``torch.amp.GradScaler`` behind the uniform surface, and GradScaler's own loop.

    GradScaler's loop, as its users write it (``step`` unscales the optimizer's
    gradients in place once and skips ``optimizer.step()`` on inf/nan)::

        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    The uniform loop (``unscale`` divides the gradients in place too, so ``p.grad``
    and the optimizer see the result)::

        grads, finite = scaler.unscale([p.grad for p in model.parameters()])
        if finite:
            optimizer.step()
        scaler.update(finite)

    Both keep their state in one ``GradScaler`` (``grad_scaler``), made on first use:
    a ``ShardedGradScaler`` when ``torch.distributed`` is initialised by then, so that
    ``step`` agrees on the overflow across ranks; ``unscale`` all-reduces its flag
    (max) itself. Use one loop or the other within a step: unscaling twice would divide
    the gradients twice, so that is refused.

    Attributes:
        device (str): The device GradScaler is made for (``"cuda"`` or ``"cpu"``).
    """

    def __init__(self, config: ScalerConfig, device: str, enabled: bool = True) -> None:
        super().__init__(config, "torch")
        self.device = device
        self._enabled = enabled
        self._grad_scaler: Any = None
        self._unscaled = False  # unscale(grads) ran and update(finite) has not
        self._recorded = False  # GradScaler checked this step's gradients (step/unscale_); update() has not run

    @property
    def enabled(self) -> bool:
        return self._enabled

    @property
    def grad_scaler(self) -> Any:
        """The ``torch.amp.GradScaler`` (``ShardedGradScaler`` under ``torch.distributed``) holding the state."""
        if self._grad_scaler is None:
            torch = _torch()
            config = self.config
            kwargs: dict[str, Any] = {
                "init_scale": config.initial_scale,
                "growth_factor": config.growth_factor,
                "backoff_factor": config.backoff_factor,
                "growth_interval": config.growth_interval,
                "enabled": self._enabled,
            }
            if _distributed(torch):
                from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

                self._grad_scaler = ShardedGradScaler(self.device, **kwargs)
            else:
                self._grad_scaler = torch.amp.GradScaler(self.device, **kwargs)
        return self._grad_scaler

    @property
    def scale_value(self) -> float:
        if not self._enabled:
            return 1.0
        if self._grad_scaler is None:
            return self.config.initial_scale
        return float(self._grad_scaler.get_scale())

    @property
    def good_steps(self) -> int:
        if not self._enabled or self._grad_scaler is None:
            return 0
        return int(self._grad_scaler.state_dict()["_growth_tracker"])

    def scale(self, loss: Any) -> Any:
        if not self._enabled:
            return loss
        # float32 first: an fp16 loss times 2**15 would itself overflow.
        return self.grad_scaler.scale(loss.float())

    def unscale(self, grads: Any) -> tuple[Any, bool]:
        if not self._enabled:
            return grads, True
        self._refuse_second_unscale("unscale(grads)")
        if self._recorded:
            raise UnimemError(
                "torch: unscale(grads) after scaler.step(optimizer) or scaler.unscale_(optimizer) in the same "
                "step would divide the gradients twice; call scaler.update() first (unscale once per optimizer step)"
            )
        torch = sys.modules["torch"]
        tensors = [g for g in tree_leaves(grads) if isinstance(g, torch.Tensor)]
        if not tensors:
            self._unscaled = True
            return grads, True
        inverse = 1.0 / self.scale_value
        groups: dict[tuple[Any, Any], list[Any]] = {}
        for tensor in tensors:
            groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
        found: list[Any] = []
        with torch.no_grad():
            for (where, _), group in groups.items():
                found_inf = torch.zeros(1, dtype=torch.float32, device=where)
                inv = torch.full((1,), inverse, dtype=torch.float32, device=where)
                # GradScaler's fused kernel: divides in place and flags inf/nan in the inputs.
                torch._amp_foreach_non_finite_check_and_unscale_(group, found_inf, inv)
                if inverse > 1:  # a scale below 1 can overflow the division itself
                    found_inf += sum((~torch.isfinite(t)).any().float() for t in group)
                found.append(found_inf.to(tensors[0].device))
        flag = torch.cat(found).amax()
        if _distributed(torch):  # every rank skips the same steps: any rank's overflow counts
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        self._unscaled = True
        return grads, not bool(flag)  # the one host sync per step

    def unscale_(self, optimizer: Any) -> None:
        """``GradScaler.unscale_``: unscale the optimizer's gradients in place now, to clip
        them before ``step(optimizer)`` (which then does not unscale them again).

        Args:
            optimizer: The ``torch.optim.Optimizer`` whose parameters' ``.grad`` to unscale.

        Raises:
            UnimemError: ``unscale(grads)`` already unscaled this step's gradients.
        """
        self._refuse_second_unscale("unscale_(optimizer)")
        self.grad_scaler.unscale_(optimizer)
        self._recorded = True

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``GradScaler.step``: unscale the optimizer's gradients in place (unless
        ``unscale_`` did), then ``optimizer.step(*args, **kwargs)`` unless one of them is
        inf or nan. Call ``update()`` after it, once per step.

        Under gradient accumulation call it once, after the last micro-batch's
        ``scale(loss).backward()``: the summed gradients are unscaled once.

        Args:
            optimizer: A ``torch.optim.Optimizer``.
            *args: Passed to ``optimizer.step``.
            **kwargs: Passed to ``optimizer.step``.

        Returns:
            What ``optimizer.step`` returned; None when the step was skipped.

        Raises:
            UnimemError: ``unscale(grads)`` already unscaled this step's gradients (call
                ``optimizer.step()`` and ``update(finite)`` yourself then).
        """
        self._refuse_second_unscale("step(optimizer)")
        result = self.grad_scaler.step(optimizer, *args, **kwargs)
        self._recorded = True
        return result

    def wrap(self, optimizer: Any) -> Any:
        """Refused: torch has no optimizer that scales the loss itself.

        Raises:
            UnsupportedFeature: Always; use ``step(optimizer)`` then ``update()``.
        """
        raise UnsupportedFeature(
            "torch",
            "loss_scaler.wrap",
            "torch has no optimizer that scales the loss itself; use scaler.step(optimizer) then scaler.update()",
        )

    def update(self, finite: Any = None) -> None:
        """After the step: shrink the scale on an overflow, grow it after
        ``growth_interval`` good steps in a row.

        Args:
            finite: After ``unscale(grads)``: what it returned. After ``step(optimizer)``
                (or ``unscale_(optimizer)``): nothing (None, the default): it was recorded.

        Raises:
            UnimemError: ``finite`` is missing after ``unscale(grads)``, or given after
                ``step(optimizer)``/``unscale_(optimizer)``.
        """
        if finite is None:
            if self._unscaled:
                raise UnimemError("torch: after unscale(grads), pass its finite: scaler.update(finite)")
            self.grad_scaler.update()
            self._recorded = False
            return
        if self._recorded:
            raise UnimemError(
                "torch: after scaler.step(optimizer) or scaler.unscale_(optimizer), call scaler.update() "
                "without arguments: the scaler recorded whether the gradients were finite"
            )
        self._unscaled = False
        if not self._enabled:
            return
        state = self.grad_scaler.state_dict()
        scale, good = next_scale(self.config, state["scale"], state["_growth_tracker"], bool(finite))
        self.grad_scaler.load_state_dict({**state, "scale": scale, "_growth_tracker": good})

    def _refuse_second_unscale(self, call: str) -> None:
        if self._unscaled:
            raise UnimemError(
                f"torch: {call} after unscale(grads) in the same step would divide the gradients twice; "
                "call scaler.update(finite) first (unscale once per optimizer step)"
            )


def _distributed(torch: Any) -> bool:
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized())


def loss_scaler(config: ScalerConfig, enabled: bool) -> LossScaler:
    """A ``TorchLossScaler`` for the device autocast acts on; disabled: scale 1, no checks."""
    return TorchLossScaler(config, device(), enabled)
