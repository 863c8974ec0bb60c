"""The page's template filled: its style, its scripts, the manifest and the data, inline.

The template, the style and the scripts are package data in ``assets/`` beside this module
(pyproject.toml ships them in the wheel); every page holds them, so it opens without a network.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from typing import Any

__all__ = ["fill"]

_ASSETS = "assets"  # the page's template, style and scripts: package data beside this module


def _asset(name: str) -> str:
    return (resources.files("unimem.view") / _ASSETS / name).read_text(encoding="utf-8")


def _script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element: no ``<`` can close it or open a comment."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def fill(manifest: dict[str, Any], packed: str) -> str:
    """The template with its slots (``{{NAME}}``) filled: the style, the scripts, the manifest, the data.

    The template is cut at its slots once, so text put in (a mark's label) is never read as a slot.
    """
    contents = {
        "TITLE": html.escape(manifest["title"]),
        "STYLE": _asset("view.css"),
        "SCRIPT": _asset("thinning.js") + _asset("view.js"),
        "MANIFEST": _script_json(manifest),
        "DATA": packed,
    }
    parts = re.split(r"\{\{([A-Z]+)\}\}", _asset("page.html"))
    return "".join(contents[part] if index % 2 else part for index, part in enumerate(parts))
