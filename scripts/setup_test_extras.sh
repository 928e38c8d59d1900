#!/usr/bin/env bash
# Extras only the test suite needs; each step is skipped when already done. Filled in per feature.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
