"""Qwen-Image 2.1's text encoder as Unsloth hosts it: ``Qwen-Image-2.1-text_encoder-INT8-ConvRot.safetensors``, tag
``unsloth_prequant_text_encoder_int8_convrot_v1``, every decoder projection of the Qwen3-VL-8B ComfyUI's
``int8_tensorwise`` with ConvRot, written here by the restated Unsloth builder (tests/unsloth_te_builder.py) on a tiny
config of the real transformers class.

ComfyUI's class for this encoder arrives in 0.38.1, which no ComfyUI here has: the pack reads, judges and describes
the file (Info, ``info`` / ``verify``), names it on the Hub the way Unsloth's resolver does, and refuses to build it
(tests/text_encoders/test_text_encoder_comfy.py: the node, naming the version). Core tier: no ComfyUI."""
from __future__ import annotations

from prequant_core.context import LoadContext

import json
import os

import pytest
import torch
from safetensors import safe_open

import unsloth_te_builder as te_builder
from prequant_core import report
from prequant_core.errors import BuildError, CorruptCheckpointError, PrequantError, ValidationError
from prequant_core.load import opening, pipeline
from prequant_core.text_encoders import sources as encoder_sources
from prequant_core.load.metadata import Request

BASE = "Qwen/Qwen-Image-2.1"
NAME = "Qwen-Image-2.1-text_encoder-INT8-ConvRot.safetensors"
LAYER = "model.language_model.layers.1.mlp.down_proj"


def build(tmp_path, name=NAME, **kw) -> str:
    path = str(tmp_path / name)
    te_builder.build_int8_convrot_file(path, **kw)
    return path


def judge(path, **req):
    req.setdefault("component", "text_encoder")
    return opening.open_checkpoint(path, Request(**req), model_dirs=[os.path.dirname(path)])


def rewrite(src: str, dest: str, edit) -> str:
    """The file's tensors and header through ``edit(tensors, header)``, written back the way Unsloth's builder writes
    (a stranger's variant of a real file)."""
    with safe_open(src, framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        header = dict(f.metadata())
    edit(tensors, header)
    names = sorted(tensors)
    header["tensor_names"] = json.dumps(names)
    header = {k: v for k, v in header.items() if not k.startswith("model.") and not k.startswith("lm_head")}
    header.update({n: json.dumps({"_type": "Tensor"}) for n in names})
    te_builder.write_canonical_safetensors(dest, tensors, header)
    return dest


def test_unsloths_int8_convrot_encoder_is_judged_and_described(tmp_path, capsys):
    from prequant_core import cli
    path = build(tmp_path)
    for scheme in ("int8", "auto", None):
        opened = judge(path, family="qwen-image-2.1", base_model_id=BASE, scheme=scheme)
        assert opened.verdict.ok and opened.encoder.name == "Qwen3-VL" and not opened.encoder.hostable
    r = report.info(path)
    assert r.valid and r.read_mode == "header" and r.scheme == "int8"
    assert r.quantized_count == 14  # 7 projections x 2 layers, each its int8 codes
    assert "ComfyUI 0.38.1" in r.encoder and "qwen3vl_8b_int8_convrot.safetensors" in r.encoder
    rows = dict(map(tuple, r.to_dict()["rows"]))
    assert "int8 codes + per-row scales, ConvRot" in rows["Quantized tensors"]
    assert r.dense_equivalent_bytes > r.total_bytes  # the codes stand for bf16 weights
    # the whole file read: every layer's blob, codes and scale checked, the unquantized values too
    assert report.info(path, verify_fingerprint=True).valid
    assert cli.main(["verify", path, "--base", BASE, "--scheme", "int8"]) == 0
    assert cli.main(["verify", path, "--base", "Qwen/Qwen-Image", "--scheme", "int8"]) == 1
    assert "base model is 'Qwen/Qwen-Image-2.1', requested 'Qwen/Qwen-Image'" in capsys.readouterr().out
    assert cli.main(["info", path, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["format_tag"] == "unsloth_prequant_text_encoder_int8_convrot_v1"
    assert d["encoder"].startswith("Qwen3-VL (Qwen3VLForConditionalGeneration)")
    assert "qwen3vl_8b_int8_convrot.safetensors" in d["encoder"]  # the family's own ComfyUI file


def _drop_layer_quant(tensors, header):  # one projection left bf16, as a careless builder would
    tensors.pop(LAYER + ".comfy_quant")
    tensors.pop(LAYER + ".weight_scale")
    tensors[LAYER + ".weight"] = torch.zeros(tensors[LAYER + ".weight"].shape, dtype=torch.bfloat16)


def _blob(cfg):
    return torch.tensor(list(json.dumps(cfg).encode()), dtype=torch.uint8)


@pytest.mark.parametrize("edit,request_kw,reason", [
    (None, {"scheme": "fp8"}, "scheme is 'int8', requested 'fp8'"),
    (None, {"family": "z-image"}, "Z-Image's text_encoder is a Qwen3-4B, this file holds a Qwen3-VL"),
    (lambda t, h: t.update({"lm_head.weight": torch.zeros(256, 256, dtype=torch.bfloat16)}), {},
     "it holds an lm_head"),
    (_drop_layer_quant, {}, f"1 decoder projection(s) left unquantized, e.g. '{LAYER}'"),
    (lambda t, h: t.update({LAYER + ".comfy_quant": _blob({"format": "int8_tensorwise"})}), {},
     f"layer '{LAYER}' is 'int8_tensorwise' without ConvRot"),
    (lambda t, h: t.update({LAYER + ".comfy_quant": _blob({"format": "int8_tensorwise", "convrot": True,
                                                          "convrot_groupsize": 64})}), {},
     "layers use different ConvRot groups (64, 256)"),
    (lambda t, h: h.update({"unsloth_metadata": json.dumps({**json.loads(h["unsloth_metadata"]), "scheme": "fp8"})}),
     {}, "scheme 'fp8': a 'unsloth_prequant_text_encoder_int8_convrot_v1' file is int8"),
])
def test_what_does_not_match_is_refused_with_the_reason(tmp_path, edit, request_kw, reason):
    path = build(tmp_path)
    if edit is not None:
        path = rewrite(path, str(tmp_path / "edited.safetensors"), edit)
    with pytest.raises(ValidationError) as e:
        judge(path, **request_kw)
    assert any(reason in r for r in e.value.reasons), e.value.reasons


def _scale(value):
    def edit(t, h):
        s = t[LAYER + ".weight_scale"].clone()
        s[3, 0] = value
        t[LAYER + ".weight_scale"] = s
    return edit


@pytest.mark.parametrize("edit,found", [
    (_scale(float("nan")), "NaN"),
    (_scale(-0.5), "negative"),
    (lambda t, h: t.update({LAYER + ".weight_scale": t[LAYER + ".weight_scale"][:-1].clone()}), "scale of shape"),
    (lambda t, h: t.update({LAYER + ".comfy_quant": torch.tensor(list(b"{not json"), dtype=torch.uint8)}),
     "valid JSON"),
])
def test_corrupt_layers_are_errors_naming_the_layer(tmp_path, edit, found):
    path = rewrite(build(tmp_path), str(tmp_path / "bad.safetensors"), edit)
    with pytest.raises(PrequantError) as e:  # typed: corrupt bytes, or a layout this reader does not take
        judge(path)
    assert LAYER in str(e.value) and found in str(e.value), str(e.value)
    assert e.value.path == os.path.realpath(path)


def test_integer_tensors_pass_only_under_the_int8_encoders_own_tag(tmp_path):
    """The float rule for unquantized tensors is lifted for exactly the codes and blobs of an int8 ConvRot encoder:
    the same tensors under the fp8 encoder's tag are refused as they always were."""
    path = rewrite(build(tmp_path), str(tmp_path / "retagged.safetensors"),
                   lambda t, h: h.update({"unsloth_format": "unsloth_prequant_text_encoder_state_dict_v1"}))
    with pytest.raises(CorruptCheckpointError) as e:
        judge(path)
    assert "not a floating-point weight" in e.value.message


def test_hub_names_and_preset_follow_unsloths_resolver():
    assert encoder_sources.filenames("unsloth/Qwen-Image-2.1-FP8", "text_encoder") == (
        NAME, "Qwen-Image-2.1-text_encoder-FP8.safetensors", "Qwen-Image-2.1-text_encoder-FP8.pt")
    assert encoder_sources.filenames("unsloth/Qwen-Image-2.1-FP8", "text_encoder", "fp8")[0] == \
        "Qwen-Image-2.1-text_encoder-FP8.safetensors"
    assert encoder_sources.get_preset("Qwen-Image 2.1 / text_encoder").scheme == "int8"
    p = encoder_sources.plan(preset="Qwen-Image 2.1 / text_encoder")
    assert p.candidates[0].repo == "unsloth/Qwen-Image-2.1-FP8"
    assert p.candidates[0].scheme is None  # the int8 file, else the fp8 names: either scheme may arrive
    assert p.candidates[0].filenames[0] == NAME
    # the fp8 families keep their names
    assert encoder_sources.filenames("unsloth/Qwen-Image-FP8", "text_encoder")[0] == \
        "Qwen-Image-text_encoder-FP8.safetensors"


def test_the_builder_does_not_write_the_int8_form(tmp_path):
    from prequant_core.builder import text_encoder
    from prequant_core.builder.recipe import Target
    with pytest.raises(BuildError) as e:
        text_encoder.build_text_encoder(str(tmp_path / "dense.safetensors"), Target(str(tmp_path / "out.safetensors")),
                                        family="qwen-image-2.1")
    assert NAME in e.value.fix and not os.path.exists(tmp_path / "out.safetensors")


def test_the_family_download_asks_for_the_int8_file_first(hub, tmp_path):
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    hub.commit("unsloth/Qwen-Image-2.1-FP8", {NAME: build(src_dir)})
    dest = tmp_path / "prequant"
    dest.mkdir()
    routed = pipeline.run(encoder_sources.plan(family="qwen-image-2.1"), Request(scheme="auto", family="qwen-image-2.1", component="text_encoder"), LoadContext.of(download_dir=str(dest), model_dirs=[str(dest)]))
    assert routed.located.fetched.filename == NAME and routed.route.opened.encoder.name == "Qwen3-VL"
    assert [r["filename"] for r in hub.requests("HEAD")][0] == NAME
