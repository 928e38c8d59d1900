"""The server the server tests share (tests/nodes/test_server.py, tests/nodes/test_concurrency.py): a real ComfyUI on the
loopback with tiny Z-Image files of this pack's builder, the example workflow as an API prompt, an image's digest."""
from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from conftest import ROOT

WORKFLOW = os.path.join(ROOT, "example_workflows", "z_image_turbo_prequant.json")


@pytest.fixture(scope="module")
def server(tmp_path_factory, zimage_dense, comfy):
    from prequant_core import builder, families
    from tools import tiny_assets, tiny_models
    from tools.comfy_server import ComfyServer
    base = tmp_path_factory.mktemp("server")
    models = base / "models"
    (models / "prequant").mkdir(parents=True)
    tiny_assets.install(str(models))
    dense = tiny_models.zimage_dense(seed=0, cap_feat_dim=tiny_assets.CAP_FEAT_DIM)
    comfy_layout = tiny_models.zimage_comfy_layout(dense)
    fam = families.get("z-image")
    for scheme in ("int8", "fp8"):
        recipe = builder.Recipe(scheme, family=fam, base_model_id="Tongyi-MAI/Z-Image-Turbo")
        stem = str(models / "prequant" / f"Z-Image-Turbo-{scheme.upper()}")
        builder.build_from_tensors(dense, builder.Target(stem + ".safetensors"), recipe)
        builder.build_from_tensors(comfy_layout, builder.Target(stem + "-comfykeys.pt", container="pt"), recipe)
    outside = tmp_path_factory.mktemp("outside")
    shutil.copy(models / "prequant" / "Z-Image-Turbo-INT8.safetensors", outside / "elsewhere.safetensors")
    env = {"PREQUANT_ALLOW_LOCAL_PATH": "", "UNSLOTH_ALLOW_LOCAL_PREQUANT_PATH": ""}
    s = ComfyServer(str(base), env=env).start()
    s.outside = str(outside / "elsewhere.safetensors")
    yield s
    s.stop()


def prompt_for(server, checkpoint="Z-Image-Turbo-FP8.safetensors", scheme="fp8", **loader):
    from tools import tiny_assets
    from tools.workflow import to_api
    with open(WORKFLOW) as f:
        wf = json.load(f)
    return to_api(wf, server.get("/object_info"), {
        "Load Prequant Transformer": {"checkpoint": checkpoint, "scheme": scheme, **loader},
        "PrequantLoadTextEncoder": tiny_assets.text_encoder_stand_in(),
        "VAELoader": {"vae_name": tiny_assets.VAE_NAME},
        "EmptySD3LatentImage": {"width": 128, "height": 128},
        "KSampler": {"steps": 2},
    })


def image_digest(server, entry):
    imgs = [i for out in entry["outputs"].values() for i in out.get("images", [])]
    assert len(imgs) == 1
    p = os.path.join(server.base_dir, "output", imgs[0].get("subfolder", ""), imgs[0]["filename"])
    return hashlib.sha256(open(p, "rb").read()).hexdigest()
