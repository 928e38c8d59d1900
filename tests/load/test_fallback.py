"""The fallback chain: pre-quantized first, else quantize the dense model at load time, decided up front."""
from __future__ import annotations

from prequant_core.context import LoadContext

import os

import pytest
import torch

from conftest import sample
from prequant_core import errors
from prequant_core.load import route
from prequant_core.load.metadata import Request

NONE = "(none: use path or hub_repo)"


@pytest.fixture(scope="module")
def dense_file(comfy, zimage_dense, models_dir):
    """The tiny Z-Image as a dense bf16 file in ComfyUI's diffusion_models folder (diffusers keys)."""
    from tools import tiny_models
    d = os.path.join(models_dir, "diffusion_models")
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, "tiny_zimage_bf16.safetensors")
    tiny_models.save_dense_safetensors(zimage_dense, p)
    return p


def run_node(comfy, **kw):
    nodes, _ = comfy
    node = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]()
    with torch.inference_mode():
        r = node.load(kw.pop("checkpoint", NONE), **kw)
    return r["result"][0], r["ui"]["text"][0]


def test_valid_prequant_is_used(comfy, prequant_files, allow_dir, dense_file):
    allow_dir(os.path.dirname(prequant_files("int8")))
    _, text = run_node(comfy, path=prequant_files("int8"), scheme="int8", policy=route.PREQUANT_ELSE_DENSE,
                       dense_fallback="tiny_zimage_bf16.safetensors")
    assert "pre-quantized" in text and "quantized at load" not in text


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_refused_prequant_falls_back_to_identical_output(comfy, prequant_files, allow_dir, dense_file, scheme):
    allow_dir(os.path.dirname(prequant_files(scheme)))
    good, _ = run_node(comfy, path=prequant_files(scheme), scheme=scheme)
    model, text = run_node(comfy, path=prequant_files(scheme), scheme=scheme, base_model_id="Qwen/Qwen-Image",
                           policy=route.PREQUANT_ELSE_DENSE, dense_fallback="tiny_zimage_bf16.safetensors")
    assert "quantized at load" in text and "requested 'Qwen/Qwen-Image'" in text, text
    assert torch.equal(sample(model), sample(good)), "both paths must give the same output from the same weights"


def test_forced_dense(comfy, prequant_files, allow_dir, dense_file):
    allow_dir(os.path.dirname(prequant_files("int8")))
    model, text = run_node(comfy, path=prequant_files("int8"), scheme="int8", policy=route.DENSE_ONLY,
                           dense_fallback="tiny_zimage_bf16.safetensors")
    assert "quantized at load" in text and "forced by policy" in text
    good, _ = run_node(comfy, path=prequant_files("int8"), scheme="int8")
    assert torch.equal(sample(model), sample(good))


def test_prequant_only_bad_file_lists_reasons_and_evicts_nothing(comfy, prequant_files, allow_dir, dense_file):
    import comfy.model_management as mm
    allow_dir(os.path.dirname(prequant_files("int8")))
    resident, _ = run_node(comfy, path=prequant_files("int8"), scheme="int8")
    sample(resident)
    loaded_before = [m.model for m in mm.current_loaded_models]
    assert loaded_before
    with pytest.raises(errors.ValidationError) as e:
        run_node(comfy, path=prequant_files("int8"), scheme="fp8", base_model_id="Qwen/Qwen-Image",
                 min_features=1024, dense_fallback="tiny_zimage_bf16.safetensors")
    assert len(e.value.reasons) == 3, str(e.value)
    assert [m.model for m in mm.current_loaded_models] == loaded_before


def test_plan_is_decided_before_loading(comfy, prequant_files, allow_dir, dense_file, models_dir):
    allow_dir(os.path.dirname(prequant_files("int8")))
    dirs = [os.path.join(models_dir, "diffusion_models")]
    p = route.choose(prequant_files("int8"), Request(scheme="int8", base_model_id="nope/other"),
                     LoadContext.of(model_dirs=dirs), fallback=route.Fallback(route.PREQUANT_ELSE_DENSE, dense_file))
    assert p.taken == "quantized at load" and p.skipped_because and p.family.name == "z-image"
    with pytest.raises(errors.PathNotAllowedError):
        route.choose(None, Request(scheme="int8"), LoadContext.of(model_dirs=dirs),
                     fallback=route.Fallback(route.DENSE_ONLY, "/etc/hostname"))
    with pytest.raises(errors.ValidationError):
        route.choose(None, Request(), LoadContext.of(model_dirs=dirs),
                     fallback=route.Fallback(route.DENSE_ONLY, dense_file))
