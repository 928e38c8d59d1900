"""The real ComfyUI server, its real front end (comfyui-frontend-package) and this pack, in headless Chromium.

Chromium is Debian's (``apt-get install -y chromium``), driven through playwright-core from npm
(``npm ci --prefix tests/browser``): playwright-core talks to the browser over the DevTools protocol, so no
matching driver binary (chromedriver) and no browser download are needed, no Python package joins the venv, and
its waits (``waitForFunction``) make the run deterministic. A missing Chromium, node or playwright-core FAILS the
test with the command that fixes it; this test never skips.

One workflow: two Prequant Info nodes on a real tiny int8 file in the server's models/prequant (one asked for the
right base + scheme, one for the wrong ones) and Load Prequant Transformer feeding PreviewAny, queued from the page.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request

import pytest

from conftest import BASE_ID, ROOT
from prequant_core.report import info
from prequant_core.units import human_bytes
from browser_kit import (BROWSER_DIR, DEFAULT_SHOWN, DEFAULTS, LOADER_TYPE, OLD_LAYOUTS, TOKEN, find_chromium,
                         find_node, single)
from tools.comfy_server import ComfyServer
from tools.workflow import needs_newer_comfyui

FILE = "Z-Image-Turbo-INT8.safetensors"
SCREENSHOT_COPY = os.environ.get("PREQUANT_SCREENSHOT_DIR", os.path.join(ROOT, "out", "browser"))
WRONG_BASE = "black-forest-labs/FLUX.1-dev"


MODEL_LOADERS = {"PrequantLoadTransformer", "PrequantLoadTextEncoder", "CLIPLoader", "DualCLIPLoader", "VAELoader",
                 "UNETLoader", "TripleCLIPLoader", "QuadrupleCLIPLoader", "LoraLoaderModelOnly", "LTXVAudioVAELoader"}


def _widgets(fname: str) -> dict:
    """The same inputs by name, applied after loading (robust to inputs added to the nodes since)."""
    return {1: {"checkpoint": fname, "base_model_id": BASE_ID, "scheme": "int8"},
            2: {"checkpoint": fname, "base_model_id": WRONG_BASE, "scheme": "fp8", "verify_fingerprint": True},
            3: {"checkpoint": fname, "path": "", "base_model_id": "", "scheme": "auto", "family": "auto"}}


def _workflow(fname: str) -> dict:
    """A UI-format workflow, as the front end saves it."""
    def info_node(nid, x, y, base, scheme):
        return {"id": nid, "type": "PrequantInfo", "pos": [x, y], "size": [460, 420], "flags": {}, "order": nid - 1,
                "mode": 0, "inputs": [], "outputs": [{"name": "report", "type": "STRING", "links": None}],
                "properties": {"Node name for S&R": "PrequantInfo"},
                "widgets_values": [fname, "", base, scheme, False]}
    return {
        "last_node_id": 4, "last_link_id": 1,
        "nodes": [
            info_node(1, 20, 20, BASE_ID, "int8"),
            info_node(2, 500, 20, WRONG_BASE, "fp8"),
            {"id": 3, "type": "PrequantLoadTransformer", "pos": [980, 20], "size": [420, 200], "flags": {},
             "order": 2, "mode": 0, "inputs": [], "outputs": [{"name": "model", "type": "MODEL", "links": [1]}],
             "properties": {"Node name for S&R": "PrequantLoadTransformer"},
             "widgets_values": [fname, "", "", "auto", "auto"]},
            {"id": 4, "type": "PreviewAny", "pos": [980, 560], "size": [420, 160], "flags": {}, "order": 3,
             "mode": 0, "inputs": [{"name": "source", "type": "*", "link": 1}], "outputs": [],
             "properties": {"Node name for S&R": "PreviewAny"}, "widgets_values": []},
        ],
        "links": [[1, 3, 0, 4, 0, "MODEL"]],
        "groups": [], "config": {}, "extra": {}, "version": 0.4,
    }


def test_info_and_loader_panels_in_the_real_front_end(prequant_files, tmp_path):
    chromium, node = find_chromium(), find_node()
    src = prequant_files("int8", "safetensors")
    base = tmp_path / "comfy"
    (base / "models" / "prequant").mkdir(parents=True)
    shutil.copy(src, base / "models" / "prequant" / FILE)
    expected = info(base / "models" / "prequant" / FILE, {"base_model_id": BASE_ID, "scheme": "int8"})
    shot = tmp_path / "prequant_info.png"
    out = tmp_path / "browser.json"

    with ComfyServer(str(base)) as server:
        # A returning user: the front end opens the default workflow instead of the first-run template browser.
        server.post("/settings/Comfy.TutorialCompleted", True)
        listed = server.get("/object_info/PrequantInfo")["PrequantInfo"]
        assert FILE in listed["input"]["required"]["checkpoint"][0]
        assert listed["output_node"] is True and listed["category"] == "loaders/prequant"
        with urllib.request.urlopen(server.url + "/extensions/ComfyUI-Prequant/prequant.js", timeout=10) as r:
            assert b"registerExtension" in r.read(), "the pack's web extension is not served"
        cfg = {"url": server.url, "workflow": _workflow(FILE), "widgets": _widgets(FILE), "screenshot": str(shot), "out": str(out),
               "chromium": chromium, "userDataDir": str(tmp_path / "chromium-profile"), "timeoutMs": 120000,
               "shotDir": str(tmp_path / "shots")}
        proc = subprocess.run([node, os.path.join(BROWSER_DIR, "drive.mjs"), json.dumps(cfg)], cwd=BROWSER_DIR,
                              capture_output=True, text=True, timeout=240)
        server_log = server.log_tail()
    res = json.loads(out.read_text()) if out.exists() else {}
    assert proc.returncode == 0 and res.get("ok"), (
        f"browser run failed (rc {proc.returncode}): {res.get('error') or proc.stderr[-3000:]}\n"
        f"console: {res.get('console', [])[-30:]}\nserver log:\n{server_log}")
    ours = [m for m in res["console"] if m.startswith(("error", "pageerror")) and "/extensions/ComfyUI-Prequant/" in m]
    assert not ours, f"the extension logged errors: {ours}"
    assert res["missingWidgets"] == []
    assert res["expected"]["placeholders"] == ["Run the workflow (Queue) to inspect the file."] * 2

    nodes = {n["id"]: n for n in res["nodes"]}
    good, bad, loader = nodes[1], nodes[2], nodes[3]

    # the valid request: green verdict, the table rows the Python report chose, the report as the widget value
    assert good["visible"] and good["onTop"] and good["verdictAttr"] == "valid" and "prequant-valid" in good["verdictClass"]
    assert good["verdictColor"] == "rgb(30, 107, 52)"
    assert good["domText"].startswith("VALID for base_model_id 'Tongyi-MAI/Z-Image-Turbo', scheme 'int8'")
    assert good["rows"] == expected.to_dict()["rows"]
    rows = dict(good["rows"])
    assert rows["Scheme"] == "int8" and rows["Base model"] == BASE_ID and rows["Family"].startswith("z-image")
    assert "header only" in rows["Format"] and "47.5 %" in rows["Dense model"]
    assert good["widgetValue"]["verdict"]["ok"] is True
    assert good["widgetValue"]["total_bytes"] == expected.total_bytes
    assert good["widgetValue"]["quantized_count"] == expected.quantized_count > 0
    assert good["reasons"] == []

    # the wrong request: red verdict listing every mismatch
    assert bad["visible"] and bad["onTop"] and bad["verdictAttr"] == "invalid" and "prequant-invalid" in bad["verdictClass"]
    assert bad["verdictColor"] == "rgb(138, 31, 31)"
    assert any("requested 'fp8'" in r for r in bad["reasons"]), bad["reasons"]
    assert any(f"requested '{WRONG_BASE}'" in r for r in bad["reasons"]), bad["reasons"]
    assert bad["widgetValue"]["verdict"]["ok"] is False
    assert bad["domText"].startswith(f"INVALID for base_model_id '{WRONG_BASE}', scheme 'fp8'")

    # the loader, after really loading the file in the server: scheme and size on the node
    assert loader["visible"] and loader["onTop"]
    assert loader["summary"]["scheme"] == "int8" and loader["loadedScheme"] == "int8"
    assert loader["summary"]["file"] == FILE and loader["summary"]["size_bytes"] > 0
    assert loader["domText"].startswith("int8 · ") and "MiB in memory" in loader["domText"]
    assert "smaller" in loader["domText"] and "z-image" in loader["domText"]
    # where the file is
    where = os.path.realpath(base / "models" / "prequant" / FILE)
    assert os.path.realpath(loader["summary"]["location"]) == where
    assert f"File: {loader['summary']['location']}" in loader["domText"]

    # what was read: the header for the first, every weight for the one asked to verify the fingerprint
    bad_rows = dict(bad["rows"])
    assert "full read" in bad_rows["Format"] and "verify_fingerprint" in bad_rows["Format"], bad_rows["Format"]
    assert bad_rows["Fingerprint"].endswith("verified") and "not verified" not in bad["domText"]
    assert any("verify_fingerprint" in n for n in expected.notes) and "verify_fingerprint" in good["domText"]

    # narrowed after the run: the table reflows and the node grows, nothing hidden in an inner scroll area
    rs = res["resize"]
    assert rs["before"]["scrollHidden"] <= 1 and rs["before"]["lastRowInside"]
    assert rs["after"]["size"][0] == 300 and rs["after"]["size"][1] > rs["before"]["size"][1], rs
    assert rs["after"]["scrollHidden"] <= 1 and rs["after"]["lastRowInside"], rs["after"]
    assert rs["after"]["rows"] == rs["before"]["rows"]

    # the last results show again after a tab switch and after a page reload
    kept = res["kept"]
    assert kept["before"]["1"]["verdict"] == "valid" and kept["before"]["2"]["verdict"] == "invalid"
    assert kept["before"]["3"]["state"] == "done" and kept["before"]["3"]["text"].startswith("int8 · ")
    for when in ("afterSwitch", "afterReload"):
        assert kept[when] == kept["before"], (when, kept[when], kept["before"])

    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    os.makedirs(SCREENSHOT_COPY, exist_ok=True)
    shutil.copy(shot, os.path.join(SCREENSHOT_COPY, "prequant_info.png"))
    assert len(res["nodeShots"]) == 4
    for p in res["nodeShots"]:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n", p
        shutil.copy(p, os.path.join(SCREENSHOT_COPY, os.path.basename(p)))


# --- every shipped workflow, and workflows saved with the loader's earlier input orders -------------------------

# (the Krea 2 and Qwen-Image 2.1 workflows need ComfyUI 0.38.1's nodes: tests/project/test_example_workflows.py holds them
# against ComfyUI's own templates instead)
SHIPPED = sorted(f for f in os.listdir(os.path.join(ROOT, "example_workflows")) if f.endswith(".json") and not
                 needs_newer_comfyui(json.load(open(os.path.join(ROOT, "example_workflows", f), encoding="utf-8"))))


def test_every_example_workflow_and_old_saved_layouts_load_in_the_real_front_end(tmp_path):
    chromium, node = find_chromium(), find_node()
    base = tmp_path / "comfy"
    (base / "models" / "prequant").mkdir(parents=True)
    out = tmp_path / "load.json"
    shipped = {}
    for f in SHIPPED:
        with open(os.path.join(ROOT, "example_workflows", f)) as fh:
            shipped[f] = json.load(fh)
    workflows = [{"name": f, "workflow": wf} for f, wf in shipped.items()]
    workflows += [{"name": k, "workflow": single(v[0], *v[2:])} for k, v in OLD_LAYOUTS.items()]
    # a shared workflow whose Info node carries a saved result of any shape (issue 39 #8: "number 5 is not iterable"
    # aborted loading the workflow)
    hostile = single(["Z-Image-Turbo-INT8.safetensors", "", BASE_ID, "int8", False], "PrequantInfo")
    hostile["nodes"][0]["properties"]["prequant_last_result"] = {
        "rows": 5, "notes": {"a": 1}, "verdict": {"ok": False, "reasons": 7, "summary": ["x"]},
        "valid": "yes"}
    hostile2 = single(["Z-Image-Turbo-INT8.safetensors", "", BASE_ID, "int8", False], "PrequantInfo")
    hostile2["nodes"][0]["properties"]["prequant_last_result"] = {"rows": [5, [{"toString": 1}, {"valueOf": 2}]],
                                                                  "notes": [None, {"toString": "x"}]}
    workflows += [{"name": "hostile saved result", "workflow": hostile},
                  {"name": "hostile saved rows", "workflow": hostile2}]
    with ComfyServer(str(base)) as server:
        server.post("/settings/Comfy.TutorialCompleted", True)
        server.post("/settings/Comfy.Validation.Workflows", True)
        server.post("/settings/Comfy.Workflow.ShowMissingModelsWarning", True)
        server.post("/settings/Comfy.Workflow.ShowMissingNodesWarning", True)
        loader_inputs = server.get("/object_info/PrequantLoadTransformer")["PrequantLoadTransformer"]["input"]
        cfg = {"url": server.url, "workflows": workflows, "out": str(out), "chromium": chromium,
               "userDataDir": str(tmp_path / "chromium-profile"), "timeoutMs": 120000}
        proc = subprocess.run([node, os.path.join(BROWSER_DIR, "load_workflows.mjs"), json.dumps(cfg)],
                              cwd=BROWSER_DIR, capture_output=True, text=True, timeout=600)
        server_log = server.log_tail()
    res = json.loads(out.read_text()) if out.exists() else {}
    assert proc.returncode == 0 and res.get("ok"), (
        f"browser run failed (rc {proc.returncode}): {res.get('error') or proc.stderr[-3000:]}\n"
        f"console: {res.get('console', [])[-30:]}\nserver log:\n{server_log}")
    order = list(loader_inputs["required"]) + list(loader_inputs["optional"])

    for f, wf in shipped.items():
        r = res["workflows"][f]
        assert r["missingNodes"] == [], (f, r["missingNodes"])
        # ComfyUI 0.33's front end (1.49) marks a loader whose file is not on the server yet (none is here: the
        # Prequant loader downloads its file on the first run, ComfyUI offers the others) as in error; every other
        # node must load clean
        assert not [n for n in r["nodes"] if not n["registered"] or
                    (n["hasErrors"] and n["type"] not in MODEL_LOADERS)], (f, r["nodes"])
        assert r["toasts"] == [], (f, r["toasts"])  # a schema error would show as an alert
        # (the front end asks huggingface.co for the missing files' sizes; this machine has no internet: net::ERR_*)
        bad = [m for m in r["console"] if (m.startswith(("error", "pageerror")) or "nvalid workflow" in m)
               and "net::ERR_" not in m]
        assert not bad, (f, bad)
        # the front end read the declared text encoders / VAE (none is on this server) with their URLs and folders
        declared = {(m["name"], m["url"], m["directory"]) for n in wf["nodes"]
                    for m in n.get("properties", {}).get("models", [])}
        if r["missingModels"]:  # front ends up to 1.3x: ComfyUI's hook gets them
            assert declared and {(m["name"], m["url"], m["directory"]) for m in r["missingModels"]} == declared, f
        else:  # newer ones (1.49, ComfyUI 0.33) call no hook: each node that declares a file it lacks is flagged
            flagged = {n["id"] for n in r["nodes"] if n["hasErrors"]}
            declaring = {n["id"] for n in wf["nodes"] if n.get("properties", {}).get("models")}
            assert declared and declaring <= flagged, (f, declaring - flagged)
        # the loader shows the shipped values under the right names
        loader = next(n for n in wf["nodes"] if n["type"] == "PrequantLoadTransformer")
        shown = next(n for n in r["nodes"] if n["type"] == "PrequantLoadTransformer")["widgets"]
        assert list(shown) == order and list(shown.values()) == loader["widgets_values"], (f, shown)
        # the inputs marked advanced reach the front end and fold (the pack's extension; "Show Advanced" in the
        # node's menu draws them: tests/project/test_browser_fold.py)
        drawn = {n["type"]: n for n in r["nodes"]}
        assert set(drawn[LOADER_TYPE]["advanced"]) == set(order) - set(DEFAULT_SHOWN[LOADER_TYPE]), f
        assert drawn[LOADER_TYPE]["shown"] == DEFAULT_SHOWN[LOADER_TYPE], f
        assert [n for n in r["nodes"] if n["type"] == "MarkdownNote"], f

    for name in ("hostile saved result", "hostile saved rows"):
        r = res["workflows"][name]
        # (ComfyUI 0.33's front end flags the node whose checkpoint is not on this server, as any model loader, so
        # its error flag says nothing here: the page renders the saved result and logs no error)
        assert [n["type"] for n in r["nodes"]] == ["PrequantInfo"], (name, r)
        bad = [m for m in r["console"] if m.startswith(("error", "pageerror")) and "net::ERR_" not in m]
        assert not bad and r["toasts"] == [], (name, bad, r["toasts"])

    for name, (values, expected, *_) in OLD_LAYOUTS.items():
        r = res["workflows"][name]
        shown = r["nodes"][0]["widgets"]
        assert shown == expected, (name, shown)
        if name in ("info", "info without a file", "build"):
            assert list(shown) == list(expected), "expert inputs are last on the node now"
        node_type = r["nodes"][0]["type"]
        assert set(r["nodes"][0]["advanced"]) == set(shown) - set(DEFAULT_SHOWN[node_type]), name
        for blob in (r["saved"], r["prompt"], r["promptWorkflow"]):
            assert TOKEN not in blob, f"{name}: the old hf_token value survives in what the front end saves/queues"
        assert "hf_token" not in r["prompt"]


# --- what a user sees: every shipped workflow laid out, run, kept -----------------------------------------------

SHIPPED_FILE = "Z-Image-Turbo-FP8.safetensors"  # the name z_image_turbo_prequant.json ships with
ARTIFACTS = os.path.join(SCREENSHOT_COPY, "workflows")


def _intersect(a, b) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def _overlaps(nodes) -> list:
    return [(a["id"], a["type"], b["id"], b["type"]) for i, a in enumerate(nodes) for b in nodes[i + 1:]
            if _intersect(a["box"], b["box"])]


def test_shipped_workflows_laid_out_run_and_kept_in_the_real_front_end(prequant_files, tmp_path):
    """Each shipped workflow as a user sees it at 1600x1000: no two nodes' rendered boxes intersect, before or after
    the loader has run (for real, in the server); every widget's label and value are drawn in full at the width the
    workflow gives the node; the loader's panel stays inside its node and needs no inner scrolling; its result shows
    again after a tab switch and a page reload. Screenshots of each workflow and of each node after the run are
    written to out/browser/workflows/ (ignored by git) for a reviewer to look at."""
    chromium, node = find_chromium(), find_node()
    base = tmp_path / "comfy"
    (base / "models" / "prequant").mkdir(parents=True)
    # a tiny real Z-Image fp8 file under the shipped name: z_image_turbo_prequant.json runs exactly as shipped;
    # the other families' loaders are pointed at it (their own files and text encoders are not on this server)
    shutil.copy(prequant_files("fp8", "safetensors"), base / "models" / "prequant" / SHIPPED_FILE)
    run_elsewhere = {"checkpoint": SHIPPED_FILE, "preset": "none", "hub_repo": "", "scheme": "auto", "family": "auto",
                     "base_model_id": "", "policy": "prequant only", "dense_fallback": "none", "revision": "",
                     "component": "transformer"}
    workflows = []
    for f in SHIPPED:
        with open(os.path.join(ROOT, "example_workflows", f)) as fh:
            wf = json.load(fh)
        loader = next(n for n in wf["nodes"] if n["type"] == "PrequantLoadTransformer")
        ships_the_file = loader["widgets_values"][0] == SHIPPED_FILE
        run = {}
        if not ships_the_file:
            # a file name of its own per workflow: identical loader inputs would be answered from the server's
            # cache of the previous run (its /free takes effect only between prompts), and a cached node shows
            # no new result
            own = f"run{len(workflows)}-{SHIPPED_FILE}"
            os.link(base / "models" / "prequant" / SHIPPED_FILE, base / "models" / "prequant" / own)
            run = {**run_elsewhere, "checkpoint": own}
        workflows.append({"name": f, "workflow": wf, "run": run})
    assert any(w["run"] == {} for w in workflows), "z_image_turbo_prequant.json no longer names " + SHIPPED_FILE
    workflows.sort(key=lambda w: w["run"] == {})  # the one run as shipped last: its result is then kept and reloaded
    shots = tmp_path / "shots"
    out = tmp_path / "workflows.json"
    with ComfyServer(str(base)) as server:
        server.post("/settings/Comfy.TutorialCompleted", True)
        # the missing text encoders / VAE dialog would cover the canvas in every screenshot
        server.post("/settings/Comfy.Workflow.ShowMissingModelsWarning", False)
        cfg = {"url": server.url, "workflows": workflows, "shotDir": str(shots), "out": str(out),
               "chromium": chromium, "userDataDir": str(tmp_path / "chromium-profile"), "timeoutMs": 120000}
        proc = subprocess.run([node, os.path.join(BROWSER_DIR, "workflows.mjs"), json.dumps(cfg)], cwd=BROWSER_DIR,
                              capture_output=True, text=True, timeout=900)
        server_log = server.log_tail()
    res = json.loads(out.read_text()) if out.exists() else {}
    if shots.exists():  # the artifacts, also when the run failed (failed.png)
        shutil.rmtree(ARTIFACTS, ignore_errors=True)
        shutil.copytree(shots, ARTIFACTS)
    assert proc.returncode == 0 and res.get("ok"), (
        f"browser run failed (rc {proc.returncode}): {res.get('error') or proc.stderr[-3000:]}\n"
        f"console: {res.get('console', [])[-30:]}\nserver log:\n{server_log}")
    ours = [m for m in res["console"] if m.startswith(("error", "pageerror")) and "/extensions/ComfyUI-Prequant/" in m]
    assert not ours, f"the extension logged errors: {ours}"

    for w in workflows:
        f, r = w["name"], res["workflows"][w["name"]]
        for when in ("before", "after"):
            nodes = r[when]["nodes"]
            assert len(nodes) == len(w["workflow"]["nodes"]), (f, when)
            assert _overlaps(nodes) == [], (f, when, _overlaps(nodes))
        # the view the workflow opens with: zoom readable, and the loader on screen
        assert r["before"]["ds"]["scale"] >= 0.7, (f, r["before"]["ds"])
        ld_before = next(n for n in r["before"]["nodes"] if n["type"] == "PrequantLoadTransformer")
        sx, sy, sw, sh = ld_before["screen"]
        assert sx >= 0 and sy >= 0 and sx + sw <= 1600 and sy + sh <= 1000, (f, ld_before["screen"])
        assert ld_before["covered"] == [], (f, ld_before["covered"])  # nothing of the page lies over it
        assert ld_before["panel"]["state"] is None and "Queue the workflow" in ld_before["panel"]["text"]
        # every widget of every node: label and value drawn in full at the node's width
        cut = [(nid, x["name"], x["label"], x["value"], round(x["needed"]), round(x["room"]))
               for nid, fits in r["fits"].items() for x in fits if not x["fits"]]
        assert cut == [], (f, cut)
        loader_id = str(ld_before["id"])
        # the drawn ones (the advanced inputs are folded)
        assert {x["name"] for x in r["fits"][loader_id]} == set(DEFAULT_SHOWN[LOADER_TYPE]), r["fits"]
        # after the run: the loader's result, inside its node, fully shown
        ld = next(n for n in r["after"]["nodes"] if n["type"] == "PrequantLoadTransformer")
        assert ld["panel"]["state"] == "done", (f, ld["panel"], server_log[-3000:])
        assert ld["summary"]["file"] == w["run"].get("checkpoint", SHIPPED_FILE) and ld["summary"]["scheme"] == "fp8"
        assert ld["panel"]["text"].startswith("fp8 · ") and f"File: {ld['summary']['location']}" in ld["panel"]["text"]
        assert not ld["panel"]["scrolls"], (f, ld["panel"])
        px, py, pw, ph = ld["panel"]["rect"]
        nx, ny, nw, nh = ld["screen"]
        assert nx - 1 <= px and px + pw <= nx + nw + 1 and ny - 1 <= py and py + ph <= ny + nh + 1, (f, ld)
        # kept with the workflow (node properties): the same summary
        assert ld["kept"] == ld["summary"]
        # screenshots: the workflow before and after, each node after
        for p in [r["shotBefore"], r["shotAfter"], *r["nodeShots"]]:
            with open(p, "rb") as fh:
                assert fh.read(8) == b"\x89PNG\r\n\x1a\n", p
        assert len(r["nodeShots"]) == len(w["workflow"]["nodes"])

    # the last result shows again after a tab switch and after a reload
    p = res["persisted"]
    assert p["name"] == workflows[-1]["name"] and p["otherTab"] == 0
    shown = p["beforeSwitch"]
    assert shown["state"] == "done" and shown["scheme"] == "fp8" and shown["text"].startswith("fp8 · ")
    for when in ("afterSwitch", "afterReload"):
        assert p[when] == shown, (when, p[when], shown)
    assert os.path.isfile(os.path.join(ARTIFACTS, os.path.basename(p["shot"])))

    # this pack's nodes added fresh: default widths at which every label and value is drawn in full
    assert [n["type"] for n in res["fresh"]] == ["PrequantLoadTransformer", "PrequantInfo", "PrequantBuildCheckpoint"]
    for n in res["fresh"]:
        fits = res["freshFits"][str(n["id"])]
        # the drawn inputs (advanced ones folded; toggles have no label to cut)
        assert len(fits) >= 3 and {x["name"] for x in fits} <= set(DEFAULT_SHOWN[n["type"]]), (n, fits)
        assert [x["name"] for x in fits if not x["fits"]] == [], (n, fits)


# --- long waits: what the loader says while downloading, and when the Hub cannot be reached ---------------------

def test_waits_say_what_is_happening_and_a_network_failure_reads_plainly(prequant_files, tmp_path):
    """A real download from the loopback Hub (slowed down) shows on the node as it happens: connecting, then
    downloading with bytes and rate, then checking and loading, then the result. With the Hub gone, the node says it
    is connecting, then fails with one plain sentence and the fix; ComfyUI's error dialog says the same; the client's
    raw exception is only in the server log."""
    from hub_server import HubServer, free_port
    chromium, node = find_chromium(), find_node()
    repo, fname = "unsloth/Z-Image-Turbo-INT8", "Z-Image-Turbo-INT8.safetensors"
    src = prequant_files("int8", "safetensors")
    size = os.path.getsize(src)
    base = tmp_path / "comfy"
    (base / "models" / "prequant").mkdir(parents=True)
    shots = tmp_path / "shots"
    shots.mkdir()
    wf = single(["(none: use path or hub_repo)"])
    wf["nodes"][0]["outputs"][0]["links"] = [1]
    wf["nodes"].append({"id": 2, "type": "PreviewAny", "pos": [520, 20], "size": [300, 160], "flags": {}, "order": 1,
                        "mode": 0, "inputs": [{"name": "source", "type": "*", "link": 1}], "outputs": [],
                        "properties": {"Node name for S&R": "PreviewAny"}, "widgets_values": []})
    wf["links"], wf["last_node_id"], wf["last_link_id"] = [[1, 1, 0, 2, 0, "MODEL"]], 2, 1

    def drive(endpoint, inputs, name):
        env = {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}
        result = tmp_path / f"{name}.json"
        with ComfyServer(str(base), env=env) as server:
            server.post("/settings/Comfy.TutorialCompleted", True)
            cfg = {"url": server.url, "workflow": wf, "loaderId": 1, "runs": [{"inputs": inputs}], "out": str(result),
                   "shotDir": str(shots), "shotName": name, "chromium": chromium,
                   "userDataDir": str(tmp_path / f"chromium-{name}"), "timeoutMs": 180000}
            proc = subprocess.run([node, os.path.join(BROWSER_DIR, "waits.mjs"), json.dumps(cfg)], cwd=BROWSER_DIR,
                                  capture_output=True, text=True, timeout=400)
            log = server.log_tail(20000)
        res = json.loads(result.read_text()) if result.exists() else {}
        assert proc.returncode == 0 and res.get("ok"), (
            f"browser run failed (rc {proc.returncode}): {res.get('error') or proc.stderr[-3000:]}\n"
            f"console: {res.get('console', [])[-30:]}\nserver log:\n{log[-6000:]}")
        return res["runs"][0], log

    with HubServer() as hub:
        hub.commit(repo, {fname: src})
        hub.slow[(repo, fname)] = 0.01  # ~4 s for the tiny file: long enough to be seen
        ok, _ = drive(hub.url, {"hub_repo": repo, "scheme": "int8"}, "waits-download")
        hub_url = hub.url
    gone = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    failed, server_log = drive(gone, {"hub_repo": "someone/Other-Model-INT8", "scheme": "int8"}, "waits-no-hub")
    os.makedirs(SCREENSHOT_COPY, exist_ok=True)
    for p in shots.iterdir():
        shutil.copy(p, os.path.join(SCREENSHOT_COPY, p.name))

    # the download, as the user saw it on the node
    seen = ok["seen"]
    said = [e["text"] for e in ok["events"]]  # every status the page received (brief ones may not be sampled)
    assert said[0].startswith(f"connecting to {hub_url} for {repo}/"), said
    downloading = [t for t in seen if t.startswith(f"downloading {fname} from {repo}: ") and " of " in t]
    assert downloading, seen
    assert any("MiB/s" in t or "KiB/s" in t for t in downloading), downloading  # the rate
    assert any(f"of {human_bytes(size)}" in t for t in downloading), downloading  # bytes of the total
    stages = [t.split(":")[0] for t in said]
    at = [next(i for i, t in enumerate(said) if t.startswith(w)) for w in
          ("connecting", f"downloading {fname}", f"checking {fname}", f"loading {fname} into ComfyUI's z-image model")]
    assert at == sorted(at), stages  # in the order they happen
    assert ok["state"] == "done" and ok["final"].startswith("int8 · ") and "downloaded from" in ok["final"]
    assert len(downloading) >= 2, downloading  # it moves
    # the failure: connecting first, then one sentence and the fix on the node
    assert any(t.startswith(f"connecting to {gone} for someone/Other-Model-INT8/") for t in failed["seen"]), failed
    assert failed["state"] == "failed"
    lines = failed["final"].splitlines()
    assert len(lines) == 2 and lines[0].startswith("Failed: Could not reach the Hugging Face Hub at ") \
        and lines[1].startswith("Fix: Check the network connection"), lines
    raw = ("MaxRetryError", "ConnectionError", "ConnectionPool", "Errno", "NewConnectionError")
    assert not [r for r in raw if r in failed["final"]]
    dialog = "\n".join(failed["dialogs"])
    # ComfyUI's own error display: the message itself in a dialog (front ends up to 1.3x), or a toast naming the node
    # that failed (1.49, ComfyUI 0.33: "View details" opens the message); never a raw exception either way
    assert ("Could not reach the Hugging Face Hub" in dialog or "Load Prequant Transformer failed" in dialog) and \
        not [r for r in raw if r in dialog], dialog
    # the raw exception is in the server log, for whoever needs it
    assert "could not reach" in server_log and any(r in server_log for r in raw), server_log[-3000:]


def test_the_text_encoder_node_says_what_it_does_while_a_user_waits(tmp_path):
    """Load Prequant Text Encoder has the loader's panel: a download of the hosted encoder from the slowed loopback Hub
    shows on the node as it happens (connecting, downloading with bytes, checking, building ComfyUI's encoder), a
    failure shows as one sentence and the fix, and a result (the encoder, its size against the dense bf16 one, the
    tokenizer, the file) is drawn and kept with the workflow. The hosted file here is a tiny Qwen3-4B of the real
    class (the restated Unsloth builder): ComfyUI's full-size class refuses its shapes: the failure shown."""
    import unsloth_te_builder as te_builder
    from hub_server import HubServer
    chromium, node = find_chromium(), find_node()
    repo, fname = "unsloth/Z-Image-Turbo-FP8", "Z-Image-Turbo-text_encoder-FP8.safetensors"
    src = str(tmp_path / fname)
    te_builder.build_file(src, "Qwen3ForCausalLM", base_model_id=BASE_ID, family="z-image")
    base = tmp_path / "comfy"
    (base / "models" / "prequant").mkdir(parents=True)
    shots = tmp_path / "shots"
    shots.mkdir()
    wf = single(["(none: use path or hub_repo)", "none", "none", "auto", "", "auto", "", "", ""],
                 "PrequantLoadTextEncoder")
    wf["nodes"][0]["outputs"][0]["links"] = [1]
    wf["nodes"].append({"id": 2, "type": "PreviewAny", "pos": [520, 20], "size": [300, 160], "flags": {}, "order": 1,
                        "mode": 0, "inputs": [{"name": "source", "type": "*", "link": 1}], "outputs": [],
                        "properties": {"Node name for S&R": "PreviewAny"}, "widgets_values": []})
    wf["links"], wf["last_node_id"], wf["last_link_id"] = [[1, 1, 0, 2, 0, "CLIP"]], 2, 1
    # a result as the node sends it (nodes/te_node.py): the test server has no full-size encoder to build one
    summary = {"file": "Lumina-Image-2.0-text_encoder-FP8.safetensors", "encoder": "Gemma2-2B", "family": "lumina-2",
               "component": "text_encoder", "container": "safetensors", "fp8_tensors": 182,
               "size_bytes": 3_214_000_000, "dense_bytes": 5_228_000_000,
               "tokenizer": "the spiece_model of gemma_2_2b_fp16.safetensors", "notes": [],
               "location": "/models/prequant/unsloth/Lumina-Image-2.0-FP8/Lumina-Image-2.0-text_encoder-FP8.safetensors",
               "source": "hub:unsloth/Lumina-Image-2.0-FP8@main", "downloaded": True}
    out = tmp_path / "te.json"
    with HubServer(chunk=8192) as hub:
        hub.commit(repo, {fname: src})
        hub.slow[(repo, fname)] = 0.1  # seconds per 8 KiB: a few seconds for the tiny file, long enough to be seen
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}
        with ComfyServer(str(base), env=env) as server:
            server.post("/settings/Comfy.TutorialCompleted", True)
            cfg = {"url": server.url, "workflow": wf, "loaderId": 1,
                   "runs": [{"inputs": {"preset": "Z-Image / text_encoder"}}], "show": {"prequant": [summary]},
                   "out": str(out), "shotDir": str(shots), "shotName": "waits-text-encoder", "chromium": chromium,
                   "userDataDir": str(tmp_path / "chromium"), "timeoutMs": 180000}
            proc = subprocess.run([node, os.path.join(BROWSER_DIR, "waits.mjs"), json.dumps(cfg)], cwd=BROWSER_DIR,
                                  capture_output=True, text=True, timeout=400)
            log = server.log_tail(20000)
    res = json.loads(out.read_text()) if out.exists() else {}
    os.makedirs(SCREENSHOT_COPY, exist_ok=True)
    for p in shots.iterdir():
        shutil.copy(p, os.path.join(SCREENSHOT_COPY, p.name))
    assert proc.returncode == 0 and res.get("ok"), (
        f"browser run failed (rc {proc.returncode}): {res.get('error') or proc.stderr[-3000:]}\n"
        f"console: {res.get('console', [])[-30:]}\nserver log:\n{log[-6000:]}")
    run_ = res["runs"][0]
    said = [e["text"] for e in run_["events"]]
    at = [next((i for i, t in enumerate(said) if t.startswith(w)), None) for w in
          ("connecting", f"downloading {fname}", f"checking {fname}", "building ComfyUI's Qwen3-4B encoder")]
    assert None not in at and at == sorted(at), said
    assert any(t.startswith(f"downloading {fname} from {repo}: ") for t in run_["seen"]), run_["seen"]  # on screen
    lines = run_["final"].splitlines()
    from conftest import absent_comfy_tokenizer
    if absent_comfy_tokenizer():  # ComfyUI 0.33.0 as shipped here lacks that tokenizer of its own
        assert run_["state"] == "failed" and lines[0].startswith("Failed: A file this step needs, which is not the "
                                                                 "checkpoint") and absent_comfy_tokenizer() in lines[0], \
            lines
        assert "not at fault" in lines[1], lines
    else:
        assert run_["state"] == "failed" and lines[0].startswith(
            "Failed: Tensor 'model.embed_tokens.weight' has shape (256, 64), ComfyUI's encoder expects (151936, 2560)"), \
            lines
        assert lines[1].startswith("Fix: Pick the file hosted for this family"), lines
    shown = res["shown"]
    assert shown["state"] == "done" and shown["kept"]["encoder"] == "Gemma2-2B"
    text = shown["text"]
    assert text.startswith("fp8 · 2.99 GiB in memory (dense 4.87 GiB, 38.5 % smaller)"), text
    assert "Gemma2-2B · lumina-2 text_encoder · 182 float8 weights" in text and "Tokenizer: the spiece_model" in text
    assert "(downloaded from unsloth/Lumina-Image-2.0-FP8@main)" in text
