"""Helpers of the trainers' integration tests (Lightning, Hugging Face, accelerate)."""

from __future__ import annotations

import importlib.util

import pytest


def need_package(name: str) -> None:
    """Skip when the top-level package ``name`` is not installed (found without importing it: the test
    process imports no framework). The ``test`` extra installs every one of them."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")


# For a test's script (a fresh process, torch imported): a device emulated for a tiny model. ``device(model,
# size)`` runs where a forward pass of ``size`` samples raises torch's out-of-memory error: above CAP, and above
# CAP - 1 where (``state=True``) an optimizer holds state made by a step of ``size`` or more (a fit makes its
# state in its first step, inside the pool that step's activations left: its second step meets that pool split),
# or where (``grads=True``) the model holds gradients (added up over an accumulation). ``sizes``: every forward.
EMULATED_DEVICE = """
    import weakref
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    CAP = 24
    sizes = []
    made = weakref.WeakKeyDictionary()  # optimizer -> the batch of the forward pass when a step made its state
    stateless = weakref.WeakSet()

    def _before_step(optimizer, args, kwargs):
        if not optimizer.state:
            stateless.add(optimizer)

    def _after_step(optimizer, args, kwargs):  # Lightning's step runs the forward pass inside (its closure)
        if optimizer in stateless and optimizer.state:
            made[optimizer] = sizes[-1]
        stateless.discard(optimizer)

    register_optimizer_step_pre_hook(_before_step)
    register_optimizer_step_post_hook(_after_step)

    def device(model, size, state=True, grads=False):
        sizes.append(size)
        split = state and any(at >= size for optimizer, at in made.items() if optimizer.state)
        held = grads and any(p.grad is not None for p in model.parameters())
        if size > CAP - (1 if split or held else 0):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
"""

# For a test's script: ``shaped(module, name)`` makes the batch search that ``module`` (an integration) calls
# by ``name`` read a GPT-2-like step on a 24 GiB cap (0.5 GB in use before, 1.533 GB fixed, 1.683 GB a sample:
# the figures a GPU's search reads, which the CPU has none of) and count every call of its step in ``calls``.
SHAPED_SEARCH = """
    calls = []

    def shaped(module, name):
        real = getattr(module, name)

        def search(step, **settings):
            def counted(size):
                calls.append(size)
                step(size)

            settings.update(measure=lambda: int((0.5 + 1.533 + 1.683 * sizes[-1]) * 1e9), limit=24 << 30,
                            baseline=int(0.5e9), progress=False)
            return real(counted, **settings)

        setattr(module, name, search)
"""
