"""Memory savers: recompute activations in the backward pass, or keep them on the host; for a
block (``remat``) or every matching block of a model in place (``remat_model``).

Each framework's own mechanism does the work, through its adapter (its ``savers`` topic).
Which mechanism per framework and policy, and why dropout replays: docs/guides/memory-savers.md.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable
from typing import Any, TypeVar

from unimem import registry
from unimem.errors import ConfigError

__all__ = ["POLICIES", "offload", "remat", "remat_model"]

T = TypeVar("T")

# What each policy keeps from the forward pass for the backward pass.
POLICIES: dict[str, str] = {
    "full": "fn's inputs only; every activation inside is recomputed",
    "matmuls": "the outputs of matrix products, convolutions (and fused attention); the rest is recomputed",
    "offload": "activations on the host, copied back for the backward pass",
}


def _policy(policy: object) -> str:
    choices = ", ".join(repr(name) for name in POLICIES)
    if not isinstance(policy, str) or policy.strip().lower() not in POLICIES:
        raise ConfigError("policy", f"expected one of {choices}, got {policy!r}")
    return policy.strip().lower()


def _framework(backend: object, obj: object = None, parameter: str = "fn") -> str:
    """The framework a saver is for: ``obj``'s own where it is a framework object, else the action
    rule (configured, else the one imported). A ``backend`` that contradicts ``obj`` is refused."""
    owner = registry.framework_of_object(obj)
    if owner is not None:
        if backend is not None and registry.canonical_name(backend) != owner:
            raise ConfigError(
                "backend",
                f"{parameter} is a {owner} object ({type(obj).__name__}) but backend={backend!r}; "
                f"pass backend={owner!r} or leave it out",
            )
        return owner
    name = registry.resolve(backend, "action")
    if name is None:  # an action always names one or raises; kept for the type checker
        raise ConfigError("backend", "pass backend= the framework the block runs in")
    return name


def remat(fn: T, policy: str = "full", backend: str | None = None) -> T:
    """``fn`` wrapped so the backward pass recomputes, or fetches from the host, what it would keep.

    Call the result where ``fn`` was called: the same outputs and gradients, dropout included. A
    framework object stays one: a ``torch.nn.Module`` comes back as an ``nn.Module`` (its
    ``state_dict()`` keys unchanged, its ``named_parameters()`` as torch's ``checkpoint_wrapper``
    names them), a Keras layer as a Keras layer, a Flax module class as the class ``nn.remat`` makes.
    Each framework's mechanism per policy, and what a saver costs: [Memory savers](../guides/memory-savers.md).

    Args:
        fn: The block: a function, a ``torch.nn.Module``, a Keras layer or model, a Flax module class,
            any differentiable callable.
        policy: ``"full"`` (default; keep ``fn``'s inputs only), ``"matmuls"`` or ``"offload"``.
        backend: A framework name or alias, or None (default): ``fn``'s own framework where it is a
            framework object, else the one configured, else the one imported.

    Returns:
        ``fn`` with the saver: a module, layer or module class for one, else a function named as ``fn``.

    Raises:
        ConfigError: ``fn`` is not callable, ``policy`` is none of the three, or ``backend`` is unknown,
            undecided or not ``fn``'s framework.
        UnsupportedFeature: The framework cannot do ``policy`` (the message names the nearest alternative),
            or ``fn`` draws random numbers no recomputation can replay (the message names the operation and
            the policy that works; TensorFlow: in the backward pass).
        BackendUnavailable: The framework is not installed.

    Example:
        ```python
        model.blocks[0] = unimem.remat(model.blocks[0], "matmuls")  # still an nn.Module
        loss = model(x).sum()
        loss.backward()
        ```
    """
    if not callable(fn):
        raise ConfigError("fn", f"expected the block to recompute (a function, module or layer), got {fn!r}")
    key = _policy(policy)
    wrapped: T = registry.get_backend(_framework(backend, fn)).savers.remat(fn, key)
    return wrapped


Match = type | tuple[type, ...] | str | Callable[[Any], bool]


def _matcher(match: object) -> Callable[[Any], bool]:
    """``match`` as a predicate on a submodule: a class or tuple of classes (``isinstance``), a class
    name (the submodule's class's ``__name__``), or a predicate itself."""
    if isinstance(match, type) or (
        isinstance(match, tuple) and match and all(isinstance(item, type) for item in match)
    ):
        classes = match
        return lambda module: isinstance(module, classes)
    if isinstance(match, str) and match.strip():
        name = match.strip()
        return lambda module: type(module).__name__ == name
    if callable(match):
        predicate: Callable[[Any], bool] = match
        return lambda module: bool(predicate(module))
    raise ConfigError(
        "match", f"expected a class, a tuple of classes, a class name or a predicate on a submodule, got {match!r}"
    )


def remat_model(model: Any, policy: str = "full", *, match: Match, backend: str | None = None) -> int:
    """Every submodule of ``model`` that ``match`` picks, saved in place with ``policy``; how many were.

    One call for a whole model, as torch's ``apply_activation_checkpointing``: torch replaces each
    picked submodule by its ``unimem.remat`` module (``state_dict()`` keys unchanged); Keras runs each
    picked layer's ``call`` under the saver. A picked submodule's own submodules are not looked at
    (nested matches are saved once), the model itself is never picked, and one saved before gets the
    new policy. Works under ``torch.compile``. Flax builds submodules from their classes when the model
    runs: wrap the block's class instead (``Block = unimem.remat(Block, policy)``, Flax's ``nn.remat``).

    Args:
        model: A ``torch.nn.Module`` or a Keras layer or model.
        policy: ``"full"`` (default), ``"matmuls"`` or ``"offload"``, as for ``remat``.
        match: Which submodules: a class or tuple of classes, a class name (``"GPT2Block"``), or a
            predicate taking a submodule.
        backend: A framework name or alias, or None (default): ``model``'s own framework.

    Returns:
        How many submodules are saved (one reached twice counts once); never 0.

    Raises:
        ConfigError: ``policy`` or ``match`` is invalid, ``match`` picks no submodule of ``model`` (nothing
            changed; a misspelt class name gets the nearest one in the model), or ``model`` is not a model of
            ``backend``.
        UnsupportedFeature: The framework cannot do ``policy``, or has no models to change in place (JAX).
        BackendUnavailable: The framework is not installed.

    Example:
        ```python
        count = unimem.remat_model(model, "full", match=GPT2Block)  # every transformer block
        ```
    """
    key = _policy(policy)
    matches = _matcher(match)
    seen: set[str] = set()  # the class names of the submodules looked at, for a misspelt name

    def picks(module: Any) -> bool:
        seen.add(type(module).__name__)
        return matches(module)

    count = registry.get_backend(_framework(backend, model, "model")).savers.remat_model(model, key, picks)
    if count == 0:
        raise ConfigError(
            "match",
            f"{match!r} picked no submodule of the model; {_did_you_mean(match, seen)}pass the class of its "
            "repeated block (the transformer layer, the residual block), a tuple of classes, a class name, or a "
            "predicate",
        )
    return count


def _did_you_mean(match: object, names: set[str]) -> str:
    """``"did you mean 'Block'? "`` where ``match`` is a class name close to one of ``names`` (case aside),
    else ``""``."""
    if not isinstance(match, str):
        return ""
    by_lower = {name.lower(): name for name in sorted(names)}
    close = difflib.get_close_matches(match.strip().lower(), list(by_lower), n=1)
    return f"did you mean {by_lower[close[0]]!r}? " if close else ""


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
