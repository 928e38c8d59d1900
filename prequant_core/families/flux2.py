"""FLUX.2 [klein] and [dev]: Flux2Transformer2DModel -> ComfyUI's Flux2 (comfy.ldm.flux.model.Flux with image_model
"flux2"), with our own key map (ComfyUI has none in comfy.utils)."""
from __future__ import annotations

from typing import Mapping

from .keymap import mlp_embedder, moves, qkv_rows
from ._base import (FLUX_QK_NORMS, Architecture, ComfyParamDefault, Family, HostedEncoder, Hosting, Shapes, blocks,
                    first, has_any)


def config(shapes: Shapes) -> dict:
    hidden, in_ch = first(shapes, "x_embedder.weight", "img_in.weight")
    head = first(shapes, "transformer_blocks.0.attn.norm_q.weight", "double_blocks.0.img_attn.norm.query_norm.scale",
                 "double_blocks.0.img_attn.norm.query_norm.weight")[0]  # ComfyUI 0.33+ names it .weight
    # ComfyUI's detection hard-codes FLUX.2-dev's 48 heads; klein (24) and tiny models need heads = hidden / 128.
    return {
        "image_model": "flux2", "in_channels": in_ch, "patch_size": 1,
        "out_channels": first(shapes, "proj_out.weight", "final_layer.linear.weight")[0],
        "vec_in_dim": None, "context_in_dim": first(shapes, "context_embedder.weight", "txt_in.weight")[1],
        "hidden_size": hidden, "num_heads": hidden // head,
        "mlp_ratio": first(shapes, "transformer_blocks.0.ff.linear_in.weight", "double_blocks.0.img_mlp.0.weight")[0]
        / 2 / hidden,
        "depth": blocks(shapes, "transformer_blocks.", "double_blocks."),
        "depth_single_blocks": blocks(shapes, "single_transformer_blocks.", "single_blocks."),
        "axes_dim": [32, 32, 32, 32], "theta": 2000, "qkv_bias": False, "ops_bias": False, "mlp_silu_act": True,
        "global_modulation": True, "default_ref_method": "index", "ref_index_scale": 10.0,
        "guidance_embed": has_any(shapes, "time_guidance_embed.guidance_embedder.linear_1.weight",
                                  "guidance_in.in_layer.weight"),
    }


# Key map (prequant_core.families.keymap describes the form). Linears carry no bias.


def flux2_to_diffusers(cfg: Mapping) -> dict:
    h = int(cfg["hidden_size"])
    m: dict = {}
    w = ("weight",)
    for i in range(int(cfg.get("depth", 0))):
        s, d = f"transformer_blocks.{i}", f"double_blocks.{i}"
        qkv_rows(m, f"{s}.attn", f"{d}.img_attn.qkv", (h, h, h), ends=w)
        qkv_rows(m, f"{s}.attn", f"{d}.txt_attn.qkv", (h, h, h), names=("add_q_proj", "add_k_proj", "add_v_proj"),
                 ends=w)
        moves(m, s + ".", d + ".", {
            "attn.to_out.0.weight": "img_attn.proj.weight", "attn.to_add_out.weight": "txt_attn.proj.weight",
            "attn.norm_q.weight": "img_attn.norm.query_norm.scale", "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
            "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
            "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale",
            "ff.linear_in.weight": "img_mlp.0.weight", "ff.linear_out.weight": "img_mlp.2.weight",
            "ff_context.linear_in.weight": "txt_mlp.0.weight", "ff_context.linear_out.weight": "txt_mlp.2.weight",
        })
    for i in range(int(cfg.get("depth_single_blocks", 0))):
        s, d = f"single_transformer_blocks.{i}", f"single_blocks.{i}"
        moves(m, s + ".", d + ".", {
            "attn.to_qkv_mlp_proj.weight": "linear1.weight", "attn.to_out.weight": "linear2.weight",
            "attn.norm_q.weight": "norm.query_norm.scale", "attn.norm_k.weight": "norm.key_norm.scale",
        })
    moves(m, "", "", {
        "x_embedder.weight": "img_in.weight", "context_embedder.weight": "txt_in.weight",
        "double_stream_modulation_img.linear.weight": "double_stream_modulation_img.lin.weight",
        "double_stream_modulation_txt.linear.weight": "double_stream_modulation_txt.lin.weight",
        "single_stream_modulation.linear.weight": "single_stream_modulation.lin.weight",
        "proj_out.weight": "final_layer.linear.weight",
    })
    mlp_embedder(m, "time_guidance_embed.timestep_embedder", "time_in", w)
    mlp_embedder(m, "time_guidance_embed.guidance_embedder", "guidance_in", w)
    m["norm_out.linear.weight"] = ("final_layer.adaLN_modulation.1.weight", None, "swap_scale_shift")
    return m


# ComfyUI 0.12.1's FluxParams requires the text ids' axes: FLUX.2's text ids have 3 (its detection's value)
TXT_IDS_DIMS = ComfyParamDefault("comfy.ldm.flux.model", "FluxParams", "txt_ids_dims", lambda cfg: [3])


def _arch(**kw) -> Architecture:
    """FLUX.2 [klein] and [dev]: one class, one key map."""
    return Architecture(
        diffusers_class="Flux2Transformer2DModel",
        diffusers_markers=("double_stream_modulation_img.linear.weight",),
        comfy_markers=("double_stream_modulation_img.lin.weight",),
        comfy_model="Flux2", comfy_key_map=flux2_to_diffusers, unet_config=config,
        comfy_renames=(FLUX_QK_NORMS,), comfy_params=(TXT_IDS_DIMS,), **kw)


FAMILIES = (
    Family(
        name="flux.2-klein", title="FLUX.2 [klein]",
        # the transformer runs in 0.3.75's Flux2 class (tested); its Qwen3-4B text encoder arrived later
        arch=_arch(min_comfy="0.9.2"),
        hosting=Hosting(base_repos=("black-forest-labs/FLUX.2-klein-4B",),
                        repos={"unsloth/FLUX.2-klein-4B-FP8": ("fp8", "int8")}),
    ),
    Family(
        name="flux.2-dev", title="FLUX.2 [dev]",
        arch=_arch(),
        hosting=Hosting(
            base_repos=("black-forest-labs/FLUX.2-dev",), repos={"unsloth/FLUX.2-dev-FP8": ("fp8", "int8")},
            # Mistral-Small-3.1-24B (diffusers' Flux2Pipeline: Mistral3ForConditionalGeneration); described, not built
            text_encoders=(HostedEncoder("text_encoder", "Mistral3ForConditionalGeneration", "unsloth/FLUX.2-dev-FP8",
                                         "FLUX2", comfy_file="mistral_3_small_flux2_bf16.safetensors"),),
        ),
    ),
)
