#!/usr/bin/env bash
# The main job: install everything, show frameworks, devices and memory, then run the
# same workloads in every installed framework side by side (compare-results/: JSON + PNG).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh plot
. .venv/bin/activate
unimem info
unimem stats
unimem compare --out compare-results
