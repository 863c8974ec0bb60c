"""Nested containers of arrays (dicts, lists, tuples, named tuples) walked without a framework.

Used by the precision helpers of frameworks that have no tree utilities of their own
(JAX has ``jax.tree_util``). A leaf module: it imports nothing from unimem, so backends
and the front can both import it without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["map_leaves", "tree_leaves"]


def map_leaves(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` with ``fn`` applied to every leaf; dicts, lists and tuples (named ones
    too) keep their type, ``None`` stays ``None``."""
    if tree is None:
        return None
    if isinstance(tree, dict):
        return type(tree)((key, map_leaves(fn, value)) for key, value in tree.items())
    if isinstance(tree, list):
        return [map_leaves(fn, item) for item in tree]
    if isinstance(tree, tuple):
        items = [map_leaves(fn, item) for item in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    return fn(tree)


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of ``tree`` in ``map_leaves`` order, ``None`` left out."""
    found: list[Any] = []

    def collect(leaf: Any) -> Any:
        found.append(leaf)
        return leaf

    map_leaves(collect, tree)
    return found
