"""The public face is written once: the lazy table, the type checkers' import block and
``__all__`` in ``unimem/__init__.py`` name the same things, and every name resolves."""

from __future__ import annotations

import ast
import importlib
import importlib.util

import pytest
from conftest import REPO

import unimem

INIT = REPO / "unimem" / "__init__.py"


def _typing_block() -> dict[str, str]:
    """``{name: module}`` of the imports under ``if TYPE_CHECKING:`` (``typing`` itself left out)."""
    names: dict[str, str] = {}
    for node in ast.parse(INIT.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module != "typing":
                    module = stmt.module or ""
                    for alias in stmt.names:
                        names[alias.asname or alias.name] = module.removeprefix("unimem.")
    return names


def test_all_names_the_lazy_table_exactly():
    assert sorted(unimem.__all__) == sorted(unimem._LAZY), "__all__ and the lazy table disagree"
    assert len(set(unimem.__all__)) == len(unimem.__all__), "__all__ names a name twice"


def test_the_typing_block_imports_each_name_from_its_lazy_module():
    assert _typing_block() == unimem._LAZY, "the TYPE_CHECKING imports and the lazy table disagree"


@pytest.mark.parametrize("name", sorted(unimem._LAZY))
def test_every_public_name_resolves_from_the_module_the_table_names(name):
    value = getattr(unimem, name)
    module = importlib.import_module(f"unimem.{unimem._LAZY[name]}")
    assert getattr(module, name) is value


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="no_such_name"):
        unimem.no_such_name  # noqa: B018


def test_the_console_script_and_the_named_submodules_resolve():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "unimem"]
    assert callable(script.load())
    for name in ("unimem.testing", "unimem.integrations.keras", "unimem.__main__"):
        assert importlib.util.find_spec(name) is not None, name


def test_a_path_the_api_reference_named_before_a_move_still_imports():
    from unimem import loss_scaling
    from unimem.training import loss_scaling as older

    assert older.LossScaler is unimem.LossScaler is loss_scaling.LossScaler
    assert older.__all__ == loss_scaling.__all__
    assert all(getattr(older, name) is getattr(loss_scaling, name) for name in older.__all__)
