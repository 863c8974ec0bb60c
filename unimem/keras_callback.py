"""The Keras callback's original import path; it lives in ``unimem.integrations.keras``.

Importing this module imports Keras (``import unimem`` does not)::

    from unimem.keras_callback import MemoryCallback
"""

from __future__ import annotations

from unimem.integrations.keras import MemoryCallback, keras_backend

__all__ = ["MemoryCallback", "keras_backend"]
