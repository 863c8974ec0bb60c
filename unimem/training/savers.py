"""Memory savers: recompute activations in the backward pass, or keep them on the host.

Each framework's own mechanism does the work, through its adapter (its ``savers`` topic).
Which mechanism per framework and policy, and why dropout replays: docs/guides/memory-savers.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from unimem import registry
from unimem.errors import ConfigError

__all__ = ["POLICIES", "offload", "remat"]

# What each policy keeps from the forward pass for the backward pass.
POLICIES: dict[str, str] = {
    "full": "fn's inputs only; every activation inside is recomputed",
    "matmuls": "the outputs of matrix products (and fused attention); the rest is recomputed",
    "offload": "activations on the host, copied back for the backward pass",
}


def _policy(policy: object) -> str:
    choices = ", ".join(repr(name) for name in POLICIES)
    if not isinstance(policy, str) or policy.strip().lower() not in POLICIES:
        raise ConfigError("policy", f"expected one of {choices}, got {policy!r}")
    return policy.strip().lower()


def _framework(backend: object) -> str:
    """The framework a saver is for: the action rule (configured, else the one imported)."""
    name = registry.resolve(backend, "action")
    if name is None:  # an action always names one or raises; kept for the type checker
        raise ConfigError("backend", "pass backend= the framework the block runs in")
    return name


def remat(fn: Callable[..., Any], policy: str = "full", backend: str | None = None) -> Callable[..., Any]:
    """``fn`` wrapped so the backward pass recomputes, or fetches from the host, what it would keep.

    Call the result where ``fn`` was called: the same outputs and gradients, dropout included.
    Each framework's mechanism per policy, and what a saver costs: [Memory savers](../guides/memory-savers.md).

    Args:
        fn: The block: a function, a ``torch.nn.Module``, a Keras layer or model, any differentiable callable.
        policy: ``"full"`` (default; keep ``fn``'s inputs only), ``"matmuls"`` or ``"offload"``.
        backend: A framework name or alias, or None (default): the one configured, else the one imported.

    Returns:
        A callable that runs ``fn`` with the saver.

    Raises:
        ConfigError: ``fn`` is not callable, ``policy`` is none of the three, or ``backend`` is unknown or undecided.
        UnsupportedFeature: The framework cannot do ``policy`` (the message names the nearest alternative); TensorFlow,
            in the backward pass: randomness that cannot be replayed.
        BackendUnavailable: The framework is not installed.

    Example:
        ```python
        block = unimem.remat(model.encoder, "matmuls", backend="torch")
        loss = head(block(x)).sum()
        loss.backward()
        ```
    """
    if not callable(fn):
        raise ConfigError("fn", f"expected the block to recompute (a function, module or layer), got {fn!r}")
    key = _policy(policy)
    return registry.get_backend(_framework(backend)).savers.remat(fn, key)


def offload(backend: str | None = None) -> contextlib.AbstractContextManager[None]:
    """A context in which the activations kept for the backward pass live in host memory (torch only).

    torch's ``save_on_cpu``; JAX offloads through ``remat(fn, "offload")``. No promised saving:
    [Memory savers](../guides/memory-savers.md#what-to-know).

    Args:
        backend: A framework name or alias, or None (default): the one configured, else the one imported.

    Returns:
        A context manager; enter it around the forward pass.

    Raises:
        ConfigError: ``backend`` is unknown, or (None) ambiguous or undecidable.
        UnsupportedFeature: The framework has no such context (feature ``offload``); the
            message names the nearest alternative.
        BackendUnavailable: The framework is not installed.

    Example:
        ```python
        with unimem.offload(backend="torch"):
            loss = model(x).sum()
        loss.backward()
        ```
    """
    return registry.get_backend(_framework(backend)).savers.offload()
