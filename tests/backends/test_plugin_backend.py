"""A third-party backend, installed from a distribution of its own, registers through the
entry-point group ``unimem.backends`` and passes the public conformance suite
(``unimem.testing``) with no change to unimem.

The toy framework is a stand-in for a GPU framework on a host without its device: it
reads one setting from the environment when it starts, and knows no memory figures here.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TOY_FRAMEWORK = '''
"""A stand-in framework: reads TOYFW_GROWTH when it starts, like a real one reads its allocator settings."""
import os

started = False
growth = None


def start():
    global started, growth
    growth = os.environ.get("TOYFW_GROWTH")
    started = True
'''

TOY_ADAPTER = '''
"""The toy framework's unimem adapter: what a third party writes, nothing more."""
from __future__ import annotations

import sys
from typing import ClassVar

from unimem.backends.base import Backend, Step, env_step
from unimem.config import Settings
from unimem.errors import UnsupportedFeature
from unimem.memory_stats import MemoryStats
from unimem.support import FEATURES, Level, Phase, Support, When

_FIX = "restart the process and call unimem.configure before toyfw.start()"


class ToyBackend(Backend):
    name = "toy"
    module = "toyfw"
    distributions = ("unimem-toy",)
    CAPABILITIES: ClassVar[dict[str, Support]] = {
        **{feature: Support(Level.UNSUPPORTED, note="toyfw has no such control") for feature in FEATURES},
        "growth": Support(Level.ENV, "TOYFW_GROWTH", When.BEFORE_INIT),
    }

    def phase(self) -> Phase:
        toyfw = sys.modules.get("toyfw")
        if toyfw is None:
            return Phase.NOT_IMPORTED
        return Phase.INITIALIZED if toyfw.started else Phase.IMPORTED

    def plan(self, settings: Settings) -> list[Step]:
        steps = []
        for setting in settings.given():
            if setting != "growth":
                raise UnsupportedFeature(self.name, setting, "toyfw has no such control; use growth")
            value = "1" if settings.growth else "0"
            steps.append(
                env_step(self.name, "growth", settings.growth, "TOYFW_GROWTH", value,
                         phase=self.phase(), when=When.BEFORE_INIT, fix=_FIX)
            )
        return steps

    def stats(self, device: int = 0, *, nvml: bool = True) -> MemoryStats:
        return MemoryStats(self.name, device)  # no device on this host: every figure unknown

    def reset_peak(self, device: int = 0) -> None:
        return None

    def clear_cache(self, device: int = 0) -> int:
        return 0
'''

TOY_PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "unimem-toy"
version = "0.1"

[project.entry-points."unimem.backends"]
toy = "unimem_toy.adapter:ToyBackend"

[tool.setuptools]
packages = ["toyfw", "unimem_toy"]
"""

TOY_CONFORMANCE = """
from unimem.testing import BackendContract


class TestToyBackend(BackendContract):
    backend = "toy"
    module = "toyfw"
    start = "import toyfw\\ntoyfw.start()"
    starts_on_cpu = True
    env_kwargs = {"growth": True}
    env_expect = {"TOYFW_GROWTH": "1"}
    late_kwargs = {"growth": False}
    late_setting = "growth"
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


@pytest.fixture(scope="module")
def installed_toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy distribution built and installed into a folder of its own (``pip --target``)."""
    source = tmp_path_factory.mktemp("toy-source")
    _write(
        source,
        {
            "pyproject.toml": TOY_PYPROJECT,
            "toyfw/__init__.py": TOY_FRAMEWORK,
            "unimem_toy/__init__.py": "",
            "unimem_toy/adapter.py": TOY_ADAPTER,
        },
    )
    target = tmp_path_factory.mktemp("toy-site")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", target, source],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return target


def _run(code: str, site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


@pytest.mark.slow
def test_the_plug_in_is_found_lazily_and_works_through_the_front(installed_toy: Path, tmp_path: Path) -> None:
    proc = _run(
        """
        import sys
        import unimem
        from unimem import registry
        assert not registry._discovered, "import unimem read entry points"
        assert "toy" in unimem.available_backends()
        applied = unimem.configure(backend="toy", growth=True)
        assert [(a.target, a.status) for a in applied] == [("TOYFW_GROWTH=1", "pending")]
        import toyfw
        toyfw.start()
        assert toyfw.growth == "1"
        assert unimem.stats().backend == "toy"
        assert unimem.capabilities("toy")["growth"].api == "TOYFW_GROWTH"
        try:
            unimem.configure(backend="toy", growth=False)
        except unimem.TooLateError as exc:
            assert "restart" in str(exc)
        else:
            raise AssertionError("a late setting was accepted")
        print("ok")
        """,
        installed_toy,
        tmp_path,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


@pytest.mark.slow
def test_the_plug_in_passes_the_conformance_suite(installed_toy: Path, tmp_path: Path) -> None:
    _write(tmp_path, {"test_toy_conformance.py": TOY_CONFORMANCE})
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_toy_conformance.py"],
        env={"PYTHONPATH": str(installed_toy), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout and "skipped" not in proc.stdout


def test_a_member_written_before_the_topics_is_not_ignored_without_a_word() -> None:
    """An adapter class that still defines a member a topic now holds is told which topic reads it."""
    from unimem.backends.base import Backend

    import unimem

    with pytest.warns(unimem.UnimemWarning) as caught:

        class OldStyle(Backend):
            release_every_trial = True

            def recognises_oom(self, exc: BaseException, message: str) -> bool:
                return False

            def precision(self) -> None:
                return None

    said = [str(w.message) for w in caught]
    assert any("OldStyle.release_every_trial" in s and "'search'" in s and "base.Search" in s for s in said)
    assert any("OldStyle.recognises_oom" in s and "'diagnose'" in s and "base.Diagnose" in s for s in said)
    assert any("OldStyle.precision is a method" in s and "cached_property" in s for s in said)
    assert len(said) == 3


def test_the_built_in_adapters_define_no_member_a_topic_holds(py) -> None:
    proc = py(
        """
        import warnings
        warnings.simplefilter("error")
        from unimem import registry
        for name in registry.BACKENDS:
            registry.adapter_class(name)
        """
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
