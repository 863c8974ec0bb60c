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
# Each stage prints its seconds, so a slow one shows in the log.
set -euo pipefail
cd "$(dirname "$0")/.."
slow=0
case "${1:-}" in
  "") ;;
  --all) slow=1 ;;
  *) echo "usage: bash scripts/test.sh [--all]" >&2; exit 2 ;;
esac
total=$SECONDS
stage() { echo "test.sh: $1 in $((SECONDS - started)) s"; started=$SECONDS; }
started=$SECONDS
bash scripts/setup.sh test
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=3 TF_ENABLE_ONEDNN_OPTS=0
stage "setup"
ruff format --check .
ruff check .
# unimem's own modules, strictly, with the frameworks' types left out (a cold mypy spends 90 s
# reading torch, TensorFlow and JAX); the second step checks the calls into them too.
mypy --follow-imports=skip --no-warn-unused-ignores unimem backends
stage "lint and types"
unimem matrix --check
mkdocs build --strict --site-dir "$(mktemp -d)"
stage "matrix and docs"
# One worker per core: most tests start fresh interpreters, and two of those run side by side.
pytest=(python -m pytest tests --ignore=tests/gpu -q -p no:cacheprovider -n auto --hypothesis-profile=repeatable)
"${pytest[@]}" -m "not slow"
stage "fast set"
echo "test.sh: the test command took $((SECONDS - total)) s"
if [ "$slow" = 1 ]; then
  mypy unimem backends
  stage "types against the frameworks"
  bash scripts/install-chromium.sh
  stage "chromium"
  "${pytest[@]}" -m slow
  stage "slow set"
fi
