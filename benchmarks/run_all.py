"""Run the latency benchmarks (``import unimem`` cost, ``stats()`` latency) and write one JSON.

python benchmarks/run_all.py --out benchmarks/results/gpu-h200.json --machine "nvidia-h200 (device tool)"

Run it alone on the machine: other work in the same machine moves both figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import benchlib

HERE = Path(__file__).resolve().parent
BENCHMARKS = {"import": "bench_import.py", "stats": "bench_stats.py"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON file to write (default: stdout)")
    parser.add_argument("--machine", default=None, help="how to name this machine in the output")
    args, extra = parser.parse_known_args(argv)
    combined: dict[str, object] = {}
    code = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, script in BENCHMARKS.items():
            out = Path(tmp) / f"{name}.json"
            command = [sys.executable, str(HERE / script), "--out", str(out)]
            if args.machine:
                command += ["--machine", args.machine]
            done = subprocess.run(command)
            code = code or done.returncode
            combined[name] = json.loads(out.read_text()) if out.is_file() else {"error": f"exit {done.returncode}"}
    benchlib.write(combined, args.out)
    return code


if __name__ == "__main__":
    sys.exit(main())
