"""Helpers of the trainers' integration tests (Lightning, Hugging Face, accelerate)."""

from __future__ import annotations

import importlib.util

import pytest


def need_package(name: str) -> None:
    """Skip when the top-level package ``name`` is not installed (found without importing it: the test
    process imports no framework). The ``test`` extra installs every one of them."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
