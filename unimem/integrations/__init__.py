"""Integrations with one framework's own API (a Keras callback, ...).

The one place in ``unimem`` that may import a framework: each module here imports its
framework at its top, so import it only where that framework is in use. ``import unimem``
imports none of them.
"""

from __future__ import annotations

__all__: list[str] = []
