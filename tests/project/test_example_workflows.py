"""Every example workflow (UI format, as users drag it in), values exactly as shipped, on a real ComfyUI server for a
user who has none of the pre-quantized files yet (empty models/prequant) and a reachable Hub (the loopback Hub, which
serves a tiny real-architecture file of each workflow's family under the hosted repo's name):

- the graph is sound (node types exist, links join matching types, widget values fit the inputs) and ComfyUI's own
  prompt validation accepts it, although it names a checkpoint the user does not have;
- the loader, with the workflow's values, downloads exactly the file the workflow names into models/prequant, loads
  it, says where it is, and the file shows in the node's list afterwards;
- later runs use that file without any network (a server restarted with the Hub gone);
- every text encoder / VAE the graph names is declared on its loader node (properties.models: name, official URL,
  directory) and the workflow's Note says what is needed and where each file goes.

Text encoders and VAEs are empty placeholders (the full graph is validated and queued, the loader is run to a model).
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import re

import pytest

from conftest import ROOT
from hub_server import HubServer, free_port
from prequant_core import families
from prequant_core.load import sources
from tools import workflow as wfmod

WF_DIR = os.path.join(ROOT, "example_workflows")
WORKFLOWS = sorted(glob.glob(os.path.join(WF_DIR, "*.json")))
# Workflows of a family no ComfyUI tested here has the model class of (Krea 2, Qwen-Image 2.1: ComfyUI 0.38.1) cannot
# be queued here: they are held against ComfyUI's own template of that model instead (test_..._official_template).
NEWER = [p for p in WORKFLOWS if wfmod.needs_newer_comfyui(json.load(open(p, encoding="utf-8")))]
RUNNABLE = [p for p in WORKFLOWS if p not in NEWER]
IDS = [os.path.basename(p) for p in RUNNABLE]
LOADER = "PrequantLoadTransformer"
MODEL_EXTS = (".safetensors", ".pt", ".pth", ".ckpt", ".gguf", ".sft", ".bin")
# The model folder each stock loader in the workflows reads its files from
LOADER_DIRS = {"CLIPLoader": "text_encoders", "DualCLIPLoader": "text_encoders", "TripleCLIPLoader": "text_encoders",
               "QuadrupleCLIPLoader": "text_encoders", "VAELoader": "vae", "UNETLoader": "diffusion_models",
               "PrequantLoadTextEncoder": "text_encoders",  # its with_encoder: ComfyUI's CLIP-L for FLUX.1
               "LoraLoaderModelOnly": "loras",
               "LTXVAudioVAELoader": "checkpoints"}  # ComfyUI 0.33's audio VAE loader lists checkpoints/
OFFICIAL_URL = re.compile(r"^https://huggingface\.co/(Comfy-Org|comfyanonymous)/[^/]+/resolve/main/(.+/)?([^/]+)$")
# The one exception, named file by file: LTX-2.3's VAEs and text projection, which Lightricks and Comfy-Org ship only
# inside the 27 GB single-file checkpoint (the dense model again); Kijai/LTX2.3_comfy hosts those parts alone
SPLIT_FILES_URL = re.compile(r"^https://huggingface\.co/Kijai/LTX2\.3_comfy/resolve/main/(.+/)?([^/]+)$")
SPLIT_FILES = {"ltx-2.3_text_projection_bf16.safetensors", "LTX23_video_vae_bf16.safetensors",
               "LTX23_audio_vae_bf16.safetensors"}
NOTES = ("Note", "MarkdownNote")


def load_wf(path):
    with open(path) as f:
        return json.load(f)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def widget_values(node, info) -> tuple[dict, list[str]]:
    """{input name: value} from a UI node's widgets_values (seed controls skipped; a dynamic combo's chosen option's
    widgets as ``combo.name``), and problems found."""
    values = list(node.get("widgets_values") or [])
    linked = {i["name"] for i in node.get("inputs", []) if i.get("link") is not None}
    named, problems = {}, []
    found, used = wfmod.widgets(info.get("input", {}), values)
    for name, spec, required, value, control in found:
        if value is wfmod.MISSING:
            if required and name not in linked:
                problems.append(f"node {node['id']} {node['type']}: no value for required '{name}'")
            continue
        named[name] = value
        if control is not None and control is not wfmod.MISSING and \
                control not in ("fixed", "increment", "decrement", "randomize"):
            problems.append(f"node {node['id']} {node['type']}: '{name}' control is {control!r}")
    if used < len(values):
        problems.append(f"node {node['id']} {node['type']}: {len(values) - used} widget values more than inputs")
    return named, problems


def combo_options(spec):
    if isinstance(spec[0], list):
        return spec[0]
    if spec[0] == wfmod.DYNAMIC_COMBO:
        return [o["key"] for o in spec[1].get("options", [])]
    if spec[0] == "COMBO" and len(spec) > 1 and isinstance(spec[1], dict):
        return spec[1].get("options")
    return None


def loader_nodes(wf) -> list[dict]:
    """The workflow's loaders: one, or one per expert of a two-expert model (Wan 2.2 A14B: high / low noise)."""
    loaders = [n for n in wf["nodes"] if n["type"] == LOADER]
    assert 1 <= len(loaders) <= 2
    return loaders


def loader_node(wf):
    return loader_nodes(wf)[0]


def node_values(node, loader_info) -> dict:
    named, problems = widget_values(node, loader_info)
    assert not problems, problems
    named.setdefault("component", "transformer")  # workflows saved before the input existed
    return named


def loader_values(wf, loader_info) -> dict:
    return node_values(loader_node(wf), loader_info)


def hosted_target(named) -> sources.Candidate:
    """The Hub candidate that serves the file the workflow names (what the node will download)."""
    plan = sources.plan(sources.Wanted(None, named["hub_repo"], named["family"], named["scheme"],
                                       base_model_id=named["base_model_id"], revision=named["revision"],
                                       preset=named["preset"], component=named["component"]))
    c = sources.provider(plan, named["checkpoint"])
    assert c is not None, f"nothing in the workflow's preset / hub_repo / family serves {named['checkpoint']}"
    return c


def other_model_files(wf) -> list[tuple[dict, str]]:
    """(node, file name) for every model file a stock loader in the graph names."""
    out = []
    for n in wf["nodes"]:
        if n["type"] in LOADER_DIRS:
            out += [(n, v) for v in n.get("widgets_values") or [] if isinstance(v, str) and v.endswith(MODEL_EXTS)]
    return out


@pytest.fixture(scope="module")
def env(tmp_path_factory, comfy):
    """The loopback Hub holding, for each workflow's loader, a tiny real model of its family (of the scheme and
    component the loader asks for, built from the base the workflow names) under the hosted repo and file name; a
    ComfyUI base folder with an empty models/prequant. served: {workflow: [(repo, file, local, loader id)]}."""
    from safetensors.torch import save_file
    from prequant_core import builder
    from tools import tiny_families, tiny_models
    _, pack = comfy
    loader_info = {"input": pack.nodes.load_node.PrequantLoadTransformer.INPUT_TYPES()}
    files_dir = tmp_path_factory.mktemp("hosted")
    hub = HubServer().start()
    served, by_repo = {}, {}
    for path in RUNNABLE:
        for node in loader_nodes(load_wf(path)):
            named = node_values(node, loader_info)
            c = hosted_target(named)
            fam = named["family"]
            seed = families.get(fam).arch.components.index(named["component"])  # each expert its own weights
            if fam == "z-image":
                dense = tiny_models.zimage_dense(seed=0)
            elif fam in tiny_families.DIFFUSERS_ONLY:  # its class needs diffusers 0.42.1: made in a subprocess
                dense = tiny_families.dense_from_subprocess(fam)
            else:
                dense = tiny_families.dense(fam, seed=seed)
            companion = families.get(fam).arch.companion
            if companion is not None:  # LTX-2.3's text connectors: the base repo's own component, beside the file
                part = {k[len(companion.prefix):]: v for k, v in dense.items() if k.startswith(companion.prefix)}
                dense = {k: v for k, v in dense.items() if not k.startswith(companion.prefix)}
                part_path = str(files_dir / f"{fam}-companion.safetensors")
                save_file(part, part_path)
                by_repo.setdefault(families.get(fam).hosting.base_repos[0], {})[companion.repo_file] = part_path
            local = str(files_dir / named["checkpoint"])
            builder.build_from_tensors(dense, builder.Target(local, container=os.path.splitext(local)[1][1:]),
                                       builder.Recipe(c.scheme, family=families.get(fam),
                                                      base_model_id=named["base_model_id"],
                                                      component=named["component"]))
            by_repo.setdefault(c.repo, {})[named["checkpoint"]] = local  # one commit per repo holds all its files
            served.setdefault(os.path.basename(path), []).append((c.repo, named["checkpoint"], local,
                                                                   str(node["id"])))
    for repo, files in by_repo.items():
        hub.commit(repo, files)
    base = tmp_path_factory.mktemp("wf_server")
    models = base / "models"
    (models / "prequant").mkdir(parents=True)
    for path in WORKFLOWS:
        for n, name in other_model_files(load_wf(path)):
            (models / LOADER_DIRS[n["type"]]).mkdir(parents=True, exist_ok=True)
            (models / LOADER_DIRS[n["type"]] / name).write_bytes(b"")
    server_env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(base / "hf_home"), "HF_HUB_OFFLINE": "0", "HF_TOKEN": "",
                  "PREQUANT_ALLOW_LOCAL_PATH": ""}
    yield {"hub": hub, "served": served, "base": base, "env": server_env}
    hub.stop()


@pytest.fixture(scope="module")
def server(env):
    from tools.comfy_server import ComfyServer
    s = ComfyServer(str(env["base"]), env=env["env"]).start()
    s.object_info = s.get("/object_info")
    yield s
    s.stop()


def test_there_is_a_workflow_for_every_family(comfy):
    _, pack = comfy
    loader_info = {"input": pack.nodes.load_node.PrequantLoadTransformer.INPUT_TYPES()}
    covered = {node_values(n, loader_info)["family"] for p in WORKFLOWS for n in loader_nodes(load_wf(p))}
    # Families no ComfyUI this pack can test has a model class for (unet_config None: the loader refuses them
    # naming min_comfy) get a workflow once one can be run here; every other family must have one.
    runnable = {n for n, f in families.FAMILIES.items() if f.arch.unet_config is not None}
    assert {"z-image", "flux.1", "qwen-image"} <= runnable
    missing = runnable - covered
    assert not missing, f"families without an example workflow: {sorted(missing)}"
    assert {"krea-2", "qwen-image-2.1"} <= covered  # the image families of ComfyUI 0.38.1 (Note: that version)


def _graph_problems(wf, info) -> list[str]:
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
            opts = combo_options(specs[name]) if name in specs else None
            if n["type"] == LOADER and name == "checkpoint":
                continue  # a file the user may not have yet: the point of this test
            if opts is not None and value not in opts and name not in linked:
                problems.append(f"node {n['id']} {n['type']}: {name}={value!r} is not one of its options")
    return problems


@pytest.mark.parametrize("path", RUNNABLE, ids=IDS)
def test_workflow_runs_as_shipped_for_a_user_without_the_file(env, server, path):
    from tools.comfy_server import PromptRejected, execution_error
    wf = load_wf(path)
    info = server.object_info
    hub = env["hub"]
    served = env["served"][os.path.basename(path)]
    prequant_dir = os.path.join(server.base_dir, "models", "prequant")
    for _, fname, _, _ in served:
        assert not os.path.exists(os.path.join(prequant_dir, fname))
        assert fname not in info[LOADER]["input"]["required"]["checkpoint"][0]  # not in the user's list

    problems = _graph_problems(wf, info)
    assert not problems, "\n".join(problems)
    assert [n for n in wf["nodes"] if info.get(n["type"], {}).get("output_node")], "the workflow produces nothing"

    # The pre-quantized transformer(s): a hosted file of the family the node names, built from one of its bases; a
    # two-expert model has one loader per expert, each asking for its component
    nodes = {str(n["id"]): n for n in loader_nodes(wf)}
    components = [node_values(nodes[lid], info[LOADER])["component"] for _, _, _, lid in served]
    assert len(set(components)) == len(components)
    for repo, fname, _, lid in served:
        named = node_values(nodes[lid], info[LOADER])
        fam = named["family"]
        assert named["base_model_id"] in families.get(fam).hosting.base_repos
        assert named["component"] in families.get(fam).arch.components
        assert sources.hosted_repo(fam, base_model_id=named["base_model_id"]) == repo
        p = sources.get_preset(named["preset"])
        assert (p.repo, p.family, p.scheme) == (repo, fam, named["scheme"])
        assert named["download_to"] == "models/prequant" and named["path"] == "" and \
            named["policy"] == "prequant only"

    # 1. ComfyUI's own validation accepts the whole graph as shipped (it used to answer "Value not in list")
    prompt = wfmod.to_api(wf, info)
    try:
        pid = server.queue(prompt)
    except PromptRejected as e:
        pytest.fail(f"ComfyUI rejected the workflow: {e}")
    first = server.wait(pid, timeout=300)  # runs until a placeholder text encoder / VAE fails to load

    # 2. Each loader with the workflow's values, to a model: the named file is fetched into models/prequant
    for repo, fname, hosted, lid in served:
        named = node_values(nodes[lid], info[LOADER])
        target = os.path.join(prequant_dir, *repo.split("/"), fname)  # kept under its origin (owner/repo)
        partial = {lid: prompt[lid], "999": {"class_type": "PreviewAny", "inputs": {"source": [lid, 0]}}}
        entry = server.run(partial, timeout=300)
        assert execution_error(entry) is None, execution_error(entry) or server.log_tail()
        s = entry["outputs"][lid]["prequant"][0]
        assert (s["file"], s["family"], s["scheme"]) == (fname, named["family"], named["scheme"])
        assert s["location"] == target and s["base_model_id"] == named["base_model_id"]
        assert sha256(target) == sha256(hosted)
        assert len(hub.body_gets(fname)) == 1, "downloaded exactly once"
        downloads = [o["prequant"][0] for e in (first, entry) for k, o in e["outputs"].items()
                     if "prequant" in o and k == lid]
        assert any(d.get("source") == f"hub:{repo}@main" and d.get("downloaded") for d in downloads), downloads
        text = [o["text"][0] for e in (first, entry) for o in e["outputs"].values() if "text" in o]
        assert any(f"File: {target}" in t and f"from {repo}@main" in t for t in text), text
        listed = server.get(f"/object_info/{LOADER}")[LOADER]["input"]["required"]["checkpoint"][0]
        assert f"{repo}/{fname}" in listed
    # nothing half-written or left over next to them
    left = [os.path.relpath(os.path.join(r, f), prequant_dir) for r, _, fs in os.walk(prequant_dir) for f in fs]
    assert not [f for f in left if f.endswith(".incomplete") or f.startswith(".prequant-download")], left


def test_later_runs_need_no_network(env, server):
    """A fresh server (new session) with the Hub gone: every workflow's loader runs from models/prequant."""
    from tools.comfy_server import ComfyServer, execution_error
    prequant_dir = os.path.join(server.base_dir, "models", "prequant")
    want = sorted({(repo, f) for served in env["served"].values() for repo, f, _, _ in served})
    assert all(os.path.isfile(os.path.join(prequant_dir, *repo.split("/"), f)) for repo, f in want), \
        "run the per-workflow test first (same module) to download"
    server.stop()
    hub = env["hub"]
    n = len(hub.log)
    offline_env = {**env["env"], "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}  # nothing listens there
    with ComfyServer(str(env["base"]), env=offline_env) as s:
        info = s.get("/object_info")
        for path in RUNNABLE:
            wf = load_wf(path)
            prompt = wfmod.to_api(wf, info)
            for repo, fname, _, lid in env["served"][os.path.basename(path)]:
                entry = s.run({lid: prompt[lid],
                               "999": {"class_type": "PreviewAny", "inputs": {"source": [lid, 0]}}}, timeout=300)
                assert execution_error(entry) is None, execution_error(entry)
                summary = entry["outputs"][lid]["prequant"][0]
                assert summary["location"] == os.path.join(prequant_dir, *repo.split("/"), fname)
                assert summary.get("downloaded") is not True  # the earlier download, found under its origin
    assert len(hub.log) == n, "no request reached the Hub"
    server.start()  # leave the module's server running for the tests after this one
    server.object_info = server.get("/object_info")


@pytest.mark.parametrize("loader,needle", [
    # a file nothing in the node serves (preset none, family auto): the error says where it is hosted
    ({"checkpoint": "Z-Image-Turbo-INT8.safetensors", "scheme": "int8", "preset": "none", "family": "auto"},
     "It is hosted at https://huggingface.co/unsloth/Z-Image-Turbo-FP8: pick the preset 'Z-Image-Turbo / int8'"),
    # a name no hosted repo has, next to a preset serving another file: never replaced by that file
    ({"checkpoint": "my-finetune-FP8.safetensors"}, "Put the file into "),
])
def test_a_missing_file_nothing_serves_names_the_file_and_where_to_get_it(env, server, loader, needle):
    from tools.comfy_server import execution_error
    wf = load_wf(os.path.join(WF_DIR, "z_image_turbo_prequant.json"))
    prompt = wfmod.to_api(wf, server.object_info)
    lid = str(loader_node(wf)["id"])
    inputs = {**prompt[lid]["inputs"], **loader}
    n = len(env["hub"].log)
    entry = server.run({lid: {"class_type": LOADER, "inputs": inputs},
                        "999": {"class_type": "PreviewAny", "inputs": {"source": [lid, 0]}}}, timeout=120)
    assert len(env["hub"].log) == n, "nothing is downloaded in place of the file named"
    err = execution_error(entry)
    assert err and f"names the checkpoint '{inputs['checkpoint']}', which is not in " in err, err
    assert os.path.join(server.base_dir, "models", "prequant") in err
    assert needle in err, err


def test_workflows_declare_their_models_and_say_where_they_go(comfy):
    _, pack = comfy
    loader_info = {"input": pack.nodes.load_node.PrequantLoadTransformer.INPUT_TYPES()}
    for path in WORKFLOWS:
        wf = load_wf(path)
        where = os.path.basename(path)
        notes = [n for n in wf["nodes"] if n["type"] in NOTES]
        assert len(notes) == 1, f"{where}: one Note saying what the workflow needs"
        note = notes[0]["widgets_values"][0]
        for node in loader_nodes(wf):
            named = node_values(node, loader_info)
            c = hosted_target(named)
            assert named["checkpoint"] in note and c.repo in note and "models/prequant" in note, where
            companion = families.get(named["family"]).arch.companion
            if companion is not None:  # what the loader fetches besides the file, and the local name that saves it
                assert companion.repo_file in note and f"models/prequant/` as `{companion.local_name}" in note, where
        files = other_model_files(wf)
        assert files, where
        for n, name in files:
            declared = {m["name"]: m for m in n.get("properties", {}).get("models", [])}
            assert name in declared, f"{where}: node {n['id']} does not declare {name}"
            m = declared[name]
            assert m["directory"] == LOADER_DIRS[n["type"]], (where, m)
            match = (SPLIT_FILES_URL if name in SPLIT_FILES else OFFICIAL_URL).match(m["url"])
            assert match and match.groups()[-1] == name, f"{where}: {m['url']} is not an official download of {name}"
            assert name in note and f"models/{m['directory']}/" in note and m["url"] in note, (where, name)


def test_every_input_and_output_has_a_tooltip_and_the_nodes_can_be_found(server, comfy):
    ours = {k: v for k, v in server.object_info.items() if v.get("python_module", "").endswith("ComfyUI-Prequant")
            or k.startswith("Prequant")}
    assert set(ours) >= {"PrequantLoadTransformer", "PrequantBuildCheckpoint", "PrequantInfo"}
    for name, info in ours.items():
        for sec in ("required", "optional"):
            for inp, spec in (info["input"].get(sec) or {}).items():
                opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
                assert len(opts.get("tooltip", "")) > 20, f"{name}.{inp} has no tooltip"
        assert len(info.get("output_tooltips") or []) == len(info["output"]), f"{name}: output tooltips"
        assert all(len(t) > 20 for t in info["output_tooltips"]), name
        assert len(info["description"]) > 60, name
        # the text-encoder loader: Unsloth hosts fp8 encoders only
        words = ("fp8", "quantized", "unsloth", "text encoder") if name == "PrequantLoadTextEncoder" else \
            ("int8", "fp8", "quantized", "unsloth")
        for word in words:
            assert word in info["description"].lower(), f"{name}: '{word}' is not in its description"
    # the aliases ComfyUI's node search reads (V1 SEARCH_ALIASES; newer ComfyUI serves them as search_aliases)
    _, pack = comfy
    for cls in (pack.nodes.load_node.PrequantLoadTransformer, pack.nodes.build_node.PrequantBuildCheckpoint,
                pack.nodes.info_node.PrequantInfo):
        assert {"int8", "fp8", "quantized", "unsloth"} <= set(cls.SEARCH_ALIASES), cls.__name__
    assert {"fp8", "quantized", "unsloth", "text encoder", "clip"} <= \
        set(pack.nodes.te_node.PrequantLoadTextEncoder.SEARCH_ALIASES)


def test_the_list_check_is_replaced_not_dropped(env, server):
    """The loader's own validation still refuses what is not a model file name, before anything runs; an API-format
    prompt saved with the removed hf_token input still runs, and the value is neither used nor logged."""
    from tools.comfy_server import PromptRejected, execution_error
    wf = load_wf(os.path.join(WF_DIR, "z_image_turbo_prequant.json"))
    prompt = wfmod.to_api(wf, server.object_info)
    lid = str(loader_node(wf)["id"])
    preview = {"class_type": "PreviewAny", "inputs": {"source": [lid, 0]}}
    with pytest.raises(PromptRejected) as e:
        server.queue({lid: {"class_type": LOADER, "inputs": {**prompt[lid]["inputs"], "checkpoint": "notes.txt"}},
                      "999": preview})
    assert "'notes.txt' is not a .safetensors or .pt file name" in str(e.value)
    secret = "hf_legacyPromptValue0123456789"
    n = len(env["hub"].log)
    entry = server.run({lid: {"class_type": LOADER, "inputs": {**prompt[lid]["inputs"], "hf_token": secret}},
                        "999": preview}, timeout=300)
    assert execution_error(entry) is None, execution_error(entry)
    assert entry["outputs"][lid]["prequant"][0]["file"] == "Z-Image-Turbo-FP8.safetensors"
    assert secret not in server.log_tail(10**7)
    assert all(not r["auth"] for r in env["hub"].log[n:]), "the old token value was sent to the Hub"


# ComfyUI's own templates (comfyui-workflow-templates-json 0.1.123, PyPI: Comfy-Org's template files, the ones its
# template browser shows; .cache/comfy-templates) of the models whose workflows need a newer ComfyUI than any here
TEMPLATES_DIR = os.path.join(ROOT, ".cache", "comfy-templates", "comfyui_workflow_templates_json", "templates")
OFFICIAL_TEMPLATE = {"krea_2_turbo_prequant.json": "image_krea2_turbo_t2i.json",
                     "qwen_image_2_1_prequant.json": "image_qwen_image_2_1_t2i.json"}
# what the official graph's settings are: stock nodes whose widget values ours must equal (KSampler from steps on:
# seed and its control are a choice of the workflow, not of the model)
SAME_VALUES = {"CLIPLoader": slice(None), "VAELoader": slice(None), "EmptyLatentImage": slice(None),
               "KSampler": slice(2, None), "TextEncodeQwenImage21": slice(2, None)}


def _template_nodes(tpl) -> list[dict]:
    """Every node of a template: the top-level graph and its subgraphs (ComfyUI's templates wrap the model's graph
    in one)."""
    return list(tpl["nodes"]) + [n for sg in (tpl.get("definitions") or {}).get("subgraphs", []) for n in sg["nodes"]]


@pytest.mark.parametrize("name", sorted(OFFICIAL_TEMPLATE))
def test_a_workflow_for_a_newer_comfyui_follows_its_official_template(comfy, monkeypatch, name):
    """Krea 2 and Qwen-Image 2.1 run only in ComfyUI 0.38.1's classes, which no ComfyUI here has: their workflows are
    ComfyUI's own template of the model with Load Prequant Transformer where its UNETLoader was. Every stock node is
    one the template uses, with the template's settings, model files and download URLs, and the same input and output
    names; the links join matching types; the Note names the version; and on this ComfyUI the loader, with the
    workflow's values, refuses naming that version before any download."""
    from prequant_core.errors import ComfyVersionError
    assert set(os.path.basename(p) for p in NEWER) <= set(OFFICIAL_TEMPLATE)
    wf = load_wf(os.path.join(WF_DIR, name))
    assert os.path.isdir(TEMPLATES_DIR), "scripts/setup_test_extras.sh comfy-templates"
    with open(os.path.join(TEMPLATES_DIR, OFFICIAL_TEMPLATE[name]), encoding="utf-8") as f:
        theirs = _template_nodes(json.load(f))
    need = wfmod.needs_newer_comfyui(wf)  # None: a family this ComfyUI hosts (its run: the tests above)
    fam = families.get(next(n for n in wf["nodes"] if n["type"] == LOADER)["widgets_values"][wfmod.LOADER_FAMILY_SLOT])
    assert need in (None, "0.38.1") and (need is None) == (fam.arch.unet_config is not None)

    by_type = {}
    for n in theirs:
        by_type.setdefault(n["type"], []).append(n)
    assert len(by_type.get("UNETLoader", [])) == 1  # the one node ours replaces
    ours = [n for n in wf["nodes"] if n["type"] not in NOTES]
    assert "UNETLoader" not in {n["type"] for n in ours}
    for n in ours:
        if n["type"].startswith("Prequant") or n["type"] == "SaveImage":  # (every shipped workflow saves with it)
            continue
        assert n["type"] in by_type, f"{name}: {n['type']} is not in ComfyUI's template"
        twin = by_type[n["type"]][0]
        if n["type"] in ("CLIPLoader", "VAELoader"):  # the template may load several: the one of the same file
            twin = next((t for t in by_type[n["type"]] if t["widgets_values"][0] == n["widgets_values"][0]), None)
            assert twin is not None, f"{name}: the template loads no {n['widgets_values'][0]}"
            assert n["properties"]["models"] == twin["properties"]["models"], (name, n["type"])
        if n["type"] in SAME_VALUES:
            cut = SAME_VALUES[n["type"]]
            assert n["widgets_values"][cut] == twin["widgets_values"][cut], (name, n["type"], twin["widgets_values"])
        assert [(o["name"], o["type"]) for o in n["outputs"]] == [(o["name"], o["type"]) for o in twin["outputs"]]
        assert {i["name"] for i in n["inputs"]} <= {i["name"] for i in twin["inputs"]}, (name, n["type"])

    nodes = {n["id"]: n for n in wf["nodes"]}
    for lid, src, src_slot, dst, dst_slot, ltype in wf["links"]:
        out, inp = nodes[src]["outputs"][src_slot], nodes[dst]["inputs"][dst_slot]
        assert out["type"] == ltype == inp["type"] and lid in out["links"] and inp["link"] == lid, (name, lid)
    assert all(i.get("link") is not None or i["type"] == "VAE" for n in ours for i in n["inputs"]), name
    assert {"KSampler", "VAEDecode", "SaveImage"} <= {n["type"] for n in ours}

    note = next(n for n in wf["nodes"] if n["type"] in NOTES)["widgets_values"][0]
    assert f"Needs ComfyUI {fam.arch.min_comfy} or newer" in note and fam.arch.min_comfy in wf["extra"]["info"]
    if need is None:
        return

    # here (an older ComfyUI): the loader refuses naming the version, before the Hub is asked (offline, so a
    # download attempt would fail with the Hub's error instead)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    nodes_, pack = comfy
    loader_info = {"input": pack.nodes.load_node.PrequantLoadTransformer.INPUT_TYPES()}
    named = node_values(loader_node(wf), loader_info)
    assert named["preset"] in combo_options(loader_info["input"]["optional"]["preset"])
    c = hosted_target(named)
    assert c.repo in note and named["checkpoint"] in note
    import torch
    with pytest.raises(ComfyVersionError) as e, torch.inference_mode():
        nodes_.NODE_CLASS_MAPPINGS[LOADER]().load(**named)
    assert need in str(e.value) and families.get(named["family"]).title in str(e.value)
