"""The ``covers`` markers the matrix generator reads are well-formed literals naming real cells."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from unimem.registry import BACKENDS
from unimem.support import FEATURES

TESTS = Path(__file__).resolve().parent


def _covers_calls() -> list[tuple[str, int, ast.Call]]:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.is_relative_to(TESTS / "gpu"):
            continue  # GPU evidence comes from the recorded run, not these markers
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "covers":
                found.append((path.name, node.lineno, node))
    return found


def test_every_covers_argument_is_a_literal_backend_feature_cell():
    calls = _covers_calls()
    assert calls, "no covers markers found"
    bad = []
    for name, line, call in calls:
        if call.keywords or not call.args:
            bad.append(f"{name}:{line}: covers() takes cells as positional string literals")
        for arg in call.args:
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                bad.append(f"{name}:{line}: {ast.unparse(arg)} is not a string literal")
                continue
            backend, sep, feature = arg.value.partition(":")
            if not sep or backend not in BACKENDS or feature not in FEATURES:
                bad.append(f"{name}:{line}: {arg.value!r} is not 'backend:feature'")
    assert bad == []


def test_every_backend_has_cpu_evidence():
    cells = {arg.value for _, _, call in _covers_calls() for arg in call.args if isinstance(arg, ast.Constant)}
    for backend in ("torch", "tensorflow", "jax", "nvml"):
        assert any(cell.startswith(f"{backend}:") for cell in cells), backend


@pytest.mark.slow
def test_the_matrix_generator_sees_every_cell_claimed_here():
    from unimem.cli import matrix

    claimed = {arg.value for _, _, call in _covers_calls() for arg in call.args if isinstance(arg, ast.Constant)}
    seen = set(matrix.collect_evidence(TESTS.parent).cpu)
    assert claimed - seen == set()
