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
# Debian's strace for the load-trace test (tests/test_load_trace.py: how often a load opens the checkpoint)
if ! command -v strace >/dev/null 2>&1; then
  echo "[setup] installing Debian's strace for the load-trace test"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq strace >/dev/null
fi
if [ ! -d tests/browser/node_modules/playwright-core ]; then
  echo "[setup] npm ci (playwright-core, no browser download)"
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --prefix tests/browser --no-audit --no-fund --loglevel=error >/dev/null
fi
# torchao 0.14.1 (still has the v1 tensor classes) beside the current one, for legacy-file fixtures only.
if [ ! -f .cache/torchao014/torchao/__init__.py ]; then
  echo "[setup] torchao 0.14.1 into .cache/torchao014 (legacy v1 test fixtures)"
  .venv/bin/python -m pip install -q --no-deps --no-cache-dir --target .cache/torchao014 torchao==0.14.1 2>&1 \
    | grep -v '^WARNING: Location' || true
fi
# The Comfy Registry's own tooling (comfy-cli: `comfy node validate` / `comfy node pack`) for tests/test_registry.py,
# in its own venv inside the checkout (its pins must not move the dev env's packages).
if [ ! -x .cache/comfy-cli/bin/comfy ] || ! .cache/comfy-cli/bin/python -m ruff --version >/dev/null 2>&1; then
  echo "[setup] comfy-cli 1.23.0 into .cache/comfy-cli (Registry validator)"
  python3 -m venv .cache/comfy-cli
  .cache/comfy-cli/bin/python -m pip install -q --disable-pip-version-check comfy-cli==1.23.0 2>&1 \
    | grep -v '^WARNING: Location' || true
fi
# diffusers 0.42.1 (Krea2Transformer2DModel, QwenImage21Transformer2DModel) beside the pinned 0.38.0, with the
# huggingface_hub / transformers / tokenizers it needs, for the diffusers-loader tests of those two families only
# (run in a subprocess with this folder first on PYTHONPATH; see tests/test_diffusers_loader.py).
if [ ! -f .cache/diffusers042/diffusers/__init__.py ] || [ ! -f .cache/diffusers042/transformers/__init__.py ]; then
  echo "[setup] diffusers 0.42.1 into .cache/diffusers042 (Krea 2 / Qwen-Image 2.1 diffusers classes, tests only)"
  .venv/bin/python -m pip install -q --no-deps --no-cache-dir --upgrade --target .cache/diffusers042 diffusers==0.42.1 \
    huggingface_hub==1.32.0 click==8.4.2 transformers==5.24.0 tokenizers==0.23.1 2>&1 | grep -v '^WARNING: Location' || true
fi
# comfy-kitchen 0.2.40 (ComfyUI's kernel library; its pure-Python wheel: the eager CPU reference functions) for the
# ComfyUI-native format tests' writer and reference dequantization only (tests/comfy_quantizer.py); the pack itself
# never imports it.
if [ ! -f .cache/comfy-kitchen/comfy_kitchen/__init__.py ]; then
  echo "[setup] comfy-kitchen 0.2.40 (pure wheel) into .cache/comfy-kitchen (ComfyUI-native format tests)"
  rm -rf .cache/comfy-kitchen-dl
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --platform any --python-version 3.11 \
    comfy-kitchen==0.2.40 -d .cache/comfy-kitchen-dl 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -m pip install -q --no-deps --target .cache/comfy-kitchen .cache/comfy-kitchen-dl/*.whl 2>&1 \
    | grep -v '^WARNING: Location' || true
  rm -rf .cache/comfy-kitchen-dl
fi
