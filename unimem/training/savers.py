"""Memory savers: recompute activations in the backward pass, or keep them on the host.

``remat(fn, policy)`` wraps a block so that the backward pass recomputes (or fetches from
host memory) the activations it would otherwise keep on the device from the forward
pass to the backward pass; ``offload()`` is the context form of host offload where the
framework has one. Each framework's own mechanism does the work, through its adapter
(``Backend.remat``, ``Backend.offload``):

- torch: ``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)``, with a
  selective-checkpoint policy for ``"matmuls"``; ``torch.autograd.graph.save_on_cpu``
  for ``"offload"`` and ``offload()``.
- JAX: ``jax.checkpoint(fn, policy=...)`` with ``nothing_saveable``, ``dots_saveable``
  or ``offload_dot_with_no_batch_dims``; offload is a policy only.
- TensorFlow: ``tf.recompute_grad`` for ``"full"``, with Keras dropout replayed (below);
  ``"matmuls"`` and ``"offload"`` are unsupported.

Randomness replays: the gradients with a saver equal those without it. torch restores
its RNG state before recomputing; ``jax.random`` takes explicit keys. TensorFlow's
``tf.recompute_grad`` and ``keras.RematScope`` draw a new dropout mask when recomputing,
so unimem restores the seed generators of the Keras layers ``fn`` reaches before the
recomputation, and compares the recomputed output with the forward's: randomness it
cannot replay is an error in the backward pass, never silently wrong gradients.

Whether a saver saves memory depends on the model: measure it (``unimem.track``).
``compat_matrix.md`` (rows ``remat.*``) says what each framework does.
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

    Call the result where ``fn`` was called; its inputs, outputs and gradients are the
    same. The memory of the activations ``fn`` keeps for the backward pass is traded for
    time: ``"full"`` runs ``fn``'s forward pass twice.

    - ``"full"``: keep ``fn``'s inputs only; recompute everything inside. torch:
      ``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)``; JAX:
      ``jax.checkpoint(fn, policy=nothing_saveable)``; TensorFlow: ``tf.recompute_grad``.
    - ``"matmuls"``: keep the outputs of matrix products (torch: ``aten.mm``, ``addmm``,
      ``bmm``, ``baddbmm`` and the scaled-dot-product attention kernels; JAX:
      ``dots_saveable``), recompute the cheap rest. Not in TensorFlow.
    - ``"offload"``: keep activations in host memory. torch: every tensor autograd saves in
      ``fn`` goes through ``save_on_cpu`` (pinned where CUDA is available), nothing is
      recomputed; JAX: dots without batch dimensions go to pinned host memory and the rest
      is recomputed. Not in TensorFlow. Offload does not promise a saving: the copies take
      time, a saved tensor still referenced elsewhere stays on the device as well, and
      buffers coming back can raise the device peak. Measure it (``unimem.track``).

    Dropout replays in every framework, so the gradients equal those without recomputation
    (within rounding). TensorFlow's own ``tf.recompute_grad`` and ``keras.RematScope`` do not
    replay it; unimem restores the seed generators of the Keras layers ``fn`` reaches (``fn``
    itself, a bound method's layer, layers in its closure or the globals it names) before
    recomputing, and checks the recomputed output against the forward's. Randomness it
    cannot replay (``tf.random.uniform``, ``tf.nn.dropout`` without a seed) is an error in
    the backward pass. In TensorFlow, positional arguments are the tensors gradients flow
    to; keyword arguments (``training=True``) pass through.

    Args:
        fn: The block: a function, a ``torch.nn.Module``, a Keras layer or model, any callable
            the framework differentiates through.
        policy: ``"full"`` (default), ``"matmuls"`` or ``"offload"``.
        backend: A framework name or alias, or None (default): the framework named to
            ``configure()``, else the one imported (an action: never guessed).

    Returns:
        A callable that runs ``fn`` with the saver.

    Raises:
        ConfigError: ``fn`` is not callable, ``policy`` is none of the three, or ``backend``
            is unknown, or (None) ambiguous or undecidable.
        UnsupportedFeature: The framework cannot do ``policy`` (feature ``remat.<policy>``);
            the message names the nearest alternative. In TensorFlow in eager mode, also from
            the backward pass when the recomputation differs from the forward pass (graph
            mode: ``tf.errors.InvalidArgumentError`` with the same message).
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
    return registry.get_backend(_framework(backend)).remat(fn, key)


def offload(backend: str | None = None) -> contextlib.AbstractContextManager[None]:
    """A context in which the activations kept for the backward pass live in host memory.

    torch only: ``torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available())``.
    Every tensor autograd saves inside the block is copied to the host and back when the
    backward pass needs it; nothing is recomputed. It does not promise a saving: the copies
    take time, a saved tensor still referenced elsewhere stays on the device as well, and
    one saved twice comes back twice. Measure it (``unimem.track``).

    JAX offloads through a ``jax.checkpoint`` policy only: use ``remat(fn, "offload")``.

    Args:
        backend: A framework name or alias, or None (default): the framework named to
            ``configure()``, else the one imported.

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
    return registry.get_backend(_framework(backend)).offload()
