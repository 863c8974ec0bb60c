"""Cost of ``import unimem`` over a bare interpreter, in fresh processes.

    python benchmarks/bench_import.py [--runs 40] [--out FILE] [--machine LABEL]

Two measures, each the median of many fresh interpreters, the two kinds interleaved
so that drift hits both alike:

- wall: ``python -c "import unimem"`` minus ``python -c "pass"``, start to exit;
- importtime: the cumulative time Python's ``-X importtime`` gives ``unimem`` itself.

It also checks, and fails on, the rule that ``import unimem`` (and asking which
backends are available and what they can do) imports no framework and no NVML.
Target, reported not asserted: under 20 ms beyond a bare interpreter.

Run it against an installed (not editable) unimem: an editable install's finder adds
imports of its own to every interpreter.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from typing import Any

import benchlib

TARGET_MS = 20.0
WATCHED = ("torch", "jax", "jaxlib", "tensorflow", "pynvml")
PROBE = f"""
import json, sys
import unimem
after_import = sorted(m for m in {WATCHED!r} if m in sys.modules)
unimem.available_backends()
for name in ("torch", "tensorflow", "jax", "nvml"):
    unimem.capabilities(name)
after_queries = sorted(m for m in {WATCHED!r} if m in sys.modules)
editable = any("editable" in type(f).__module__ or "editable" in repr(f) for f in sys.meta_path)
print(json.dumps({{"after_import": after_import, "after_queries": after_queries,
                  "unimem_file": unimem.__file__, "editable_finder_in_every_interpreter": editable}}))
"""


# ``python -c`` puts the working directory first on sys.path: from a checkout that would
# import the source tree (without its ``unimem.backends`` mapping) instead of the install.
NEUTRAL_CWD = tempfile.gettempdir()


def _wall(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, cwd=NEUTRAL_CWD)
    return (time.perf_counter() - start) * 1000.0


def _importtime(module: str) -> float:
    """Cumulative µs ``-X importtime`` reports for ``module``, in ms."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        check=True,
        capture_output=True,
        text=True,
        cwd=NEUTRAL_CWD,
    )
    for line in done.stderr.splitlines():
        # "import time:      self [us] | cumulative | imported package"
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] == module:
            return int(parts[1]) / 1000.0
    raise RuntimeError(f"-X importtime printed no line for {module}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="fresh interpreters of each kind (default 40)")
    parser.add_argument("--out", default=None, help="JSON file to write (default: stdout)")
    parser.add_argument("--machine", default=None, help="how to name this machine in the output")
    args = parser.parse_args(argv)

    probe = json.loads(
        subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True, cwd=NEUTRAL_CWD).stdout
    )

    for _ in range(3):  # warm the page cache and the .pyc files
        _wall("pass")
        _wall("import unimem")
    bare: list[float] = []
    loaded: list[float] = []
    importtime: list[float] = []
    for _ in range(args.runs):
        bare.append(_wall("pass"))
        loaded.append(_wall("import unimem"))
        importtime.append(_importtime("unimem"))
    overhead = [u - b for u, b in zip(loaded, bare, strict=True)]

    bare_s, loaded_s = benchlib.summary(bare), benchlib.summary(loaded)
    overhead_median = loaded_s["median"] - bare_s["median"]
    importtime_s = benchlib.summary(importtime)
    result: dict[str, Any] = benchlib.header("import", args.machine, [sys.argv[0], *(argv or sys.argv[1:])])
    result.update(
        {
            "runs": args.runs,
            "unit": "ms",
            "bare_interpreter_ms": bare_s,
            "import_unimem_ms": loaded_s,
            "overhead_ms": {"median_of_differences": benchlib.summary(overhead)["median"], "median": overhead_median},
            "importtime_unimem_cumulative_ms": importtime_s,
            "frameworks_imported": probe,
            "target": {
                "text": f"import unimem < {TARGET_MS:g} ms beyond a bare interpreter",
                "measured_ms": round(overhead_median, 3),
                "met": overhead_median < TARGET_MS,
            },
        }
    )
    benchlib.write(result, args.out)
    leaked = probe["after_import"] + probe["after_queries"]
    if leaked:
        print(f"FAIL: import unimem imported {sorted(set(leaked))}", file=sys.stderr)
        return 1
    print(
        f"import unimem: +{overhead_median:.2f} ms over a bare interpreter "
        f"({bare_s['median']:.1f} -> {loaded_s['median']:.1f} ms; -X importtime {importtime_s['median']:.2f} ms); "
        f"target < {TARGET_MS:g} ms: {'met' if overhead_median < TARGET_MS else 'MISSED'}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
