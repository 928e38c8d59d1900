"""Lay out example_workflows/*.json with the sizes ComfyUI's front end really draws (no overlaps, labels in full).

    .venv/bin/python -m tools.layout_workflows [FILE ...]

Starts a real ComfyUI server with this pack, opens each workflow in headless Chromium (tests/browser/measure_nodes.mjs,
the same playwright-core setup as the browser tests) and measures every node: its minimum size and the width at which
each widget's label and value are drawn in full. Then it keeps each workflow's columns (nodes grouped by x, in
their y order) and rewrites positions and sizes: a column is as wide as its widest need (at least 320; the loader
460), nodes are stacked at their drawn height with room for a title and a gap, the loader gets room for its result
panel and Save Image for its preview, the note sits above, and the view opens at 75 % with the loader in sight.
tests/project/test_browser.py checks the result in the browser (no overlap before or after a run, labels in full).
"""
from __future__ import annotations

import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

from .comfy_headless import ROOT
from .comfy_server import ComfyServer

TITLE, GAP_X, GAP_Y, TOP = 30, 60, 40, 80
MIN_WIDTH = {"PrequantLoadTransformer": 460}
HEIGHT = {"PrequantLoadTransformer": 520,  # widgets + the result panel after a run (names, sizes, the location)
          "SaveImage": 420}  # the image it previews after a run
NOTES = ("MarkdownNote", "Note")
VIEW = {"scale": 0.75, "offset": [90, 470]}


def measure(files: list[str]) -> dict:
    chromium = os.environ.get("PREQUANT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    browser_dir = os.path.join(ROOT, "tests", "browser")
    with tempfile.TemporaryDirectory() as tmp, ComfyServer(os.path.join(tmp, "comfy")) as server:
        server.post("/settings/Comfy.TutorialCompleted", True)
        server.post("/settings/Comfy.Workflow.ShowMissingModelsWarning", False)
        out = os.path.join(tmp, "measured.json")
        cfg = {"url": server.url, "files": files, "out": out, "chromium": chromium,
               "userDataDir": os.path.join(tmp, "profile")}
        proc = subprocess.run(["node", os.path.join(browser_dir, "measure_nodes.mjs"), json.dumps(cfg)],
                              cwd=browser_dir, capture_output=True, text=True, timeout=600)
        res = json.load(open(out)) if os.path.exists(out) else {}
        if proc.returncode or not res.get("ok"):
            raise SystemExit(f"measuring failed: {res.get('error') or proc.stderr[-3000:]}")
        return res["workflows"]


def layout(wf: dict, measured: list[dict]) -> dict:
    m = {n["id"]: n for n in measured}
    nodes = [n for n in wf["nodes"] if n["type"] not in NOTES]
    x = 40
    for col_x in sorted({n["pos"][0] for n in nodes}):
        col = sorted((n for n in nodes if n["pos"][0] == col_x), key=lambda n: n["pos"][1])
        width = max([320] + [MIN_WIDTH.get(n["type"], 0) for n in col] +
                    [int(math.ceil((m[n["id"]]["width"] + 20) / 10.0) * 10) for n in col])
        y = TOP
        for n in col:
            h = HEIGHT.get(n["type"]) or max(n["size"][1], int(math.ceil(m[n["id"]]["min"][1])))
            n["pos"], n["size"] = [x, y], [width, h]
            y += h + TITLE + GAP_Y
        x += width + GAP_X
    for n in wf["nodes"]:
        if n["type"] in NOTES:
            n["pos"] = [40, TOP - TITLE - GAP_Y - n["size"][1]]
    wf.setdefault("extra", {})["ds"] = json.loads(json.dumps(VIEW))
    return wf


def main(argv: list[str]) -> int:
    files = [os.path.abspath(f) for f in argv] or sorted(glob.glob(os.path.join(ROOT, "example_workflows", "*.json")))
    measured = measure(files)
    for f in files:
        with open(f) as fh:
            wf = json.load(fh)
        with open(f, "w") as fh:
            fh.write(json.dumps(layout(wf, measured[f]), indent=1) + "\n")
        print(f"laid out {os.path.relpath(f, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
