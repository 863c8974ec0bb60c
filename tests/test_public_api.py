"""The public face is written once: the lazy table in ``unimem/__init__.py`` names each public
name and its module. ``__all__`` is made from it, and so is ``unimem/__init__.pyi``, which type
checkers read in place of ``__init__.py`` (``python tests/test_public_api.py`` writes it again
after the table changes). Every name resolves, and every name is in the API reference."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re

import pytest
from conftest import REPO

import unimem

STUB = REPO / "unimem" / "__init__.pyi"
STUB_HEAD = """\
# Written from the lazy table in __init__.py by `python tests/test_public_api.py`; do not edit.
# Type checkers read this file in place of __init__.py: each public name keeps its type, while
# `import unimem` loads none of them.
"""


def _member_order(name: str) -> tuple[int, str]:
    """The order the import sorter gives the names of one module: constants, classes, the rest."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def render_stub(table: dict[str, str]) -> str:
    """``unimem/__init__.pyi`` for the lazy table ``table``: each name imported from its module
    under its own name (an explicit re-export, which strict type checkers require)."""
    lines = [STUB_HEAD, "from typing import Any", ""]
    for module in sorted(set(table.values())):
        names = sorted((name for name, home in table.items() if home == module), key=_member_order)
        lines += [f"from unimem.{module} import {name} as {name}" for name in names]
    lines += ["", "__version__: str", "", "def __getattr__(name: str) -> Any: ...", ""]
    return "\n".join(lines)


def _stub_imports() -> dict[str, str]:
    """``{name: module}`` of the stub's re-exports (``typing`` itself left out)."""
    names: dict[str, str] = {}
    for node in ast.parse(STUB.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.module != "typing":
            for alias in node.names:
                assert alias.asname == alias.name, f"{alias.name} is not re-exported under its own name"
                names[alias.name] = (node.module or "").removeprefix("unimem.")
    return names


def test_all_names_the_lazy_table_exactly():
    assert sorted(unimem.__all__) == sorted(unimem._LAZY), "__all__ and the lazy table disagree"
    assert len(set(unimem.__all__)) == len(unimem.__all__), "__all__ names a name twice"


def test_the_type_checkers_stub_imports_each_name_from_its_lazy_module():
    assert _stub_imports() == unimem._LAZY, "the stub and the lazy table disagree"
    assert STUB.read_text(encoding="utf-8") == render_stub(unimem._LAZY), (
        "unimem/__init__.pyi is stale: run python tests/test_public_api.py"
    )


def test_the_stub_is_written_from_the_table():
    text = render_stub({"stats": "api", "Phase": "support", "FEATURES": "support", "parse_size": "sizes"})
    assert text.startswith(STUB_HEAD)
    assert [line for line in text.splitlines() if line.startswith("from unimem.")] == [
        "from unimem.api import stats as stats",
        "from unimem.sizes import parse_size as parse_size",
        "from unimem.support import FEATURES as FEATURES",
        "from unimem.support import Phase as Phase",
    ]


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


API_REFERENCE = REPO / "docs" / "api"
# A mkdocstrings entry of the API reference: a line ``::: unimem.module.name``.
ENTRY = re.compile(r"^:::[ \t]*(unimem(?:\.\w+)+)[ \t]*$", re.MULTILINE)


def _undocumented(public: dict[str, object], entries: list[str]) -> list[str]:
    """The names of ``public`` no entry documents: one whose path ends in the name and leads to
    the public object itself (an entry may name the module that defines it or one that re-exports it)."""
    found = set()
    for path in entries:
        module, _, name = path.rpartition(".")
        if name in public and getattr(importlib.import_module(module), name, None) is public[name]:
            found.add(name)
    return sorted(set(public) - found)


def test_every_public_name_is_in_the_api_reference():
    entries = [e for page in sorted(API_REFERENCE.glob("*.md")) for e in ENTRY.findall(page.read_text("utf-8"))]
    missing = _undocumented({name: getattr(unimem, name) for name in unimem.__all__}, entries)
    assert not missing, f"public names with no ``::: unimem.<module>.<name>`` entry in docs/api/: {missing}"


def test_the_api_reference_check_catches_a_missing_or_wrong_entry():
    public = {"stats": unimem.stats, "configure": unimem.configure, "Phase": unimem.Phase}
    text = "# Stats\n\n::: unimem.api.stats\n\n::: unimem.api.configure_from_env\n::: unimem.sizes.stats\n"
    assert _undocumented(public, ENTRY.findall(text)) == ["Phase", "configure"]
    assert _undocumented(public, ["unimem.api.stats", "unimem.api.configure", "unimem.support.Phase"]) == []


if __name__ == "__main__":
    STUB.write_text(render_stub(unimem._LAZY), encoding="utf-8")
    print(f"wrote {STUB.relative_to(REPO)}")
