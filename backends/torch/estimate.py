"""``unimem.estimate_memory`` for torch: the user's step run under fake tensors, every allocation
recorded (``_recorder``), and, for a CUDA device, what CUDA does differently done on the host
(``_cuda_target``). Nothing of the step's memory is allocated and CUDA is never started.

The step is a factory: ``build()`` makes the model and the optimizer and returns ``step(n)``, one
training step at batch size ``n`` (inputs made inside it). The estimate calls ``build()`` under
fake tensors, then ``step(n)`` twice; the second call is the one measured, as a real run's second
step would be (the optimizer's state then exists).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from unimem.backends.base import Estimate
from unimem.backends.torch import _cuda_target as cuda
from unimem.backends.torch._cuda_autocast import autocast_like_cuda
from unimem.backends.torch._recorder import BACKWARD, FORWARD, OPTIMIZER, Phases, categorise, make_recorder

from unimem.errors import ConfigError, UnsupportedFeature
from unimem.step_estimates import Measured, Plan, Trace

__all__ = ["TorchEstimate"]

# Operators cuBLAS runs (a thread's first one allocates its workspace), and those that go through cuBLASLt.
_CUBLAS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "addr", "dot", "_addmm_activation"})
_CUBLASLT = frozenset({"addmm", "_addmm_activation"})
_CONVOLUTIONS = frozenset({"convolution", "_convolution", "convolution_backward", "cudnn_convolution"})
_SDP_NAMES = {
    0: "the math fallback (attention weights materialised)",
    1: "flash attention",
    2: "memory-efficient attention",
}


def _fake_mode() -> Any:
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError as exc:  # a torch without fake tensors
        import torch

        raise UnsupportedFeature(
            "torch",
            "estimate",
            f"torch {torch.__version__} has no FakeTensorMode (torch._subclasses.fake_tensor): "
            "unimem.estimate_memory needs torch 2.1 or later",
        ) from exc
    return FakeTensorMode()


def _copies_stay_fake() -> Any:
    """A function mode in which ``copy.deepcopy`` of a fake tensor is a clone made under the same fake mode
    (``nn.TransformerEncoder`` deep-copies its layer): torch's own deep copy of one would make it under a new
    mode, which the estimate's cannot use."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.overrides import TorchFunctionMode

    class FakeCopies(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.Tensor.__deepcopy__ and isinstance(args[0], FakeTensor):
                tensor, memo = args
                if id(tensor) not in memo:
                    with torch.no_grad():
                        copied = tensor.clone()
                    copied.requires_grad_(tensor.requires_grad)
                    if getattr(tensor, "_is_param", False):
                        copied._is_param = True  # still an nn.Parameter to the module it goes to
                    memo[id(tensor)] = copied
                return memo[id(tensor)]
            return func(*args, **(kwargs or {}))

    return FakeCopies()


@contextlib.contextmanager
def _modules_built(torch: Any) -> Iterator[list[Any]]:
    """Within: every ``nn.Module`` that gets a submodule or a parameter is seen; yields (filled on exit) the
    top-level ones still alive, those no other module took as a submodule. Modules are held weakly: one the
    factory drops (a layer ``nn.TransformerEncoder`` copied) is freed as in a real run."""
    seen: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
    children: set[int] = set()
    found: list[Any] = []

    def child(module: Any, name: str, submodule: Any) -> None:
        seen.setdefault(id(module), module)
        if submodule is not None:
            children.add(id(submodule))
            seen.setdefault(id(submodule), submodule)

    def parameter(module: Any, name: str, param: Any) -> None:
        seen.setdefault(id(module), module)

    hooks = torch.nn.modules.module
    handles = [hooks.register_module_module_registration_hook(child)]
    handles.append(hooks.register_module_parameter_registration_hook(parameter))
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()
        found += [weakref.ref(module) for key, module in list(seen.items()) if key not in children]


def _apply_saver(models: list[Any], plan: Plan) -> int:
    """The saver on every top-level model the factory built, as ``unimem.remat_model`` applies it."""
    if plan.save_blocks is None:
        raise ConfigError("saver", f"{plan.saver!r} came without the front's saver; call unimem.estimate_memory")
    saved = 0
    for model in filter(None, (ref() for ref in models)):
        try:
            saved += plan.save_blocks(model)
        except ConfigError as exc:
            if exc.parameter != "match":
                raise
    if not saved:
        raise ConfigError(
            "match",
            f"{plan.match!r} picked no submodule of the model(s) build() made; pass the class of the repeated "
            "block (the transformer layer, the residual block), its class name, or a predicate",
        )
    return saved


class _Run:
    """One estimate's state: the trace, the phases, what CUDA would add, and what was assumed."""

    def __init__(self, torch: Any, cuda_target: bool, capability: tuple[int, int] | None) -> None:
        self.torch = torch
        self.cuda = cuda_target
        self.trace = Trace(caching=cuda_target)
        self.phases = Phases()
        self.notes: list[str] = []
        self.unseen: list[str] = []
        self.workspace_threads: set[tuple[str, str]] = set()
        self.cublas, how = cuda.cublas_workspace(capability)
        self.cublaslt = cuda.cublaslt_workspace(self.cublas)
        self.workspace_note = how
        self.recorder = make_recorder(self.trace, self.phases)
        if cuda_target:
            self.recorder.on_op.append(self.workspaces)
        self.kernels: set[str] = set()
        self.clear_cache: Callable[[], None] = lambda: None

    def chosen(self, kernel: int) -> None:
        """Note the attention kernel CUDA would run."""
        self.kernels.add(_SDP_NAMES[kernel])

    def workspaces(self, func: Any) -> None:
        """cuBLAS's (and cuBLASLt's) workspace at a thread's first matrix product: the step's thread, or
        autograd's CUDA thread in a backward pass."""
        name = func.__name__.split(".")[0]
        if name not in _CUBLAS:
            return
        thread = "backward" if self.phases.current[0] == BACKWARD else "step"
        for library, size, ops in (("cublas", self.cublas, _CUBLAS), ("cublaslt", self.cublaslt, _CUBLASLT)):
            if name in ops and (thread, library) not in self.workspace_threads:
                self.workspace_threads.add((thread, library))
                self.recorder.allocate(size, "workspace")

    @contextlib.contextmanager
    def phases_followed(self, autocast_off: bool) -> Iterator[None]:
        """Within: backward passes and optimizer steps mark their phases; a backward pass runs with autocast
        off and its weight cache emptied (as a loop leaves autocast before ``backward()``)."""
        torch = self.torch
        backward, grad = torch.autograd.backward, torch.autograd.grad

        def passing(original: Callable[..., Any]) -> Callable[..., Any]:
            def run(*args: Any, **kwargs: Any) -> Any:
                self.phases.push(BACKWARD)
                context: Any = contextlib.nullcontext()
                if autocast_off:
                    self.clear_cache()
                    torch.clear_autocast_cache()
                    context = torch.autocast("cpu", enabled=False)
                try:
                    with context:
                        return original(*args, **kwargs)
                finally:
                    self.phases.pop()

            return run

        from torch.optim import optimizer as hooks

        handles = [hooks.register_optimizer_step_pre_hook(lambda *_: self.phases.push(OPTIMIZER))]
        handles.append(hooks.register_optimizer_step_post_hook(lambda *_: self.phases.pop()))
        torch.autograd.backward, torch.autograd.grad = passing(backward), passing(grad)
        try:
            yield
        finally:
            torch.autograd.backward, torch.autograd.grad = backward, grad
            for handle in handles:
                handle.remove()

    def describe(self) -> None:
        """The notes on what was assumed, and what the figures cannot see, from the operators that ran."""
        ops = self.recorder.ops
        if not self.cuda:
            self.notes.append("host memory: exact bytes of every tensor (no caching allocator)")
            return
        self.notes.append(
            "a CUDA device planned on the host: fake host tensors, CUDA's allocator, autocast and kernels"
        )
        if self.workspace_threads:
            threads = len({thread for thread, _ in self.workspace_threads})
            sizes = f"{self.cublas / 2**20:.1f} MiB (+ {self.cublaslt / 2**20:.1f} MiB cuBLASLt)"
            self.notes.append(
                f"cuBLAS workspaces: {sizes} for each of {threads} thread(s) running matrix products "
                f"({self.workspace_note})"
            )
        for kernel in sorted(self.kernels):
            self.notes.append(f"scaled_dot_product_attention: {kernel}, as CUDA picks it for these inputs")
        if self.kernels - {_SDP_NAMES[0]}:
            self.unseen.append(
                "the fused attention kernels' own scratch buffers in the backward pass (a float32 buffer of about "
                "the query's size per layer, freed at once): counted only if the peak falls inside one"
            )
        if ops & _CONVOLUTIONS:
            self.unseen.append(
                "cuDNN's convolution workspaces (the algorithm, and its workspace, is chosen on the device; "
                "freed after each convolution): counted only if the peak falls inside one"
            )
        self.unseen.append("the CUDA context and the libraries' memory outside torch's allocator: not counted")


@contextlib.contextmanager
def _cuda_on_host(run: _Run) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        run.clear_cache = stack.enter_context(autocast_like_cuda())
        stack.enter_context(cuda.kernels_like_cuda(run.chosen))
        stack.enter_context(cuda.foreach_like_cuda())
        yield


def _precision(torch: Any, plan: Plan) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """The context a step's call runs in: autocast on the host (CUDA's lists where CUDA is planned)."""
    if plan.precision is None:
        return contextlib.nullcontext
    if plan.precision == "fp32":
        return lambda: torch.autocast("cpu", enabled=False)
    dtype = torch.bfloat16 if plan.precision == "bf16" else torch.float16
    return lambda: torch.autocast("cpu", dtype=dtype)


def _capability() -> tuple[int, int] | None:
    """The GPU's compute capability from NVML (which starts no CUDA context); None without one."""
    from unimem.backends.torch.precision import _nvml_compute_capability

    return _nvml_compute_capability(0)


class TorchEstimate(Estimate):
    """torch in ``unimem.estimate_memory`` (``EstimateTopic``): a factory's step run under fake tensors."""

    def estimate_size(self, step: Any, size: int, plan: Plan) -> Measured:
        import torch

        if not callable(step):
            raise ConfigError(
                "step", f"expected build(), a function making the model and returning step(n); got {step!r}"
            )
        device = plan.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device not in ("cuda", "cpu"):
            raise ConfigError("device", f"torch: expected 'cuda' or 'cpu', got {device!r}")
        run = _Run(torch, device == "cuda", _capability() if device == "cuda" else None)
        precision = _precision(torch, plan)
        with contextlib.ExitStack() as stack:
            if run.cuda:
                stack.enter_context(_cuda_on_host(run))
            stack.enter_context(_fake_mode())
            stack.enter_context(_copies_stay_fake())
            if run.cuda:
                stack.enter_context(cuda.device_to_host())
            stack.enter_context(run.recorder)
            stack.enter_context(run.phases_followed(plan.precision is not None))
            with _modules_built(torch) as models:
                made = step()
            if not callable(made):
                raise ConfigError("step", f"build() returned {made!r}; it must return step(n), one training step")
            if plan.saver is not None:
                run.notes.append(f"saver {plan.saver!r} on {_apply_saver(models, plan)} block(s)")
            del models
            for call in range(2):
                run.phases.restart(FORWARD)
                if call == 1:
                    run.trace.window = len(run.trace.events)
                with precision():
                    made(size)
                run.clear_cache()
        categorise(run.trace, run.recorder, run.phases)
        run.describe()
        return Measured(size, device, trace=run.trace, notes=tuple(run.notes), unseen=tuple(run.unseen))
