"""prequant_core stands alone: importing every one of its modules loads no ComfyUI module (and no diffusers: that
extra is imported only when its loader is called). Runs in the core tier (tests/no_comfyui.py), in a fresh
interpreter so nothing another test imported can hide an import."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT

PROBE = r"""
import importlib, json, pkgutil, sys
import prequant_core
names = sorted(m.name for m in pkgutil.walk_packages(prequant_core.__path__, "prequant_core.")
               if not m.name.endswith("__main__"))  # __main__ runs the command line
for n in names:
    importlib.import_module(n)
top = {m.split(".")[0] for m in sys.modules}
print(json.dumps({"modules": names, "loaded": sorted(top)}))
"""
COMFYUI_MODULES = {"comfy", "comfy_extras", "comfy_api", "comfy_execution", "folder_paths", "nodes",
                   "comfyui_version", "execution", "server"}


def test_every_core_module_imports_without_comfyui():
    p = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ROOT, "PREQUANT_NO_COMFYUI": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(out["modules"]) >= 30 and "prequant_core.formats.pickle_guard" in out["modules"]
    assert not COMFYUI_MODULES & set(out["loaded"]), COMFYUI_MODULES & set(out["loaded"])
    assert not {"diffusers", "accelerate"} & set(out["loaded"])
