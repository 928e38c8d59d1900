"""Regenerates the README's picture of a workflow in the real front end (docs/images/z_image_workflow.png). The
template browser's card pictures (``example_workflows/<name>.jpg``) are rendered cards: tools/workflow_cards.py.

    .venv/bin/python -m tools.make_thumbnails z_image_turbo_prequant

A real ComfyUI 0.3.75 server with this pack starts on 127.0.0.1 (scripts/setup_dev.sh makes it,
scripts/setup_test_extras.sh browser the headless Chromium), the workflow is opened in the front end and fitted into
the canvas (tests/browser/thumbnails.mjs), and the Z-Image capture is saved, 1200 wide, as the README's picture.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKFLOWS = os.path.join(ROOT, "example_workflows")
README_WORKFLOW = "z_image_turbo_prequant"
# Nodes of ComfyUI 0.38.1 that the Krea 2 / Qwen-Image 2.1 workflows use and 0.3.75 lacks: their schema, restated from
# 0.38's comfy_extras/nodes_qwen.py, registered in the page for the picture only (0.3.75's front end would draw
# them as red "missing" boxes, which is not what a user of 0.38.1 sees). Nothing is registered on the server.
NEWER_NODE_DEFS = {
    "TextEncodeQwenImage21": {
        "name": "TextEncodeQwenImage21", "display_name": "Text Encode Qwen Image 2.1",
        "category": "model/conditioning/qwen image", "python_module": "comfy_extras.nodes_qwen", "description": "",
        "input": {"required": {"clip": ["CLIP", {}], "prompt": ["STRING", {"multiline": True, "dynamicPrompts": True}],
                               "negative_prompt": ["STRING", {"multiline": True, "dynamicPrompts": True}],
                               "resolution": ["INT", {"default": 1024, "min": 0, "max": 4096, "step": 32}]},
                  "optional": {"vae": ["VAE", {}]}},
        "input_order": {"required": ["clip", "prompt", "negative_prompt", "resolution"], "optional": ["vae"]},
        "output": ["CONDITIONING", "CONDITIONING", "LATENT"], "output_is_list": [False, False, False],
        "output_name": ["positive", "negative", "latent"], "output_node": False},
}


def chromium() -> str:
    for c in (os.environ.get("PREQUANT_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if c and os.path.exists(c):
            return c
    raise SystemExit("no Chromium: run scripts/setup_test_extras.sh browser (apt-get install chromium)")


def main(argv: list[str]) -> int:
    from PIL import Image

    from tools.comfy_server import ComfyServer
    names = argv or [README_WORKFLOW]
    workflows = [{"name": n, "workflow": json.load(open(os.path.join(WORKFLOWS, n + ".json"), encoding="utf-8"))}
                 for n in names]
    with tempfile.TemporaryDirectory(prefix="prequant-thumbs-") as tmp:
        server = ComfyServer(os.path.join(tmp, "comfy")).start()
        try:
            cfg = {"url": server.url, "workflows": workflows, "outDir": tmp, "out": os.path.join(tmp, "result.json"),
                   "extraNodeDefs": NEWER_NODE_DEFS,
                   "chromium": chromium(), "userDataDir": os.path.join(tmp, "profile"), "timeoutMs": 120000}
            subprocess.run(["node", os.path.join(ROOT, "tests", "browser", "thumbnails.mjs"), json.dumps(cfg)],
                           cwd=os.path.join(ROOT, "tests", "browser"), timeout=600, check=False)
            res = json.load(open(cfg["out"]))
            if not res.get("ok"):
                print(res.get("error"), file=sys.stderr)
                return 1
        finally:
            server.stop()
        for name, png in res["shots"].items():
            img = Image.open(png).convert("RGB")
            if name == README_WORKFLOW:  # the README's picture: the same view, larger
                big = os.path.join(ROOT, "docs", "images", "z_image_workflow.png")
                img.resize((1200, round(img.height * 1200 / img.width)), Image.LANCZOS).save(big, optimize=True)
                print(big)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
