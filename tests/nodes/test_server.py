"""The pack inside a real ComfyUI server on 127.0.0.1: the example workflow, /free, errors reaching the UI."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from conftest import ROOT
from server_kit import WORKFLOW, image_digest, prompt_for, server  # noqa: F401  (the module-scoped server fixture)

def image_pixels(server, entry) -> bytes:
    from PIL import Image
    imgs = [i for out in entry["outputs"].values() for i in out.get("images", [])]
    assert len(imgs) == 1
    with Image.open(os.path.join(server.base_dir, "output", imgs[0].get("subfolder", ""), imgs[0]["filename"])) as im:
        return im.tobytes()


def test_example_workflow_matches_object_info(server):
    from tools.workflow import check
    with open(WORKFLOW) as f:
        wf = json.load(f)
    info = server.get("/object_info")
    assert check(wf, info) == []
    assert "PrequantLoadTransformer" in info
    assert info["PrequantLoadTransformer"]["category"] == "loaders/prequant"
    choices = info["PrequantLoadTransformer"]["input"]["required"]["checkpoint"][0]
    assert "Z-Image-Turbo-FP8.safetensors" in choices and "Z-Image-Turbo-INT8-comfykeys.pt" in choices


@pytest.mark.parametrize("checkpoint,scheme", [
    ("Z-Image-Turbo-FP8.safetensors", "fp8"), ("Z-Image-Turbo-INT8.safetensors", "int8"),
    ("Z-Image-Turbo-FP8-comfykeys.pt", "fp8"), ("Z-Image-Turbo-INT8-comfykeys.pt", "int8")])
def test_example_workflow_runs(server, checkpoint, scheme):
    from tools.comfy_server import execution_error
    entry = server.run(prompt_for(server, checkpoint, scheme))
    assert execution_error(entry) is None, execution_error(entry)
    loader_ui = [o for o in entry["outputs"].values() if "prequant" in o]
    assert loader_ui and loader_ui[0]["prequant"][0]["scheme"] == scheme
    image_digest(server, entry)


def test_free_then_run_again_gives_the_same_image(server):
    from tools.comfy_server import execution_error
    p = prompt_for(server)
    first = server.run(p)
    assert execution_error(first) is None
    server.free()
    p["7"]["inputs"]["denoise"] = 1.0  # identical graph; /free forces a full reload from disk
    second = server.run(p)
    assert execution_error(second) is None
    assert image_digest(server, first) == image_digest(server, second)


@pytest.mark.parametrize("loader,needle", [
    ({"checkpoint": "(none: use path or hub_repo)", "path": "OUTSIDE"}, "PREQUANT_ALLOW_LOCAL_PATH"),
    ({"base_model_id": "Qwen/Qwen-Image"}, "requested 'Qwen/Qwen-Image'"),
    ({"scheme": "int8"}, "requested 'int8'"),
])
def test_errors_reach_the_ui_and_the_server_keeps_serving(server, loader, needle):
    from tools.comfy_server import execution_error
    loader = {k: (server.outside if v == "OUTSIDE" else v) for k, v in loader.items()}
    before = sorted(os.listdir(os.path.join(server.base_dir, "output"))), \
        sorted(os.listdir(os.path.join(server.base_dir, "models", "prequant")))
    entry = server.run(prompt_for(server, **loader))
    err = execution_error(entry)
    assert err and needle in err, err
    assert "Fix:" in err
    after = sorted(os.listdir(os.path.join(server.base_dir, "output"))), \
        sorted(os.listdir(os.path.join(server.base_dir, "models", "prequant")))
    assert before == after, "a refused load must write nothing"
    ok = server.run(prompt_for(server))
    assert execution_error(ok) is None


@pytest.mark.parametrize("kind", ["surrogate-metadata", "surrogate-name", "undeclared-rotation", "string-kwargs"])
def test_a_hostile_file_through_the_node_ends_typed_and_the_queue_keeps_running(server, kind):
    """Files a stranger could make (issue: hostile files, round 3): lone surrogates in metadata strings or tensor
    names (they used to kill ComfyUI's prompt worker: every later prompt waited for ever), a ConvRot group the
    metadata never declared, a string where torchao's quantization kwargs belong. Each prompt ends in a typed error
    shown on the node; the next prompt runs."""
    import hostile_corpus as hc
    import torch
    from tools.comfy_server import execution_error
    t = hc.tiny_tensors("int8")
    md = hc.tiny_metadata(t, "int8")
    key = "layers.0.attention.to_q.weight"
    if kind == "surrogate-metadata":
        md = hc.tiny_metadata(t, "int8", family="z-image\ud800", base_model_id="a/b\udcff")
    elif kind == "surrogate-name":
        t = {**t, "layers.0.\ud800.weight": torch.ones(2)}
    elif kind == "undeclared-rotation":
        t[key].__dict__["prequant_rotation"] = 4 ** 8
    else:
        t[key].__dict__["act_quant_kwargs"] = "not kwargs"
    name = f"hostile-{kind}.pt"
    with open(os.path.join(server.base_dir, "models", "prequant", name), "wb") as f:
        f.write(hc.pt_container(t, md))
    entry = server.run(prompt_for(server, checkpoint=name, scheme="int8"), timeout=120)
    err = execution_error(entry)
    assert err and "Fix:" in err and not any("\ud800" <= c <= "\udfff" for c in err), err
    ok = server.run(prompt_for(server), timeout=300)
    assert execution_error(ok) is None, "the queue must keep serving after a hostile file"


MARKER_NODE = '''
import comfy.model_patcher as mp


class MarkerPatcher(mp.ModelPatcher):
    """Test-only: what main.py does with DynamicVRAM on (CoreModelPatcher = ModelPatcherDynamic), with a class a
    CPU keeps."""


mp.CoreModelPatcher = MarkerPatcher
NODE_CLASS_MAPPINGS = {}
'''


def test_the_model_is_comfyuis_core_patcher_class_in_a_server(server, tmp_path):
    """A server whose ``CoreModelPatcher`` names another class before the first prompt (as ``main.py`` sets
    ``ModelPatcherDynamic``): the loader's MODEL is that class, says so, and the image is the plain server's, byte
    for byte."""
    from tools.comfy_server import ComfyServer, execution_error
    plain = server.run(prompt_for(server, "Z-Image-Turbo-INT8.safetensors", "int8"))
    assert execution_error(plain) is None, execution_error(plain)
    node = tmp_path / "custom_nodes" / "core_patcher_marker"
    node.mkdir(parents=True)
    (node / "__init__.py").write_text(MARKER_NODE)
    os.symlink(os.path.join(server.base_dir, "models"), tmp_path / "models")
    with ComfyServer(str(tmp_path), env=server.env) as marked_server:
        marked = marked_server.run(prompt_for(marked_server, "Z-Image-Turbo-INT8.safetensors", "int8"))
        assert execution_error(marked) is None, execution_error(marked)
        texts = [t for o in marked["outputs"].values() if "prequant" in o for t in o["text"]]
        assert texts and "managed by ComfyUI's MarkerPatcher" in texts[0], texts
        # the pixels: the PNG's embedded prompt names each server's own folder
        assert image_pixels(marked_server, marked) == image_pixels(server, plain)
    texts = [t for o in plain["outputs"].values() if "prequant" in o for t in o["text"]]
    assert "managed by ComfyUI's ModelPatcher" in texts[0], texts


def test_a_checkpoint_rewritten_under_a_lora_model_never_stops_the_prompt_worker(server):
    """Round 6 (issue 58, 1): Load Prequant Transformer -> LoraLoaderModelOnly -> KSampler ran; then layer 0's codes
    were rewritten in place (same size, same mtime). ``POST /free {"unload_models": true}`` raised out of ComfyUI's
    unpatch in the prompt worker's thread, and every later prompt stayed queued for ever. Now the unload completes,
    the next prompt loads the file again (the loader's IS_CHANGED moved) and runs, and a LoRA change meanwhile ends
    its prompt with a typed error at most once."""
    import json
    import struct
    from safetensors import safe_open
    from safetensors.torch import save_file
    import torch
    from tools.comfy_server import execution_error
    name = "Z-Image-Turbo-INT8-rewritten.safetensors"
    path = os.path.join(server.base_dir, "models", "prequant", name)
    shutil.copy(os.path.join(server.base_dir, "models", "prequant", "Z-Image-Turbo-INT8.safetensors"), path)
    with safe_open(path, "pt") as f:
        out_f, in_f = f.get_slice("layers.0.attention.to_q._weight_qdata").get_shape()
    g = torch.Generator().manual_seed(5)
    lora = os.path.join(server.base_dir, "models", "loras", "rewrite_lora.safetensors")
    os.makedirs(os.path.dirname(lora), exist_ok=True)
    save_file({"diffusion_model.layers.0.attention.qkv.lora_up.weight": torch.randn(3 * out_f, 4, generator=g) * .05,
               "diffusion_model.layers.0.attention.qkv.lora_down.weight": torch.randn(4, in_f, generator=g) * .05,
               "diffusion_model.layers.0.attention.qkv.alpha": torch.tensor(4.0)}, lora)
    p = prompt_for(server, name, "int8")
    loader_id = next(k for k, n in p.items() if n["class_type"] == "PrequantLoadTransformer")
    for n in p.values():
        for k, v in n["inputs"].items():
            if v == [loader_id, 0]:
                n["inputs"][k] = ["lora", 0]
    p["lora"] = {"class_type": "LoraLoaderModelOnly",
                 "inputs": {"model": [loader_id, 0], "lora_name": "rewrite_lora.safetensors", "strength_model": 1.0}}
    first = server.run(p, timeout=300)
    assert execution_error(first) is None, execution_error(first)
    st = os.stat(path)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        a, b = json.loads(f.read(n))["layers.0.attention.to_q._weight_qdata"]["data_offsets"]
        f.seek(8 + n + a)
        codes = f.read(b - a)

    def put(data):  # layer 0's to_q codes rewritten in place, the file's size and mtime kept
        with open(path, "r+b") as f:
            f.seek(8 + n + a)
            f.write(data)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    flipped = bytes(c ^ 1 for c in codes)  # each code's low bit: still valid int8 codes
    put(flipped)
    # the unload that stopped the worker; waited for, or the next prompt may run before the worker unloads
    server.free(until_log="changed on disk")
    again = execution_error(server.run(p, timeout=300))  # waited for ever behind a dead worker
    # the next prompt read the file again (IS_CHANGED moved though size and mtime did not) and judged it changed
    assert again and path in again and "fingerprint" in again and "Fix:" in again, again
    assert "changed on disk" in server.log_tail(20000)
    put(codes)
    restored = server.run(p, timeout=300)
    assert execution_error(restored) is None, execution_error(restored)
    put(flipped)  # then a LoRA change: ComfyUI unpatches the cached model in the middle of the next prompt
    p["lora"]["inputs"]["strength_model"] = 0.5
    changed = execution_error(server.run(p, timeout=300))
    assert changed is None or ("changed on disk" in changed and "Queue the prompt again" in changed), changed
    put(codes)
    last = server.run(p, timeout=300)
    assert execution_error(last) is None, execution_error(last)
