"""HunyuanVideo 1.5 (480p / 720p t2v): HunyuanVideo15Transformer3DModel -> ComfyUI's HunyuanVideo15
(comfy.ldm.hunyuan_video.model.HunyuanVideo with cond_type_embedding and vision_in), with our own key map:
HunyuanImage 2.1's (hunyuan_image.py) plus its own time embedder, condition-type embedding and image (SigLIP)
projection.

Registered before HunyuanImage 2.1 (families.MODULES): a ComfyUI-layout HunyuanVideo 1.5 file also has
HunyuanImage's ComfyUI markers.
"""
from __future__ import annotations

from typing import Mapping

from .keymap import mlp_embedder, moves
from . import hunyuan_image
from ._base import FLUX_QK_NORMS, Architecture, Family, HostedFile, Hosting, Shapes, first, has_any


def config(shapes: Shapes) -> dict:
    cfg = hunyuan_image.config(shapes)
    cfg.update(
        meanflow=has_any(shapes, "time_embed.timestep_embedder_r.linear_1.weight", "time_r_in.in_layer.weight"),
        guidance_embed=False, use_cond_type_embedding=True, axes_dim=[16, 56, 56],
        vision_in_dim=first(shapes, "image_embedder.linear_1.weight", "vision_in.proj.1.weight")[1],
    )
    return cfg


def hunyuan_video15_to_diffusers(cfg: Mapping) -> dict:
    m = hunyuan_image.hunyuan_image_to_diffusers(cfg)
    for k in [k for k in m if k.startswith("time_guidance_embed.")]:  # HunyuanImage's names for the time embedders
        del m[k]
    mlp_embedder(m, "time_embed.timestep_embedder", "time_in")
    mlp_embedder(m, "time_embed.timestep_embedder_r", "time_r_in")
    m["cond_type_embed.weight"] = "cond_type_embedding.weight"
    moves(m, "image_embedder.", "vision_in.proj.", {"norm_in": "0", "linear_1": "1", "linear_2": "3",
                                                     "norm_out": "4"})
    return m


FAMILIES = (
    Family(
        name="hunyuanvideo-1.5", title="HunyuanVideo 1.5",
        arch=Architecture(
            diffusers_class="HunyuanVideo15Transformer3DModel",
            diffusers_markers=(("cond_type_embed.weight", "context_embedder_2.linear_1.weight"),),
            comfy_markers=(("cond_type_embedding.weight", "txt_in.individual_token_refiner.blocks.0.norm1.weight"),),
            comfy_model="HunyuanVideo15", comfy_key_map=hunyuan_video15_to_diffusers,
            unet_config=config,
            int8_exclude_extra=("context_embedder", "image_embedder", "add_q_proj", "add_k_proj", "add_v_proj",
                                "to_add_out", "ff_context"),
            comfy_renames=(FLUX_QK_NORMS,), comfy_params=(hunyuan_image.MEANFLOW_SUM,),
        ),
        hosting=Hosting(
            video=True,
            base_repos=("hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v",
                        "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-720p_t2v"),
            repos={"unsloth/HunyuanVideo-1.5-NVFP4": ("nvfp4",)},
            # one repo, one file per variant (base): the base picks it (sources.filenames)
            files=(HostedFile("unsloth/HunyuanVideo-1.5-NVFP4", "nvfp4", "HunyuanVideo-1.5-Diffusers-480p_t2v-NVFP4.pt",
                              base="hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v"),
                   HostedFile("unsloth/HunyuanVideo-1.5-NVFP4", "nvfp4", "HunyuanVideo-1.5-Diffusers-720p_t2v-NVFP4.pt",
                              base="hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-720p_t2v")),
        ),
    ),
)
