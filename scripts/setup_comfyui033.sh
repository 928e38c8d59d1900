#!/usr/bin/env bash
# Idempotent set-up of the ComfyUI the tests run on first: upstream ComfyUI 0.33.0 (source tree, started as main.py)
# in ./.cache/comfyui-0.33 (comfyui-0.33.0/ and venv/). The sources come from the nearest of a mirror
# (PREQUANT_COMFYUI_MIRROR), an offline copy in ../shared, or upstream at the pinned commit, checked before use
# (scripts/comfyui_sources.py). Its venv sees ./.venv's packages through a .pth file placed after its own (torch,
# torchao, the test runner, diffusers: the same pins, not another 5 GB) and installs only what 0.33 adds
# (scripts/comfyui-0.33.0-requirements.txt: comfy-kitchen, comfy-aimdo, its front end and templates, ...): about
# half a minute once the sources are here.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
. "$root/scripts/lib.sh"
dest="$root/.cache/comfyui-0.33"
tree="$dest/comfyui-0.33.0"
if [ ! -f "$dest/venv/.ready" ] || [ ! -f "$tree/main.py" ]; then
  "$root/scripts/setup_dev.sh" >/dev/null
  echo "[setup] building ComfyUI 0.33.0 in $dest (once)"
  t0=$SECONDS
  [ -f "$tree/main.py" ] || python3 "$root/scripts/comfyui_sources.py" 0.33.0 "$dest"
  rm -rf "$dest/venv"
  python3 -m venv "$dest/venv"
  printf 'torch==2.14.1\ntorchvision==0.29.1\ntorchao==0.18.0\n' > "$dest/constraints.txt"
  # torch, torchvision, torchao (and the rest of .venv) through a .pth after the venv's own packages
  dev_sp="$("$root/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  sp="$("$dest/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$dev_sp" > "$sp/zz_torch_from_elsewhere.pth"
  pipq "$dest/venv/bin/pip" install -q -r "$root/scripts/comfyui-0.33.0-requirements.txt" -c "$dest/constraints.txt"
  # ComfyUI imports torchaudio at module level (audio VAEs, nodes_audio); the registry's newest is 2.11.1, built for
  # an older torch: installed without its dependencies, its Python side imports and nothing here calls its kernels.
  PIP_CONSTRAINT= pipq "$dest/venv/bin/pip" install -q --no-deps torchaudio==2.11.1
  "$dest/venv/bin/python" -c "import sys; sys.path.insert(0, '$tree'); import comfyui_version, torch, torchao
assert comfyui_version.__version__ == '0.33.0', comfyui_version.__version__"
  touch "$dest/venv/.ready"
  echo "[setup] ComfyUI 0.33.0 built in $((SECONDS - t0)) s"
fi
mkdir -p "$tree/custom_nodes"
ln -sfn "$root" "$tree/custom_nodes/ComfyUI-Prequant"
