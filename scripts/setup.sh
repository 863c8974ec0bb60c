#!/usr/bin/env bash
# Create .venv (if missing) with the CPU frameworks and unimem installed editable.
# Usage: source scripts/setup.sh [extras]   e.g. "test"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
extras="${1:-}"
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --disable-pip-version-check --no-compile -r requirements-cpu.txt
python -m pip install -q --disable-pip-version-check --no-compile -e ".${extras:+[$extras]}"
