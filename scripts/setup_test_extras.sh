#!/usr/bin/env bash
# Extras only the test suite needs; each step is skipped when already done.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# Headless Chromium (Debian's package) for the browser test, driven by playwright-core from npm.
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
  echo "[setup] installing Debian's chromium for the browser test"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null
fi
if [ ! -d tests/browser/node_modules/playwright-core ]; then
  echo "[setup] npm ci (playwright-core, no browser download)"
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --prefix tests/browser --no-audit --no-fund --loglevel=error >/dev/null
fi
