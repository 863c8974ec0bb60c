#!/usr/bin/env bash
# Install everything, then lint, type-check, check the matrix is current, build the docs strictly
# (a broken docstring or link fails), and run the CPU test suite with every framework (torch,
# TensorFlow, JAX, CuPy).
#
#   bash scripts/test.sh          the fast set: every test not marked slow
#   bash scripts/test.sh --all    then, as a second step, the slow set (end-to-end runs of several
#                                 seconds each: launchers, compare, kills, trainers, the browser);
#                                 what CI runs
#
# A pytest run that collects no test exits 5, which fails this script like any other failure.
set -euo pipefail
cd "$(dirname "$0")/.."
slow=0
case "${1:-}" in
  "") ;;
  --all) slow=1 ;;
  *) echo "usage: bash scripts/test.sh [--all]" >&2; exit 2 ;;
esac
bash scripts/setup.sh test
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=3 TF_ENABLE_ONEDNN_OPTS=0
ruff format --check .
ruff check .
mypy unimem backends
unimem matrix --check
mkdocs build --strict --site-dir "$(mktemp -d)"
# One worker per core: most tests start fresh interpreters, and two of those run side by side.
pytest=(python -m pytest tests --ignore=tests/gpu -q -p no:cacheprovider -n auto)
SECONDS=0
"${pytest[@]}" -m "not slow"
echo "test.sh: fast set passed in ${SECONDS} s"
if [ "$slow" = 1 ]; then
  SECONDS=0
  "${pytest[@]}" -m slow
  echo "test.sh: slow set passed in ${SECONDS} s"
fi
