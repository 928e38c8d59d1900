"""Wan 2.2 TI2V-5B and T2V-A14B: WanTransformer3DModel -> ComfyUI's WAN22_T2V / WAN21_T2V
(comfy.ldm.wan.model.WanModel), with our own key map.

Unsloth hosts NVFP4 files only (docs/FORMAT.md section 6); int8 / fp8 files built with this pack's builder load the
same way. The two share the diffusers class and key names: a file without a family field loads either way, ComfyUI's
class picked from the shapes (48 latent channels: WAN22_T2V).
"""
from __future__ import annotations

from typing import Mapping

from .keymap import moves
from ._base import Architecture, Family, HostedFile, Hosting, Shapes, count_blocks, first


def config(shapes: Shapes) -> dict:
    w = shapes["patch_embedding.weight"]  # [dim, in_dim, pt, ph, pw], the same name in both layouts
    dim, in_dim, patch = w[0], w[1], tuple(w[2:])
    n_patch = 1
    for p in patch:
        n_patch *= p
    # ComfyUI's detection, with the text width read from the file (tiny models); Wan's heads are 128 wide at every
    # released size (5B: 24 heads of 3072, A14B: 40 of 5120).
    return {
        "image_model": "wan2.1", "model_type": "t2v", "patch_size": patch, "in_dim": in_dim, "dim": dim,
        "out_dim": first(shapes, "proj_out.weight", "head.head.weight")[0] // n_patch,
        "ffn_dim": first(shapes, "blocks.0.ffn.net.0.proj.weight", "blocks.0.ffn.0.weight")[0],
        "text_dim": first(shapes, "condition_embedder.text_embedder.linear_1.weight", "text_embedding.0.weight")[1],
        "freq_dim": first(shapes, "condition_embedder.time_embedder.linear_1.weight", "time_embedding.0.weight")[1],
        "num_heads": dim // 128, "num_layers": count_blocks(shapes, "blocks."), "window_size": (-1, -1),
        "qk_norm": True, "cross_attn_norm": True, "eps": 1e-6,
    }


# Key map (prequant_core.families.keymap describes the form): plain renames, no fused weights (the inverse of diffusers' own
# convert_wan_transformer_to_diffusers; ComfyUI's norm3 is the cross-attention norm, diffusers' norm2).


def wan_to_diffusers(cfg: Mapping) -> dict:
    m: dict = {}
    for i in range(int(cfg.get("num_layers", 0))):
        s = d = f"blocks.{i}."
        for a, b in (("attn1", "self_attn"), ("attn2", "cross_attn")):
            moves(m, s, d, {f"{a}.to_q": f"{b}.q", f"{a}.to_k": f"{b}.k", f"{a}.to_v": f"{b}.v",
                            f"{a}.to_out.0": f"{b}.o"})
            moves(m, s, d, {f"{a}.norm_q.weight": f"{b}.norm_q.weight", f"{a}.norm_k.weight": f"{b}.norm_k.weight"})
        moves(m, s, d, {"ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2", "norm2": "norm3"})
        m[f"{s}scale_shift_table"] = f"{d}modulation"
    moves(m, "", "", {
        "patch_embedding": "patch_embedding", "proj_out": "head.head",
        "condition_embedder.time_embedder.linear_1": "time_embedding.0",
        "condition_embedder.time_embedder.linear_2": "time_embedding.2",
        "condition_embedder.text_embedder.linear_1": "text_embedding.0",
        "condition_embedder.text_embedder.linear_2": "text_embedding.2",
        "condition_embedder.time_proj": "time_projection.1",
    })
    m["scale_shift_table"] = "head.modulation"
    return m


def _arch(shape_test, **kw) -> Architecture:
    """Wan 2.2 TI2V-5B and T2V-A14B: one class and one key map, told apart by their shapes."""
    return Architecture(
        diffusers_class="WanTransformer3DModel",
        diffusers_markers=(("condition_embedder.time_proj.weight", "blocks.0.attn1.to_q.weight"),),
        comfy_markers=(("head.modulation", "blocks.0.self_attn.q.weight"),),
        comfy_model=("WAN22_T2V", "WAN21_T2V"), comfy_key_map=wan_to_diffusers,
        unet_config=config, shape_test=shape_test, **kw)


FAMILIES = (
    Family(
        name="wan2.2-ti2v-5b", title="Wan 2.2 TI2V-5B",
        arch=_arch(lambda s: s["patch_embedding.weight"][1] == 48),  # Wan 2.2's 48-channel latents
        hosting=Hosting(
            video=True,
            base_repos=("Wan-AI/Wan2.2-TI2V-5B-Diffusers",), repos={"unsloth/Wan2.2-TI2V-5B-NVFP4": ("nvfp4",)},
            files=(HostedFile("unsloth/Wan2.2-TI2V-5B-NVFP4", "nvfp4", "Wan2.2-TI2V-5B-NVFP4.pt"),),
        ),
    ),
    Family(
        name="wan2.2-t2v-a14b", title="Wan 2.2 T2V-A14B",
        arch=_arch(lambda s: s["patch_embedding.weight"][1] == 16,  # Wan 2.1's 16-channel latents
                   # two experts: transformer (high noise, the first steps), transformer_2 (low noise, the rest)
                   components=("transformer", "transformer_2")),
        hosting=Hosting(
            video=True,
            base_repos=("Wan-AI/Wan2.2-T2V-A14B-Diffusers",), repos={"unsloth/Wan2.2-T2V-A14B-NVFP4": ("nvfp4",)},
            files=(HostedFile("unsloth/Wan2.2-T2V-A14B-NVFP4", "nvfp4", "Wan2.2-T2V-A14B-NVFP4.pt"),
                   HostedFile("unsloth/Wan2.2-T2V-A14B-NVFP4", "nvfp4", "Wan2.2-T2V-A14B-transformer_2-NVFP4.pt",
                              component="transformer_2")),
        ),
    ),
)
