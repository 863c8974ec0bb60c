"""CUDA's autocast, done on the host: while a CUDA device is planned with fake host tensors, autocast on
the host casts as CUDA's autocast does (its op lists and its weight cache) instead of as the CPU's, and
``torch.autocast("cuda")`` is autocast on the host. The lists' kernels are registered over the host's
autocast kernels for the estimate only (a ``torch.library`` registration, removed on exit).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["autocast_like_cuda"]

# CUDA's autocast lists (ATen's autocast_mode.h), by policy, as "op" or "op.overload".
_LOWER = (
    "_convolution.deprecated",
    "_convolution",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linalg_vecdot",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention",
)
_FP32 = (
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "group_norm",
    "frobenius_norm.dim",
    "nuclear_norm",
    "nuclear_norm.dim",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "upsample_nearest1d",
    "_upsample_nearest_exact1d",
    "upsample_nearest2d",
    "_upsample_nearest_exact2d",
    "upsample_nearest3d",
    "_upsample_nearest_exact3d",
    "upsample_linear1d",
    "upsample_bilinear2d",
    "_upsample_bilinear2d_aa",
    "upsample_trilinear3d",
    "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
)
_FP32_DTYPE = (
    "prod",
    "prod.dim_int",
    "prod.dim_Dimname",
    "softmax.int",
    "softmax.Dimname",
    "log_softmax.int",
    "log_softmax.Dimname",
    "cumprod",
    "cumprod.dimname",
    "cumsum",
    "cumsum.dimname",
    "linalg_vector_norm",
    "linalg_matrix_norm",
    "linalg_matrix_norm.str_ord",
    "sum",
    "sum.dim_IntList",
    "sum.dim_DimnameList",
)
_PROMOTE = (
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "vdot",
    "grid_sampler",
    "index_put",
    "tensordot",
    "scatter_add",
)


class _Casts:
    """Autocast's casts, as CUDA's autocast makes them: eligible arguments (floating tensors but float64,
    inside lists too) cast; a float32 leaf that requires grad cast to the lower precision once per
    autocast region (its cache)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        # id -> (the tensor, its cast): the tensor is held, not weakly referenced, as a weak reference
        # would stop ``Module.to`` swapping it (fake parameters are swapped, not assigned).
        self.cache: dict[int, tuple[Any, Any]] = {}

    def eligible(self, value: Any) -> bool:
        torch = self.torch
        return isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64

    def cast(self, value: Any, dtype: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return type(value)(self.cast(item, dtype) for item in value)
        if not self.eligible(value) or value.dtype == dtype:
            return value
        torch = self.torch
        cached = dtype != torch.float32 and value.dtype == torch.float32 and value.requires_grad and value.is_leaf
        if cached and torch.is_autocast_cache_enabled() and not value._is_view():
            hit = self.cache.get(id(value))
            if hit is not None and hit[0] is value:
                return hit[1]
            result = value.to(dtype)
            self.cache[id(value)] = (value, result)
            return result
        return value.to(dtype)

    def widest(self, values: Any, start: Any) -> Any:
        for value in values:
            if isinstance(value, (list, tuple)):
                start = self.widest(value, start)
            elif self.eligible(value):
                start = self.torch.promote_types(start, value.dtype)
        return start


def _set_dtype(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: Any) -> tuple[tuple[Any, ...], dict]:
    """``args``/``kwargs`` with the op's ``dtype`` argument set to ``dtype`` where the caller left it None."""
    for index, argument in enumerate(op._schema.arguments):
        if argument.name == "dtype":
            if index < len(args) and not argument.kwarg_only:
                if args[index] is None:
                    args = (*args[:index], dtype, *args[index + 1 :])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": dtype}
    return args, kwargs


def _kernel(torch: Any, op: Any, policy: str, casts: _Casts) -> Callable[..., Any]:
    key = torch._C.DispatchKey.AutocastCPU
    excluded = torch._C.DispatchKeySet(key)

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if policy == "through":  # not on CUDA's lists: autocast falls through for this op only
            return op.redispatch(keyset.remove(key), *args, **kwargs)
        lower = torch.get_autocast_dtype("cpu")
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            if policy == "lower":
                args, kwargs = casts.cast(args, lower), {k: casts.cast(v, lower) for k, v in kwargs.items()}
            elif policy == "fp32":
                args, kwargs = (
                    casts.cast(args, torch.float32),
                    {k: casts.cast(v, torch.float32) for k, v in kwargs.items()},
                )
            elif policy == "promote":
                wide = casts.widest([*args, *kwargs.values()], lower)
                args, kwargs = casts.cast(args, wide), {k: casts.cast(v, wide) for k, v in kwargs.items()}
            elif policy == "fp32_dtype" and args and casts.eligible(args[0]):
                args, kwargs = _set_dtype(op, tuple(args), dict(kwargs), torch.float32)
            return op(*args, **kwargs)

    return kernel


def _overload(torch: Any, name: str) -> Any:
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    return None if packet is None else getattr(packet, overload or "default", None)


@contextlib.contextmanager
def autocast_like_cuda() -> Iterator[Callable[[], None]]:
    """Within: autocast on the host casts as CUDA's does, and ``torch.autocast("cuda")`` is autocast on
    the host. Yields a function that empties the weight cache (as leaving an autocast region does)."""
    import torch

    casts = _Casts(torch)
    policies = {name: "lower" for name in _LOWER} | {name: "fp32" for name in _FP32}
    policies |= {name: "fp32_dtype" for name in _FP32_DTYPE} | {name: "promote" for name in _PROMOTE}
    host_only = [
        name.removeprefix("aten::")
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCPU")
    ]
    policies = {name: "through" for name in host_only if name not in policies} | policies
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # each registration overrides the host's kernel, and says so
        for name, policy in policies.items():
            op = _overload(torch, name)
            if op is not None:
                library.impl(name, _kernel(torch, op, policy, casts), "AutocastCPU", with_keyset=True)
    original = torch.amp.autocast_mode.autocast.__init__

    def on_host(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        original(self, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    torch.amp.autocast_mode.autocast.__init__ = on_host  # type: ignore[method-assign]
    try:
        yield casts.cache.clear
    finally:
        torch.amp.autocast_mode.autocast.__init__ = original  # type: ignore[method-assign]
        library._destroy()
        casts.cache.clear()
