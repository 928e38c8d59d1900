"""FLUX.1 (schnell, dev, Krea-dev): FluxTransformer2DModel -> ComfyUI's Flux / FluxSchnell (ComfyUI's own key map)."""
from __future__ import annotations

from ._base import (FLUX_QK_NORMS, Architecture, ComfyParamDefault, Family, HostedEncoder, Hosting, KnownPolicy, Shapes,
                    blocks, first, has_any)


def config(shapes: Shapes) -> dict:
    hidden, in_ch = first(shapes, "x_embedder.weight", "img_in.weight")
    head = first(shapes, "transformer_blocks.0.attn.norm_q.weight", "double_blocks.0.img_attn.norm.query_norm.scale",
                 "double_blocks.0.img_attn.norm.query_norm.weight")[0]  # ComfyUI 0.33+ names it .weight
    # ComfyUI's detection assumes hidden 3072 / 24 heads; FLUX.1's head is 128 wide (rope axes 16/56/56) at any size.
    return {
        "image_model": "flux", "in_channels": in_ch // 4, "patch_size": 2,
        "out_channels": first(shapes, "proj_out.weight", "final_layer.linear.weight")[0] // 4,
        "vec_in_dim": first(shapes, "time_text_embed.text_embedder.linear_1.weight", "vector_in.in_layer.weight")[1],
        "context_in_dim": first(shapes, "context_embedder.weight", "txt_in.weight")[1],
        "hidden_size": hidden, "num_heads": hidden // head,
        "mlp_ratio": first(shapes, "transformer_blocks.0.ff.net.0.proj.weight", "double_blocks.0.img_mlp.0.weight")[0]
        / hidden,
        "depth": blocks(shapes, "transformer_blocks.", "double_blocks."),
        "depth_single_blocks": blocks(shapes, "single_transformer_blocks.", "single_blocks."),
        "axes_dim": [16, 56, 56], "theta": 10000,
        "qkv_bias": has_any(shapes, "transformer_blocks.0.attn.to_q.bias", "double_blocks.0.img_attn.qkv.bias"),
        "guidance_embed": has_any(shapes, "time_text_embed.guidance_embedder.linear_1.weight",
                                  "guidance_in.in_layer.weight"),
    }


# ComfyUI 0.12.1's FluxParams requires the text ids' axes, which its detection gives FLUX.1 as none
TXT_IDS_DIMS = ComfyParamDefault("comfy.ldm.flux.model", "FluxParams", "txt_ids_dims", lambda cfg: [])

FAMILIES = (
    Family(
        name="flux.1", title="FLUX.1",
        arch=Architecture(
            diffusers_class="FluxTransformer2DModel",
            diffusers_markers=(("single_transformer_blocks.0.proj_mlp.weight",
                                "time_text_embed.timestep_embedder.linear_1.weight"),),
            comfy_markers=(("double_blocks.0.img_mod.lin.weight", "img_in.weight", "vector_in.in_layer.weight"),),
            comfy_model=("Flux", "FluxSchnell"), comfy_key_map="flux_to_diffusers", unet_config=config,
            comfy_renames=(FLUX_QK_NORMS,), comfy_params=(TXT_IDS_DIMS,),
        ),
        hosting=Hosting(
            base_repos=("black-forest-labs/FLUX.1-schnell", "black-forest-labs/FLUX.1-dev",
                        "black-forest-labs/FLUX.1-Krea-dev"),
            repos={"unsloth/FLUX.1-schnell-FP8": ("fp8", "int8"), "unsloth/FLUX.1-dev-FP8": ("fp8", "int8"),
                   "unsloth/FLUX.1-Krea-dev-FP8": ("fp8", "int8"), "unsloth/FLUX.1-schnell-NVFP4": ("nvfp4",)},
            # T5-XXL, the same bytes in every FLUX.1 release; ComfyUI's FLUX CLIP takes CLIP-L next to it
            text_encoders=(HostedEncoder("text_encoder_2", "T5EncoderModel", "unsloth/FLUX.1-schnell-FP8", "FLUX",
                                         with_encoders=("clip_l",)),),
            shared_encoders={"T5-XXL": ("black-forest-labs/flux.1-schnell", "black-forest-labs/flux.1-dev",
                                        "black-forest-labs/flux.1-krea-dev")},
            nvfp4_policies=(
                KnownPolicy("flux_r420_v1", 1, "black-forest-labs/flux.1-schnell",
                            {"nvfp4": 187, "fp8": 312, "bf16": 3}, "unsloth/FLUX.1-schnell-NVFP4",
                            replaces=("flux_mod_single_v1",)),
            ),
        ),
    ),
)
