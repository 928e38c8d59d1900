"""MXFP8 weights (``prequant_core/schemes/mxfp8.py``) where no other core test reaches them: torchao's own
safetensors JSON for an ``MXTensor`` decoded by the strict reader (``MXFP8Codec.from_json``, ``decode_act``), the
refusals of that JSON, the structure checks of stranger's pickled tensors (``structure_problem``, ``parts``), and
ComfyUI's ``mxfp8`` layout both ways (``comfy_read``, ``comfy_from_weight``, ``comfy_from_dense``).

Every file is real: torchao's ``flatten_tensor_state_dict`` / this pack's safetensors writer, or ``torch.save``
(tests/hostile_corpus.py), read back through ``formats.read``; every weight is torchao's own ``MXTensor`` quantized
on the CPU. Core tier: no ComfyUI.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torchao.prototype.mx_formats.mx_tensor import MXTensor
from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict

from hostile_corpus import pt_container, st_container, tiny_metadata, tiny_tensors
from prequant_core import formats, schemes
from prequant_core.errors import CorruptCheckpointError
from prequant_core.formats import comfy_layout, torchao_json
from prequant_core.formats.validate_tensors import check_quantized
from prequant_core.schemes import qtensor
from prequant_core.schemes.native_layout import Stored
from prequant_core.schemes.json_values import DecodeError

KEY = "layers.0.attention.to_q.weight"


def _weight(rows=64, cols=128, seed=1):
    w = (torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 3).to(torch.bfloat16)
    return w, schemes.quantize_weight(w, "mxfp8")


def _bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def _torchao_json(t):
    flat, header = flatten_tensor_state_dict({"layer.weight": t})
    return json.loads(header["layer.weight"]), {"qdata": flat["layer._weight_qdata"],
                                                "scale": flat["layer._weight_scale"]}


def _decode(entry: dict, parts: dict):
    return torchao_json.decode_weight(json.dumps(entry), parts)


def test_torchaos_own_json_of_an_mx_weight_decodes_bit_for_bit():
    _, t = _weight()
    entry, parts = _torchao_json(t)
    assert entry["_type"] == "MXTensor" and entry["_data"]["act_quant_kwargs"]["_type"] == "QuantizeTensorToMXKwargs"
    got = _decode(entry, parts)
    assert type(got) is MXTensor and got.is_swizzled_scales and got.block_size == 32
    assert got.act_quant_kwargs == t.act_quant_kwargs and got.kernel_preference == t.kernel_preference
    for dt in (torch.bfloat16, torch.float32):
        assert torch.equal(_bits(got.dequantize(dt)), _bits(t.dequantize(dt)))


def test_e8m0_exponents_written_as_bytes_and_a_missing_kernel_preference_read_as_torchao_defaults():
    from torchao.quantization.quantize_.common import KernelPreference
    _, t = _weight()
    entry, parts = _torchao_json(t)
    del entry["_data"]["kernel_preference"]
    del entry["_data"]["act_quant_kwargs"]  # weight settings only: torchao's default activation handling
    parts["scale"] = parts["scale"].view(torch.uint8)  # a writer without the float8_e8m0fnu dtype
    got = _decode(entry, parts)
    assert got.scale.dtype == torch.float8_e8m0fnu and got.kernel_preference == KernelPreference.AUTO
    assert got.act_quant_kwargs is None
    check_quantized("layer.weight", got, "/f.safetensors")  # the reader's field and value checks pass it
    assert torch.equal(got.dequantize(torch.float32), t.dequantize(torch.float32))


@pytest.mark.parametrize("edit,message", [
    (lambda d, p: d.update(block_size=16), "MX block_size must be 32, found 16"),
    (lambda d, p: d["act_quant_kwargs"]["_data"].update(block_size=16), "MX activation block size must be 32"),
    (lambda d, p: d.update(elem_dtype={"_type": "torch.dtype", "_data": "float8_e5m2"}),
     "MX elements torch.float8_e5m2 / data torch.float8_e4m3fn: only mxfp8 is read"),
    (lambda d, p: p.update(scale=p["scale"].float()), "MX scales torch.float32, expected float8_e8m0fnu"),
])
def test_json_that_is_not_mxfp8_is_refused_naming_the_field(edit, message):
    _, t = _weight()
    entry, parts = _torchao_json(t)
    edit(entry["_data"], parts)
    with pytest.raises(DecodeError, match=message.replace("(", r"\(").replace(".", r"\.")):
        _decode(entry, parts)


def test_a_safetensors_file_of_mx_weights_reads_and_its_bad_block_size_is_corrupt(tmp_path):
    t = tiny_tensors("mxfp8")
    md = tiny_metadata(t, "mxfp8")
    ok = tmp_path / "mx.safetensors"
    ok.write_bytes(st_container(t, md))
    ck = formats.read(str(ok))
    for k, v in t.items():
        got = ck.tensors[k]
        if isinstance(v, MXTensor):
            assert type(got) is MXTensor and torch.equal(got.dequantize(torch.float32), v.dequantize(torch.float32))
        else:
            assert torch.equal(got, v)
    # the same file with one weight's JSON saying blocks of 16
    flat, header = flatten_tensor_state_dict({k: v for k, v in t.items() if "." in k})
    entry = json.loads(header[KEY])
    entry["_data"]["block_size"] = 16
    header[KEY] = json.dumps(entry)
    header.update(unsloth_format="unsloth_prequant_transformer_state_dict_v1", unsloth_metadata=json.dumps(md),
                  unsloth_root_tensors="[]")
    bad = tmp_path / "mx-bs16.safetensors"
    save_file({k: v.contiguous() for k, v in flat.items()}, str(bad), metadata=header)
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(str(bad))
    assert f"Quantized tensor '{KEY}' cannot be decoded: MX block_size must be 32" in str(e.value)


def _mx_like(t, **attrs):
    """A copy of torchao's MXTensor with attributes replaced the way a pickle's state replaces them (torch.load
    restores a subclass's attributes without running its constructor's asserts)."""
    out = MXTensor(t.qdata, t.scale, t.elem_dtype, t.block_size, t.orig_dtype, t.kernel_preference,
                   t.act_quant_kwargs, t.is_swizzled_scales)
    for k, v in attrs.items():
        setattr(out, k, v)
    return out


@pytest.mark.parametrize("attrs,found", [
    (lambda t: {"qdata": t.qdata.view(torch.float8_e5m2)},
     "MX elements torch.float8_e4m3fn / data torch.float8_e5m2: only mxfp8 (float8 elements) is supported"),
    (lambda t: {"scale": t.scale.view(torch.uint8)}, "MX scales torch.uint8, expected float8_e8m0fnu"),
])
def test_a_pickled_mx_weight_whose_parts_disagree_is_corrupt(tmp_path, attrs, found):
    t = tiny_tensors("mxfp8")
    bad = dict(t)
    bad[KEY] = _mx_like(t[KEY], **attrs(t[KEY]))
    path = tmp_path / "mx-bad.pt"
    path.write_bytes(pt_container(bad, tiny_metadata(t, "mxfp8")))
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(str(path))
    assert f"Quantized tensor '{KEY}' (mxfp8) is inconsistent" in str(e.value) and found in str(e.value)
    # control: the untouched tensors in the same container read
    good = tmp_path / "mx-good.pt"
    good.write_bytes(pt_container(t, tiny_metadata(t, "mxfp8")))
    assert type(formats.read(str(good)).tensors[KEY]) is MXTensor


def test_parts_refuse_mx_weights_this_codec_does_not_store():
    w, t = _weight()
    fp4 = MXTensor.to_mx(w, torch.float4_e2m1fn_x2, 32)
    with pytest.raises(ValueError, match="are not supported \\(mxfp8 only\\)"):
        qtensor.parts(fp4)
    cols_major = _mx_like(t, qdata=t.qdata.t().contiguous().t())
    assert not cols_major.qdata.is_contiguous()
    with pytest.raises(ValueError, match="only row-major MX weights are supported"):
        qtensor.parts(cols_major)
    with pytest.raises(ValueError, match="MX weight width 128 is not a multiple of its block size 48"):
        qtensor.parts(_mx_like(t, block_size=48))
    ts, spec = qtensor.parts(t)  # control
    assert ts[0].dtype == torch.uint8 and tuple(ts[1].shape) == (64, 4)


def test_comfyuis_mxfp8_layout_round_trips_and_matches_torchaos_quantizer():
    w, t = _weight(rows=144, cols=96)  # 144 rows: ComfyUI's exponents padded to 256 rows of 128x4 tiles
    parts = comfy_layout.from_weight("mxfp8", t)
    assert set(parts) == {"", "_scale"} and parts[""].dtype == torch.float8_e4m3fn
    assert parts["_scale"].dtype == torch.uint8 and tuple(parts["_scale"].shape) == (256, 4)
    # ComfyUI's quantizer (torchao's math) from the dense weight gives the same bytes
    dense = comfy_layout.from_dense("mxfp8", w)
    assert torch.equal(dense[""].view(torch.uint8), parts[""].view(torch.uint8))
    assert torch.equal(dense["_scale"], parts["_scale"])
    fmt = comfy_layout.layout("mxfp8")
    back, _, _ = comfy_layout.to_weight(fmt, Stored("l", "/f.safetensors", {"format": "mxfp8"}, parts[""],
                                                    {"weight_scale": parts["_scale"]}))
    assert torch.equal(back.dequantize(torch.float32), t.dequantize(torch.float32))
    # a weight whose scales are row-major (rows fused from weights of different scales) has no ComfyUI bytes as is
    with pytest.raises(ValueError, match="do not fit the layout as they are"):
        comfy_layout.from_weight("mxfp8", _mx_like(t, is_swizzled_scales=False))
    with pytest.raises(ValueError, match="mxfp4"):  # a ComfyUI format no registered scheme holds
        comfy_layout.layout("mxfp4")


@pytest.mark.parametrize("weight,scale,found", [
    (lambda q: q.view(torch.uint8), lambda s: s, "an mxfp8 layer needs e4m3 codes"),
    (lambda q: q, lambda s: s.float(), "an mxfp8 layer needs e4m3 codes"),
    (lambda q: q, lambda s: s[:-1], "its block exponents do not fit its codes"),
])
def test_comfyuis_mxfp8_layer_with_other_bytes_is_corrupt_naming_the_layer(weight, scale, found):
    _, t = _weight()
    parts = comfy_layout.from_weight("mxfp8", t)
    with pytest.raises(CorruptCheckpointError) as e:
        comfy_layout.to_weight(comfy_layout.layout("mxfp8"),
                               Stored("blocks.0.attn.qkv", "/f.safetensors", {"format": "mxfp8"}, weight(parts[""]),
                                      {"weight_scale": scale(parts["_scale"])}))
    assert "ComfyUI-native layer 'blocks.0.attn.qkv'" in str(e.value) and found in str(e.value)
