"""Load Prequant Text Encoder through a real ComfyUI server (on 0.3.75 and, in the 0.12.1 leg, on 0.12.1), as a
workflow posted to /prompt reaches it: what does not fit is refused with the reason in the prompt's error (another
component, another base, a transformer file, an encoder of another size, Qwen-Image 2.1's encoder on a ComfyUI
without its class), and the family's hosted file is asked for by Unsloth's name on the loopback Hub, downloaded into
models/prequant and taken from there once the Hub is gone (0.3.75: the 0.12.1 venv's huggingface_hub is another
release than the one the loopback Hub is written against, as for tests/hub/test_hub.py).

The encoders are tiny real-class files (the restated Unsloth builder): ComfyUI builds each encoder from its fixed
config, so a tiny one ends at the shape check, which names the tensor. Conditioning identity needs a full-size
encoder: tests/text_encoders/test_text_encoder_comfy.py (in-process, both versions)."""
from __future__ import annotations

import os
import shutil

import pytest

import unsloth_builder
import unsloth_te_builder as te_builder
from conftest import BASE_ID, absent_comfy_tokenizer
from hub_server import HubServer, free_port
from tools.comfy_server import ComfyServer, execution_error

TE = "PrequantLoadTextEncoder"
REPO, NAME = "unsloth/Z-Image-Turbo-FP8", "Z-Image-Turbo-text_encoder-FP8.safetensors"
TOO_SMALL = "Tensor 'model.embed_tokens.weight' has shape (256, 64), ComfyUI's encoder expects ("


def graph(**inputs) -> dict:
    """The node and a sink that takes its CLIP (PreviewAny takes any type)."""
    values = {"text_encoder": "(none: use path or hub_repo)", "preset": "none", "with_encoder": "none",
              "family": "auto", "hub_repo": "", "component": "auto", "base_model_id": "", "revision": "", "path": ""}
    values.update(inputs)
    return {"1": {"class_type": TE, "inputs": values},
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    src = tmp_path_factory.mktemp("hosted")
    te = str(src / NAME)
    te_builder.build_file(te, "Qwen3ForCausalLM", base_model_id=BASE_ID, family="z-image")
    dit = str(src / "Z-Image-Turbo-FP8.safetensors")
    unsloth_builder.build_file("z-image", "fp8", dit)
    return {"te": te, "dit": dit}


def test_what_does_not_fit_is_refused_with_the_reason_in_the_prompts_error(served, tmp_path, monkeypatch):
    from tools.comfy_headless import comfyui_version
    base = tmp_path / "comfy"
    prequant = base / "models" / "prequant"
    prequant.mkdir(parents=True)
    shutil.copy(served["te"], prequant / NAME)
    shutil.copy(served["dit"], prequant / "Z-Image-Turbo-FP8.safetensors")
    env = {"HF_HUB_OFFLINE": "1"}  # nothing here may download: a download attempt fails with the Hub's error
    with ComfyServer(str(base), env=env) as server:
        cases = [
            # judged valid, then ComfyUI's full-size class takes its shapes
            (graph(text_encoder=NAME), absent_comfy_tokenizer() or TOO_SMALL),
            (graph(text_encoder=NAME, family="z-image", component="text_encoder_2"),
             "component is 'text_encoder', requested 'text_encoder_2'"),
            (graph(text_encoder=NAME, base_model_id="Qwen/Qwen-Image"),
             "base model is 'Tongyi-MAI/Z-Image-Turbo', requested 'Qwen/Qwen-Image'"),
            (graph(text_encoder="Z-Image-Turbo-FP8.safetensors"), "Load Prequant Transformer"),
            (graph(preset="Qwen-Image 2.1 / text_encoder"), "runs in ComfyUI 0.38.1's encoder class"),
            (graph(preset="Krea 2 / text_encoder"),
             "does not build ComfyUI's Qwen3-VL encoder yet" if comfyui_version().startswith("0.33") else
             "Krea 2's Qwen3-VL text encoder runs in ComfyUI 0.33.0"),
        ]
        for g, needle in cases:
            err = execution_error(server.run(g, timeout=300))
            assert err and needle in err, (needle, err)


def test_the_preset_downloads_by_unsloths_name_and_later_runs_need_no_hub(served, tmp_path):
    base = tmp_path / "comfy"
    prequant = base / "models" / "prequant"
    prequant.mkdir(parents=True)
    with HubServer() as hub:
        hub.commit(REPO, {NAME: served["te"]})
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0", "HF_TOKEN": ""}
        with ComfyServer(str(base), env=env) as server:
            err = execution_error(server.run(graph(preset="Z-Image / text_encoder"), timeout=300))
            assert err and (absent_comfy_tokenizer() or TOO_SMALL) in err, err  # downloaded, judged, handed to ComfyUI
        asked = [r["filename"] for r in hub.requests("HEAD")]
        assert asked and asked[0] == NAME, asked
    got = prequant / "unsloth" / "Z-Image-Turbo-FP8" / NAME
    with open(served["te"], "rb") as f:
        assert got.is_file() and got.read_bytes() == f.read()
    # the Hub gone: the downloaded file serves the preset
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0",
           "HF_TOKEN": ""}
    with ComfyServer(str(base), env=env) as server:
        err = execution_error(server.run(graph(preset="Z-Image / text_encoder"), timeout=300))
        assert err and (absent_comfy_tokenizer() or TOO_SMALL) in err, err
    assert os.path.getsize(got) == os.path.getsize(served["te"])
