"""README code that runs: every ```python block marked ``<!-- test: NAME -->`` runs in CI.

A block is marked by an HTML comment on the line before it (GitHub does not render it):

    <!-- test: readme-torch -->
    <!-- test: readme-torch, precisions: fp16 bf16 -->

Each marked block runs in a fresh interpreter (the ``py`` fixture) and must exit 0, so
README code that rots fails the suite. ``precisions:`` runs the block once per listed
precision, with its ``mixed_precision("fp16"`` call changed to that precision: the README
says the same loop serves every precision, and this holds it to that. Keep marked blocks
fast (tiny models, a few steps: seconds on 2 CPU cores).
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from conftest import REPO, need_framework

README = REPO / "README.md"
MARKER = re.compile(r"<!--\s*test:\s*(?P<name>[\w.-]+)(?:\s*,\s*precisions:\s*(?P<precisions>[\w ]+?))?\s*-->")
# A marked block: the marker, optional blank lines, then a ```python fence.
BLOCK = re.compile(MARKER.pattern + r"[ \t]*\n(?:[ \t]*\n)*```python[ \t]*\n(?P<code>.*?)\n```", re.DOTALL)
PRECISION_CALL = 'mixed_precision("fp16"'
# Top-level modules a block may import, and the framework each needs.
FRAMEWORK_OF = {"torch": "torch", "tensorflow": "tensorflow", "keras": "tensorflow", "jax": "jax", "cupy": "cupy"}
SECONDS = 60  # far above what a marked block should take: catches a block grown into a real training run


def marked_blocks(text: str) -> list[tuple[str, str, str | None]]:
    """``(name, code, precision)`` for every marked block (one per listed precision)."""
    found = []
    for match in BLOCK.finditer(text):
        precisions = (match["precisions"] or "").split()
        for precision in precisions or [None]:
            found.append((match["name"], match["code"], precision))
    return found


def frameworks_in(code: str) -> set[str]:
    modules = re.findall(r"^\s*(?:import|from)\s+(\w+)", code, flags=re.MULTILINE)
    return {FRAMEWORK_OF[module] for module in modules if module in FRAMEWORK_OF}


def with_precision(code: str, precision: str | None) -> str:
    if precision is None:
        return code
    assert code.count(PRECISION_CALL) == 1, f"a block with precisions: calls {PRECISION_CALL} once"
    return code.replace(PRECISION_CALL, f'mixed_precision("{precision}"')


BLOCKS = marked_blocks(README.read_text(encoding="utf-8"))


def test_every_marker_is_followed_by_a_python_block() -> None:
    text = README.read_text(encoding="utf-8")
    markers = [m["name"] for m in MARKER.finditer(text)]
    blocks = [m["name"] for m in BLOCK.finditer(text)]
    assert markers == blocks, "a <!-- test: --> marker must sit on the line before a ```python block"
    assert len(set(markers)) == len(markers), f"marker names repeat: {markers}"
    assert {"readme-torch", "readme-keras", "readme-jax"} <= set(markers), "the mixed-precision loops are marked"


def test_the_marker_parser_finds_blocks_and_precisions() -> None:
    text = (
        "<!-- test: one -->\n```python\nprint(1)\n```\n"
        "```python\nnot marked\n```\n"
        '<!-- test: two, precisions: fp16 bf16 -->\n\n```python\nmixed_precision("fp16", backend="jax")\n```\n'
    )
    assert marked_blocks(text) == [
        ("one", "print(1)", None),
        ("two", 'mixed_precision("fp16", backend="jax")', "fp16"),
        ("two", 'mixed_precision("fp16", backend="jax")', "bf16"),
    ]
    assert with_precision('mixed_precision("fp16", backend="jax")', "bf16") == 'mixed_precision("bf16", backend="jax")'
    assert frameworks_in("import keras\nimport numpy as np\nfrom jax import numpy\n") == {"tensorflow", "jax"}


@pytest.mark.parametrize(
    "name, code, precision",
    BLOCKS,
    ids=[f"{name}-{precision}" if precision else name for name, _, precision in BLOCKS],
)
def test_readme_block_runs(py: Any, name: str, code: str, precision: str | None) -> None:
    for framework in sorted(frameworks_in(code)):
        need_framework(framework)
    started = time.monotonic()
    proc = py(with_precision(code, precision))
    took = time.monotonic() - started
    assert proc.returncode == 0, (
        f"README block {name!r} ({precision or 'as written'}) exited {proc.returncode}\n"
        f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-5000:]}"
    )
    assert took < SECONDS, f"README block {name!r} took {took:.0f} s; keep marked blocks to a few seconds"
