#!/usr/bin/env bash
# Idempotent set-up of the second ComfyUI the tests run on: upstream ComfyUI 0.12.1 (its pip-installable distribution)
# in ./.cache/comfyui-0.12 (src/ and its own venv/: torch 2.14.1 + torchao 0.18.0, the pair .venv pins). The sources
# come from the nearest of a mirror (PREQUANT_COMFYUI_MIRROR), an offline copy in ../shared, or upstream at the pinned
# commit, checked before use (scripts/comfyui_sources.py); its requirements: scripts/comfyui-0.12.1-requirements.txt.
# Adds the test runner.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
. "$root/scripts/lib.sh"
dest="$root/.cache/comfyui-0.12"
# the test runner's pins (from requirements-dev.txt): a change of them re-installs just these
pins=$(grep -E '^(pytest|pytest-xdist|execnet|hypothesis)==' "$root/requirements-dev.txt")
stamp="$dest/venv/.prequant-tests-$(echo "$pins soundfile-bundled" | sha256sum | cut -c1-16)"  # bump the words to redo the steps below
if [ ! -f "$stamp" ]; then
  if [ ! -f "$dest/venv/.ready" ]; then
    echo "[setup] building ComfyUI 0.12.1 in $dest (a few minutes, once)"
    t0=$SECONDS
    # torch 2.14.1 / torchvision 0.29.1 / torchao 0.18.0 (and torch's CUDA libraries) are the same pins as ./.venv's:
    # the venv is made first with those installed files on its path (links in $dest/dev-torch, named by a .pth file,
    # so they come after the venv's own packages), and pip finds them satisfied instead of unpacking another 5 GB.
    # pip never removes a package outside the venv, so nothing in ./.venv can be changed from here.
    "$root/scripts/setup_dev.sh" >/dev/null
    [ -f "$dest/src/pyproject.toml" ] || python3 "$root/scripts/comfyui_sources.py" 0.12.1 "$dest"
    rm -rf "$dest/venv" "$dest/dev-torch"
    python3 -m venv "$dest/venv"
    mkdir -p "$dest/dev-torch"
    dev_sp="$("$root/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    for e in "$dev_sp"/{torch,torchgen,functorch,torchvision,torchvision.libs,torchao,triton,nvidia,cuda} \
             "$dev_sp"/{torch,torchvision,torchao,triton}-[0-9]*.dist-info "$dev_sp"/{nvidia,cuda}_*.dist-info; do
      [ -e "$e" ] && ln -s "$e" "$dest/dev-torch/"
    done
    "$dest/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
      | { read -r sp; echo "$dest/dev-torch" > "$sp/prequant-dev-torch.pth"; }
    printf 'torch==2.14.1\ntorchvision==0.29.1\ntorchao==0.18.0\n' > "$dest/constraints.txt"
    pipq "$dest/venv/bin/pip" install -q torch==2.14.1 torchvision==0.29.1 torchao==0.18.0 -c "$dest/constraints.txt"
    pipq "$dest/venv/bin/pip" install -q -r "$root/scripts/comfyui-0.12.1-requirements.txt" -c "$dest/constraints.txt"
    pipq "$dest/venv/bin/pip" install -q --no-deps -e "$dest/src" -c "$dest/constraints.txt"
    touch "$dest/venv/.ready"
    echo "[setup] ComfyUI 0.12.1 built in $((SECONDS - t0)) s"
    [ -f "$dest/venv/.ready" ] || { echo "[setup] ComfyUI 0.12.1 did not build" >&2; exit 1; }
  fi
  # shellcheck disable=SC2086
  pipq "$dest/venv/bin/pip" install -q $pins -c "$dest/constraints.txt"
  # ComfyUI 0.12.1's requirements name both soundfile and the old PySoundFile, which ship the same soundfile.py: when
  # PySoundFile's lands last (pip's order varies with what is cached) the module looks for a system libsndfile and
  # transformers' text-encoder imports fail. soundfile's own copy, with its bundled library, is put back.
  if ! "$dest/venv/bin/python" -c "import soundfile" 2>/dev/null; then
    sf="$("$dest/venv/bin/python" -c 'from importlib.metadata import version; print(version("soundfile"))')"
    pipq "$dest/venv/bin/pip" install -q --no-deps --force-reinstall "soundfile==$sf"
  fi
  "$dest/venv/bin/python" -c "import pytest, xdist, hypothesis, torch, torchao, comfy, soundfile
assert comfy.__version__ == '0.12.1' and torch.__version__.startswith('2.14.1'), (comfy.__version__, torch.__version__)"
  rm -f "$dest"/venv/.prequant-tests*
  touch "$stamp"
fi
