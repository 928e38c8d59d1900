"""ComfyUI's own quantized files (issue: "ComfyUI's own quantized files, both ways"), read by this pack: files written by
a restatement of ComfyUI's writer with comfy-kitchen's own quantizer (tests/comfy_quantizer.py, never this pack's
writer), for every format whose math the pack runs: float8_e4m3fn, float8_e5m2, nvfp4, mxfp8, int8_tensorwise (per
tensor, per row, ConvRot with per-layer groups), in both markings (per-layer ``.comfy_quant`` and the older
``_quantization_metadata`` header). Each layer's weight, as the pack holds and computes it, equals ComfyUI's own
dequantization of the same bytes (comfy-kitchen's eager reference functions). Core tier: no ComfyUI needed.
The ComfyUI side (the node on 0.3.75 / 0.12.1, and files this pack writes loading in stock ComfyUI):
tests/formats/test_comfy_native_comfy.py.
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


def test_an_nvfp4_layer_with_an_input_smoothing_factor_is_refused_by_name(tmp_path):
    """ComfyUI 0.33's nvfp4 layers may carry ``pre_quant_scale`` (the input is multiplied by it before the matmul).
    Before, such a file reached the model with a stray tensor and was refused as not matching it: the file accused."""
    from safetensors.torch import load_file, save_file
    p = str(tmp_path / "nvfp4.safetensors")
    cq.write(p, _dense(), {"blocks.0.mlp.0": ("nvfp4", {})})
    sd = load_file(p)
    sd["blocks.0.mlp.0.pre_quant_scale"] = torch.ones(256, dtype=torch.bfloat16)
    save_file(sd, p)
    with pytest.raises(UnsupportedFormatError) as e:
        formats.read(p)
    assert "pre_quant_scale" in str(e.value) and "Load Diffusion Model" in str(e.value), str(e.value)


DROPPING = [("float8_e4m3fn", {}), ("float8_e5m2", {}), ("mxfp8", {}), ("int8_tensorwise", {"per_row": True})]


@pytest.mark.parametrize("fmt,opts", DROPPING, ids=[f for f, _ in DROPPING])
def test_a_pre_quant_scale_on_a_format_comfyui_does_not_apply_it_to_is_ignored_as_comfyui_ignores_it(tmp_path, fmt,
                                                                                                      opts):
    """Issue 58 #8: ComfyUI 0.33 loads ``pre_quant_scale`` for nvfp4 layers only (QUANT_ALGOS' parameters); on an
    fp8 / int8 / mxfp8 layer its loader drops it and the layer computes without it. Such a layer was left holding a
    stray tensor, and the node refused the file as one for another model size. It reads as ComfyUI reads it: the
    weights as without the entry, the entry noted; the command line (a fresh process) says so and judges it loadable."""
    import subprocess
    import sys
    from safetensors.torch import load_file, save_file
    dense = _dense()
    plain, smoothed = str(tmp_path / "plain.safetensors"), str(tmp_path / "smoothed.safetensors")
    cq.write(plain, dense, {"blocks.0.mlp.0": (fmt, opts), "blocks.0.mlp.2": (fmt, opts)})
    sd = load_file(plain)
    sd["blocks.0.mlp.0.pre_quant_scale"] = torch.full((256,), 2.0, dtype=torch.bfloat16)
    sd["blocks.0.mlp.2.pre_quant_scale"] = torch.full((512,), 0.5, dtype=torch.bfloat16)
    save_file(sd, smoothed)
    want, got = formats.read(plain), formats.read(smoothed)
    assert set(got.tensors) == set(want.tensors) and not any("pre_quant_scale" in k for k in got.tensors)
    for k in ("blocks.0.mlp.0.weight", "blocks.0.mlp.2.weight"):
        assert torch.equal(_pack_dense(got.tensors[k]), _pack_dense(want.tensors[k]))
    assert got.metadata["comfy_dropped_side"] == {"pre_quant_scale": 2}
    assert any("2 pre_quant_scale entries" in n and "ComfyUI's own loader ignores" in n
               for n in metadata.validate(got, metadata.Request()).notes)
    if fmt != "float8_e4m3fn":
        return  # one fresh process is enough: the reader is the same for every format
    from conftest import ROOT as root
    p = subprocess.run([sys.executable, "-m", "prequant_core", "info", smoothed, "--json"], capture_output=True,
                       text=True, cwd=root, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    import json
    r = json.loads(p.stdout)
    assert r["valid"] is True and any("pre_quant_scale" in n for n in r["notes"]), r


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
        report.info(path, memory=memory_check.Guard(available=lambda: 1))
    assert report.info(path, memory=None).read_mode == "full"
    elsewhere = tmp_path / "models"
    elsewhere.mkdir()
    with pytest.raises(errors.PathNotAllowedError):
        report.info(path, model_dirs=[str(elsewhere)])


def _poisoned(tmp_path, fmt, opts, key_suffix, poison, style="comfy_quant"):
    """A native file written by ComfyUI's writer (restated), then one side tensor of one layer replaced: what a
    stranger's file may hold."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    path = str(tmp_path / f"poison-{fmt}.safetensors")
    cq.write(path, _dense(), {"blocks.0.attn.qkv": (fmt, opts), "blocks.0.mlp.0": (fmt, opts)}, style=style)
    with safe_open(path, "pt") as f:
        sd, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    key = "blocks.0.mlp.0.weight" + key_suffix
    sd[key] = poison(sd[key])
    save_file(sd, path, metadata=meta)
    return path


def _bytes_set(v):
    def f(t):
        t = t.clone()
        t.view(torch.uint8).reshape(-1)[0] = v
        return t
    return f


def _code_at(row, v):
    def f(t):
        t = t.clone()
        t.view(torch.uint8)[row, 7] = v
        return t
    return f


NAN = float("nan")
# (format, options, the side tensor, how it is poisoned, what the refusal says)
POISONS = [
    ("int8_tensorwise", {}, "_scale", lambda t: torch.full_like(t, NAN), "not finite"),
    ("int8_tensorwise", {"per_row": True}, "_scale", lambda t: t.index_fill(0, torch.tensor([3]), float("inf")),
     "not finite"),
    ("int8_tensorwise", {"per_row": True}, "_scale", lambda t: -t, "negative"),
    ("int8_tensorwise", {}, "_scale", lambda t: torch.full_like(t, 1e38), "above"),
    ("float8_e4m3fn", {}, "_scale", lambda t: torch.full_like(t, NAN), "not finite"),
    ("float8_e5m2", {}, "_scale", lambda t: -t, "negative"),
    ("nvfp4", {}, "_scale_2", lambda t: torch.full_like(t, NAN), "not finite"),
    ("nvfp4", {}, "_scale_2", lambda t: torch.zeros_like(t), "zero, though the codes are not"),
    ("nvfp4", {}, "_scale_2", lambda t: torch.full_like(t, 1e36), "infinite"),
    ("nvfp4", {}, "_scale_2", lambda t: torch.ones((), dtype=torch.int64) * 7, "one float weight_scale_2"),
    ("nvfp4", {}, "_scale", _bytes_set(0x7F), "NaN"),
    ("nvfp4", {}, "_scale", _bytes_set(0xB8), "negative"),
    ("mxfp8", {}, "_scale", _bytes_set(0xFF), "NaN"),
    ("mxfp8", {}, "_scale", _bytes_set(0xFE), "infinite"),
    ("mxfp8", {}, "_scale", _bytes_set(250), "infinite"),
    # round 5: NaN codes under a finite scale sampled a NaN latent with no error
    ("float8_e4m3fn", {}, "", _code_at(5, 0x7F), "Row 5"),
    ("float8_e4m3fn", {}, "", _code_at(9, 0xFF), "Row 9"),
    ("float8_e5m2", {}, "", _code_at(5, 0x7C), "Row 5"),
    ("float8_e5m2", {}, "", _code_at(6, 0xFE), "Row 6"),
    ("mxfp8", {}, "", _code_at(5, 0xFF), "Row 5"),
]


@pytest.mark.parametrize("fmt,opts,suffix,poison,says", POISONS,
                         ids=[f"{p[0]}{'-row' if p[1] else ''}-{p[2]}-{i}" for i, p in enumerate(POISONS)])
def test_native_scales_that_would_make_nan_or_flip_signs_are_refused(tmp_path, fmt, opts, suffix, poison, says):
    # issue 39 #1: the native reader passes the boundary every reader's quantized tensors pass
    path = _poisoned(tmp_path, fmt, opts, suffix, poison)
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(path)
    assert "blocks.0.mlp.0" in str(e.value) and says in str(e.value) and path in str(e.value), str(e.value)
    with pytest.raises(CorruptCheckpointError):
        report.info(path)


def test_a_nan_scale_in_an_older_scaled_fp8_file_is_refused_by_the_command_line(tmp_path):
    import subprocess
    import sys
    from safetensors.torch import save_file
    dense = _dense()
    path = str(tmp_path / "scaled-fp8.safetensors")
    w = dense["blocks.0.mlp.0.weight"]
    sd = {k: v for k, v in dense.items() if k != "blocks.0.mlp.0.weight"}
    sd["blocks.0.mlp.0.weight"] = (w.to(torch.float32) / 0.01).to(torch.float8_e4m3fn)
    sd["blocks.0.mlp.0.scale_weight"] = torch.tensor(NAN)
    sd["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    save_file(sd, path)
    from conftest import ROOT as root
    p = subprocess.run([sys.executable, "-m", "prequant_core", "info", path], capture_output=True, text=True,
                       cwd=root, timeout=300)
    assert p.returncode == 2 and "not finite" in p.stderr and "blocks.0.mlp.0.weight" in p.stderr, p.stderr[-2000:]


def test_e5m2_codes_held_as_bytes_decode_and_requantize_as_e5m2():
    """A device without a float8 dtype (and the LoRA path) holds codes as bytes: an e5m2 layer's bytes are read as
    e5m2, and a LoRA's requantization keeps the layer e5m2 (round 5: decoded as e4m3, wrong weights)."""
    from torchao.quantization import PerRow
    from torchao.quantization.quantize_.workflows import Float8Tensor
    from prequant_core.schemes import registry
    w = _dense()["blocks.0.mlp.0.weight"]
    codec = registry.codec("float8")
    (q, s), spec = codec.parts(Float8Tensor.from_hp(w, float8_dtype=torch.float8_e5m2, granularity=PerRow()))
    want = codec.dequantize((q, s), spec, torch.float32)
    assert torch.equal(codec.dequantize((q.view(torch.uint8), s), spec, torch.float32), want)
    q2, s2 = codec.quantize(want.to(torch.bfloat16), spec)
    assert q2.dtype == torch.float8_e5m2
    assert torch.equal(codec.dequantize((q2, s2), spec, torch.float32), want)
