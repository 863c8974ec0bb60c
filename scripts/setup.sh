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
# The browser tests (tests/observe/test_view_browser.py) drive Debian's chromium, never a downloaded
# browser: installed here when missing, as root or with sudo. Where it cannot be, they fail, loudly.
if [[ ",${extras}," == *",test,"* ]] && [ ! -x /usr/bin/chromium ]; then
  as_root=()
  [ "$(id -u)" = 0 ] || as_root=(sudo -n)
  if command -v apt-get >/dev/null && { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then
    { "${as_root[@]}" apt-get update -qq &&
      "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } ||
      echo "setup: apt-get could not install chromium; the browser tests will fail" >&2
  else
    echo "setup: no /usr/bin/chromium, and no root or sudo to install it; the browser tests will fail" >&2
  fi
fi
