"""Every example workflow (UI format, as users drag it in) against a real ComfyUI server: node types exist, links
join matching types, widget values fit the inputs, the Load Prequant Transformer names a real hosted file of the
family it claims, and ComfyUI's own prompt validation accepts the graph.

Model files the graphs name are empty placeholders (the graphs are checked, not run to an image); the pre-quantized
ones are created from the family registry's hosted repos only, so a workflow naming any other file fails.
"""
from __future__ import annotations

import glob
import json
import os

import pytest

from conftest import ROOT
from prequant_core import families, sources
from tools import workflow as wfmod

WF_DIR = os.path.join(ROOT, "example_workflows")
WORKFLOWS = sorted(glob.glob(os.path.join(WF_DIR, "*.json")))
LOADER = "PrequantLoadTransformer"
MODEL_EXTS = (".safetensors", ".pt", ".pth", ".ckpt", ".gguf", ".sft", ".bin")
# Folders a placeholder for a non-prequant model file goes to (the graphs are validated, never run to an image)
PLACEHOLDER_FOLDERS = ("text_encoders", "vae", "diffusion_models", "loras", "checkpoints", "clip_vision")


def load_wf(path):
    with open(path) as f:
        return json.load(f)


def hosted_files() -> dict[str, tuple]:
    """{file name: (family, repo, scheme)} for every hosted repo and scheme in the registry."""
    out = {}
    for p in sources.presets():
        out[sources.filenames(p.repo, p.scheme)[0]] = (p.family, p.repo, p.scheme)
    return out


def widget_specs(info):
    """[(name, spec, required)] of an object_info entry's widget inputs, in the order the UI stores them."""
    out = []
    for sec in ("required", "optional"):
        for name, spec in (info.get("input", {}).get(sec) or {}).items():
            if wfmod._is_widget(spec):
                out.append((name, spec, sec == "required"))
    return out


def widget_values(node, info) -> tuple[dict, list[str]]:
    """{input name: value} from a UI node's widgets_values (seed controls skipped), and problems found."""
    values = list(node.get("widgets_values") or [])
    linked = {i["name"] for i in node.get("inputs", []) if i.get("link") is not None}
    named, problems, pos = {}, [], 0
    for name, spec, required in widget_specs(info):
        if pos >= len(values):
            if required and name not in linked:
                problems.append(f"node {node['id']} {node['type']}: no value for required '{name}'")
            continue
        named[name] = values[pos]
        pos += 1
        opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
        if opts.get("control_after_generate") or (name in ("seed", "noise_seed") and spec[0] == "INT"):
            if pos < len(values) and values[pos] not in ("fixed", "increment", "decrement", "randomize"):
                problems.append(f"node {node['id']} {node['type']}: '{name}' control is {values[pos]!r}")
            pos += 1
    if pos < len(values):
        problems.append(f"node {node['id']} {node['type']}: {len(values) - pos} widget values more than inputs")
    return named, problems


def combo_options(spec):
    if isinstance(spec[0], list):
        return spec[0]
    if spec[0] == "COMBO" and len(spec) > 1 and isinstance(spec[1], dict):
        return spec[1].get("options")
    return None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tools.comfy_server import ComfyServer
    base = tmp_path_factory.mktemp("wf_server")
    models = base / "models"
    (models / "prequant").mkdir(parents=True)
    for name in hosted_files():
        (models / "prequant" / name).write_bytes(b"")
    others = set()
    for path in WORKFLOWS:
        for n in load_wf(path)["nodes"]:
            if n["type"] != LOADER:
                others |= {v for v in n.get("widgets_values") or [] if isinstance(v, str) and v.endswith(MODEL_EXTS)}
    for folder in PLACEHOLDER_FOLDERS:
        (models / folder).mkdir(parents=True, exist_ok=True)
        for name in others:
            (models / folder / name).write_bytes(b"")
    s = ComfyServer(str(base), env={"PREQUANT_ALLOW_LOCAL_PATH": "", "HF_HUB_OFFLINE": "1"}).start()
    s.object_info = s.get("/object_info")
    yield s
    s.stop()


def test_there_is_a_workflow_for_every_family():
    covered = set()
    for path in WORKFLOWS:
        for n in load_wf(path)["nodes"]:
            if n["type"] == LOADER:
                covered.add(n["widgets_values"][4])  # checkpoint, path, base_model_id, scheme, family, ...
    missing = set(families.FAMILIES) - covered
    if not os.path.exists(os.path.join(WF_DIR, "z_image_turbo_prequant.json")):
        missing.discard("z-image")
    assert not missing, f"families without an example workflow: {sorted(missing)}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=[os.path.basename(p) for p in WORKFLOWS])
def test_workflow_is_valid_on_a_real_comfyui(server, path):
    wf = load_wf(path)
    info = server.object_info
    nodes = {n["id"]: n for n in wf["nodes"]}
    problems = list(wfmod.check(wf, info))  # node types exist; link types match both ends

    # The UI keeps each link three times (links list, the input's link, the output's links): all must agree
    for lid, src, src_slot, dst, dst_slot, ltype in (l[:6] for l in wf["links"]):
        if src not in nodes or dst not in nodes:
            continue
        outs, ins = nodes[src].get("outputs", []), nodes[dst].get("inputs", [])
        if src_slot >= len(outs) or lid not in (outs[src_slot].get("links") or []):
            problems.append(f"link {lid}: not listed on node {src}'s output {src_slot}")
        elif outs[src_slot]["type"] != ltype:
            problems.append(f"link {lid}: type {ltype} but node {src}'s output is {outs[src_slot]['type']}")
        if dst_slot >= len(ins) or ins[dst_slot].get("link") != lid:
            problems.append(f"link {lid}: not the link of node {dst}'s input {dst_slot}")
    link_ids = {l[0] for l in wf["links"]}
    for n in wf["nodes"]:
        for i in n.get("inputs", []):
            if i.get("link") is not None and i["link"] not in link_ids:
                problems.append(f"node {n['id']}: input {i['name']} names missing link {i['link']}")
        if n["type"] not in info:
            continue
        specs = {**(info[n["type"]]["input"].get("required") or {}), **(info[n["type"]]["input"].get("optional") or {})}
        linked = {i["name"] for i in n.get("inputs", []) if i.get("link") is not None}
        for name, spec in (info[n["type"]]["input"].get("required") or {}).items():
            if not wfmod._is_widget(spec) and name not in linked:
                problems.append(f"node {n['id']} {n['type']}: required input '{name}' is not connected")
        named, p = widget_values(n, info[n["type"]])
        problems += p
        for name, value in named.items():
            opts = combo_options(specs[name])
            if opts is not None and value not in opts and name not in linked:
                problems.append(f"node {n['id']} {n['type']}: {name}={value!r} is not one of its options")
    assert not problems, "\n".join(problems)

    outputs = [n for n in wf["nodes"] if info.get(n["type"], {}).get("output_node")]
    assert outputs, "the workflow produces nothing (no output node)"

    # The pre-quantized transformer: a hosted file of the family the node names, built from one of its bases
    loaders = [n for n in wf["nodes"] if n["type"] == LOADER]
    assert len(loaders) == 1
    named, _ = widget_values(loaders[0], info[LOADER])
    hosted = hosted_files()
    assert named["checkpoint"] in hosted, f"{named['checkpoint']} is not a hosted file name"
    fam, repo, scheme = hosted[named["checkpoint"]]
    assert named["family"] == fam and named["scheme"] == scheme
    assert named["base_model_id"] in families.get(fam).base_repos
    assert sources.hosted_repo(fam, base_model_id=named["base_model_id"]) == repo
    if named.get("preset", sources.PRESET_NONE) != sources.PRESET_NONE:
        p = sources.get_preset(named["preset"])
        assert (p.repo, p.scheme, p.family) == (repo, scheme, fam)

    # ComfyUI's own validation of the whole graph (types, ranges, combo values, required inputs)
    from tools.comfy_server import PromptRejected
    try:
        pid = server.queue(wfmod.to_api(wf, info))
    except PromptRejected as e:
        pytest.fail(f"ComfyUI rejected the workflow: {e}")
    server.wait(pid, timeout=120)  # runs until a placeholder file fails to load; keeps the queue empty
