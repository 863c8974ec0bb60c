#!/usr/bin/env bash
# Install Debian's chromium, which the browser tests (tests/observe/test_view_browser.py, all in
# the slow set) drive: never a downloaded browser. As root or with sudo; where neither is
# possible it says so, and those tests fail, loudly.
set -euo pipefail
[ -x /usr/bin/chromium ] && exit 0
as_root=()
[ "$(id -u)" = 0 ] || as_root=(sudo -n)
if command -v apt-get >/dev/null && { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then
  { "${as_root[@]}" apt-get update -qq &&
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } ||
    echo "install-chromium: apt-get could not install chromium; the browser tests will fail" >&2
else
  echo "install-chromium: no /usr/bin/chromium, and no root or sudo to install it; the browser tests will fail" >&2
fi
