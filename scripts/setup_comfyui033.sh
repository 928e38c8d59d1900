#!/usr/bin/env bash
# Idempotent set-up of the ComfyUI the tests run on first: upstream ComfyUI 0.33.0 (source tree, started as main.py)
# in ./.cache/comfyui-0.33 (comfyui-0.33.0/ and venv/), built by ../shared/comfyui-0.33/setup.sh from the source
# archive beside it and the package registry. Its venv sees ./.venv's packages through a .pth file placed after its
# own (torch, torchao, the test runner, diffusers: the same pins, not another 5 GB), and installs only what 0.33 adds
# (comfy-kitchen, comfy-aimdo, its front end and templates, ...): about half a minute.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
. "$root/scripts/lib.sh"
dest="$root/.cache/comfyui-0.33"
shared="$(shared_dir "$root" comfyui-0.33)"
if [ ! -f "$dest/venv/.ready" ] || [ ! -f "$dest/comfyui-0.33.0/main.py" ]; then
  [ -n "$shared" ] || { echo "[setup] ../shared/comfyui-0.33/setup.sh (the ComfyUI 0.33.0 archive) is missing: looked" \
    "beside this checkout, beside the repository it was cloned from and in PREQUANT_SHARED" >&2; exit 1; }
  "$root/scripts/setup_dev.sh" >/dev/null
  echo "[setup] building ComfyUI 0.33.0 in $dest (once)"
  t0=$SECONDS
  rm -rf "$dest/venv"
  dev_sp="$("$root/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  pipq bash "$shared/setup.sh" "$dest" "$dev_sp"
  echo "[setup] ComfyUI 0.33.0 built in $((SECONDS - t0)) s"
fi
mkdir -p "$dest/comfyui-0.33.0/custom_nodes"
ln -sfn "$root" "$dest/comfyui-0.33.0/custom_nodes/ComfyUI-Prequant"
