"""The package as users install it: a wheel and an editable install, each into a FRESH
virtual environment with no framework, from a copy of the working tree.

Slow (two venvs, click and rich from PyPI): about a minute. Needs network access to PyPI.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from unimem import registry

REPO = Path(__file__).resolve().parent.parent
_IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "tests",
    "benchmarks",
    "evidence",
    ".whl",
)

# Run inside the fresh venv, from a folder that is not the source tree.
CHECK = textwrap.dedent(
    """
    import importlib.util, json, os, shutil, sys
    import importlib
    import unimem
    from unimem import registry
    # Every adapter of the registry's table, imported from the wheel (no framework needed).
    adapters = {name: registry.adapter_class(name).__module__ for name in registry.BACKENDS}
    package = os.path.dirname(unimem.__file__)
    print(json.dumps({
        "available": unimem.available_backends(),
        "py_typed": os.path.isfile(os.path.join(package, "py.typed")),
        "top_level_backends": importlib.util.find_spec("backends") is not None,
        "frameworks_loaded": [m for m in ("torch", "tensorflow", "jax", "pynvml") if m in sys.modules],
        "script": shutil.which("unimem", path=os.path.dirname(sys.executable)),
        "file": unimem.__file__,
        "capabilities": sorted(unimem.capabilities("torch")) == sorted(unimem.capabilities("jax")),
        "adapters": adapters,
    }))
    """
)


def _run(args: list[str | Path], **kwargs) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, args))} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def _fresh_venv(path: Path) -> Path:
    _run([sys.executable, "-m", "venv", path])
    return path / "bin" / "python"


def _pip(python: Path, *args: str | Path) -> None:
    _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args])


def _check(python: Path, cwd: Path) -> dict:
    proc = _run([python, "-c", CHECK], cwd=cwd)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_cli(python: Path, cwd: Path) -> None:
    script = python.parent / "unimem"
    assert script.is_file(), "the unimem console script was not installed"
    out = _run([script, "--version"], cwd=cwd).stdout
    assert "0.1.0" in out or "version" in out.lower()
    _run([python, "-m", "unimem", "--help"], cwd=cwd)


BARE = textwrap.dedent(
    """
    import importlib.util, json
    import unimem
    snapshot = unimem.stats()  # no GPU here: the framework-free view, every figure None
    try:
        unimem.Recording().plot("memory.png")
        plot = None
    except unimem.BackendUnavailable as exc:
        plot = str(exc)
    print(json.dumps({
        "stats_backend": snapshot.backend,
        "absent": [m for m in ("numpy", "matplotlib", "PIL") if importlib.util.find_spec(m) is None],
        "plot": plot,
    }))
    """
)


def _check_bare_install(python: Path, cwd: Path) -> None:
    """What a training image gets from a bare install: NVML's bindings, no plotting stack."""
    script = python.parent / "unimem"
    info = _run([script, "info", "--json"], cwd=cwd).stdout
    assert json.loads(info)["frameworks"], "unimem info lists the backends"
    _run([script, "stats"], cwd=cwd)
    out = json.loads(_run([python, "-c", BARE], cwd=cwd).stdout.strip().splitlines()[-1])
    assert out["stats_backend"] == "nvml"
    assert out["absent"] == ["numpy", "matplotlib", "PIL"], "plotting must stay an extra"
    assert out["plot"] is not None and "unimem[plot]" in out["plot"], out["plot"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of the working tree (what is committed or about to be), without build debris."""
    src = tmp_path_factory.mktemp("pkg") / "src"
    shutil.copytree(REPO, src, ignore=_IGNORE)
    return src


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv(source, tmp_path):
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, source])
    [wheel] = dist.glob("unimem-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops <= {"unimem", next(t for t in tops if t.endswith(".dist-info"))}, f"unexpected top level: {tops}"
    assert "unimem/py.typed" in names
    assert "unimem/__init__.pyi" in names, "type checkers read the stub in place of the lazy __init__.py"
    # Every module of the source tree, a moved or new one too (a folder left off pyproject's packages list).
    shipped = {f"unimem/{p.relative_to(source / 'unimem').as_posix()}" for p in (source / "unimem").rglob("*.py")}
    shipped |= {
        f"unimem/backends/{p.relative_to(source / 'backends').as_posix()}" for p in (source / "backends").rglob("*.py")
    }
    missing = sorted(shipped - set(names))
    assert not missing, f"modules of the source tree missing from the wheel: {missing}"
    for name in registry.BACKENDS:  # every backend folder is in the wheel
        assert f"unimem/backends/{name}/__init__.py" in names, f"the wheel lacks unimem/backends/{name}/"
    assert not any(name.startswith(("backends/", "tests/")) for name in names)
    for part in ("page.html", "view.css", "thinning.js", "view.js"):  # unimem view puts them in every page
        assert f"unimem/view/assets/{part}" in names, f"the wheel lacks the view page's {part}"

    python = _fresh_venv(tmp_path / "venv")
    _pip(python, wheel)
    out = _check(python, cwd=tmp_path)
    assert out["available"] == ["nvml"], "a bare install has NVML's bindings and no framework"
    assert out["py_typed"] is True
    assert out["top_level_backends"] is False, "a top-level 'backends' package was installed"
    assert out["frameworks_loaded"] == []
    assert out["script"] is not None
    assert out["capabilities"] is True
    assert out["adapters"] == {name: f"unimem.backends.{name}.adapter" for name in registry.BACKENDS}
    assert str(tmp_path / "venv") in out["file"]
    _check_cli(python, cwd=tmp_path)
    _check_bare_install(python, cwd=tmp_path)


@pytest.mark.slow
def test_editable_install_into_a_fresh_venv(source, tmp_path):
    python = _fresh_venv(tmp_path / "venv")
    _pip(python, "--upgrade", "setuptools")
    _pip(python, "--no-build-isolation", "-e", source)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = _check(python, cwd=elsewhere)
    assert out["available"] == ["nvml"]
    assert out["py_typed"] is True
    assert out["top_level_backends"] is False, "the editable install exposes a top-level 'backends'"
    assert out["frameworks_loaded"] == []
    assert out["file"] == str(source / "unimem" / "__init__.py"), "editable: unimem must come from the source tree"
    _check_cli(python, cwd=elsewhere)


@pytest.mark.slow
def test_declared_build_requirements_are_enough_to_build(source, tmp_path):
    """A build without isolation (offline CI, distro packaging) in an environment holding
    exactly what ``[build-system] requires`` asks for: the declaration must suffice."""
    text = (source / "pyproject.toml").read_text()
    try:
        import tomllib

        requires = tomllib.loads(text)["build-system"]["requires"]
    except ModuleNotFoundError:  # Python 3.10
        block = re.search(r"\[build-system\][^\[]*?requires\s*=\s*\[(.*?)\]", text, re.S)
        assert block is not None
        requires = re.findall(r'"([^"]+)"', block.group(1))
    python = _fresh_venv(tmp_path / "venv")
    _pip(python, *requires)
    _run([python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp_path / "w", source])
    assert list((tmp_path / "w").glob("unimem-*.whl"))
