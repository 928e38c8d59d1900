"""Unsloth's files of the video families (LTX-2.3's fp8, MiniMax-H3's fp8 and int8 ConvRot, as Unsloth's builder
writes them: never this pack's writer) sample in a real ComfyUI 0.33 server through Load Prequant Transformer, as close to what ComfyUI's
stock Load Diffusion Model samples from the same weights in ComfyUI's own layout as fp8 allows.

Both prompts are ComfyUI's own nodes end to end (KSampler, LTXVConcatAVLatent, LTXVSeparateAVLatent, SaveLatent) but
one: the families' text encoders exist only at full size (Gemma 3 12B, Qwen3-VL 32B), so a small test node
(written into the server's custom_nodes here) hands the sampler a conditioning and both streams' empty latents of
the tiny models' widths. LTX-2.3's conditioning is marked unprocessed, as ComfyUI's LTX-2 text encoder marks its
own, so ComfyUI runs the text connectors, which the node reads from their own file (the companion).
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from conftest import unsloth_video_file
from prequant_core import families
from tools import tiny_families as tf

# The test node: a conditioning and the two latents, from a safetensors file the test writes
INPUTS_NODE = '''
from safetensors.torch import load_file


class PrequantTestAVInputs:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"file": ("STRING", {"default": ""})}}
    RETURN_TYPES = ("CONDITIONING", "CONDITIONING", "LATENT", "LATENT")
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, file):
        t = load_file(file)
        extra = {"unprocessed_ltxav_embeds": True} if "unprocessed" in t else {}
        return ([[t["positive"], dict(extra)]], [[t["negative"], dict(extra)]], {"samples": t["video"]},
                {"samples": t["audio"]})


NODE_CLASS_MAPPINGS = {"PrequantTestAVInputs": PrequantTestAVInputs}
'''

# (latent widths, context width, whether the context goes through LTX-2.3's connectors) of each tiny model
SHAPES = {
    "ltx-2": {"video": (1, 64, 2, 4, 4), "audio": (1, 8, 5, 16), "context": (1, 6, 512 + 512), "unprocessed": True},
    "minimax-h3": {"video": (1, 16, 2, 4, 4), "audio": (1, 32, 2, 3), "context": (1, 6, 384), "unprocessed": False},
}


def _relative(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _graph(loader: dict, inputs: str, seed: int, prefix: str) -> dict:
    return {
        "1": loader,
        "2": {"class_type": "PrequantTestAVInputs", "inputs": {"file": inputs}},
        "3": {"class_type": "LTXVConcatAVLatent", "inputs": {"video_latent": ["2", 2], "audio_latent": ["2", 3]}},
        "4": {"class_type": "KSampler", "inputs": {"model": ["1", 0], "seed": seed, "steps": 2, "cfg": 1.0,
                                                   "sampler_name": "euler", "scheduler": "simple",
                                                   "positive": ["2", 0], "negative": ["2", 1],
                                                   "latent_image": ["3", 0], "denoise": 1.0}},
        "5": {"class_type": "LTXVSeparateAVLatent", "inputs": {"av_latent": ["4", 0]}},
        "6": {"class_type": "SaveLatent", "inputs": {"samples": ["5", 0], "filename_prefix": f"{prefix}_video"}},
        "7": {"class_type": "SaveLatent", "inputs": {"samples": ["5", 1], "filename_prefix": f"{prefix}_audio"}},
    }


def _latents(server, entry) -> list[torch.Tensor]:
    from safetensors.torch import load_file
    out = []
    for node in ("6", "7"):
        saved = entry["outputs"][node]["latents"][0]
        path = os.path.join(server.base_dir, "output", saved.get("subfolder", ""), saved["filename"])
        out.append(load_file(path)["latent_tensor"])
    return out


# what Unsloth hosts of each (unsloth/LTX-2.3-FP8: fp8; unsloth/MiniMax-H3-FP8: fp8 and int8 ConvRot v2)
FILES = [("ltx-2", "fp8", "safetensors"), ("minimax-h3", "fp8", "safetensors"), ("minimax-h3", "convrot", "pt")]


@pytest.mark.parametrize("family,kind,container", FILES, ids=["-".join(f) for f in FILES])
def test_unsloths_video_file_samples_through_the_node_as_the_stock_loader_samples_its_weights(comfy, tmp_path,
                                                                                              family, kind, container):
    from safetensors.torch import save_file
    from tools.comfy_server import ComfyServer, execution_error
    fam = families.get(family)
    nodes_, pack = comfy
    cm = pack.nodes.comfy_model
    if cm._older_than(cm.comfy_version(), fam.arch.min_comfy):
        pytest.fail(f"this test runs on ComfyUI {fam.arch.min_comfy}+ (the 0.33.0 leg): {cm.comfy_version()}")
    base = tmp_path / "comfy"
    models = base / "models"
    (models / "prequant").mkdir(parents=True)
    (models / "diffusion_models").mkdir(parents=True)
    (base / "custom_nodes" / "prequant_test_inputs").mkdir(parents=True)
    (base / "custom_nodes" / "prequant_test_inputs" / "__init__.py").write_text(INPUTS_NODE)

    # Unsloth's file of the tiny model (its builder, run with diffusers 0.42.1)
    name = f"{tf.DIFFUSERS_ONLY[family].file_stem}-unsloth-{kind}.{container}"
    unsloth_video_file(family, kind, str(models / "prequant" / name))

    # the same weights, dense, in ComfyUI's own layout (the model ComfyUI's class holds, as its checkpoints store it;
    # LTX-2.3's with its configuration, which ComfyUI reads from a checkpoint's metadata alone)
    dense = tf.dense_from_subprocess(family)
    c = fam.arch.companion
    if c is not None:  # the base repo's connectors component, where the node looks for it
        save_file({k[len(c.prefix):]: v for k, v in dense.items() if k.startswith(c.prefix)},
                  str(models / "prequant" / c.local_name))
    patcher = cm.build_patcher(fam, "diffusers", dense)
    comfy_sd = {k: v.contiguous() for k, v in patcher.model.diffusion_model.state_dict().items()}
    config = json.dumps({"transformer": patcher.model.model_config.unet_config}, default=str)
    stock_name = f"{family}-bf16-comfyui.safetensors"
    save_file(comfy_sd, str(models / "diffusion_models" / stock_name), metadata={"config": config})

    shapes = SHAPES[family]
    g = torch.Generator().manual_seed(5)
    inputs = str(tmp_path / "inputs.safetensors")
    save_file({"positive": torch.randn(*shapes["context"], generator=g),
               "negative": torch.randn(*shapes["context"], generator=g),
               "video": torch.zeros(shapes["video"]), "audio": torch.zeros(shapes["audio"]),
               **({"unprocessed": torch.ones(1)} if shapes["unprocessed"] else {})}, inputs)

    scheme = "int8" if kind == "convrot" else kind
    ours = {"class_type": "PrequantLoadTransformer", "inputs": {"checkpoint": name, "scheme": scheme}}
    stock = {"class_type": "UNETLoader", "inputs": {"unet_name": stock_name, "weight_dtype": "default"}}
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}  # everything is local: nothing may be fetched
    with ComfyServer(str(base), env=env) as server:
        runs = {}
        for label, loader, seed in (("ours", ours, 0), ("stock", stock, 0), ("stock_seed1", stock, 1)):
            entry = server.run(_graph(loader, inputs, seed, label), timeout=600)
            assert execution_error(entry) is None, (label, execution_error(entry), server.log_tail())
            runs[label] = _latents(server, entry)
            if label == "ours":  # the node's summary: the family, and where LTX-2.3's connectors came from
                s = entry["outputs"]["1"]["prequant"][0]
                assert (s["family"], s["scheme"], s.get("companion")) == \
                    (family, scheme, f"{c.local_name} (local)" if c else None), s
    for i, stream in enumerate(("video", "audio")):
        got, want, other = runs["ours"][i], runs["stock"][i], runs["stock_seed1"][i]
        assert got.shape == want.shape == torch.Size(shapes[stream]) and torch.isfinite(got).all()
        rel, apart = _relative(got, want), _relative(other, want)
        print(f"[{family} {kind} {stream}] node (Unsloth's file) vs stock loader (bf16): {rel:.4f}; another seed: "
              f"{apart:.3f}")
        assert 0 < rel < 0.05 and apart > 10 * rel, (stream, rel, apart)
