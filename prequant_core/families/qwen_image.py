"""Qwen-Image (and 2512): QwenImageTransformer2DModel -> ComfyUI's QwenImage, which uses the diffusers names."""
from __future__ import annotations

from ._base import Architecture, Family, HostedEncoder, Hosting, KnownPolicy, Shapes, count_blocks


def config(shapes: Shapes) -> dict:
    inner, in_ch = shapes["img_in.weight"]
    head = shapes["transformer_blocks.0.attn.norm_q.weight"][0]
    return {
        "image_model": "qwen_image", "patch_size": 2, "in_channels": in_ch,
        "out_channels": shapes["proj_out.weight"][0] // 4, "num_layers": count_blocks(shapes, "transformer_blocks."),
        "attention_head_dim": head, "num_attention_heads": inner // head,
        "joint_attention_dim": shapes["txt_in.weight"][1], "axes_dims_rope": [16, 56, 56],
    }


FAMILIES = (
    Family(
        name="qwen-image", title="Qwen-Image",
        arch=Architecture(
            diffusers_class="QwenImageTransformer2DModel",
            # ComfyUI's Qwen-Image uses the diffusers names: one layout
            diffusers_markers=(("txt_norm.weight", "transformer_blocks.0.img_mod.1.weight"),), comfy_markers=(),
            comfy_model="QwenImage", comfy_key_map=None, unet_config=config,
            int8_exclude_extra=("txt_in", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "txt_mlp"),
        ),
        hosting=Hosting(
            base_repos=("Qwen/Qwen-Image", "Qwen/Qwen-Image-2512"),
            # unsloth/Qwen-Image-FP8 held only an int8 transformer in released Unsloth (fp8 added since): int8 first
            repos={"unsloth/Qwen-Image-FP8": ("int8", "fp8"), "unsloth/Qwen-Image-2512-FP8": ("fp8", "int8"),
                   "unsloth/Qwen-Image-2512-NVFP4": ("nvfp4",)},
            text_encoders=(HostedEncoder("text_encoder", "Qwen2_5_VLForConditionalGeneration",
                                         "unsloth/Qwen-Image-FP8", "QWEN_IMAGE"),),
            # Qwen-Image-2512 republishes Qwen-Image's four encoder shards (HunyuanImage 2.1 has the same bytes)
            shared_encoders={"Qwen2.5-VL-7B": ("qwen/qwen-image", "qwen/qwen-image-2512")},
            nvfp4_policies=(
                KnownPolicy("qwen2512_m120_attn8_v1", 1, "qwen/qwen-image-2512",
                            {"nvfp4": 600, "fp8": 243, "bf16": 3}, "unsloth/Qwen-Image-2512-NVFP4"),
                KnownPolicy("qwen_p02_v1", 1, "qwen/qwen-image", {"nvfp4": 120, "fp8": 723, "bf16": 3},
                            "unsloth/Qwen-Image-FP8"),
            ),
        ),
    ),
)
