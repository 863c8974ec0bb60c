#!/usr/bin/env bash
# Install everything, then lint, type-check, check the matrix is current, build the API
# reference strictly (a broken docstring or link fails), and run the
# CPU test suite with every framework (torch, TensorFlow, JAX, CuPy). A pytest run that collects no test exits 5,
# which fails this script like any other failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=3 TF_ENABLE_ONEDNN_OPTS=0
ruff format --check .
ruff check .
mypy unimem backends
unimem matrix --check
mkdocs build --strict --site-dir "$(mktemp -d)"
# One worker per core: most tests start fresh interpreters, and two of those run side by side.
python -m pytest tests --ignore=tests/gpu -q -p no:cacheprovider -n auto
