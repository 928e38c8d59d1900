"""HiDream-I1 (Full): HiDreamImageTransformer2DModel -> ComfyUI's HiDream, which uses the diffusers names."""
from __future__ import annotations

from ._base import Architecture, Family, HostedEncoder, Hosting, Shapes, count_blocks

# HiDream-I1's text-layer schedule (ComfyUI's detection): which Llama-3.1 hidden layer feeds each block.
HIDREAM_LLAMA_LAYERS = list(range(32)) + [31] * 16


def config(shapes: Shapes) -> dict:
    inner, patch_in = shapes["x_embedder.proj.weight"]
    n_double = count_blocks(shapes, "double_stream_blocks.")
    n_single = count_blocks(shapes, "single_stream_blocks.")
    n_caption = count_blocks(shapes, "caption_projection.")
    n_blocks = n_double + n_single
    layers = HIDREAM_LLAMA_LAYERS if n_blocks == len(HIDREAM_LLAMA_LAYERS) else list(range(n_blocks))
    return {
        "image_model": "hidream", "patch_size": 2, "in_channels": patch_in // 4,
        "out_channels": shapes["final_layer.linear.weight"][0] // 4,
        "num_layers": n_double, "num_single_layers": n_single,
        "attention_head_dim": 128, "num_attention_heads": inner // 128,
        "caption_channels": [shapes[f"caption_projection.{n_caption - 1}.linear.weight"][1],
                             shapes["caption_projection.0.linear.weight"][1]],
        "text_emb_dim": shapes["p_embedder.pooled_embedder.linear_1.weight"][1],
        "num_routed_experts": count_blocks(shapes, "double_stream_blocks.0.block.ff_i.experts.")
        or count_blocks(shapes, "single_stream_blocks.0.block.ff_i.experts."),
        "num_activated_experts": 2, "axes_dims_rope": [64, 32, 32], "max_resolution": [128, 128],
        "llama_layers": layers,
    }


FAMILIES = (
    Family(
        name="hidream-i1", title="HiDream-I1",
        arch=Architecture(
            diffusers_class="HiDreamImageTransformer2DModel",
            diffusers_markers=(("caption_projection.0.linear.weight",
                                "double_stream_blocks.0.block.attn1.to_q.weight"),),
            comfy_markers=(),  # ComfyUI's HiDream uses the diffusers names
            comfy_model="HiDream", comfy_key_map=None, unet_config=config,
        ),
        hosting=Hosting(
            base_repos=("HiDream-ai/HiDream-I1-Full",), repos={"unsloth/HiDream-I1-Full-FP8": ("fp8", "int8")},
            text_encoders=(HostedEncoder("text_encoder_4", "LlamaForCausalLM", "unsloth/HiDream-I1-Full-FP8",
                                         "HIDREAM"),),
            excluded_bases=("hidream-ai/hidream-i1-dev", "hidream-ai/hidream-i1-fast"),
            shared_encoders={"T5-XXL": ("hidream-ai/hidream-i1-full",)},  # its text_encoder_3: FLUX.1's T5-XXL
        ),
    ),
)
