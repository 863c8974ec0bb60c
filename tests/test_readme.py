"""Documentation code that runs: every block marked ``<!-- test: NAME -->`` in README.md and in
docs/guides/*.md runs in CI.

A block is marked by an HTML comment on the line before it (neither GitHub nor the docs site
renders it):

    <!-- test: guide-configure -->
    <!-- test: guide-precision-torch, precisions: fp16 bf16 -->

A ```python block runs in a fresh interpreter (the ``py`` fixture), a ```bash block in bash
with this interpreter's ``bin`` folder first on ``PATH`` (so ``python`` and ``unimem`` are the
ones under test); each in an empty folder of its own, and each must exit 0, so documentation
code that rots fails the suite. ``precisions:`` runs a python block once per listed
precision, with its ``mixed_precision("fp16"`` call changed to that precision: the guide says
the same loop serves every precision, and this holds it to that. Names are unique over all the
files. Keep marked blocks fast (tiny models, a few steps: seconds on 2 CPU cores); code that
needs a GPU is shown unmarked and says so. In a single pytest process the selected blocks start
together, as many at a time as there are cores (each is a process of its own, mostly spent
importing a framework); under pytest-xdist each runs when its test does, the workers being the
parallelism.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from conftest import REPO, need_framework, subprocess_env

README = REPO / "README.md"
GUIDES = REPO / "docs" / "guides"
MARKER = re.compile(r"<!--\s*test:\s*(?P<name>[\w.-]+)(?:\s*,\s*precisions:\s*(?P<precisions>[\w ]+?))?\s*-->")
# A marked block: the marker, optional blank lines, then a ```python or ```bash fence.
BLOCK = re.compile(
    MARKER.pattern + r"[ \t]*\n(?:[ \t]*\n)*```(?P<lang>python|bash)[ \t]*\n(?P<code>.*?)\n```", re.DOTALL
)
PRECISION_CALL = 'mixed_precision("fp16"'
# Top-level modules a block may import, and the framework each needs.
FRAMEWORK_OF = {"torch": "torch", "tensorflow": "tensorflow", "keras": "tensorflow", "jax": "jax", "cupy": "cupy"}
# Far above what a marked block takes even on a loaded two-core machine (under 90 s seen): it catches
# a block grown into a real training run, not a slow machine.
SECONDS = 300


class Block(NamedTuple):
    name: str
    lang: str
    code: str
    precision: str | None


def sources() -> list[Path]:
    """README.md and every guide: the files whose marked blocks run."""
    return [README, *sorted(GUIDES.glob("*.md"))]


def marked_blocks(text: str) -> list[Block]:
    """Every marked block (one per listed precision)."""
    found = []
    for match in BLOCK.finditer(text):
        precisions = (match["precisions"] or "").split()
        for precision in precisions or [None]:
            found.append(Block(match["name"], match["lang"], match["code"], precision))
    return found


def frameworks_in(code: str) -> set[str]:
    """Frameworks a block imports, or asks a ``unimem`` command for (``-f torch``)."""
    modules = re.findall(r"^\s*(?:import|from)\s+(\w+)", code, flags=re.MULTILINE)
    modules += re.findall(r"(?:^|\s)(?:-f|--framework)\s+(\w+)", code)
    return {FRAMEWORK_OF[module] for module in modules if module in FRAMEWORK_OF}


def with_precision(code: str, precision: str | None) -> str:
    if precision is None:
        return code
    assert code.count(PRECISION_CALL) == 1, f"a block with precisions: calls {PRECISION_CALL} once"
    return code.replace(PRECISION_CALL, f'mixed_precision("{precision}"')


def run_bash(code: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``code`` in bash (stopping at the first failing command), this interpreter's tools first."""
    env = subprocess_env()
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(cwd),
    )


BLOCKS = [(path, block) for path in sources() for block in marked_blocks(path.read_text(encoding="utf-8"))]


def test_every_marker_is_followed_by_a_block_and_names_are_unique() -> None:
    names: list[str] = []
    for path in sources():
        text = path.read_text(encoding="utf-8")
        markers = [m["name"] for m in MARKER.finditer(text)]
        blocks = [m["name"] for m in BLOCK.finditer(text)]
        assert markers == blocks, f"{path.name}: a <!-- test: --> marker must sit on the line before a code block"
        names += markers
    repeated = sorted({name for name in names if names.count(name) > 1})
    assert not repeated, f"marker names repeat: {repeated}"
    loops = {"guide-precision-torch", "guide-precision-keras", "guide-precision-jax"}
    assert loops <= set(names), "the mixed-precision loops are marked"


def test_every_guide_has_code_that_runs() -> None:
    guides = sorted(GUIDES.glob("*.md"))
    assert len(guides) >= 10, [g.name for g in guides]
    for guide in guides:
        assert marked_blocks(guide.read_text(encoding="utf-8")), f"{guide.name} has no marked block"


def test_the_marker_parser_finds_blocks_and_precisions() -> None:
    text = (
        "<!-- test: one -->\n```python\nprint(1)\n```\n"
        "```python\nnot marked\n```\n"
        '<!-- test: two, precisions: fp16 bf16 -->\n\n```python\nmixed_precision("fp16", backend="jax")\n```\n'
        "<!-- test: three -->\n```bash\nunimem info\n```\n"
    )
    assert marked_blocks(text) == [
        ("one", "python", "print(1)", None),
        ("two", "python", 'mixed_precision("fp16", backend="jax")', "fp16"),
        ("two", "python", 'mixed_precision("fp16", backend="jax")', "bf16"),
        ("three", "bash", "unimem info", None),
    ]
    assert with_precision('mixed_precision("fp16", backend="jax")', "bf16") == 'mixed_precision("bf16", backend="jax")'
    assert frameworks_in("import keras\nimport numpy as np\nfrom jax import numpy\n") == {"tensorflow", "jax"}
    assert frameworks_in("unimem compare -f torch -w mlp\n") == {"torch"}


def _run_block(py: Any, block: Block, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    if block.lang == "bash":
        proc = run_bash(block.code, cwd)
    else:
        proc = py(with_precision(block.code, block.precision), cwd=cwd)
    return proc, time.monotonic() - started


@pytest.fixture(scope="session")
def block_runs(request: pytest.FixtureRequest, py: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Future]:
    """The selected blocks' runs, started at once (a block whose framework is missing is not).

    Empty under pytest-xdist: every worker collects every test, so each would start them all.
    """
    runs: dict[int, Future] = {}
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return runs
    pool = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1))
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        block = params.get("block")
        if getattr(item, "originalname", None) != "test_documented_block_runs" or block is None:
            continue
        if all(importlib.util.find_spec(fw) is not None for fw in frameworks_in(block.code)):
            cwd = tmp_path_factory.mktemp(block.name)
            runs[id(block)] = pool.submit(_run_block, py, block, cwd)
    pool.shutdown(wait=False)
    return runs


# A block that imports a framework runs in the slow set: each is a process spent mostly importing it.
@pytest.mark.parametrize(
    "path, block",
    [pytest.param(path, b, marks=[pytest.mark.slow] if frameworks_in(b.code) else []) for path, b in BLOCKS],
    ids=[f"{b.name}-{b.precision}" if b.precision else b.name for _, b in BLOCKS],
)
def test_documented_block_runs(
    block_runs: dict[int, Future], py: Any, tmp_path: Path, path: Path, block: Block
) -> None:
    for framework in sorted(frameworks_in(block.code)):
        need_framework(framework)
    started = block_runs.get(id(block))
    proc, took = started.result() if started is not None else _run_block(py, block, tmp_path)
    where = f"{path.relative_to(REPO)}: block {block.name!r} ({block.precision or 'as written'})"
    assert proc.returncode == 0, (
        f"{where} exited {proc.returncode}\n"
        f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-5000:]}"
    )
    assert took < SECONDS, f"{where} took {took:.0f} s; keep marked blocks to a few seconds"
