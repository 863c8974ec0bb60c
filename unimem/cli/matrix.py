"""Render ``compat_matrix.md`` from the backends' capability tables and the evidence.

Evidence comes from two places, both read as data (no framework is imported):
- CPU tests: every ``@pytest.mark.covers("backend:feature")`` in ``tests/`` (outside
  ``tests/gpu``), found with ``ast``; CI runs them on every change.
- GPU runs: ``evidence/gpu.json``, written by ``tests/gpu/run_suite.py`` on a GPU
  machine, with each test's outcome and the cells it covers.
A cell with neither says "not verified here".
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unimem.registry import BACKENDS, adapter_class, capability_table
from unimem.support import FEATURES, Level, Support

__all__ = ["Evidence", "check", "collect_evidence", "render", "repo_root"]

MATRIX_FILE = "compat_matrix.md"
GPU_EVIDENCE = Path("evidence") / "gpu.json"


def repo_root(start: Path | None = None) -> Path:
    """The checkout holding ``pyproject.toml`` and ``unimem/``, from ``start`` or this file."""
    candidates = [start] if start is not None else [Path.cwd(), Path(__file__).resolve().parent.parent]
    for base in candidates:
        for folder in [base, *base.parents]:
            if (folder / "pyproject.toml").is_file() and (folder / "unimem").is_dir():
                return folder
    raise FileNotFoundError("no unimem checkout found (looked for pyproject.toml beside unimem/)")


@dataclass
class Evidence:
    cpu: dict[str, list[str]] = field(default_factory=dict)  # cell -> test ids
    gpu: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # cell -> (test id, outcome)
    gpu_run: dict[str, Any] | None = None  # machine, versions, date


def _covers_in(path: Path, root: Path) -> list[tuple[str, str]]:
    """``(test id, cell)`` for every literal in a ``covers(...)`` marker call in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, owner: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = owner
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{owner}::{child.name}"
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "covers":
                for arg in child.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        found.append((owner, arg.value))
            visit(child, name)

    visit(tree, path.relative_to(root).as_posix())
    return found


CONTRACT = Path("unimem") / "testing.py"
CONTRACT_CLASS = "BackendContract"


def _contract_features(root: Path) -> dict[str, list[str]]:
    """``{test name: features}`` from the ``covers_features(...)`` marks of the conformance suite."""
    path = root / CONTRACT
    if not path.is_file():
        return {}
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef) or node.name != CONTRACT_CLASS:
            continue
        for item in node.body:
            if not isinstance(item, ast.FunctionDef):
                continue
            for decorator in item.decorator_list:
                if isinstance(decorator, ast.Call) and getattr(decorator.func, "id", "") == "covers_features":
                    found[item.name] = [
                        a.value for a in decorator.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                    ]
    return found


def _contract_runs(path: Path, root: Path, features: dict[str, list[str]]) -> list[tuple[str, str]]:
    """``(test id, cell)`` for each test a ``BackendContract`` subclass in ``path`` inherits:
    its features, where that backend's table says it supports them (the rest are refusals)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[str, str]] = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or not any(getattr(b, "id", "") == CONTRACT_CLASS for b in node.bases):
            continue
        backend = next(
            (
                item.value.value
                for item in node.body
                if isinstance(item, ast.Assign)
                and any(getattr(t, "id", "") == "backend" for t in item.targets)
                and isinstance(item.value, ast.Constant)
            ),
            None,
        )
        if not isinstance(backend, str) or backend not in BACKENDS:
            continue
        table = capability_table(backend)
        owner = f"{path.relative_to(root).as_posix()}::{node.name}"
        for test, names in features.items():
            found += [(f"{owner}::{test}", f"{backend}:{f}") for f in names if f in table and table[f].supported]
    return found


def collect_evidence(root: Path) -> Evidence:
    evidence = Evidence()
    tests = root / "tests"
    features = _contract_features(root)
    if tests.is_dir():
        for path in sorted(tests.rglob("test_*.py")):
            if "gpu" in path.relative_to(tests).parts:
                continue
            for test_id, cell in _covers_in(path, root) + _contract_runs(path, root, features):
                ids = evidence.cpu.setdefault(cell, [])
                if test_id not in ids:
                    ids.append(test_id)
    gpu_file = root / GPU_EVIDENCE
    if gpu_file.is_file():
        run = json.loads(gpu_file.read_text(encoding="utf-8"))
        evidence.gpu_run = {k: v for k, v in run.items() if k != "tests"}
        for test in run.get("tests", []):
            for cell in test.get("covers", []):
                evidence.gpu.setdefault(cell, []).append((test["nodeid"], test["outcome"]))
    return evidence


def _was_installed(backend: str, run: dict[str, Any]) -> bool:
    versions = run.get("versions") or {}
    return any(versions.get(dist) for dist in adapter_class(backend).distributions)


def _gpu_cell(backend: str, cell: str, evidence: Evidence) -> str:
    if evidence.gpu_run is not None and not _was_installed(backend, evidence.gpu_run):
        # The run records every backend's distributions: one it lacks was never testable there.
        return f"GPU: not run: {backend} was not installed on the GPU machine; CPU only"
    results = evidence.gpu.get(cell)
    if not results or evidence.gpu_run is None:
        return "GPU: not verified here"
    passed = sum(1 for _, outcome in results if outcome == "passed")
    failed = sum(1 for _, outcome in results if outcome == "failed")
    gpu = evidence.gpu_run.get("gpu", "GPU")
    date = evidence.gpu_run.get("date", "?")
    verdict = "pass" if failed == 0 and passed else "FAIL" if failed else "skipped"
    return f"GPU ({gpu}, {date}): {verdict} {passed}/{len(results)}"


def _cpu_cell(cell: str, evidence: Evidence) -> str:
    tests = evidence.cpu.get(cell)
    if not tests:
        return "CPU: not verified here"
    return f"CPU: {len(tests)} test{'s' if len(tests) != 1 else ''} (`{tests[0].split('::', 1)[-1]}`)"


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def render(root: Path | None = None) -> str:
    """The whole ``compat_matrix.md`` as a string. Deterministic for the same inputs."""
    root = repo_root(root)
    evidence = collect_evidence(root)
    backends = list(BACKENDS)
    tables: dict[str, dict[str, Support]] = {b: capability_table(b) for b in backends}
    lines = [
        "# unimem compatibility matrix",
        "",
        "<!-- GENERATED by `unimem matrix` from the backends' capability tables and the recorded",
        "     evidence; do not edit by hand. `unimem matrix --check` fails when this file is stale. -->",
        "",
        "Each cell: **level** (native API, env var, emulated by unimem, or unsupported), when it must",
        "be set (`anytime`, `before-init` = before the framework starts its GPU runtime, `before-import`),",
        "the exact API or variable, then its evidence: CPU tests that CI runs on every change, and the",
        "outcome of the GPU test suite on record.",
        "",
    ]
    if evidence.gpu_run:
        run = evidence.gpu_run
        versions = ", ".join(f"{k} {v}" for k, v in sorted(run.get("versions", {}).items()) if v)
        lines += [
            f"GPU evidence: {run.get('machine', '?')}, {run.get('gpu', '?')}, driver {run.get('driver', '?')}, "
            f"{run.get('date', '?')}; {versions}. File: `{GPU_EVIDENCE.as_posix()}`.",
            "",
        ]
    else:
        lines += ["GPU evidence: none on record yet (`evidence/gpu.json` is absent).", ""]
    lines += [
        "TensorFlow's GPU paths are verified only by CPU runs and contract tests: its GPU build is "
        "not available on the GPU machine.",
        "",
        "| feature | " + " | ".join(backends) + " |",
        "|---|" + "---|" * len(backends),
    ]
    for feature, title in FEATURES.items():
        cells = []
        for backend in backends:
            support = tables[backend].get(feature)
            if support is None:
                cells.append("—")
                continue
            cell_id = f"{backend}:{feature}"
            head = f"**{support.level}**"
            if support.level is not Level.UNSUPPORTED:
                head += f" · {support.when}"
            parts = [head]
            if support.api:
                parts.append(f"`{_escape(support.api)}`")
            parts.append(_cpu_cell(cell_id, evidence))
            parts.append(_gpu_cell(backend, cell_id, evidence))
            cells.append("<br>".join(parts))
        lines.append(f"| {_escape(title)} | " + " | ".join(cells) + " |")
    lines += ["", "## Notes", ""]
    for backend in backends:
        notes = [(f, s.note) for f, s in tables[backend].items() if s.note]
        if not notes:
            continue
        lines.append(f"### {backend}")
        lines.append("")
        lines += [f"- `{feature}`: {note}" for feature, note in notes]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def check(root: Path | None = None) -> bool:
    """True when ``compat_matrix.md`` on disk equals what ``render()`` gives now."""
    root = repo_root(root)
    path = root / MATRIX_FILE
    return path.is_file() and path.read_text(encoding="utf-8") == render(root)
