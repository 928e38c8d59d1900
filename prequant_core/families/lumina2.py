"""Lumina Image 2.0: Lumina2Transformer2DModel -> ComfyUI's Lumina2 (comfy.ldm.lumina.model.NextDiT), with our own key
map (ComfyUI's own reads diffusers files as OmniGen2)."""
from __future__ import annotations

from typing import Mapping

from .keymap import moves, qkv_rows
from ._base import Architecture, Family, HostedEncoder, Hosting, Shapes, count_blocks, first


def config(shapes: Shapes) -> dict:
    dim, cap_feat_dim = first(shapes, "time_caption_embed.caption_embedder.1.weight", "cap_embedder.1.weight")
    head = first(shapes, "layers.0.attn.norm_q.weight", "layers.0.attention.q_norm.weight")[0]
    if "layers.0.attn.to_k.weight" in shapes:
        kv_heads = shapes["layers.0.attn.to_k.weight"][0] // head
    else:
        kv_heads = (shapes["layers.0.attention.qkv.weight"][0] // head - dim // head) // 2
    ffn = first(shapes, "layers.0.feed_forward.linear_1.weight", "layers.0.feed_forward.w1.weight")[0]
    # ComfyUI's detection knows only dim 2304 (and reads diffusers files as OmniGen2). Lumina 2's head is 96 wide
    # (rope axes 32/32/32); ComfyUI's FFN width is ffn_dim_multiplier * dim (diffusers': 4 * dim * its multiplier).
    return {
        "image_model": "lumina2", "patch_size": 2, "in_channels": first(shapes, "x_embedder.weight")[1] // 4,
        "dim": dim, "cap_feat_dim": cap_feat_dim, "n_layers": count_blocks(shapes, "layers."),
        "n_refiner_layers": count_blocks(shapes, "noise_refiner."), "qk_norm": True,
        "n_heads": dim // head, "n_kv_heads": kv_heads, "axes_dims": [32, 32, 32], "axes_lens": [300, 512, 512],
        "rope_theta": 10000.0, "ffn_dim_multiplier": ffn / dim,
    }


# Key map (prequant_core.families.keymap describes the form). Grouped-query attention: k/v rows are n_kv_heads * head_dim each.


def lumina2_to_diffusers(cfg: Mapping) -> dict:
    dim = int(cfg["dim"])
    hd = dim // int(cfg["n_heads"])
    kv = int(cfg.get("n_kv_heads") or cfg["n_heads"]) * hd
    m: dict = {}

    def block(s, d, modulation):
        qkv_rows(m, f"{s}.attn", f"{d}.attention.qkv", (dim, kv, kv), ends=("weight",))
        moves(m, s + ".", d + ".", {
            "attn.norm_q.weight": "attention.q_norm.weight", "attn.norm_k.weight": "attention.k_norm.weight",
            "attn.to_out.0.weight": "attention.out.weight", "attn.to_out.0.bias": "attention.out.bias",
            "feed_forward.linear_1.weight": "feed_forward.w1.weight",
            "feed_forward.linear_2.weight": "feed_forward.w2.weight",
            "feed_forward.linear_3.weight": "feed_forward.w3.weight",
            "norm2.weight": "attention_norm2.weight",
            "ffn_norm1.weight": "ffn_norm1.weight", "ffn_norm2.weight": "ffn_norm2.weight",
        })
        if modulation:
            m[f"{s}.norm1.norm.weight"] = f"{d}.attention_norm1.weight"
            moves(m, s + ".", d + ".", {"norm1.linear": "adaLN_modulation.1"})
        else:
            m[f"{s}.norm1.weight"] = f"{d}.attention_norm1.weight"

    for i in range(int(cfg.get("n_layers", 0))):
        block(f"layers.{i}", f"layers.{i}", True)
    for i in range(int(cfg.get("n_refiner_layers", 0))):
        block(f"noise_refiner.{i}", f"noise_refiner.{i}", True)
        block(f"context_refiner.{i}", f"context_refiner.{i}", False)
    moves(m, "", "", {
        "x_embedder": "x_embedder", "time_caption_embed.caption_embedder.1": "cap_embedder.1",
        "time_caption_embed.timestep_embedder.linear_1": "t_embedder.mlp.0",
        "time_caption_embed.timestep_embedder.linear_2": "t_embedder.mlp.2",
        "norm_out.linear_1": "final_layer.adaLN_modulation.1", "norm_out.linear_2": "final_layer.linear",
    })
    m["time_caption_embed.caption_embedder.0.weight"] = "cap_embedder.0.weight"
    return m


FAMILIES = (
    Family(
        name="lumina-2", title="Lumina Image 2.0",
        arch=Architecture(
            diffusers_class="Lumina2Transformer2DModel",
            diffusers_markers=(("time_caption_embed.caption_embedder.1.weight", "layers.0.attn.to_q.weight"),),
            comfy_markers=(("layers.0.attention.qkv.weight", "layers.0.adaLN_modulation.1.weight",
                            "cap_embedder.1.weight"),),
            comfy_model="Lumina2", comfy_key_map=lumina2_to_diffusers, unet_config=config,
            fill_missing={"norm_final.weight": "ones"},
        ),
        hosting=Hosting(
            base_repos=("Alpha-VLLM/Lumina-Image-2.0",), repos={"unsloth/Lumina-Image-2.0-FP8": ("fp8", "int8")},
            text_encoders=(HostedEncoder("text_encoder", "Gemma2Model", "unsloth/Lumina-Image-2.0-FP8", "LUMINA2"),),
        ),
    ),
)
