#!/usr/bin/env bash
# Extras only some tests need; each step is skipped when already done. With names as arguments (browser, frontend158, strace,
# torchao014, comfy-cli, diffusers042, comfy-kitchen, comfy-templates, hf24, coverage) only those are set up; with none,
# all of them but coverage (scripts/test.sh names the ones the selected test files need; --coverage adds coverage).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. "$root/scripts/lib.sh"
wanted=("$@")
need() { [ "${#wanted[@]}" -eq 0 ] && [ "$1" != coverage ] && return 0; local w; for w in "${wanted[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1; }
apt_once() {  # Debian packages as root; the package lists are fetched once per run
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "${_apt_updated:-}" ]; then apt-get update -qq >/dev/null; _apt_updated=1; fi
  apt-get install -y -qq "$@" >/dev/null
}
# Headless Chromium (Debian's package) for the browser test, driven by playwright-core from npm.
if need browser && ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
  echo "[setup] installing Debian's chromium for the browser test"
  apt_once chromium
fi
# Debian's strace for the load-trace test (tests/load/test_load_trace.py: how often a load opens the checkpoint)
if need strace && ! command -v strace >/dev/null 2>&1; then
  echo "[setup] installing Debian's strace for the load-trace test"
  apt_once strace
fi
if need browser && [ ! -d tests/browser/node_modules/playwright-core ]; then
  echo "[setup] npm ci (playwright-core, no browser download)"
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --prefix tests/browser --no-audit --no-fund --loglevel=error >/dev/null
fi
# ComfyUI's newest front end (comfyui-frontend-package 1.58.1, static files only) for the folding check of
# tests/project/test_browser_fold.py, served by ComfyUI 0.3.75's server through --front-end-root.
if need frontend158 && [ ! -f .cache/frontend158/comfyui_frontend_package/static/index.html ]; then
  echo "[setup] comfyui-frontend-package 1.58.1 into .cache/frontend158 (the newer front end's folding check)"
  pipq .venv/bin/python -m pip install -q --no-deps --target .cache/frontend158 comfyui-frontend-package==1.58.1
fi
# ComfyUI's own workflow templates (comfyui-workflow-templates-json, Comfy-Org's template files, JSON only): the
# workflows of families that need a newer ComfyUI than any tested here are held against them
# (tests/project/test_example_workflows.py).
if need comfy-templates && [ ! -d .cache/comfy-templates/comfyui_workflow_templates_json/templates ]; then
  echo "[setup] comfyui-workflow-templates-json 0.1.123 into .cache/comfy-templates (ComfyUI's own templates)"
  pipq .venv/bin/python -m pip install -q --no-deps --target .cache/comfy-templates comfyui-workflow-templates-json==0.1.123
fi
# huggingface_hub 2.4.0 (with its own dependencies) for the download child only, in tests/hub/test_hub_staging.py: newer
# clients write a fresh partial file on every attempt and never resume, which the download watcher must follow.
if need hf24 && [ ! -f .cache/hf24/huggingface_hub/__init__.py ]; then
  echo "[setup] huggingface_hub 2.4.0 into .cache/hf24 (the newer client's downloads, tests only)"
  pipq .venv/bin/python -m pip install -q --no-warn-conflicts --target .cache/hf24 huggingface_hub==2.4.0
fi
# torchao 0.14.1 (still has the v1 tensor classes) beside the current one, for legacy-file fixtures only.
if need torchao014 && [ ! -f .cache/torchao014/torchao/__init__.py ]; then
  echo "[setup] torchao 0.14.1 into .cache/torchao014 (legacy v1 test fixtures)"
  pipq .venv/bin/python -m pip install -q --no-deps --target .cache/torchao014 torchao==0.14.1
fi
# The Comfy Registry's own tooling (comfy-cli: `comfy node validate` / `comfy node pack`) for tests/project/test_registry.py,
# in its own venv inside the checkout (its pins must not move the dev env's packages).
if need comfy-cli && { [ ! -x .cache/comfy-cli/bin/comfy ] || ! .cache/comfy-cli/bin/python -m ruff --version >/dev/null 2>&1; }; then
  echo "[setup] comfy-cli 1.23.0 into .cache/comfy-cli (Registry validator)"
  python3 -m venv .cache/comfy-cli
  pipq .cache/comfy-cli/bin/python -m pip install -q --disable-pip-version-check comfy-cli==1.23.0
fi
# diffusers 0.42.1 (Krea2Transformer2DModel, QwenImage21Transformer2DModel) beside the pinned 0.38.0, with the
# huggingface_hub / transformers / tokenizers it needs, for the diffusers-loader tests of those two families only
# (run in a subprocess with this folder first on PYTHONPATH; see tests/test_diffusers_loader.py).
if need diffusers042 && { [ ! -f .cache/diffusers042/diffusers/__init__.py ] || [ ! -f .cache/diffusers042/transformers/__init__.py ]; }; then
  echo "[setup] diffusers 0.42.1 into .cache/diffusers042 (Krea 2 / Qwen-Image 2.1 diffusers classes, tests only)"
  pipq .venv/bin/python -m pip install -q --no-deps --upgrade --target .cache/diffusers042 diffusers==0.42.1 \
    huggingface_hub==1.32.0 click==8.4.2 transformers==5.24.0 tokenizers==0.23.1
fi
# comfy-kitchen 0.2.40 (ComfyUI's kernel library; its pure-Python wheel: the eager CPU reference functions) for the
# ComfyUI-native format tests' writer and reference dequantization only (tests/comfy_quantizer.py); the pack itself
# never imports it.
if need comfy-kitchen && [ ! -f .cache/comfy-kitchen/comfy_kitchen/__init__.py ]; then
  echo "[setup] comfy-kitchen 0.2.40 (pure wheel) into .cache/comfy-kitchen (ComfyUI-native format tests)"
  rm -rf .cache/comfy-kitchen-dl
  pipq .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --platform any --python-version 3.11 \
    comfy-kitchen==0.2.40 -d .cache/comfy-kitchen-dl
  pipq .venv/bin/python -m pip install -q --no-deps --target .cache/comfy-kitchen .cache/comfy-kitchen-dl/*.whl
  rm -rf .cache/comfy-kitchen-dl
fi
# coverage.py for `scripts/test.sh --coverage` only, into .cache/coverage-pkg (no venv's pins move): each venv a run
# uses gets a .pth that puts it on the path and starts it in every Python process where COVERAGE_PROCESS_START is set
# (scripts/test.sh: coverage_hook), so servers, workers and children are measured too.
if need coverage && [ ! -f .cache/coverage-pkg/coverage/__init__.py ]; then
  echo "[setup] coverage 7.17.3 into .cache/coverage-pkg (scripts/test.sh --coverage)"
  pipq .venv/bin/python -m pip install -q --no-deps --target .cache/coverage-pkg coverage==7.17.3
fi
