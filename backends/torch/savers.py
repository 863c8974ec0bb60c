"""Memory savers for PyTorch: activation checkpointing and saved tensors kept on the host.

``TorchSavers`` is the torch adapter's ``savers`` topic; torch is imported only inside its methods,
and ``RematModule`` (the module a saved ``nn.Module`` becomes) is built on first use.

- ``full``: ``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)`` with a
  selective-checkpoint policy that recomputes every operation.
- ``matmuls``: the same, with a policy that keeps the outputs of the matrix products, the
  convolutions and the attention kernels (``create_selective_checkpoint_contexts``).
- ``offload``: ``torch.autograd.graph.save_on_cpu`` around ``fn``; nothing is recomputed.

Random numbers replay: checkpoint restores the RNG state once, at the start of the recomputation,
so the recomputation must draw exactly what the forward drew, in the same order. Every operation
that draws from torch's default generators (tagged ``nondeterministic_seeded``: dropout, bernoulli,
the attention kernels with ``dropout_p > 0``) is therefore recomputed, never kept: a kept one is
skipped in the recomputation, so every later draw, and every later dropout mask, would shift. An
operation that draws from a ``torch.Generator`` of its own is kept instead (it must not draw twice);
one that also writes into a tensor in place cannot be kept, and is refused naming ``"offload"``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from unimem.backends.base import Savers

from unimem.errors import ConfigError, UnsupportedFeature

__all__ = ["MATMUL_OPS", "TorchSavers", "draws_random_numbers"]  # and RematModule, built on first use

# aten ops whose outputs the "matmuls" policy keeps: the matrix products, the convolutions (as
# JAX's dots_saveable) and the fused attention kernels; each exists in some torch builds only.
MATMUL_OPS = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_mm",
    "_int_mm",
    "convolution",
    "_convolution",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)
# torch's own wrapper names its child so: FSDP and distributed checkpoints strip it from names already.
WRAPPED = "_checkpoint_wrapped_module"

_kept: set[Any] = set()


def _kept_packets() -> set[Any]:
    import torch

    if not _kept:
        _kept.update(getattr(torch.ops.aten, name) for name in MATMUL_OPS if hasattr(torch.ops.aten, name))
    return _kept


def _argument(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> tuple[bool, Any]:
    """``(found, value)`` of the argument ``name`` of one call of ``op``, by its schema."""
    for index, argument in enumerate(op._schema.arguments):
        if argument.name == name:
            if name in kwargs:
                return True, kwargs[name]
            return True, args[index] if index < len(args) else argument.default_value
    return False, None


def draws_random_numbers(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether this call of ``op`` draws random numbers: it is tagged ``nondeterministic_seeded``,
    and, where it takes a ``dropout_p`` (the attention kernels), that is above zero."""
    import torch

    if torch.Tag.nondeterministic_seeded not in op.tags:
        return False
    found, dropout = _argument(op, args, kwargs, "dropout_p")
    return not found or not isinstance(dropout, (int, float)) or dropout > 0


def _keep_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """The ``"matmuls"`` decision for one operation of the forward pass (see the module's docstring)."""
    from torch.utils.checkpoint import CheckpointPolicy

    if draws_random_numbers(op, args, kwargs):
        if kwargs.get("generator") is None:  # the default generator: replayed by recomputing in order
            return CheckpointPolicy.MUST_RECOMPUTE
        if op._schema.is_mutable:
            raise UnsupportedFeature(
                "torch",
                "remat.matmuls",
                f"{op} draws from a torch.Generator of its own and writes its result in place: recomputing it "
                "would draw other numbers, and keeping it would leave the tensor it writes unwritten. Use policy "
                "'offload' for this block (nothing is recomputed), or draw from torch's default generator",
            )
        return CheckpointPolicy.MUST_SAVE  # drawn once, as without a saver
    # MUST_SAVE: torch.compile may not override it; the rest may be recomputed.
    if op.overloadpacket in _kept_packets():
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


_guards: list[type] = []


def _own_generator_guard() -> Any:
    """A ``TorchFunctionMode`` for the forward pass of ``"full"``: a draw from a ``torch.Generator`` of
    its own is refused (recomputed, it would draw other numbers). A function mode sees a block's few
    torch calls, not its every kernel: it costs next to nothing, as a dispatch mode would not."""
    if not _guards:
        from torch.overrides import TorchFunctionMode

        class OwnGeneratorGuard(TorchFunctionMode):
            def __torch_function__(
                self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
            ) -> Any:
                kwargs = kwargs or {}
                if kwargs.get("generator") is not None:
                    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
                    raise UnsupportedFeature(
                        "torch",
                        "remat.full",
                        f"{name} draws from a torch.Generator of its own: recomputed, it would draw other "
                        "numbers. Use policy 'offload' (nothing is recomputed), or 'matmuls' (it keeps such a "
                        "draw when it writes no tensor in place), or draw from torch's default generator",
                    )
                return func(*args, **kwargs)

        _guards.append(OwnGeneratorGuard)
    return _guards[0]()


def _guarded_forward() -> tuple[Any, contextlib.AbstractContextManager[None]]:
    """The ``context_fn`` of ``"full"``: the guard in the forward pass, nothing in the recomputation."""
    return _own_generator_guard(), contextlib.nullcontext()


def _offload_context() -> contextlib.AbstractContextManager[None]:
    """``save_on_cpu``, pinned where CUDA is available (pinned host memory copies asynchronously)."""
    import torch

    context: contextlib.AbstractContextManager[None] = torch.autograd.graph.save_on_cpu(
        pin_memory=torch.cuda.is_available()
    )
    return context


def run(fn: Callable[..., Any], policy: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One call of ``fn(*args, **kwargs)`` under ``policy``.

    Under ``torch.compile`` the ``context_fn`` must be made here, in the traced code: dynamo takes a
    partial made in the trace, not one read from elsewhere.
    """
    if policy == "offload":
        with _offload_context():
            return fn(*args, **kwargs)
    import torch
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    if policy == "matmuls":
        context = functools.partial(create_selective_checkpoint_contexts, _keep_matmuls)
        return checkpoint(fn, *args, use_reentrant=False, context_fn=context, **kwargs)
    if torch.compiler.is_compiling():  # compiled, each recomputed random op replays its own saved RNG state
        return checkpoint(fn, *args, use_reentrant=False, **kwargs)
    return checkpoint(fn, *args, use_reentrant=False, context_fn=_guarded_forward, **kwargs)


# --- the module a saved nn.Module becomes -------------------------------------------------------


def _rename(state_dict: dict[str, Any], old: str, new: str) -> None:
    for key in [key for key in state_dict if key.startswith(old)]:
        state_dict[new + key[len(old) :]] = state_dict.pop(key)


def _drop_wrapper(module: Any, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """After ``state_dict()``: the wrapped module's keys without the wrapper's level."""
    _rename(state_dict, f"{prefix}{WRAPPED}.", prefix)


def _add_wrapper(module: Any, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """Before ``load_state_dict()``: keys saved without the wrapper reach the wrapped module."""
    _rename(state_dict, prefix, f"{prefix}{WRAPPED}.")


def _module_class() -> type:
    """``RematModule``, built once: an ``nn.Module`` that runs the module it wraps under a saver."""
    import torch

    class RematModule(torch.nn.Module):
        """``module`` run under the saver ``policy``; its ``state_dict()`` keys are the module's own.

        Attributes it lacks are the wrapped module's; ``policy`` may be changed between steps.
        """

        def __init__(self, module: torch.nn.Module, policy: str) -> None:
            super().__init__()
            setattr(self, WRAPPED, module)
            self.policy = policy
            post_hook = getattr(self, "register_state_dict_post_hook", None) or self._register_state_dict_hook
            post_hook(_drop_wrapper)
            self.register_load_state_dict_pre_hook(_add_wrapper)

        @property
        def module(self) -> torch.nn.Module:
            """The wrapped module."""
            wrapped = self._modules[WRAPPED]
            assert wrapped is not None
            return wrapped

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return run(self.module, self.policy, args, kwargs)

        def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, torch.nn.Parameter]]:
            """The names torch's ``checkpoint_wrapper`` gives: every ``_checkpoint_wrapped_module.`` taken out
            (a parent's names keep it, as there)."""
            for name, parameter in super().named_parameters(*args, **kwargs):
                yield name.replace(f"{WRAPPED}.", ""), parameter

        def __getattr__(self, name: str) -> Any:
            try:
                return super().__getattr__(name)
            except AttributeError:
                if name == WRAPPED or WRAPPED not in self.__dict__.get("_modules", {}):
                    raise
                return getattr(self.module, name)

        # A wrapped Sequential, ModuleList or ModuleDict still indexes, counts and iterates.
        def __getitem__(self, key: Any) -> Any:
            return self.module[key]  # type: ignore[index]

        def __len__(self) -> int:
            return len(self.module)  # type: ignore[arg-type]

        def __iter__(self) -> Iterator[Any]:
            return iter(self.module)  # type: ignore[call-overload]

        def extra_repr(self) -> str:
            return f"policy={self.policy!r}"

    RematModule.__module__ = __name__
    RematModule.__qualname__ = "RematModule"
    return RematModule


def __getattr__(name: str) -> Any:
    # RematModule is importable by name (pickle, torch.save) and built on first use: torch is
    # imported then, never when this module is.
    if name == "RematModule":
        cls = _module_class()
        globals()["RematModule"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _remat_module_class() -> Any:
    cls: Any = globals()["RematModule"] if "RematModule" in globals() else __getattr__("RematModule")
    return cls


# --- the topic ----------------------------------------------------------------------------------


class TorchSavers(Savers):
    """torch's memory savers (``SaversTopic``): checkpointing, selective or full, and saved tensors on the host."""

    def offload(self) -> contextlib.AbstractContextManager[None]:
        """``save_on_cpu``, pinned where CUDA is available."""
        return _offload_context()

    def remat(self, fn: Callable[..., Any], policy: str) -> Callable[..., Any]:
        """``fn`` wrapped for ``policy``: an ``nn.Module`` becomes a ``RematModule``, anything else a function."""
        import torch

        if isinstance(fn, torch.nn.Module):
            return self._wrap(fn, policy)

        def saved(*args: Any, **kwargs: Any) -> Any:
            return run(fn, policy, args, kwargs)

        return functools.update_wrapper(saved, fn, updated=())  # fn's name, not its attributes

    def _wrap(self, module: Any, policy: str) -> Any:
        cls = _remat_module_class()
        # A saved module is saved once: the new policy replaces the old.
        wrapped = cls(module.module if isinstance(module, cls) else module, policy)
        wrapped.train(module.training)
        return wrapped

    def remat_model(self, model: Any, policy: str, matches: Callable[[Any], bool]) -> int:
        """Every submodule of ``model`` that ``matches`` replaced, in place, by its ``RematModule``."""
        import torch

        if not isinstance(model, torch.nn.Module):
            raise ConfigError("model", f"expected a torch.nn.Module, got {type(model).__name__}")
        cls = _remat_module_class()
        done: dict[int, Any] = {}  # by the wrapped module's id: a module reached twice gets one wrapper

        def visit(parent: Any) -> None:
            for name, child in list(parent.named_children()):
                inner = child.module if isinstance(child, cls) else child
                if id(inner) in done:
                    setattr(parent, name, done[id(inner)])
                elif matches(inner):
                    if isinstance(child, cls):  # saved before: the new policy replaces the old
                        child.policy = policy
                        done[id(inner)] = child
                    else:
                        done[id(inner)] = self._wrap(child, policy)
                        setattr(parent, name, done[id(inner)])
                elif not isinstance(child, cls):  # below a saved module nothing is saved again
                    visit(child)

        visit(model.module if isinstance(model, cls) else model)
        return len(done)
