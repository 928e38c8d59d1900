"""The loader as a small node (issue 37): the inputs a first-time user does not set are marked ``advanced`` (at most
five shown). Two real front ends, headless Chromium (tests/project/test_browser.py has the set-up), both served by ComfyUI
0.3.75's server: its own (comfyui-frontend-package 1.32.9) and 1.58.1 (the newest on PyPI, ``--front-end-root``).

Both carry the flag to each widget's options; 1.58.1 folds it in Nodes 2.0 and its side panel, but neither folds it
on the classic canvas, their default: there a widget folds when its own ``advanced`` is set, which they never derive
from the input's spec. The pack's extension sets it (web/prequant.js foldAdvanced), so on both the node draws the
default few, is shorter, and the node menu's "Show Advanced" draws the rest. Either way a shipped workflow and a
workflow saved with every value shown open with their values, and the queued prompt carries the folded ones.
(ComfyUI 0.12.1's distribution is started without a front end here.)"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import ROOT
from browser_kit import BROWSER_DIR, DEFAULT_SHOWN, OLD_LAYOUTS, find_chromium, find_node, single
from tools import comfy_headless
from tools.comfy_server import ComfyServer

NODES = ("PrequantLoadTransformer", "PrequantLoadTextEncoder", "PrequantBuildCheckpoint", "PrequantInfo")
TE_SHOWN = ["text_encoder", "preset", "with_encoder", "family"]


FRONT_END_158 = os.path.join(ROOT, ".cache", "frontend158", "comfyui_frontend_package", "static")


@pytest.mark.parametrize("front_end", ["bundled", "1.58.1"])
def test_advanced_inputs_fold_where_the_front_end_knows_the_flag_and_values_survive(tmp_path, front_end):
    chromium, node = find_chromium(), find_node()
    extra = []
    if front_end != "bundled":
        assert os.path.isfile(os.path.join(FRONT_END_158, "index.html")), "scripts/setup_test_extras.sh frontend158"
        extra = ["--front-end-root", FRONT_END_158]
    base = tmp_path / "comfy"
    (base / "models" / "prequant").mkdir(parents=True)
    with open(os.path.join(ROOT, "example_workflows", "z_image_turbo_prequant.json")) as f:
        shipped = json.load(f)
    old = {k: v for k, v in OLD_LAYOUTS.items() if k in ("twelve inputs, before component", "info", "build")}
    workflows = [{"name": "shipped", "workflow": shipped}]
    workflows += [{"name": k, "workflow": single(v[0], *v[2:])} for k, v in old.items()]
    out = tmp_path / "load.json"
    with ComfyServer(str(base), extra_args=extra) as server:
        version = server.get("/system_stats")["system"]["comfyui_version"]
        server.post("/settings/Comfy.TutorialCompleted", True)
        schema = {n: server.get(f"/object_info/{n}")[n]["input"] for n in NODES}
        cfg = {"url": server.url, "workflows": workflows, "out": str(out), "chromium": chromium,
               "userDataDir": str(tmp_path / "chromium-profile"), "timeoutMs": 120000}
        proc = subprocess.run([node, os.path.join(BROWSER_DIR, "load_workflows.mjs"), json.dumps(cfg)],
                              cwd=BROWSER_DIR, capture_output=True, text=True, timeout=600)
        log = server.log_tail()
    res = json.loads(out.read_text()) if out.exists() else {}
    assert proc.returncode == 0 and res.get("ok"), (
        f"browser run failed (rc {proc.returncode}): {res.get('error') or proc.stderr[-3000:]}\nserver log:\n{log}")
    assert version == comfy_headless.comfyui_version()  # the server is the leg's either way: the front end differs

    def widget_order(n):
        spec = schema[n]
        return [k for sec in ("required", "optional") for k, v in (spec.get(sec) or {}).items()
                if isinstance(v, (list, tuple)) and (isinstance(v[0], list) or v[0] in ("STRING", "INT", "BOOLEAN",
                                                                                        "FLOAT", "COMBO"))]

    default = {**DEFAULT_SHOWN, "PrequantLoadTextEncoder": TE_SHOWN}
    for n in NODES:  # the server marks exactly the inputs beyond the default few
        marked = [k for sec in ("required", "optional") for k, v in (schema[n].get(sec) or {}).items()
                  if isinstance(v, (list, tuple)) and len(v) > 1 and isinstance(v[1], dict) and v[1].get("advanced")]
        assert set(marked) == set(widget_order(n)) - set(default[n]), (n, marked)
        assert len(default[n]) <= 5

    r = res["workflows"]["shipped"]
    prompt = json.loads(r["prompt"])
    for drawn in r["nodes"]:
        if drawn["type"] not in NODES:
            continue
        saved = next(n for n in shipped["nodes"] if str(n["id"]) == str(drawn["id"]))  # 1.58 keeps ids as text
        assert list(drawn["widgets"].values()) == saved["widgets_values"], drawn  # every value, folded or not
        assert drawn["shown"] == default[drawn["type"]], (front_end, drawn["type"], drawn["shown"])
        sent = prompt[str(drawn["id"])]["inputs"]
        assert all(sent[k] == v for k, v in drawn["widgets"].items() if k in sent), (drawn["type"], sent)
        assert set(drawn["advanced"]) == set(widget_order(drawn["type"])) - set(default[drawn["type"]])
        # the node menu's "Show Advanced" draws every input (the node grows to fit them where it must)
        assert drawn["unfolded"]["shown"] == widget_order(drawn["type"]), drawn
        assert drawn["unfolded"]["height"] >= drawn["height"], drawn

    for name, (values, expected, *rest) in old.items():
        node_type = rest[0] if rest else "PrequantLoadTransformer"
        drawn = res["workflows"][name]["nodes"][0]
        assert drawn["widgets"] == expected, (name, drawn["widgets"])
        assert drawn["shown"] == default[node_type], (front_end, name, drawn["shown"])
        assert drawn["unfolded"]["shown"] == widget_order(node_type), (front_end, name, drawn["unfolded"])
