"""Mixed precision for PyTorch: ``torch.autocast`` and a dynamic loss scaler.

The torch adapter's ``precision()`` returns this module, imported only once a policy is
asked for torch. Every framework's ``precision`` module has the same functions (the
``PrecisionHelpers`` protocol of ``unimem.backends.base``): ``device``, ``check``,
``dtype``, ``cast``, ``enable``, ``loss_scaler``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

from unimem.errors import ConfigError
from unimem.loss_scaling import LossScaler, NoLossScaling, ScalerConfig, next_scale
from unimem.trees import map_leaves, tree_leaves

__all__ = ["TorchLossScaler", "cast", "check", "device", "dtype", "enable", "loss_scaler"]


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
    from unimem.backends.nvml import gate

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
    """``torch.amp.GradScaler``'s dynamic scaling over a structure of gradients.

    The scale lives on the host: ``unscale`` syncs once per step anyway to answer
    ``finite`` as a Python bool. ``unscale`` divides the gradients in place (as
    ``GradScaler.unscale_`` does), so ``p.grad`` and the optimizer see the result.
    """

    def __init__(self, config: ScalerConfig) -> None:
        super().__init__(config, "torch")
        self._scale = config.initial_scale
        self._good_steps = 0

    @property
    def scale_value(self) -> float:
        return self._scale

    @property
    def good_steps(self) -> int:
        return self._good_steps

    def scale(self, loss: Any) -> Any:
        # float32 first: an fp16 loss times 2**15 would itself overflow.
        return loss.float() * self._scale

    def unscale(self, grads: Any) -> tuple[Any, bool]:
        torch = sys.modules["torch"]
        tensors = [g for g in tree_leaves(grads) if isinstance(g, torch.Tensor)]
        if not tensors:
            return grads, True
        inverse = 1.0 / self._scale
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
        finite = not bool(torch.cat(found).any())  # the one host sync per step
        return grads, finite

    def update(self, finite: Any) -> None:
        self._scale, self._good_steps = next_scale(self.config, self._scale, self._good_steps, bool(finite))


def loss_scaler(config: ScalerConfig, enabled: bool) -> LossScaler:
    return TorchLossScaler(config) if enabled else NoLossScaling(config, "torch")
