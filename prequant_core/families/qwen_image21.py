"""Qwen-Image 2.1 (and Turbo): QwenImage21Transformer2DModel (diffusers >= 0.41). As Krea 2 (krea2.py): ComfyUI's
QwenImage21 class arrives in ComfyUI 0.38.1, which the ComfyUI loader names; everything else handles it."""
from __future__ import annotations

from ._base import Architecture, Family, HostedEncoder, HostedFile, Hosting, KnownPolicy

FAMILIES = (
    Family(
        name="qwen-image-2.1", title="Qwen-Image 2.1",
        arch=Architecture(
            diffusers_class="QwenImage21Transformer2DModel",
            diffusers_markers=(("modulation.1.weight", "txt_in.in_layer.weight", "txt_in.text_norm.weight"),),
            comfy_markers=(),
            comfy_model="QwenImage21", comfy_key_map=None, unet_config=None, min_comfy="0.38.1",
        ),
        hosting=Hosting(
            base_repos=("Qwen/Qwen-Image-2.1", "Qwen/Qwen-Image-2.1-Turbo"),
            repos={"unsloth/Qwen-Image-2.1-FP8": ("fp8", "int8"), "unsloth/Qwen-Image-2.1-Turbo-FP8": ("fp8", "int8"),
                   "unsloth/Qwen-Image-2.1-NVFP4": ("nvfp4",)},
            # Unsloth's resolver lists its 2.1 repos as hosting an int8 ConvRot build (inferred from its variant table)
            convrot_repos=("unsloth/Qwen-Image-2.1-FP8", "unsloth/Qwen-Image-2.1-Turbo-FP8"),
            # Unsloth's int8 ConvRot Qwen3-VL-8B (9.35 GB against 17.5 GB dense); ComfyUI's type for it is qwen_image
            text_encoders=(HostedEncoder("text_encoder", "Qwen3VLForConditionalGeneration",
                                         "unsloth/Qwen-Image-2.1-FP8", "QWEN_IMAGE", scheme="int8",
                                         filename="Qwen-Image-2.1-text_encoder-INT8-ConvRot.safetensors",
                                         comfy_file="qwen3vl_8b_int8_convrot.safetensors"),),
            # the Turbo base has its own variant repo, which a matching base picks first (sources.hosted_repo)
            excluded_bases=("qwen/qwen-image-2.1-turbo",),
            files=(HostedFile("unsloth/Qwen-Image-2.1-FP8", "fp8", "Qwen-Image-2.1-FP8.safetensors"),
                   HostedFile("unsloth/Qwen-Image-2.1-FP8", "int8", "Qwen-Image-2.1-INT8.safetensors")),
            nvfp4_policies=(
                KnownPolicy("qwen21_r020_v1", 1, "qwen/qwen-image-2.1", {"nvfp4": 48, "fp8": 181, "bf16": 3},
                            "unsloth/Qwen-Image-2.1-NVFP4"),
            ),
        ),
    ),
)
