"""Z-Image (Turbo): ZImageTransformer2DModel -> ComfyUI's ZImage (NextDiT, ComfyUI's own key map)."""
from __future__ import annotations

from ._base import Architecture, Family, HostedEncoder, Hosting, KnownPolicy, Shapes, count_blocks, first


def config(shapes: Shapes) -> dict:
    dim, cap_feat_dim = shapes["cap_embedder.1.weight"]
    # Z-Image's head is 128 wide (rope axes 32/48/48) at every size; ComfyUI's own detection only knows dim 3840.
    cfg = {
        "image_model": "lumina2", "patch_size": 2, "in_channels": first(shapes, "x_embedder.weight", "all_x_embedder.2-1.weight")[1] // 4,
        "dim": dim, "cap_feat_dim": cap_feat_dim, "n_layers": count_blocks(shapes, "layers."),
        "n_refiner_layers": count_blocks(shapes, "noise_refiner."), "qk_norm": True,
        "n_heads": dim // 128, "n_kv_heads": dim // 128, "axes_dims": [32, 48, 48], "axes_lens": [1536, 512, 512],
        "rope_theta": 256.0, "ffn_dim_multiplier": 8.0 / 3.0, "z_image_modulation": True, "time_scale": 1000.0,
    }
    if "cap_pad_token" in shapes:
        cfg["pad_tokens_multiple"] = 32
    return cfg


FAMILIES = (
    Family(
        name="z-image", title="Z-Image",
        arch=Architecture(
            diffusers_class="ZImageTransformer2DModel",
            diffusers_markers=("all_x_embedder.2-1.weight", "layers.0.attention.to_q.weight"),
            # Lumina 2 shares ComfyUI's NextDiT names; Z-Image's modulation Linear is adaLN_modulation.0 (Lumina 2: .1)
            comfy_markers=(("x_embedder.weight", "layers.0.adaLN_modulation.0.weight"),
                           ("layers.0.attention.qkv.weight", "layers.0.adaLN_modulation.0.weight")),
            comfy_model="ZImage", comfy_key_map="z_image_to_diffusers", unet_config=config,
            fill_missing={"norm_final.weight": "ones"},
        ),
        hosting=Hosting(
            base_repos=("Tongyi-MAI/Z-Image-Turbo",),
            repos={"unsloth/Z-Image-Turbo-FP8": ("fp8", "int8"), "unsloth/Z-Image-Turbo-NVFP4": ("nvfp4",)},
            text_encoders=(HostedEncoder("text_encoder", "Qwen3ForCausalLM", "unsloth/Z-Image-Turbo-FP8", "LUMINA2"),),
            excluded_bases=("tongyi-mai/z-image",),
            # the Qwen3-4B encoder is the same bytes in Z-Image and Z-Image-Turbo
            shared_encoders={"Qwen3-4B": ("tongyi-mai/z-image-turbo", "tongyi-mai/z-image")},
            nvfp4_policies=(
                KnownPolicy("zimg_rg76_v1", 1, "tongyi-mai/z-image-turbo", {"nvfp4": 76, "fp8": 195, "bf16": 5},
                            "unsloth/Z-Image-Turbo-NVFP4", replaces=("zimg_f8mod_toq34_v1",)),
            ),
        ),
    ),
)
