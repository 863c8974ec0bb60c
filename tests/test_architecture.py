"""The house rules, read from the source with ``ast`` (nothing is imported or run):

- the front (``unimem/`` less ``unimem/integrations/``) imports no framework, statically or
  dynamically, reaches the adapters only through the registry (no static import of
  ``unimem.backends``), and holds no framework's name as a string constant outside the
  registry's table;
- no ``_``-prefixed name is imported or reached across the boundary between ``unimem/``
  and ``backends/``;
- the adapters (``backends/``) import neither the public face nor a feature folder of the front
  (``FEATURES``), anywhere in a module (functions and ``if TYPE_CHECKING:`` blocks included): they
  sit below the features they serve;
- the feature folders keep their floors (``ABOVE``): observe imports nothing from compare, view or
  the CLI, compare nothing from view or the CLI, view nothing from the CLI, anywhere in a module;
- no ``_``-prefixed name is imported or reached from another module of the front;
- no import cycle among the modules of ``unimem`` and ``unimem.backends``, imports inside
  functions included (``if TYPE_CHECKING:`` blocks excepted);
- no function is much over 80 lines, and no module (``unimem/`` and ``backends/``, every folder
  in them) is over 700 lines;
- every module in ``backends/<name>/`` is named from the design's list (``TOPIC_MODULES``) or
  starts with ``_`` (a private helper).

Framework names come from the registry's table and the adapters' ``error_modules``, so a
new backend is covered the day it is registered.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from unimem import registry

REPO = Path(__file__).resolve().parent.parent
FRONT = REPO / "unimem"
BACKENDS = REPO / "backends"
INTEGRATIONS = FRONT / "integrations"

# Front modules allowed a dynamic import, and why.
DYNAMIC_IMPORTS = {
    "unimem/registry.py": "imports the adapter its table names, on first use",
    "unimem/__init__.py": "imports its own submodules on first use (PEP 562)",
    "unimem/observe/sampler.py": "imports the probe its caller names (a plug-in point tests use)",
    "unimem/_bootstrap/sitecustomize.py": "imports the sitecustomize it shadows, so both run",
}
# Modules a framework brings that are names of it too, beside those the registry knows.
KNOWN_COMPANIONS = ("keras", "jaxlib", "cupyx", "cupy_backends", "flax", "optax", "transformers")
FUNCTION_LINES = 90  # "much over 80": a tenth of room
MAX_LINES_EXEMPT: dict[str, str] = {}


def framework_names() -> set[str]:
    names = set(KNOWN_COMPANIONS) | set(registry.ALIASES)
    for name, entry in registry.BACKENDS.items():
        names |= {name, entry.module, *entry.imported_by}
        names |= set(registry.adapter_class(name).error_modules)
    return names


NAMES = framework_names()


@dataclass(frozen=True)
class Source:
    path: Path
    module: str  # dotted name as installed
    tree: ast.Module

    @property
    def rel(self) -> str:
        return self.path.relative_to(REPO).as_posix()

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


def _module_name(path: Path) -> str:
    if path.is_relative_to(BACKENDS):
        parts = ["unimem", "backends", *path.relative_to(BACKENDS).with_suffix("").parts]
    else:
        parts = ["unimem", *path.relative_to(FRONT).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources(root: Path) -> list[Source]:
    return [
        Source(p, _module_name(p), ast.parse(p.read_text(encoding="utf-8"), filename=str(p)))
        for p in sorted(root.rglob("*.py"))
        if "__pycache__" not in p.parts
    ]


ALL = _sources(FRONT) + _sources(BACKENDS)
FRONT_SOURCES = [s for s in ALL if s.path.is_relative_to(FRONT) and not s.path.is_relative_to(INTEGRATIONS)]
BACKEND_SOURCES = [s for s in ALL if s.path.is_relative_to(BACKENDS)]
MODULES = {s.module for s in ALL}


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of nodes inside ``if TYPE_CHECKING:`` bodies."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                for child in node.body:
                    inside |= {id(n) for n in ast.walk(child)}
    return inside


def _imports(source: Source, *, typing_too: bool = False) -> Iterator[tuple[ast.AST, str, list[str]]]:
    """``(node, absolute module, imported names)`` of every import outside TYPE_CHECKING blocks
    (inside them too with ``typing_too``)."""
    skip = set() if typing_too else _type_checking_blocks(source.tree)
    package = source.module if source.is_package else source.module.rpartition(".")[0]
    for node in ast.walk(source.tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield node, base, [alias.name for alias in node.names]


def _docstrings(tree: ast.AST) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _parameter_names(tree: ast.AST) -> set[int]:
    """String constants naming a parameter in an error (``ConfigError("nvml", ...)``)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name == "ConfigError":
                found.add(id(node.args[0]))
    return found


def _names_a_framework(text: str) -> bool:
    return text in NAMES or text.split(".")[0] in NAMES and "." in text and " " not in text


def test_framework_names_come_from_the_registry():
    assert {"torch", "tensorflow", "jax", "jaxlib", "keras", "pynvml"} <= NAMES
    assert set(registry.BACKENDS) <= NAMES


# The module names of an adapter folder (docs/api/backends.md): the adapter, its planning, one per topic.
TOPIC_MODULES = (
    "adapter",
    "configure",
    "observe",
    "diagnose",
    "precision",
    "savers",
    "accumulation",
    "search",
    "distributed",
    "workloads",
    "estimate",
)


def _misnamed(paths: list[Path]) -> list[str]:
    """Modules of ``backends/<name>/`` whose name is neither in ``TOPIC_MODULES`` nor private."""
    bad = []
    for path in paths:
        parts = path.relative_to(BACKENDS).parts
        if len(parts) == 1:
            continue  # backends/base.py, steps.py, topics.py: the shared layer, not an adapter folder
        if len(parts) > 2 or not (path.stem in TOPIC_MODULES or path.stem.startswith("_")):
            bad.append(path.relative_to(REPO).as_posix())
    return bad


def test_adapter_folders_hold_topic_modules_and_private_helpers():
    """A reader finds a framework's search in ``backends/<name>/search.py``, and nothing else by that name."""
    assert not _misnamed([s.path for s in BACKEND_SOURCES])
    for name in registry.BACKENDS:
        assert (BACKENDS / name / "adapter.py").is_file(), name


def test_the_module_name_rule_catches_a_stray_module():
    made_up = [BACKENDS / "torch" / "pools.py", BACKENDS / "torch" / "_pools.py", BACKENDS / "torch" / "sub" / "x.py"]
    assert _misnamed([*made_up, BACKENDS / "torch" / "search.py", BACKENDS / "steps.py"]) == [
        "backends/torch/pools.py",
        "backends/torch/sub/x.py",
    ]


@pytest.mark.parametrize("source", FRONT_SOURCES, ids=lambda s: s.rel)
def test_the_front_imports_no_framework_and_no_adapter(source):
    bad = []
    for node, module, _ in _imports(source):
        top = module.split(".")[0]
        if top in NAMES:
            bad.append(f"line {node.lineno}: imports {module}")
        if module == "unimem.backends" or module.startswith("unimem.backends."):
            bad.append(f"line {node.lineno}: imports {module} (the front reaches adapters through the registry)")
    assert not bad, f"{source.rel}: " + "; ".join(bad)


def _dynamic_imports(source: Source) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(source.tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Attribute) and node.func.attr in ("import_module", "__import__"))
            or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))
        )
    ]


@pytest.mark.parametrize("source", [s for s in FRONT_SOURCES if s.rel not in DYNAMIC_IMPORTS], ids=lambda s: s.rel)
def test_the_front_makes_no_dynamic_import(source):
    calls = _dynamic_imports(source)
    assert not calls, f"{source.rel}: dynamic import at line(s) {calls}"


def test_every_allowed_dynamic_import_is_still_there():
    """An exemption whose module no longer needs it is removed, so it cannot hide a new one."""
    by_path = {s.rel: s for s in FRONT_SOURCES}
    for rel in DYNAMIC_IMPORTS:
        assert rel in by_path and _dynamic_imports(by_path[rel]), f"{rel} no longer imports dynamically"


# The registry's table is where the names live.
@pytest.mark.parametrize("source", [s for s in FRONT_SOURCES if s.rel != "unimem/registry.py"], ids=lambda s: s.rel)
def test_the_front_names_no_framework(source):
    skip = _docstrings(source.tree) | _parameter_names(source.tree)
    bad = [
        f"line {node.lineno}: {node.value!r}"
        for node in ast.walk(source.tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and _names_a_framework(node.value)
    ]
    assert not bad, f"{source.rel} names a framework: " + "; ".join(bad)


def _bound_modules(source: Source, other_side: str) -> set[str]:
    """Local names bound to modules of ``other_side`` (a dotted prefix) by imports."""
    names: set[str] = set()
    for _, module, imported in _imports(source):
        for name in imported:
            if f"{module}.{name}" in MODULES and f"{module}.{name}".startswith(other_side):
                names.add(name)
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name.startswith(other_side):
                    names.add(alias.asname)
    return names


def _crossing(source: Source, other_side: str, exclude: str | None = None) -> list[str]:
    def other(module: str) -> bool:
        return module.startswith(other_side) and not (exclude and module.startswith(exclude))

    bad = []
    for node, module, imported in _imports(source):
        if other(module) or module == "unimem" and other_side == "unimem.":
            bad += [f"line {node.lineno}: {module}.{n}" for n in imported if n.startswith("_") and n != "__version__"]
    bound = _bound_modules(source, other_side)
    for node in ast.walk(source.tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in bound:
            bad.append(f"line {node.lineno}: {value.id}.{node.attr}")
        if isinstance(value, ast.Call):
            func = value.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in ("get_backend", "adapter_class"):
                bad.append(f"line {node.lineno}: {called}(...).{node.attr}")
    return bad


@pytest.mark.parametrize("source", ALL, ids=lambda s: s.rel)
def test_no_private_name_crosses_the_boundary(source):
    if source in BACKEND_SOURCES:
        bad = _crossing(source, "unimem.", exclude="unimem.backends")
    else:
        bad = _crossing(source, "unimem.backends")
    assert not bad, f"{source.rel} reaches private names across the boundary: " + "; ".join(bad)


# What the adapters sit below: the public face and the front's feature folders. The types an adapter
# returns or subclasses live in root modules (live_memory, loss_scaling, trees, workload_specs), so a
# change in a feature reaches no adapter, and a feature hands an adapter what it needs.
FEATURES = (
    "unimem.api",
    "unimem.cli",
    "unimem.compare",
    "unimem.diagnose",
    "unimem.estimate",
    "unimem.integrations",
    "unimem.observe",
    "unimem.search",
    "unimem.training",
    "unimem.view",
)


def _within(module: str, folder: str) -> bool:
    return module == folder or module.startswith(f"{folder}.")


def _feature_imports(source: Source, features: tuple[str, ...] = FEATURES) -> list[str]:
    """Imports of ``features`` in ``source``: module level, in functions and in TYPE_CHECKING blocks."""
    bad = []
    for node, module, imported in _imports(source, typing_too=True):
        for target in [module, *(f"{module}.{name}" for name in imported)]:
            if any(_within(target, feature) for feature in features):
                bad.append((node.lineno, f"line {node.lineno}: imports {target}"))
                break
    return [text for _, text in sorted(bad)]


@pytest.mark.parametrize("source", BACKEND_SOURCES, ids=lambda s: s.rel)
def test_adapters_import_no_feature_of_the_front(source):
    bad = _feature_imports(source)
    assert not bad, f"{source.rel} reaches above the adapters: " + "; ".join(bad)


def test_the_feature_rule_catches_an_adapter_reaching_up():
    code = (
        "from typing import TYPE_CHECKING\n"
        "from unimem import errors\n"
        "from unimem.live_memory import LiveObject\n"
        "from unimem.backends.base import Backend\n"
        "from unimem.diagnose.live_objects import scan\n"
        "if TYPE_CHECKING:\n"
        "    from unimem.training.loss_scaling import LossScaler\n"
        "def f():\n"
        "    import unimem.compare.workloads\n"
        "    from unimem import api, sizes\n"
        "    from unimem.observe import track\n"
    )
    source = Source(BACKENDS / "torch" / "made_up.py", "unimem.backends.torch.made_up", ast.parse(code))
    assert _feature_imports(source) == [
        "line 5: imports unimem.diagnose.live_objects",
        "line 7: imports unimem.training.loss_scaling",
        "line 9: imports unimem.compare.workloads",
        "line 10: imports unimem.api",
        "line 11: imports unimem.observe",
    ]


# The floors of the feature folders: each imports nothing from the folders above it. observe records
# and draws (a comparison's chart reads what the comparison offers); compare runs the workloads and
# reads its own files through observe's readers; view shows recordings and comparisons; the CLI
# calls them all. A folder reaching up would tie a lower one to every change above it.
ABOVE = {
    "unimem.observe": ("unimem.compare", "unimem.view", "unimem.cli"),
    "unimem.compare": ("unimem.view", "unimem.cli"),
    "unimem.view": ("unimem.cli",),
}


def _reaching_up(source: Source) -> list[str]:
    """Imports in ``source`` of a folder above its own (``ABOVE``), wherever they are in the module."""
    return [
        text
        for folder, above in ABOVE.items()
        if _within(source.module, folder)
        for text in _feature_imports(source, above)
    ]


@pytest.mark.parametrize(
    "source", [s for s in FRONT_SOURCES if any(_within(s.module, folder) for folder in ABOVE)], ids=lambda s: s.rel
)
def test_feature_folders_import_nothing_above_them(source):
    bad = _reaching_up(source)
    assert not bad, f"{source.rel} reaches above its folder: " + "; ".join(bad)


def test_the_floor_rule_catches_observe_reaching_up():
    code = (
        "from typing import TYPE_CHECKING\n"
        "from unimem.observe.files import figure\n"
        "if TYPE_CHECKING:\n"
        "    from unimem.compare.harness import Comparison\n"
        "def f():\n"
        "    import unimem.compare\n"
        "    from unimem import view\n"
        "    from unimem.cli.main import main\n"
    )
    source = Source(FRONT / "observe" / "made_up.py", "unimem.observe.made_up", ast.parse(code))
    assert _reaching_up(source) == [
        "line 4: imports unimem.compare.harness",
        "line 6: imports unimem.compare",
        "line 7: imports unimem.view",
        "line 8: imports unimem.cli.main",
    ]
    view = Source(FRONT / "view" / "made_up.py", "unimem.view.made_up", ast.parse(code))
    assert _reaching_up(view) == ["line 8: imports unimem.cli.main"], "the view is above observe and compare"


FRONT_MODULES = {s.module for s in ALL if s.path.is_relative_to(FRONT)}


def _front_module(name: str) -> bool:
    return name in FRONT_MODULES and not name.startswith("unimem.backends")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _private_reaches(source: Source) -> list[str]:
    """``_``-prefixed names ``source`` imports from, or reaches in, another module of the front.

    Imports inside ``if TYPE_CHECKING:`` count too: a private name is private to its module.
    """
    package = source.module if source.is_package else source.module.rpartition(".")[0]
    bound: dict[str, str] = {}  # local name -> the front module it is bound to
    bad: list[tuple[int, str]] = []
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _front_module(alias.name):
                    local = alias.asname or alias.name.split(".")[0]
                    bound[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if not _front_module(base) or base == source.module:
                continue
            for alias in node.names:
                if _private(alias.name):
                    bad.append((node.lineno, f"from {base} import {alias.name}"))
                elif _front_module(f"{base}.{alias.name}"):
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    for node in ast.walk(source.tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        reached = _dotted(node.value)
        if reached is None:
            continue
        head, _, rest = reached.partition(".")
        module = bound.get(head)
        if module is not None:
            module = f"{module}.{rest}" if rest else module
            if _front_module(module) and module != source.module:
                bad.append((node.lineno, f"{module}.{node.attr}"))
    return [f"line {line}: {text}" for line, text in sorted(bad)]


@pytest.mark.parametrize("source", [s for s in ALL if s.path.is_relative_to(FRONT)], ids=lambda s: s.rel)
def test_no_private_name_crosses_the_fronts_modules(source):
    """A ``_`` name is its module's own: one another module needs loses the underscore (or moves)."""
    bad = _private_reaches(source)
    assert not bad, f"{source.rel} reaches private names of other modules: " + "; ".join(bad)


def test_the_private_name_rule_catches_a_crossing():
    code = (
        "import unimem.observe.monitor\nimport unimem.api as api_module\nfrom unimem import api\n"
        "from unimem.observe import recording\nfrom unimem.diagnose.recognise import _message, framework_of\n"
        "from . import _nothing\nfrom .monitor import _check_interval\n"
        "api._lock\napi_module._lock\nrecording._target('x', '.png')\nunimem.observe.monitor._check_interval\n"
        "framework_of._cache\nself._own\n_local._name\napi.__name__\n"
    )
    source = Source(FRONT / "observe" / "made_up.py", "unimem.observe.made_up", ast.parse(code))
    assert _private_reaches(source) == [
        "line 5: from unimem.diagnose.recognise import _message",
        "line 6: from unimem.observe import _nothing",
        "line 7: from unimem.observe.monitor import _check_interval",
        "line 8: unimem.api._lock",
        "line 9: unimem.api._lock",
        "line 10: unimem.observe.recording._target",
        "line 11: unimem.observe.monitor._check_interval",
    ]
    own = Source(
        FRONT / "api.py", "unimem.api", ast.parse("from unimem.api import _lock\nimport unimem.api\nunimem.api._lock\n")
    )
    assert _private_reaches(own) == [], "a module may reach its own private names"


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {s.module: set() for s in ALL}
    for source in ALL:
        for _, module, imported in _imports(source):
            targets = [f"{module}.{n}" for n in imported if f"{module}.{n}" in MODULES] or [module]
            for target in targets:
                if target in MODULES and target != source.module:
                    graph[source.module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + " | ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_checks_catch_what_they_forbid():
    """Each check fails on a small module that breaks its rule."""
    code = (
        "import sys\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
        "def f():\n    import jax\n    return sys.modules.get('tensorflow')\n"
    )
    source = Source(FRONT / "made_up.py", "unimem.made_up", ast.parse(code))
    assert [m for _, m, _ in _imports(source)] == ["sys", "typing", "jax"], "TYPE_CHECKING imports are excepted"
    constants = [n.value for n in ast.walk(source.tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert [c for c in constants if _names_a_framework(c)] == ["tensorflow"]
    assert _names_a_framework("jax.numpy") and not _names_a_framework("the jax backend")
    crossing = Source(
        BACKENDS / "made_up.py",
        "unimem.backends.made_up",
        ast.parse("from unimem import api\nfrom unimem.api import _lock\napi._configured.append(1)\n"),
    )
    assert len(_crossing(crossing, "unimem.", exclude="unimem.backends")) == 2


def _functions(source: Source) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(source.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function less its docstring: documentation never counts against its length."""
    lines = (node.end_lineno or node.lineno) - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= (first.end_lineno or first.lineno) - first.lineno + 1
    return lines


@pytest.mark.parametrize("source", ALL, ids=lambda s: s.rel)
def test_no_function_is_much_over_80_lines(source):
    long = [
        f"{node.name} ({_code_lines(node)} lines of code)"
        for node in _functions(source)
        if _code_lines(node) > FUNCTION_LINES and f"{source.rel}:{node.name}" not in MAX_LINES_EXEMPT
    ]
    assert not long, f"{source.rel}: " + ", ".join(long)


# The batch search changes most often, and its steps are read one function at a time: a stricter rule there.
SEARCH = FRONT / "search"
SEARCH_FUNCTION_LINES = 60


def _over_search_limit(source: Source) -> list[str]:
    return [
        f"{node.name} ({_code_lines(node)} lines of code)"
        for node in _functions(source)
        if _code_lines(node) > SEARCH_FUNCTION_LINES
    ]


@pytest.mark.parametrize("source", [s for s in ALL if s.path.is_relative_to(SEARCH)], ids=lambda s: s.rel)
def test_no_function_of_the_search_is_over_60_lines(source):
    long = _over_search_limit(source)
    assert not long, f"{source.rel}: " + ", ".join(long)


def test_the_search_rule_counts_code_not_docstrings():
    body = "".join(f"    x{i} = {i}\n" for i in range(SEARCH_FUNCTION_LINES - 1))
    documented = f'def fits():\n    """One line.\n\n    And more.\n    """\n{body}'
    code = f"{documented}def too_long():\n{body}    y = 0\n"
    source = Source(SEARCH / "made_up.py", "unimem.search.made_up", ast.parse(code))
    assert _over_search_limit(source) == [f"too_long ({SEARCH_FUNCTION_LINES + 1} lines of code)"]


MODULE_LINES = 700  # past this a module holds several things a reader looks for in different places


def _over_module_limit(paths: list[Path]) -> list[tuple[Path, int]]:
    counts = ((path, len(path.read_text(encoding="utf-8").splitlines())) for path in paths)
    return [(path, lines) for path, lines in counts if lines > MODULE_LINES]


def test_no_module_is_over_700_lines():
    """Every module of ``unimem/`` and ``backends/``, subfolders included; a longer one is split by topic."""
    assert {s.rel.split("/")[0] for s in ALL} == {"unimem", "backends"}
    assert any(s.rel.count("/") > 1 for s in ALL), "subfolders are counted"
    long = _over_module_limit([s.path for s in ALL])
    assert not long, "over 700 lines: " + ", ".join(f"{p.relative_to(REPO)} ({n})" for p, n in long)


def test_the_module_limit_catches_a_long_module(tmp_path: Path) -> None:
    long, short = tmp_path / "long.py", tmp_path / "short.py"
    long.write_text("x = 1\n" * (MODULE_LINES + 1), encoding="utf-8")
    short.write_text("x = 1\n" * MODULE_LINES, encoding="utf-8")
    assert _over_module_limit([long, short]) == [(long, MODULE_LINES + 1)]


# Internal code holds a resolved adapter: it reads through ``unimem.snapshots.read_snapshot`` and the
# adapter, not through the public functions, which validate and resolve the backend again.
PUBLIC_FACE = {"stats", "reset_peak", "clear_cache", "summary"}
INTERNAL_READERS = [p for folder in ("diagnose", "observe", "search") for p in sorted((FRONT / folder).glob("*.py"))]


@pytest.mark.parametrize("path", INTERNAL_READERS, ids=lambda p: p.relative_to(FRONT).as_posix())
def test_internal_code_reads_through_the_adapter_not_the_public_face(path: Path) -> None:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module in ("unimem", "unimem.api"):
            found += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name in PUBLIC_FACE]
        reached = node.value.id if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) else None
        if reached in ("api", "unimem") and isinstance(node, ast.Attribute) and node.attr in PUBLIC_FACE:
            found.append(f"line {node.lineno}: {reached}.{node.attr}")
    assert not found, f"{path.name}: " + "; ".join(found)
