"""HunyuanImage 2.1: HunyuanImageTransformer2DModel -> ComfyUI's HunyuanImage21
(comfy.ldm.hunyuan_video.model.HunyuanVideo), with our own key map."""
from __future__ import annotations

from typing import Mapping

from .keymap import mlp_embedder, moves, qkv_rows
from ._base import (FLUX_QK_NORMS, Architecture, ComfyParamDefault, Family, HostedEncoder, Hosting, Shapes, blocks,
                    first, has_any)


def config(shapes: Shapes) -> dict:
    w = first(shapes, "x_embedder.proj.weight", "img_in.proj.weight")
    hidden, in_ch, patch = w[0], w[1], list(w[2:])
    head = first(shapes, "transformer_blocks.0.attn.norm_q.weight", "double_blocks.0.img_attn.norm.query_norm.scale",
                 "double_blocks.0.img_attn.norm.query_norm.weight")[0]  # ComfyUI 0.33+ names it .weight
    out_rows = first(shapes, "proj_out.weight", "final_layer.linear.weight")[0]
    n_patch = 1
    for p in patch:
        n_patch *= p
    return {
        "image_model": "hunyuan_video", "in_channels": in_ch, "patch_size": patch, "out_channels": out_rows // n_patch,
        "vec_in_dim": None, "axes_dim": [64, 64] if len(patch) == 2 else [16, 56, 56],
        "meanflow": has_any(shapes, "time_guidance_embed.timestep_embedder_r.linear_1.weight",
                            "time_r_in.in_layer.weight"),
        "context_in_dim": first(shapes, "context_embedder.proj_in.weight", "txt_in.input_embedder.weight")[1],
        "hidden_size": hidden, "num_heads": hidden // head,
        "mlp_ratio": first(shapes, "transformer_blocks.0.ff.net.0.proj.weight", "double_blocks.0.img_mlp.0.weight")[0]
        / hidden,
        "depth": blocks(shapes, "transformer_blocks.", "double_blocks."),
        "depth_single_blocks": blocks(shapes, "single_transformer_blocks.", "single_blocks."),
        "theta": 256, "qkv_bias": True,
        "byt5": has_any(shapes, "context_embedder_2.linear_1.weight", "byt5_in.fc1.weight"),
        "guidance_embed": has_any(shapes, "time_guidance_embed.guidance_embedder.linear_1.weight",
                                  "guidance_in.in_layer.weight"),
        "use_cond_type_embedding": False, "vision_in_dim": None,
    }


# Key map (prequant_core.families.keymap describes the form). The double and single blocks follow FLUX.1's layout (ComfyUI's
# flux_to_diffusers); the text token refiner, the ByT5 mapper and the time embedders have their own names.


def hunyuan_image_to_diffusers(cfg: Mapping) -> dict:
    h = int(cfg["hidden_size"])
    mlp = int(h * float(cfg.get("mlp_ratio", 4.0)))
    m: dict = {}
    wb = ("weight", "bias")
    for i in range(int(cfg.get("depth", 0))):
        s, d = f"transformer_blocks.{i}", f"double_blocks.{i}"
        qkv_rows(m, f"{s}.attn", f"{d}.img_attn.qkv", (h, h, h), ends=wb)
        qkv_rows(m, f"{s}.attn", f"{d}.txt_attn.qkv", (h, h, h), names=("add_q_proj", "add_k_proj", "add_v_proj"),
                 ends=wb)
        moves(m, s + ".", d + ".", {
            "attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj",
            "norm1.linear": "img_mod.lin", "norm1_context.linear": "txt_mod.lin",
            "ff.net.0.proj": "img_mlp.0", "ff.net.2": "img_mlp.2",
            "ff_context.net.0.proj": "txt_mlp.0", "ff_context.net.2": "txt_mlp.2",
        })
        moves(m, s + ".", d + ".", {
            "attn.norm_q.weight": "img_attn.norm.query_norm.scale", "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
            "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
            "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale",
        })
    for i in range(int(cfg.get("depth_single_blocks", 0))):
        s, d = f"single_transformer_blocks.{i}", f"single_blocks.{i}"
        qkv_rows(m, f"{s}.attn", f"{d}.linear1", (h, h, h), ends=wb)
        for end in wb:
            m[f"{s}.proj_mlp.{end}"] = (f"{d}.linear1.{end}", (0, 3 * h, mlp))
        moves(m, s + ".", d + ".", {"proj_out": "linear2", "norm.linear": "modulation.lin"})
        moves(m, s + ".", d + ".", {"attn.norm_q.weight": "norm.query_norm.scale",
                                    "attn.norm_k.weight": "norm.key_norm.scale"})
    ce = "context_embedder"
    for i in range(2):  # ComfyUI's TokenRefiner always has two blocks (as the released model)
        s, d = f"{ce}.token_refiner.refiner_blocks.{i}", f"txt_in.individual_token_refiner.blocks.{i}"
        qkv_rows(m, f"{s}.attn", f"{d}.self_attn.qkv", (h, h, h), ends=wb)
        moves(m, s + ".", d + ".", {
            "attn.to_out.0": "self_attn.proj", "ff.net.0.proj": "mlp.0", "ff.net.2": "mlp.2",
            "norm1": "norm1", "norm2": "norm2", "norm_out.linear": "adaLN_modulation.1",
        })
    moves(m, "", "", {
        "x_embedder.proj": "img_in.proj", f"{ce}.proj_in": "txt_in.input_embedder",
        "context_embedder_2.norm": "byt5_in.layernorm", "context_embedder_2.linear_1": "byt5_in.fc1",
        "context_embedder_2.linear_2": "byt5_in.fc2", "context_embedder_2.linear_3": "byt5_in.fc3",
        "proj_out": "final_layer.linear",
    })
    mlp_embedder(m, f"{ce}.time_text_embed.timestep_embedder", "txt_in.t_embedder")
    mlp_embedder(m, f"{ce}.time_text_embed.text_embedder", "txt_in.c_embedder")
    mlp_embedder(m, "time_guidance_embed.timestep_embedder", "time_in")
    mlp_embedder(m, "time_guidance_embed.timestep_embedder_r", "time_r_in")
    mlp_embedder(m, "time_guidance_embed.guidance_embedder", "guidance_in")
    for end in wb:
        m[f"norm_out.linear.{end}"] = (f"final_layer.adaLN_modulation.1.{end}", None, "swap_scale_shift")
    return m


# ComfyUI 0.12.1's HunyuanVideoParams requires ``meanflow_sum``, which its detection sets where the model has an
# image (SigLIP) projection: HunyuanVideo 1.5 (hunyuan_video15.py), never HunyuanImage 2.1
MEANFLOW_SUM = ComfyParamDefault("comfy.ldm.hunyuan_video.model", "HunyuanVideoParams", "meanflow_sum",
                                 lambda cfg: cfg.get("vision_in_dim") is not None)

FAMILIES = (
    Family(
        name="hunyuanimage-2.1", title="HunyuanImage 2.1",
        arch=Architecture(
            diffusers_class="HunyuanImageTransformer2DModel",
            diffusers_markers=(("time_guidance_embed.timestep_embedder.linear_1.weight",
                                "context_embedder.token_refiner.refiner_blocks.0.attn.to_q.weight"),),
            comfy_markers=(("txt_in.individual_token_refiner.blocks.0.self_attn.qkv.weight", "byt5_in.fc1.weight"),
                           # the original release's names, which ComfyUI's own loader renames (process_unet_state_dict)
                           ("txt_in.individual_token_refiner.blocks.0.self_attn_qkv.weight", "byt5_in.fc1.weight")),
            comfy_model="HunyuanImage21", comfy_key_map=hunyuan_image_to_diffusers,
            unet_config=config,
            comfy_renames=(FLUX_QK_NORMS,), comfy_params=(MEANFLOW_SUM,),
        ),
        hosting=Hosting(
            base_repos=("hunyuanvideo-community/HunyuanImage-2.1-Diffusers",),
            repos={"unsloth/HunyuanImage-2.1-FP8": ("fp8", "int8")},
            # the Qwen2.5-VL encoder is byte-identical to Qwen-Image's (Unsloth compared every shard): one file serves
            # both
            text_encoders=(HostedEncoder("text_encoder", "Qwen2_5_VLForConditionalGeneration",
                                         "unsloth/Qwen-Image-FP8", "HUNYUAN_IMAGE"),),
            shared_encoders={"Qwen2.5-VL-7B": ("hunyuanvideo-community/hunyuanimage-2.1-diffusers",)},
        ),
    ),
)
