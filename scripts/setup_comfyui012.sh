#!/usr/bin/env bash
# Idempotent set-up of the second ComfyUI the tests run on: upstream ComfyUI 0.12.1 (its pip-installable distribution)
# in ./.cache/comfyui-0.12 (src/ and its own venv/: torch 2.14.1 + torchao 0.18.0, the pair .venv pins), built by
# ../shared/comfyui-0.12/setup.sh from the source archive beside it and the package registry. Adds the test runner.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
. "$root/scripts/lib.sh"
dest="$root/.cache/comfyui-0.12"
# The archive sits in ../shared beside the checkout; a clone made elsewhere (CI's clean clone of main) finds it beside
# the repository it was cloned from, or where PREQUANT_SHARED points.
origin="$(git -C "$root" config --get remote.origin.url 2>/dev/null || true)"
shared=""
for cand in "${PREQUANT_SHARED:-}" "$root/../shared" "${origin:+$origin/../shared}"; do
  if [ -n "$cand" ] && [ -f "$cand/comfyui-0.12/setup.sh" ]; then shared="$(cd "$cand/comfyui-0.12" && pwd)"; break; fi
done
# the test runner's pins (from requirements-dev.txt): a change of them re-installs just these
pins=$(grep -E '^(pytest|pytest-xdist|execnet|hypothesis)==' "$root/requirements-dev.txt")
stamp="$dest/venv/.prequant-tests-$(echo "$pins" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  if [ ! -f "$dest/venv/.ready" ]; then
    [ -n "$shared" ] || { echo "[setup] ../shared/comfyui-0.12/setup.sh (the ComfyUI 0.12.1 archive) is missing: looked" \
      "beside this checkout, beside its origin ($origin) and in PREQUANT_SHARED" >&2; exit 1; }
    echo "[setup] building ComfyUI 0.12.1 in $dest (a few minutes, once)"
    t0=$SECONDS
    pipq bash "$shared/setup.sh" "$dest"
    echo "[setup] ComfyUI 0.12.1 built in $((SECONDS - t0)) s"
    [ -f "$dest/venv/.ready" ] || { echo "[setup] ComfyUI 0.12.1 did not build" >&2; exit 1; }
  fi
  # shellcheck disable=SC2086
  pipq "$dest/venv/bin/pip" install -q $pins -c "$dest/constraints.txt"
  "$dest/venv/bin/python" -c "import pytest, xdist, hypothesis, torch, torchao, comfy; assert comfy.__version__ == '0.12.1'"
  rm -f "$dest"/venv/.prequant-tests*
  touch "$stamp"
fi
