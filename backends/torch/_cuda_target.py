"""A CUDA device planned on the host: the step's fake tensors live on the CPU (autograd on fake CUDA
tensors needs a CUDA build, and on a machine with a GPU its device guard would start CUDA), and
what CUDA would do differently is done here:

- every device argument naming CUDA is read as the host (``.cuda()``, ``.to("cuda")``,
  ``device="cuda"``, ``torch.device("cuda")`` as the default device);
- autocast casts as CUDA's autocast does (``_cuda_autocast``);
- ``scaled_dot_product_attention`` runs the kernel CUDA would pick (flash for float16/bfloat16,
  memory-efficient otherwise, the math fallback where neither applies), and ``dropout`` CUDA's fused
  kernel (a one-byte mask), each registered over the host's composite for the estimate only;
- optimizers take their ``foreach`` implementation, as they do on CUDA by default;
- cuBLAS and cuBLASLt workspaces are sized as torch sizes them (the caller adds them where CUDA
  allocates them: once per thread that runs matrix products, at its first product).
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "CUBLASLT_DEFAULT",
    "cublas_workspace",
    "cublaslt_workspace",
    "device_to_host",
    "foreach_like_cuda",
    "kernels_like_cuda",
    "sdp_choice",
]

MIB = 1024 * 1024
# cuBLAS's workspace per (handle, stream) as torch sizes it: 32 MiB on compute capability 9.0, else
# its ":4096:2:16:8" default; cuBLASLt's is 1 MiB unless CUBLASLT_WORKSPACE_SIZE says otherwise.
CUBLAS_HOPPER = 4096 * 8 * 1024
CUBLAS_OTHER = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLASLT_DEFAULT = 1024 * 1024
# SDPBackend's values, as _fused_sdp_choice answers them.
_MATH, _FLASH, _EFFICIENT = 0, 1, 2


def cublas_workspace(capability: tuple[int, int] | None) -> tuple[int, str]:
    """cuBLAS's workspace per thread and how it was found: ``CUBLAS_WORKSPACE_CONFIG``, else torch's
    default for the compute capability (``None``: unknown, the larger, Hopper's, is assumed)."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        pairs = re.findall(r":([0-9]+):([0-9]+)", config)
        if pairs:
            return sum(int(size) * 1024 * int(count) for size, count in pairs), "CUBLAS_WORKSPACE_CONFIG"
    if capability is None:
        return (
            CUBLAS_HOPPER,
            "the GPU's compute capability is unknown here: Hopper's 32 MiB assumed (8.1 MiB elsewhere)",
        )
    if capability == (9, 0):
        return CUBLAS_HOPPER, "compute capability 9.0"
    return CUBLAS_OTHER, f"compute capability {capability[0]}.{capability[1]}"


def cublaslt_workspace(cublas: int) -> int:
    """cuBLASLt's workspace per thread: ``CUBLASLT_WORKSPACE_SIZE`` KiB or 1 MiB, at most cuBLAS's."""
    value = os.environ.get("CUBLASLT_WORKSPACE_SIZE", "")
    size = int(value) * 1024 if value.isdigit() else CUBLASLT_DEFAULT
    return min(size, cublas)


def _cuda_device(value: Any, torch: Any) -> bool:
    if isinstance(value, str):
        return value.split(":")[0] == "cuda"
    return isinstance(value, torch.device) and value.type == "cuda"


def device_to_host() -> Any:
    """A function mode reading every device argument that names CUDA as the host, and ``.cuda()`` and
    ``.pin_memory()`` as the tensor itself: no CUDA call is made, and the step's tensors stay fake host
    tensors."""
    import torch
    from torch.overrides import TorchFunctionMode

    same = {torch.Tensor.cuda, torch.Tensor.pin_memory}

    class DeviceToHost(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if func in same:
                return args[0]
            if _cuda_device(kwargs.get("device"), torch):
                kwargs["device"] = "cpu"
            args = tuple("cpu" if _cuda_device(arg, torch) else arg for arg in args)
            return func(*args, **kwargs)

    return DeviceToHost()


def sdp_choice(torch: Any, query: Any, mask: Any) -> int:
    """The ``scaled_dot_product_attention`` kernel CUDA would run for these inputs (its default order:
    flash, then memory-efficient, then math), within the kernels ``torch.backends.cuda`` leaves enabled."""
    head, half = query.shape[-1], query.dtype in (torch.float16, torch.bfloat16)
    flags = torch.backends.cuda
    if flags.flash_sdp_enabled() and half and mask is None and head <= 256 and head % 8 == 0 and query.dim() == 4:
        return _FLASH
    aligned = head % (8 if half else 4) == 0
    if flags.mem_efficient_sdp_enabled() and aligned and query.dtype in (torch.float16, torch.bfloat16, torch.float32):
        return _EFFICIENT
    return _MATH


def _attention(torch: Any, chosen: Callable[[int], None]) -> Callable[..., Any]:
    """``scaled_dot_product_attention`` as CUDA runs it (autocast has cast its inputs already): the kernel
    CUDA picks, called by name (the host's composite would pick the host's kernels)."""
    aten = torch.ops.aten

    def run(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
            is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:  # fmt: skip
        choice = sdp_choice(torch, query, attn_mask)
        chosen(choice)
        if enable_gqa and key.size(-3) != query.size(-3):
            repeat = query.size(-3) // key.size(-3)
            key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
        if choice == _FLASH:
            return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, scale=scale)[0]
        if choice == _EFFICIENT:
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                attn_mask = torch.where(attn_mask, 0.0, float("-inf")).to(query.dtype)
            grads = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            out = aten._scaled_dot_product_efficient_attention(
                query, key, value, attn_mask, grads, dropout_p, is_causal, scale=scale
            )
            return out[0]
        return aten._scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)[
            0
        ]

    return run


def _dropout(torch: Any) -> Callable[..., Any]:
    """``dropout`` as CUDA runs it: in training, ``native_dropout``, whose mask is one byte an element (the
    host's composite keeps a mask of the input's dtype)."""

    def run(tensor: Any, p: float, train: bool) -> Any:
        if not train or p == 0 or tensor.numel() == 0:
            return tensor
        if p == 1:
            return tensor * 0.0
        return torch.ops.aten.native_dropout(tensor, p, True)[0]

    return run


@contextlib.contextmanager
def kernels_like_cuda(chosen: Callable[[int], None]) -> Iterator[None]:
    """Within: ``scaled_dot_product_attention`` and ``dropout`` on host tensors run as on CUDA (registered
    over the host's composites at its autograd key; ``chosen`` hears each attention kernel picked), and
    ``Module.cuda()`` leaves a model where it is."""
    import torch

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a registration over the composite says so
        library.impl("scaled_dot_product_attention", _attention(torch, chosen), "AutogradCPU")
        library.impl("dropout", _dropout(torch), "AutogradCPU")
    module_cuda = torch.nn.Module.cuda
    torch.nn.Module.cuda = lambda self, device=None: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.cuda = module_cuda  # type: ignore[method-assign]
        library._destroy()


@contextlib.contextmanager
def foreach_like_cuda() -> Iterator[None]:
    """Optimizers pick their ``foreach`` implementation for fake host tensors, as for CUDA tensors."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.optim import optimizer

    devices = optimizer._get_foreach_kernels_supported_devices
    optimizer._get_foreach_kernels_supported_devices = lambda: [*devices(), "cpu"]
    optimizer._foreach_supported_types.append(FakeTensor)
    try:
        yield
    finally:
        optimizer._foreach_supported_types.remove(FakeTensor)
        optimizer._get_foreach_kernels_supported_devices = devices
