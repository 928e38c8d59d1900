"""prequant_core/families/encoders.py's judge and key maps, and text_encoders/sources.py's planner, on what the other
tests do not give them: a layer missing below the last, a released-size file whose first layer lacks a width key or
whose attention rows are another size's, an encoder with no ComfyUI map asked for one, Qwen2.5-VL's two namings (the
transformers >= 4.52 nesting and ComfyUI's) mapped both ways; an unknown preset or component, a preset overruled by a
file or repo, a family hosting no encoder. Shapes are meta tensors (shape only, no memory). Core tier: no ComfyUI."""
from __future__ import annotations

import pytest
import torch

from prequant_core.errors import HubError
from prequant_core.families import encoders
from prequant_core.text_encoders import sources as te_sources

QWEN3 = next(k for k in encoders.KINDS if k.name == "Qwen3-4B")
QWEN25VL = next(k for k in encoders.KINDS if k.name == "Qwen2.5-VL-7B")
QWEN3VL = next(k for k in encoders.KINDS if k.name == "Qwen3-VL")


def meta(*shape):
    return torch.empty(*shape, device="meta")


def qwen3_layer(i, hidden=2560, q=4096, kv=1024, skip=()):
    shapes = {"input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,),
              "self_attn.q_proj.weight": (q, hidden), "self_attn.k_proj.weight": (kv, hidden),
              "self_attn.v_proj.weight": (kv, hidden), "self_attn.o_proj.weight": (hidden, q),
              "mlp.gate_proj.weight": (16, hidden), "mlp.up_proj.weight": (16, hidden),
              "mlp.down_proj.weight": (hidden, 16), "self_attn.q_norm.weight": (128,),
              "self_attn.k_norm.weight": (128,)}
    return {f"model.layers.{i}.{k}": meta(*s) for k, s in shapes.items() if k not in skip}


def qwen3(layers=(0, 1), vocab=151936, **kw):
    t = {"model.embed_tokens.weight": meta(vocab, kw.get("hidden", 2560)), "model.norm.weight": meta(2560)}
    for i in layers:
        t.update(qwen3_layer(i, **kw))
    return t


def test_a_full_size_qwen3_4b_is_one():
    assert QWEN3.mismatches(qwen3()) == [] and encoders.identify(qwen3()) is QWEN3


def test_a_layer_missing_below_the_last_is_named():
    assert QWEN3.mismatches(qwen3(layers=(0, 1, 3, 4))) == ["no layer 'model.layers.2.' (its layers run to "
                                                            "'model.layers.4.')"]


def test_a_released_size_file_with_another_sizes_attention_rows():
    assert QWEN3.mismatches(qwen3(q=2048, kv=512)) == [
        "attention rows 2048 / 512 ('model.layers.0.self_attn.q_proj.weight' / 'self_attn.k_proj.weight'), a "
        "Qwen3-4B's are 4096 / 1024"]


def test_a_first_layer_without_a_width_key_is_named_once_not_sized():
    t = qwen3(layers=(1,))
    t.update(qwen3_layer(0, skip=("self_attn.q_proj.weight",)))
    assert QWEN3.mismatches(t) == ["no 'model.layers.0.self_attn.q_proj.weight'"]
    # a scaled-down stand-in (a vocabulary no released tokenizer has) is judged on its structure alone
    assert QWEN3.mismatches(qwen3(q=2048, kv=512, vocab=256)) == []


def test_an_encoder_without_a_comfyui_map_is_not_hostable():
    assert not QWEN3VL.hostable
    with pytest.raises(ValueError, match="no ComfyUI key map for the Qwen3-VL"):
        QWEN3VL.to_comfy({"model.language_model.layers.0.input_layernorm.weight": meta(4)})


def test_qwen25_vl_names_map_to_comfyui_and_back():
    t = {"model.language_model.layers.0.self_attn.k_proj.bias": meta(512),
         "model.language_model.embed_tokens.weight": meta(256, 64),
         "model.visual.blocks.0.attn.qkv.weight": meta(48, 16),
         "model.visual.merger.mlp.0.weight": meta(8, 8), "lm_head.weight": meta(256, 64)}
    out = QWEN25VL.to_comfy(t)
    assert sorted(out) == ["model.embed_tokens.weight", "model.layers.0.self_attn.k_proj.bias",
                           "visual.blocks.0.attn.qkv.weight", "visual.merger.mlp.0.weight"]
    assert all(out[k] is t[src] for k, src in [("visual.blocks.0.attn.qkv.weight", "model.visual.blocks.0.attn.qkv.weight"),
                                               ("model.layers.0.self_attn.k_proj.bias",
                                                "model.language_model.layers.0.self_attn.k_proj.bias")])
    # ComfyUI's names -> the transformers class's (the builder's direction): every kept name comes back
    assert {QWEN25VL.from_comfy(k) for k in out} == set(t) - {"lm_head.weight"}
    # the older transformers naming passes through to ComfyUI unchanged, and names the class already nests stay
    assert QWEN25VL.comfy_key("model.layers.3.mlp.up_proj.weight") == "model.layers.3.mlp.up_proj.weight"
    assert QWEN25VL.from_comfy("model.language_model.norm.weight") == "model.language_model.norm.weight"
    assert QWEN25VL.from_comfy("lm_head.weight") == "lm_head.weight"


def test_an_unknown_preset_or_component_is_refused():
    with pytest.raises(HubError) as ei:
        te_sources.plan(preset="Nope / text_encoder")
    assert "Nope / text_encoder" in str(ei.value) and "Z-Image / text_encoder" in ei.value.expected
    with pytest.raises(HubError) as ei:
        te_sources.plan(hub_repo="unsloth/Z-Image-Turbo-FP8", component="text_encoder_9")
    e = ei.value
    assert e.message == "'text_encoder_9' is not a text-encoder component."
    assert (e.expected, e.found) == ("text_encoder, text_encoder_2, text_encoder_3, text_encoder_4", "text_encoder_9")


@pytest.mark.parametrize("given,origin,note", [
    ({"path": "/m/te.safetensors"}, "path", "preset 'FLUX.1 / text_encoder_2' not used: a local file is given"),
    ({"hub_repo": "me/My-Encoder-FP8"}, "hub_repo", "preset 'FLUX.1 / text_encoder_2' not used: a hub_repo is given"),
])
def test_a_preset_is_not_used_when_a_file_or_repo_is_given(given, origin, note):
    p = te_sources.plan(preset="FLUX.1 / text_encoder_2", component="text_encoder_2", **given)
    assert p.notes == (note,) and [c.origin for c in p.candidates] == [origin]
    assert p.family is None  # the preset's family is not taken either


def test_a_family_hosting_no_encoder_says_so():
    p = te_sources.plan(family="wan2.2-ti2v-5b")
    assert list(p.candidates) == [] and p.notes == ("family 'wan2.2-ti2v-5b' has no hosted text encoder",)
    named = te_sources.plan(family="z-image", component="text_encoder_2")
    assert list(named.candidates) == [] and named.notes == ("family 'z-image' has no hosted text encoder named "
                                                            "text_encoder_2",)
    assert te_sources.component_for("wan2.2-ti2v-5b", "auto") is None
    assert te_sources.component_for("flux.1", None) == "text_encoder_2"
