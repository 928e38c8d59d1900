"""Krea 2 (Turbo): Krea2Transformer2DModel (diffusers >= 0.41) -> ComfyUI's Krea2 (``comfy.ldm.krea2``, from ComfyUI
0.33.0), with our own key map: ComfyUI's ``comfy.utils.krea2_to_diffusers`` names the Linear weights only (it serves
LoRA keys), a loader needs every tensor. Both sides keep the same conventions (zero-centred RMSNorm scales, the
modulation order prescale, preshift, pregate, postscale, postshift, postgate), so the map only moves tensors, and
lays each block's ``[6, dim]`` modulation table out as ComfyUI's one ``[6 * dim]`` vector. No int8 extras:
docs/FORMAT.md (section 4) lists family tokens only for qwen-image(-edit), hunyuanvideo-1.5 and ltx-2."""
from __future__ import annotations

from typing import Mapping

from ._base import Architecture, Family, HostedEncoder, Hosting, Shapes, attention_heads, blocks, first
from .keymap import moves

HEAD = 128  # the release's head width, where a file holds no q norm to read it from


def _projections(diffusers: str, comfy: str) -> tuple[tuple[str, str], ...]:
    """The q, k, v weights of one attention, each in either layout."""
    return tuple((f"{diffusers}to_{p}.weight", f"{comfy}w{p}.weight") for p in "qkv")


def _head_width(shapes: Shapes, diffusers: str, comfy: str) -> int:
    """The head width one attention's layers hold: its q norm scales one head's dimensions. ComfyUI's Krea2 takes
    ``dim // heads`` with the text heads left at the release's 20 (its detection reads no text heads), so a Krea 2 of
    another text width has heads of another width; the q rows // 128 rule refused such a file that stock ComfyUI
    runs (issue 60)."""
    for key in (f"{diffusers}norm_q.weight", f"{comfy}qknorm.qnorm.scale"):
        if key in shapes and len(shapes[key]) == 1 and shapes[key][0] > 0:
            return shapes[key][0]
    return HEAD


def config(shapes: Shapes) -> dict:
    features, cin = first(shapes, "img_in.weight", "first.weight")
    # whole heads, kv heads dividing q heads: both attentions refused by tensor name otherwise (_base.attention_heads)
    img, txt = ("transformer_blocks.0.attn.", "blocks.0.attn."), \
        ("text_fusion.refiner_blocks.0.attn.", "txtfusion.refiner_blocks.0.attn.")
    heads, kvheads = attention_heads(shapes, *_projections(*img), _head_width(shapes, *img))
    txtheads, txtkvheads = attention_heads(shapes, *_projections(*txt), _head_width(shapes, *txt))
    return {
        "image_model": "krea2", "features": features, "patch": 2, "channels": cin // 4,
        "layers": blocks(shapes, "transformer_blocks.", "blocks."), "heads": heads, "kvheads": kvheads,
        "txtlayers": first(shapes, "text_fusion.projector.weight", "txtfusion.projector.weight")[1],
        "txtdim": first(shapes, "txt_in.norm.weight", "txtmlp.0.scale")[0],
        # ComfyUI's detection leaves the text heads at the release's 20; read them as the layers hold them
        "txtheads": txtheads, "txtkvheads": txtkvheads,
    }


_BLOCK = {
    "norm1.weight": "prenorm.scale", "norm2.weight": "postnorm.scale",
    "attn.to_q.weight": "attn.wq.weight", "attn.to_k.weight": "attn.wk.weight", "attn.to_v.weight": "attn.wv.weight",
    "attn.to_gate.weight": "attn.gate.weight", "attn.to_out.0.weight": "attn.wo.weight",
    "attn.norm_q.weight": "attn.qknorm.qnorm.scale", "attn.norm_k.weight": "attn.qknorm.knorm.scale",
    "ff.gate.weight": "mlp.gate.weight", "ff.up.weight": "mlp.up.weight", "ff.down.weight": "mlp.down.weight",
}
TEXT_BLOCKS = 2  # ComfyUI's TextFusionTransformer holds two layer-wise and two refiner blocks, as the release has


def krea2_to_comfy(cfg: Mapping) -> dict:
    m: dict = {}
    for i in range(int(cfg.get("layers", 0))):
        moves(m, f"transformer_blocks.{i}.", f"blocks.{i}.", _BLOCK)
        m[f"transformer_blocks.{i}.scale_shift_table"] = (f"blocks.{i}.mod.lin", None, "flatten_table")
    for kind in ("layerwise_blocks", "refiner_blocks"):
        for i in range(TEXT_BLOCKS):
            moves(m, f"text_fusion.{kind}.{i}.", f"txtfusion.{kind}.{i}.", _BLOCK)
    moves(m, "", "", {"img_in": "first", "time_embed.linear_1": "tmlp.0", "time_embed.linear_2": "tmlp.2",
                      "time_mod_proj": "tproj.1", "txt_in.linear_1": "txtmlp.1", "txt_in.linear_2": "txtmlp.3",
                      "final_layer.linear": "last.linear"})
    moves(m, "", "", {"text_fusion.projector.weight": "txtfusion.projector.weight",
                      "txt_in.norm.weight": "txtmlp.0.scale", "final_layer.norm.weight": "last.norm.scale"})
    m["final_layer.scale_shift_table"] = "last.modulation.lin"
    return m


FAMILIES = (
    Family(
        name="krea-2", title="Krea 2",
        arch=Architecture(
            diffusers_class="Krea2Transformer2DModel",
            diffusers_markers=(("text_fusion.projector.weight", "time_mod_proj.weight"),),
            comfy_markers=(("txtfusion.projector.weight", "tproj.1.weight"),),
            comfy_model="Krea2", comfy_key_map=krea2_to_comfy, unet_config=config, min_comfy="0.33.0",
        ),
        hosting=Hosting(
            base_repos=("krea/Krea-2-Turbo",), repos={"unsloth/Krea-2-Turbo-FP8": ("fp8", "int8")},
            # Qwen3-VL-4B (diffusers' Krea2Pipeline: Qwen3VLModel, twelve hidden layers tapped); ComfyUI's type krea2
            text_encoders=(HostedEncoder("text_encoder", "Qwen3VLModel", "unsloth/Krea-2-Turbo-FP8", "KREA2",
                                         comfy_file="qwen3vl_4b_fp8_scaled.safetensors", min_comfy="0.33.0"),),
            excluded_bases=("krea/krea-2-raw",),
            shared_encoders={"Qwen3-VL-4B": ("krea/krea-2-turbo", "krea/krea-2-raw")},  # one encoder, both bases
        ),
    ),
)
