#!/usr/bin/env bash
# Sets up the pinned dev environment if needed, then runs the whole test suite.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup_dev.sh" --with-test-extras
cd "$root"
# torch.compile's cache stays inside the checkout like everything else the suite makes.
export TORCHINDUCTOR_CACHE_DIR="$root/.cache/torchinductor"
exec .venv/bin/python -m pytest tests "$@"
