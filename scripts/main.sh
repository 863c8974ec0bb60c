#!/usr/bin/env bash
# The main job: install everything, show frameworks, devices and memory, then run the
# same workloads in every installed framework side by side (compare-results/: JSON + PNG).
# The comparison is the quick grid (configurations default and cap); `bash scripts/main.sh --full`
# runs every configuration. Arguments go to `unimem compare`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh plot
. .venv/bin/activate
unimem info
unimem stats
unimem compare --out compare-results "$@"
