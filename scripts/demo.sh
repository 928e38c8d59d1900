#!/usr/bin/env bash
# Sets up the pinned dev environment if needed, then runs the main job on the embedded default (tools/demo.py).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup_dev.sh"
cd "$root"
exec .venv/bin/python -m tools.demo "$@"
