#!/usr/bin/env bash
# Sets up the pinned dev environment if needed, then runs the whole test suite in two tiers:
#   core     prequant_core alone, ComfyUI absent (tests/no_comfyui.py): CORE_TESTS below
#   comfyui  everything else: the real ComfyUI in-process and as a server, the browser
# With test paths as arguments it runs just those (one pytest run).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup_dev.sh" --with-test-extras
cd "$root"
# torch.compile's cache stays inside the checkout like everything else the suite makes.
export TORCHINDUCTOR_CACHE_DIR="$root/.cache/torchinductor"
for a in "$@"; do  # a test file, folder or node id among the arguments (option values such as no:cacheprovider are not)
  case "$a" in -*) ;; *) if [ -e "${a%%::*}" ]; then exec .venv/bin/python -m pytest "$@"; fi ;; esac
done
CORE_TESTS=(tests/test_core_tier.py tests/test_bad_input.py tests/test_build_faults.py tests/test_hostile_files.py
            tests/test_unsloth_parity.py tests/test_registry.py tests/test_fuzz.py)
echo "[test] core tier: prequant_core without ComfyUI (${#CORE_TESTS[@]} files)"
rc=0
PYTHONPATH="$root/tests" .venv/bin/python -m pytest -p no_comfyui "${CORE_TESTS[@]}" "$@" || rc=$?
echo "[test] ComfyUI tier: the real ComfyUI 0.3.75 in-process, as a server, and in the browser"
ignore=()
for f in "${CORE_TESTS[@]}"; do ignore+=(--ignore="$f"); done
.venv/bin/python -m pytest tests "${ignore[@]}" "$@" || rc=$?
exit "$rc"
