#!/usr/bin/env bash
# The main job: install everything, then show frameworks, devices and memory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
unimem info
unimem stats
