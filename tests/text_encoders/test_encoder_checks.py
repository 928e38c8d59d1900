"""The text-encoder verdict (``prequant_core/text_encoders/checks.py`` ``validate``, ``int8_convrot_reasons``) on the
file variants no other core test writes: a foreign format tag with an unknown scheme, a metadata field that is not
a string, another cast backend, a component no encoder has, no ``te_class``, torchao tensors, float8 of the other
kind or none at all in a layerwise-cast file; and in an int8 ConvRot file: no quantized layer, an orphan scale, a
quant record without a weight, a declared group the layers do not use, float8 tensors, a header-only read whose
metadata names no format.

Each file is written from a real tiny encoder by tests/unsloth_te_builder.py (Unsloth's builder restated) and then
changed the way a stranger's builder would; each is read from disk by ``formats.read`` (or Info's header read).
Core tier: no ComfyUI.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

import unsloth_te_builder as te_builder
from prequant_core import formats, report, schemes
from prequant_core.text_encoders import checks as encoder_checks
from prequant_core.load.metadata import Request

Z_BASE = "Tongyi-MAI/Z-Image-Turbo"
Q21_BASE = "Qwen/Qwen-Image-2.1"
LAYER = "model.language_model.layers.1.mlp.down_proj"
TE_FORMAT = encoder_checks.FORMAT_V1


@pytest.fixture(scope="module")
def qwen3():
    """A tiny Qwen3-4B-class encoder cast as Unsloth's builder casts it, and its metadata."""
    sd = te_builder.state_dict(te_builder.cast_layerwise(te_builder.encoder("Qwen3ForCausalLM")))
    return sd, te_builder.metadata(te_class="Qwen3ForCausalLM", base_model_id=Z_BASE, family="z-image")


def _pt(tmp_path, sd, meta, tag=TE_FORMAT, name="te.pt"):
    path = str(tmp_path / name)
    obj = {"metadata": meta, "state_dict": sd}
    if tag is not None:
        obj["format"] = tag
    torch.save(obj, path)
    return formats.read(path)


def _verdict(ck, **req):
    req.setdefault("component", "text_encoder")
    return encoder_checks.validate(ck, Request(**req))


def test_control_the_cast_encoder_is_valid(tmp_path, qwen3):
    v = _verdict(_pt(tmp_path, *qwen3), base_model_id=Z_BASE, family="z-image")
    assert v.ok, v.reasons


def test_an_unknown_tag_and_scheme_are_both_named(tmp_path, qwen3):
    sd, meta = qwen3
    v = _verdict(_pt(tmp_path, sd, {**meta, "scheme": "int4"}, tag="someone_elses_text_encoder_v9"))
    assert not v.ok
    assert "format tag 'someone_elses_text_encoder_v9' is not a pre-cast text encoder's" in v.reasons[0]
    assert "scheme 'int4': a pre-cast text encoder is fp8 (layerwise storage cast) or int8 (ConvRot)" in v.reasons


def test_a_metadata_field_that_is_not_a_string_stops_the_verdict_there(tmp_path, qwen3):
    sd, meta = qwen3
    v = _verdict(_pt(tmp_path, sd, {**meta, "te_class": ["Qwen3ForCausalLM"], "family": 7}))
    assert not v.ok
    assert v.reasons == ["metadata 'te_class' is list \"['Qwen3ForCausalLM']\", expected a string",
                         "metadata 'family' is int '7', expected a string"]


@pytest.mark.parametrize("edit,reason", [
    ({"cast_backend": "bitsandbytes"},
     "cast_backend 'bitsandbytes': only 'diffusers_layerwise' storage casts are known"),
    ({"component": "vae"}, "component 'vae' is not a text encoder's (text_encoder, text_encoder_2, text_encoder_3, "
                           "text_encoder_4)"),
    ({"te_class": None}, "the file records no te_class (the transformers class of the encoder)"),
])
def test_what_the_metadata_records_is_judged(tmp_path, qwen3, edit, reason):
    sd, meta = qwen3
    meta = {k: v for k, v in {**meta, **edit}.items() if v is not None}
    v = _verdict(_pt(tmp_path, sd, meta))
    assert not v.ok and reason in v.reasons, v.reasons


def test_the_stored_dtypes_must_be_a_layerwise_float8_cast(tmp_path, qwen3):
    sd, meta = qwen3
    key = next(k for k, v in sd.items() if v.dtype == torch.float8_e4m3fn and k.endswith("up_proj.weight"))
    e5m2 = {**sd, key: sd[key].float().to(torch.float8_e5m2)}
    v = _verdict(_pt(tmp_path, e5m2, meta, name="e5m2.pt"))
    assert v.reasons == ["weights stored as torch.float8_e5m2: the layerwise cast stores float8_e4m3fn"]
    dense = {k: (v.to(torch.bfloat16) if v.dtype == torch.float8_e4m3fn else v) for k, v in sd.items()}
    v = _verdict(_pt(tmp_path, dense, meta, name="dense.pt"))
    assert v.reasons == ["no float8 weight: not a pre-cast (layerwise fp8) encoder"]
    quantized = {**sd, key: schemes.quantize_weight(sd[key].to(torch.bfloat16), "int8")}
    v = _verdict(_pt(tmp_path, quantized, meta, name="torchao.pt"))
    assert f"1 torchao-quantized tensors (e.g. '{key}'): a pre-cast encoder holds plain tensors only" in v.reasons


# ---- the int8 ConvRot form -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def int8_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("te_int8") / "Qwen-Image-2.1-text_encoder-INT8-ConvRot.safetensors")
    te_builder.build_int8_convrot_file(path)
    return path


def _rewrite(src: str, dest: str, edit) -> str:
    """The file's tensors and header through ``edit(tensors, header)``, written back as Unsloth's builder writes."""
    with safe_open(src, framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        header = dict(f.metadata())
    edit(tensors, header)
    if any(v.dtype == torch.float8_e4m3fn for v in tensors.values()):  # the canonical writer has no F8 entry
        from safetensors.torch import save_file
        header["tensor_names"] = json.dumps(sorted(tensors))
        header = {k: v for k, v in header.items() if not k.startswith(("model.", "lm_head"))}
        header.update({n: json.dumps({"_type": "Tensor"}) for n in tensors})
        save_file(tensors, dest, metadata=header)
        return dest
    names = sorted(tensors)  # the header's own tensor list and entries follow the tensors
    header["tensor_names"] = json.dumps(names)
    header = {k: v for k, v in header.items() if not k.startswith(("model.", "lm_head"))}
    header.update({n: json.dumps({"_type": "Tensor"}) for n in names})
    te_builder.write_canonical_safetensors(dest, tensors, header)
    return dest


def _meta_edit(**changes):
    def edit(t, h):
        m = json.loads(h["unsloth_metadata"])
        for k, v in changes.items():
            if isinstance(v, dict) and isinstance(m.get(k), dict):
                m[k] = {**m[k], **v}
            else:
                m[k] = v
        m["quant"] = {k: v for k, v in m["quant"].items() if v is not None}
        h["unsloth_metadata"] = json.dumps(m)
    return edit


def _int8_reasons(int8_file, tmp_path, edit):
    ck = formats.read(_rewrite(int8_file, str(tmp_path / "edited.safetensors"), edit))
    return _verdict(ck, base_model_id=Q21_BASE).reasons


def test_control_the_int8_convrot_encoder_is_valid(int8_file):
    assert _verdict(formats.read(int8_file), base_model_id=Q21_BASE, family="qwen-image-2.1").ok


def _drop_all_quant(t, h):
    for k in [k for k in t if k.endswith((".comfy_quant", ".weight_scale"))]:
        del t[k]
    for k in [k for k in t if k.endswith("_proj.weight") and t[k].dtype == torch.int8]:
        t[k] = torch.zeros(t[k].shape, dtype=torch.bfloat16)


def _orphan_scale(t, h):
    t["model.language_model.norm.weight_scale"] = torch.ones(1, 1)


def _no_weight(t, h):
    t["model.language_model.layers.0.mlp.extra_proj.comfy_quant"] = t[LAYER + ".comfy_quant"].clone()


def _fp8_tensor(t, h):
    t["model.language_model.norm.weight"] = t["model.language_model.norm.weight"].to(torch.float8_e4m3fn)


@pytest.mark.parametrize("edit,reason", [
    (_drop_all_quant, "no int8 ConvRot layer (no '.comfy_quant' entry): not an int8 ConvRot text encoder"),
    (_orphan_scale, "'model.language_model.norm.weight_scale' belongs to no quantized layer (no .comfy_quant entry)"),
    (_no_weight, "layer 'model.language_model.layers.0.mlp.extra_proj' has a .comfy_quant entry but no weight"),
    (_meta_edit(quant={"convrot_groupsize": 64}), "metadata quant.convrot_groupsize is 64, the layers use 256"),
    (_fp8_tensor, "float8 tensors (torch.float8_e4m3fn) in an int8 ConvRot encoder"),
])
def test_an_int8_convrot_file_that_breaks_its_form_is_refused_with_the_reason(int8_file, tmp_path, edit, reason):
    reasons = _int8_reasons(int8_file, tmp_path, edit)
    assert reason in reasons, reasons


def test_a_header_only_read_judges_the_layers_by_the_metadatas_quant_record(int8_file, tmp_path):
    assert report.info(int8_file).valid  # control: Info reads the header only, the layers on the meta device
    path = _rewrite(int8_file, str(tmp_path / "noformat.safetensors"), _meta_edit(quant={"format": None}))
    r = report.info(path)
    assert not r.valid
    assert "the metadata's quant record names no format" in " ".join(r.reasons), r.reasons
