#!/usr/bin/env bash
# Idempotent set-up of the second ComfyUI the tests run on: upstream ComfyUI 0.12.1 (its pip-installable distribution)
# in ./.cache/comfyui-0.12 (src/ and its own venv/: torch 2.14.1 + torchao 0.18.0, the pair .venv pins), built by
# ../shared/comfyui-0.12/setup.sh from the source archive beside it and the package registry. Adds the test runner.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.cache/comfyui-0.12"
shared="$root/../shared/comfyui-0.12"
if [ ! -f "$dest/venv/.prequant-tests" ]; then
  [ -f "$shared/setup.sh" ] || { echo "[setup] $shared/setup.sh is missing (the ComfyUI 0.12.1 archive)" >&2; exit 1; }
  echo "[setup] building ComfyUI 0.12.1 in $dest (a few minutes, once)"
  bash "$shared/setup.sh" "$dest" 2>&1 | grep -v "^WARNING: Location" || true
  [ -f "$dest/venv/.ready" ] || { echo "[setup] ComfyUI 0.12.1 did not build" >&2; exit 1; }
  pins=$(grep -E '^(pytest|hypothesis)==' "$root/requirements-dev.txt")
  # shellcheck disable=SC2086
  "$dest/venv/bin/pip" install -q $pins -c "$dest/constraints.txt" 2>&1 | grep -v "^WARNING: Location" || true
  "$dest/venv/bin/python" -c "import pytest, hypothesis, torch, torchao, comfy; assert comfy.__version__ == '0.12.1'"
  touch "$dest/venv/.prequant-tests"
fi
