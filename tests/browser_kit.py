"""What the browser tests share (tests/project/test_browser.py, tests/project/test_browser_fold.py): finding Chromium and node,
a one-node workflow, the loader's earlier saved layouts and the inputs each node shows by default."""
from __future__ import annotations

import os
import shutil

import pytest

from conftest import BASE_ID, ROOT

BROWSER_DIR = os.path.join(ROOT, "tests", "browser")


def find_chromium() -> str:
    for c in (os.environ.get("PREQUANT_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
              shutil.which("chromium-browser")):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    pytest.fail("Chromium is missing: the browser test needs Debian's headless Chromium. Install it with\n"
                "  apt-get update && apt-get install -y chromium\n(or point PREQUANT_CHROMIUM at a Chromium binary).")


def find_node() -> str:
    node = shutil.which("node")
    if not node:
        pytest.fail("node is missing: install Node.js >= 20 (apt-get install -y nodejs npm).")
    if not os.path.isfile(os.path.join(BROWSER_DIR, "node_modules", "playwright-core", "package.json")):
        pytest.fail("playwright-core is missing: run  npm ci --prefix tests/browser")
    return node


TOKEN = "hf_oldWorkflowToken0123456789abcdef"

def single(values, node_type="PrequantLoadTransformer") -> dict:
    out = {"PrequantLoadTransformer": ("model", "MODEL"), "PrequantInfo": ("report", "STRING"),
           "PrequantBuildCheckpoint": ("path", "STRING"), "PrequantLoadTextEncoder": ("clip", "CLIP")}[node_type]
    return {"last_node_id": 1, "last_link_id": 0, "links": [], "groups": [], "config": {}, "extra": {}, "version": 0.4,
            "nodes": [{"id": 1, "type": node_type, "pos": [20, 20], "size": [420, 360], "flags": {},
                       "order": 0, "mode": 0, "inputs": [], "outputs": [{"name": out[0], "type": out[1], "links": None}],
                       "properties": {"Node name for S&R": node_type}, "widgets_values": values}]}


DEFAULTS = {"preset": "none", "hub_repo": "", "scheme": "auto", "family": "auto", "base_model_id": "",
            "policy": "prequant only", "dense_fallback": "none", "download_to": "models/prequant", "revision": "",
            "min_features": 512, "path": "", "component": "transformer"}
# (widgets_values as saved by an earlier version of the node, the values by name the node must show)
OLD_LAYOUTS = {
    "five inputs": (["Z-Image-Turbo-INT8.safetensors", "", BASE_ID, "int8", "z-image"],
                    {**DEFAULTS, "checkpoint": "Z-Image-Turbo-INT8.safetensors", "base_model_id": BASE_ID,
                     "scheme": "int8", "family": "z-image"}),
    "hub inputs with a token": (
        ["(none: use path or hub_repo)", "", BASE_ID, "fp8", "z-image", "unsloth/Z-Image-Turbo-FP8",
         "Z-Image-Turbo / fp8", "v1.0", TOKEN],
        {**DEFAULTS, "checkpoint": "(none: use path or hub_repo)", "base_model_id": BASE_ID, "scheme": "fp8",
         "family": "z-image", "hub_repo": "unsloth/Z-Image-Turbo-FP8", "preset": "Z-Image-Turbo / fp8",
         "revision": "v1.0"}),
    "fallback inputs with a token": (
        ["Qwen-Image-FP8.safetensors", "/some/where/file.safetensors", "Qwen/Qwen-Image", "fp8", "qwen-image", "",
         "none", "refs/pr/1", TOKEN, 1024, "prequant, else quantize dense", "none"],
        {**DEFAULTS, "checkpoint": "Qwen-Image-FP8.safetensors", "path": "/some/where/file.safetensors",
         "base_model_id": "Qwen/Qwen-Image", "scheme": "fp8", "family": "qwen-image", "revision": "refs/pr/1",
         "min_features": 1024, "policy": "prequant, else quantize dense"}),
    # the layout before the component input (Wan 2.2 A14B's experts) was added last: it gets the default
    "twelve inputs, before component": (
        ["Qwen-Image-FP8.safetensors", "Qwen-Image / fp8", "", "fp8", "qwen-image", "Qwen/Qwen-Image",
         "prequant only", "none", "models/prequant", "", 768, ""],
        {**DEFAULTS, "checkpoint": "Qwen-Image-FP8.safetensors", "preset": "Qwen-Image / fp8", "scheme": "fp8",
         "family": "qwen-image", "base_model_id": "Qwen/Qwen-Image", "min_features": 768}),
    # the other two nodes: expert inputs moved last as well
    "info": (["Z-Image-Turbo-INT8.safetensors", "/x/y.safetensors", BASE_ID, "int8", True],
             {"checkpoint": "Z-Image-Turbo-INT8.safetensors", "base_model_id": BASE_ID, "scheme": "int8",
              "verify_fingerprint": True, "path": "/x/y.safetensors"}, "PrequantInfo"),
    # Info's first entry names only its own inputs now: the loader's "(none: ...)" saved there maps to Info's own
    "info without a file": (["(none: use path or hub_repo)", "/x/y.safetensors", BASE_ID, "int8", False],
                            {"checkpoint": "(none: use path)", "base_model_id": BASE_ID, "scheme": "int8",
                             "verify_fingerprint": False, "path": "/x/y.safetensors"}, "PrequantInfo"),
    "build": (["dense.safetensors", "fp8", 768, BASE_ID, "z-image", "mine.safetensors", "pt", True],
              {"dense_file": "dense.safetensors", "scheme": "fp8", "base_model_id": BASE_ID, "family": "z-image",
               "filename": "mine.safetensors", "min_features": 768, "container": "pt", "overwrite": True,
               "component": "transformer"},
              "PrequantBuildCheckpoint"),
}


LOADER_TYPE = "PrequantLoadTransformer"
DEFAULT_SHOWN = {LOADER_TYPE: ["checkpoint", "preset", "hub_repo", "scheme"],
                 "PrequantBuildCheckpoint": ["dense_file", "scheme", "filename", "container", "overwrite"],
                 "PrequantInfo": ["checkpoint", "base_model_id", "scheme", "verify_fingerprint"]}
