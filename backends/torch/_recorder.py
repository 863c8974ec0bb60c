"""Every allocation a torch step makes under fake tensors, in order, with the part of the
breakdown each one is.

``Recorder`` is a dispatch mode above ``FakeTensorMode``: after each operator it looks at the
storages of the outputs (and of arguments an operator resized) and records a new storage as an
allocation of its bytes; a finalizer on the storage records its free. The storages hold no data,
so nothing of the step's memory is allocated.

Which part an allocation is, from when it was made and whether it outlived that moment:

- made while the factory built the model and still alive after: parameters (and buffers);
- made in an optimizer's ``step()`` and alive when it returned: optimizer state;
- made in a backward pass and alive when it ended: gradients;
- made elsewhere in the step (the forward pass) and alive when the next backward pass (or the
  step) began: activations kept for the backward pass, and the inputs;
- anything freed before then: temporaries. Workspaces are added by the caller.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from unimem.step_estimates import Trace

__all__ = ["BACKWARD", "BUILD", "FORWARD", "OPTIMIZER", "Phases", "categorise", "make_recorder"]

BUILD, FORWARD, BACKWARD, OPTIMIZER = "build", "forward", "backward", "optimizer"
# What an allocation alive at the end of its phase is.
_SURVIVOR = {BUILD: "parameters", FORWARD: "activations", BACKWARD: "gradients", OPTIMIZER: "optimizer"}


def _dispatch_mode() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


class Phases:
    """The phase the step is in (a stack: a backward pass inside a step, a step inside a phase) and, per
    phase instance, the allocations made in it and still alive."""

    def __init__(self) -> None:
        self.stack: list[tuple[str, int]] = [(BUILD, 0)]
        self.count = 0
        self.live: dict[int, set[int]] = {0: set()}
        self.phase_of: dict[int, str] = {0: BUILD}
        self.survived: set[int] = set()

    @property
    def current(self) -> tuple[str, int]:
        return self.stack[-1]

    def _close(self, instance: int) -> None:
        self.survived |= self.live.pop(instance, set())

    def _open(self, phase: str) -> tuple[str, int]:
        self.count += 1
        self.live[self.count] = set()
        self.phase_of[self.count] = phase
        return phase, self.count

    def push(self, phase: str) -> None:
        """Enter ``phase``: what the phase we leave made and kept survives it."""
        self._close(self.stack[-1][1])
        self.stack.append(self._open(phase))

    def pop(self) -> None:
        """Leave the current phase; the one it interrupted starts a fresh instance."""
        self._close(self.stack.pop()[1])
        phase = self.stack.pop()[0]
        self.stack.append(self._open(phase))

    def restart(self, phase: str) -> None:
        """End every phase open and start ``phase`` afresh (a step begins)."""
        while self.stack:
            self._close(self.stack.pop()[1])
        self.stack.append(self._open(phase))


def _storages(tree: Any, torch: Any) -> list[Any]:
    from torch.utils._pytree import tree_flatten

    found = []
    for leaf in tree_flatten(tree)[0]:
        if isinstance(leaf, torch.Tensor):
            try:
                found.append(leaf.untyped_storage())
            except (RuntimeError, NotImplementedError):  # a tensor with no storage (sparse, nested)
                continue
    return found


def _written(func: Any, args: Any, kwargs: dict[str, Any]) -> list[Any]:
    """The arguments ``func`` writes into (in place, ``out=``): one may have been resized."""
    schema = func._schema.arguments
    if not any(getattr(arg, "is_write", False) for arg in schema):
        return []
    found = [value for value, arg in zip(args, schema, strict=False) if getattr(arg, "is_write", False)]
    return found + [kwargs[arg.name] for arg in schema if getattr(arg, "is_write", False) and arg.name in kwargs]


def make_recorder(trace: Trace, phases: Phases) -> Any:
    """A ``Recorder`` dispatch mode writing into ``trace``, the allocations' phases followed in ``phases``."""
    import torch

    class Recorder(_dispatch_mode()):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.known: dict[int, tuple[weakref.ref[Any], int, int]] = {}  # id(storage) -> (ref, key, bytes)
            self.next_key = 0
            self.phase_key: dict[int, tuple[str, int]] = {}
            self.ops: set[str] = set()
            self.on_op: list[Callable[[Any], None]] = []

        def allocate(self, nbytes: int, category: str | None = None) -> int:
            """Record an allocation the dispatcher does not see (a library's workspace); returns its key."""
            self.next_key += 1
            key = self.next_key
            trace.events.append((key, nbytes))
            if category is None:
                phase, instance = phases.current
                phases.live[instance].add(key)
                self.phase_key[key] = (phase, instance)
            else:
                trace.categories[key] = category
            return key

        def _freed(self, ident: int, key: int) -> None:
            entry = self.known.get(ident)
            if entry is not None and entry[1] == key:
                del self.known[ident]
            trace.events.append((key, 0))
            owner = self.phase_key.get(key)
            if owner is not None:
                phases.live.get(owner[1], set()).discard(key)

        def _see(self, storage: Any) -> None:
            nbytes = int(storage.nbytes())
            ident = id(storage)
            entry = self.known.get(ident)
            if entry is not None and entry[0]() is storage:
                if entry[2] == nbytes:
                    return
                self._freed(ident, entry[1])  # resized: the old block goes, a new one comes
            if nbytes <= 0:
                return
            key = self.allocate(nbytes)
            self.known[ident] = (weakref.ref(storage, self._finalizer(ident, key)), key, nbytes)

        def _finalizer(self, ident: int, key: int) -> Callable[[Any], None]:
            return lambda _: self._freed(ident, key)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            self.ops.add(func.__name__.split(".")[0])
            for hook in self.on_op:
                hook(func)
            written = _written(func, args, kwargs)
            for storage in _storages((out, written), torch):
                self._see(storage)
            return out

    return Recorder()


def categorise(trace: Trace, recorder: Any, phases: Phases) -> None:
    """Write each recorded allocation's part into ``trace.categories`` (workspaces already have theirs)."""
    phases.restart(FORWARD)  # what is alive at the end survived its phase
    for key, (phase, _instance) in recorder.phase_key.items():
        trace.categories.setdefault(key, _SURVIVOR[phase] if key in phases.survived else "temporaries")
