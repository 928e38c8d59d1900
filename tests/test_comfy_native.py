"""ComfyUI's own quantized files (issue: "ComfyUI's own quantized files, both ways"), read by this pack: files written by
a restatement of ComfyUI's writer with comfy-kitchen's own quantizer (tests/comfy_quantizer.py, never this pack's
writer), for every format whose math the pack runs: float8_e4m3fn, float8_e5m2, nvfp4, mxfp8, int8_tensorwise (per
tensor, per row, ConvRot with per-layer groups), in both markings (per-layer ``.comfy_quant`` and the older
``_quantization_metadata`` header). Each layer's weight, as the pack holds and computes it, equals ComfyUI's own
dequantization of the same bytes (comfy-kitchen's eager reference functions). Core tier: no ComfyUI needed.
The ComfyUI side (the node on 0.3.75 / 0.12.1, and files this pack writes loading in stock ComfyUI):
tests/test_comfy_native_comfy.py.
"""
from __future__ import annotations

import pytest
import torch

import comfy_quantizer as cq
from prequant_core import formats, report
from prequant_core.load import metadata
from prequant_core.schemes import qtensor
from prequant_core.errors import CorruptCheckpointError, UnsupportedFormatError

FORMATS = [("float8_e4m3fn", {}), ("float8_e5m2", {}), ("nvfp4", {}), ("mxfp8", {}), ("int8_tensorwise", {}),
           ("int8_tensorwise", {"per_row": True}), ("int8_tensorwise", {"convrot": 256}),
           ("int8_tensorwise", {"convrot": 64})]


def _dense(seed=0):
    g = torch.Generator().manual_seed(seed)
    w = lambda r, c: (torch.randn(r, c, generator=g) / c ** 0.5).to(torch.bfloat16)  # noqa: E731
    return {"blocks.0.attn.qkv.weight": w(384, 256), "blocks.0.attn.qkv.bias": torch.zeros(384, dtype=torch.bfloat16),
            "blocks.0.mlp.0.weight": w(512, 256), "blocks.0.mlp.2.weight": w(256, 512),
            "blocks.0.norm.weight": torch.ones(256, dtype=torch.bfloat16), "final.weight": w(64, 256)}


def _pack_dense(t) -> torch.Tensor:
    """The weight as the pack's math sees it (dequantized; a ConvRot layer rotated back)."""
    return qtensor.dense_from_parts(*qtensor.parts(t), torch.float32)


@pytest.mark.parametrize("style", ["comfy_quant", "header"])
@pytest.mark.parametrize("fmt,opts", FORMATS, ids=[f + "-" + "-".join(f"{k}{v}" for k, v in o.items()) for f, o in FORMATS])
def test_every_format_reads_as_comfyuis_own_dequantization(tmp_path, fmt, opts, style):
    dense = _dense()
    layers = {"blocks.0.attn.qkv": (fmt, opts), "blocks.0.mlp.0": (fmt, opts), "blocks.0.mlp.2": (fmt, opts)}
    path = str(tmp_path / "native.safetensors")
    made = cq.write(path, dense, layers, style=style)
    ck = formats.read(path)
    assert ck.container == "comfyui-native" and ck.metadata["comfy_quant_formats"] == {fmt: 3}
    for layer, (parts, cfg) in made.items():
        got = _pack_dense(ck.tensors[layer + ".weight"])
        want = cq.dequantize_layer(parts, cfg)
        assert got.shape == want.shape
        diff = (got - want).abs().max().item()
        assert diff == 0.0, f"{layer} {fmt} {opts}: max |pack - ComfyUI| = {diff}"
    assert torch.equal(ck.tensors["blocks.0.norm.weight"], dense["blocks.0.norm.weight"])
    v = metadata.validate(ck, metadata.Request())
    assert v.ok, v.reasons


def test_mixed_formats_and_prefixed_keys_read_each_layer_in_its_own_format(tmp_path):
    dense = _dense(1)
    layers = {"blocks.0.attn.qkv": ("nvfp4", {}), "blocks.0.mlp.0": ("float8_e4m3fn", {}),
              "blocks.0.mlp.2": ("int8_tensorwise", {"convrot": 256})}
    path = str(tmp_path / "mixed.safetensors")
    made = cq.write(path, dense, layers, style="both", prefix="model.diffusion_model.")
    ck = formats.read(path)
    assert {qtensor.kind_of(ck.tensors[f"{n}.weight"]) for n in layers} == {"nvfp4", "float8", "int8"}
    for layer, (parts, cfg) in made.items():
        assert torch.equal(_pack_dense(ck.tensors[layer + ".weight"]), cq.dequantize_layer(parts, cfg))
    assert metadata.validate(ck, metadata.Request()).ok


def test_input_scales_and_attention_configs_are_read_and_noted(tmp_path):
    path = str(tmp_path / "notes.safetensors")
    cq.write(path, _dense(), {"blocks.0.mlp.0": ("float8_e4m3fn", {})}, input_scale=True, attention=True)
    ck = formats.read(path)
    assert ck.metadata["comfy_input_scales"] == 1 and ck.metadata["comfy_attention_configs"] == 1
    assert not any("input_scale" in k or "comfy_attention" in k for k in ck.tensors)
    notes = " ".join(metadata.validate(ck, metadata.Request()).notes)
    assert "input_scale" in notes and "comfy_attention.config" in notes


def test_info_describes_formats_per_layer_and_which_comfyui_reads_them(tmp_path):
    path = str(tmp_path / "nv.safetensors")
    cq.write(path, _dense(), {"blocks.0.mlp.0": ("nvfp4", {}), "blocks.0.mlp.2": ("float8_e4m3fn", {})})
    r = report.info(path)
    text = r.to_text()
    assert "nvfp4: 1 layer" in text and "float8_e4m3fn: 1 layer" in text, text
    assert "0.8.0" in text and "Load Diffusion Model" in text, text


@pytest.mark.parametrize("fmt", ["convrot_w4a4", "svdquant_w4a4", "some_future_format"])
def test_formats_without_this_packs_math_are_refused_by_name(tmp_path, fmt):
    from safetensors.torch import save_file
    p = str(tmp_path / "other.safetensors")
    save_file({"l.weight": torch.zeros(16, 16, dtype=torch.int8), "l.weight_scale": torch.ones(16),
               "l.comfy_quant": cq._json_tensor({"format": fmt})}, p)
    with pytest.raises(UnsupportedFormatError) as e:
        formats.read(p)
    assert fmt in str(e.value) and "Load Diffusion Model" in str(e.value)


@pytest.mark.parametrize("bad", [{"convrot": "yes"}, {"convrot": True, "convrot_groupsize": 48},
                                 {"convrot": True, "convrot_groupsize": 4 ** 8}])
def test_a_bad_convrot_entry_is_refused_typed(tmp_path, bad):
    from safetensors.torch import save_file
    q, s = cq.kitchen().quantize_int8_rowwise(torch.randn(32, 256).to(torch.bfloat16))
    p = str(tmp_path / "cr.safetensors")
    save_file({"l.weight": q, "l.weight_scale": s.reshape(-1, 1).float(),
               "l.comfy_quant": cq._json_tensor({"format": "int8_tensorwise", **bad})}, p)
    with pytest.raises(CorruptCheckpointError):
        formats.read(p)


def test_info_reads_through_the_loaders_open_step_with_its_memory_guard(tmp_path):
    """Prequant Info and the command line open a file with the loader's own steps (issue 34): a kind Info must read
    whole (a ComfyUI-native twin) is judged by the memory guard first; a file outside the folders it is given is
    refused by the allowlist."""
    from prequant_core import errors
    from prequant_core.load import memory_check
    path = str(tmp_path / "nv.safetensors")
    cq.write(path, _dense(), {"blocks.0.mlp.0": ("nvfp4", {})})
    assert report.info(path).read_mode == "full"
    with pytest.raises(errors.MemoryBudgetError):
        report.info(path, memory_guard=memory_check.Guard(available=lambda: 1))
    assert report.info(path, memory_guard=False).read_mode == "full"
    elsewhere = tmp_path / "models"
    elsewhere.mkdir()
    with pytest.raises(errors.PathNotAllowedError):
        report.info(path, model_dirs=[str(elsewhere)])
