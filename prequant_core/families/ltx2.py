"""LTX-2.3 (family ``ltx-2``, as Unsloth names it; ``ltx-2.3`` is accepted too): LTX2VideoTransformer3DModel (diffusers
>= 0.39; LTX-2.3's gated attention, 9-row modulation tables and prompt modulation need 0.42.1 here), a joint
audio + video transformer -> ComfyUI's LTXAV (``comfy.ldm.lightricks.av_model``; 0.33.0's form has 2.3's layers).
Unsloth hosts it in fp8 only, under the derived names (``LTX-2.3-FP8.safetensors``, ``.pt``, ``transformer_fp8.pt``);
int8 builds exclude the audio branch, the audio-video cross attention and the modulation (``ltx-2`` tokens,
docs/FORMAT.md section 4).

Two things a diffusers-layout file does not say and ComfyUI needs:

- The configuration values no tensor shape holds (the RoPE form and precision, the audio-video timestep multiplier):
  ComfyUI reads them from a Lightricks checkpoint's ``config`` metadata, which Unsloth's files do not carry, and
  builds LTX-2.0 without them. They are the release's (``RELEASE``: Lightricks/LTX-2.3's transformer config.json in
  ComfyUI's names); ``av_ca_timestep_scale_multiplier`` left at ComfyUI's default 1.0 moves the output by ~0.1.
- The text connectors: ComfyUI's LTXAV runs them on its text encoder's output inside the diffusion model, diffusers
  keeps them in the pipeline's ``connectors`` component, so Unsloth's transformer file has none. Their tensors, where
  given, come under the prefix ``connectors.`` in diffusers' names (``CONNECTORS``); the map places them.

The map restates diffusers' conversion script (``scripts/convert_ltx2_to_diffusers.py``, original -> diffusers) the
other way: renames only, every shape the same on both sides."""
from __future__ import annotations

from typing import Mapping

from ._base import Architecture, Companion, Family, Hosting, Shapes, blocks, first, has_any
from .keymap import moves

CONNECTORS = "connectors."  # the pipeline's connectors component, as a companion's tensors are merged in

# LTX-2.3's values no shape holds (its diffusers config: rope_type "split", rope_double_precision, timestep and
# cross-attention timestep multipliers 1000, positions 20 x 2048 x 2048, audio 20), in ComfyUI's names
RELEASE = {
    "rope_type": "split", "frequencies_precision": "float64", "positional_embedding_theta": 10000.0,
    "positional_embedding_max_pos": [20, 2048, 2048], "audio_positional_embedding_max_pos": [20],
    "timestep_scale_multiplier": 1000.0, "av_ca_timestep_scale_multiplier": 1000.0,
    "vae_scale_factors": (8, 32, 32), "use_middle_indices_grid": True, "causal_temporal_positioning": True,
}
VIDEO_HEAD, AUDIO_HEAD = 128, 64  # the release's head widths, where a file holds no gate to count heads with

# diffusers' top-level time embeddings (a timestep embedder and the modulation linear) -> ComfyUI's
_EMBEDDINGS = {
    "time_embed": "adaln_single", "audio_time_embed": "audio_adaln_single",
    "prompt_adaln": "prompt_adaln_single", "audio_prompt_adaln": "audio_prompt_adaln_single",
    "av_cross_attn_video_scale_shift": "av_ca_video_scale_shift_adaln_single",
    "av_cross_attn_video_a2v_gate": "av_ca_a2v_gate_adaln_single",
    "av_cross_attn_audio_scale_shift": "av_ca_audio_scale_shift_adaln_single",
    "av_cross_attn_audio_v2a_gate": "av_ca_v2a_gate_adaln_single",
}
_EMBEDDING_PARTS = {"linear": "linear", "emb.timestep_embedder.linear_1": "emb.timestep_embedder.linear_1",
                    "emb.timestep_embedder.linear_2": "emb.timestep_embedder.linear_2"}
# the top-level Linears; LTX-2.0's caption projections too (2.3 projects the text in its connectors)
_LINEARS = {
    "proj_in": "patchify_proj", "audio_proj_in": "audio_patchify_proj", "proj_out": "proj_out",
    "audio_proj_out": "audio_proj_out",
    **{f"{p}caption_projection.{n}": f"{p}caption_projection.{n}" for p in ("", "audio_") for n in ("linear_1",
                                                                                                      "linear_2")},
}
_TABLES = {"scale_shift_table": "scale_shift_table", "audio_scale_shift_table": "audio_scale_shift_table",
           "keyframes_abs_pos_embedding": "keyframes_abs_pos_embedding"}
_ATTENTIONS = ("attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")
_BLOCK_TABLES = {
    "scale_shift_table": "scale_shift_table", "audio_scale_shift_table": "audio_scale_shift_table",
    "prompt_scale_shift_table": "prompt_scale_shift_table",
    "audio_prompt_scale_shift_table": "audio_prompt_scale_shift_table",
    "video_a2v_cross_attn_scale_shift_table": "scale_shift_table_a2v_ca_video",
    "audio_a2v_cross_attn_scale_shift_table": "scale_shift_table_a2v_ca_audio",
}


def _attention(m: dict, src: str, dst: str) -> None:
    """One attention: projections and gate as they are, the q / k norms under ComfyUI's names."""
    moves(m, src, dst, {p: p for p in ("to_q", "to_k", "to_v", "to_out.0", "to_gate_logits")})
    moves(m, src, dst, {"norm_q.weight": "q_norm.weight", "norm_k.weight": "k_norm.weight"})


def _feed_forward(m: dict, src: str, dst: str) -> None:
    moves(m, src, dst, {"net.0.proj": "net.0.proj", "net.2": "net.2"})


def _connector(m: dict, src: str, dst: str, layers: int) -> None:
    m[f"{src}learnable_registers"] = f"{dst}learnable_registers"
    for i in range(layers):
        _attention(m, f"{src}transformer_blocks.{i}.attn1.", f"{dst}transformer_1d_blocks.{i}.attn1.")
        _feed_forward(m, f"{src}transformer_blocks.{i}.ff.", f"{dst}transformer_1d_blocks.{i}.ff.")


def ltx2_to_comfy(cfg: Mapping) -> dict:
    m: dict = {}
    moves(m, "", "", _LINEARS)
    for a, b in _EMBEDDINGS.items():
        moves(m, f"{a}.", f"{b}.", _EMBEDDING_PARTS)
    m.update(_TABLES)
    for i in range(int(cfg.get("num_layers", 0))):
        block = f"transformer_blocks.{i}."  # the same name on both sides
        for attn in _ATTENTIONS:
            _attention(m, f"{block}{attn}.", f"{block}{attn}.")
        for ff in ("ff.", "audio_ff."):
            _feed_forward(m, f"{block}{ff}", f"{block}{ff}")
        for a, b in _BLOCK_TABLES.items():
            m[f"{block}{a}"] = f"{block}{b}"
    layers = int(cfg.get("connector_num_layers", 0))
    for side in ("video", "audio"):
        _connector(m, f"{CONNECTORS}{side}_connector.", f"{side}_embeddings_connector.", layers)
    return m


def _heads(shapes: Shapes, attn: str, inner: int, head: int) -> tuple[int, int]:
    """(heads, head width) of one attention: its gate has one logit per head (LTX-2.3); without one, the release's
    head width."""
    gate = shapes.get(f"transformer_blocks.0.{attn}.to_gate_logits.weight")
    heads = gate[0] if gate else inner // head
    return heads, inner // heads


def _connector_config(shapes: Shapes) -> dict:
    """The connectors' sizes from their tensors (a companion's, under ``CONNECTORS``); none given: the sizes of
    ComfyUI's defaults are left, and the placement names the tensors the model still lacks."""
    out = {}
    for side, prefix in (("", "video_connector."), ("audio_", "audio_connector.")):
        p = f"{CONNECTORS}{prefix}"
        reg = shapes.get(f"{p}learnable_registers")
        if reg is None:
            continue
        gate = shapes.get(f"{p}transformer_blocks.0.attn1.to_gate_logits.weight")
        heads = gate[0] if gate else reg[1] // VIDEO_HEAD
        out[f"{side}connector_num_attention_heads"] = heads
        out[f"{side}connector_attention_head_dim"] = reg[1] // heads
        if not side:
            out["connector_num_layers"] = blocks(shapes, f"{p}transformer_blocks.")
            out["connector_apply_gated_attention"] = gate is not None
    return out


def config(shapes: Shapes) -> dict:
    inner, cin = first(shapes, "proj_in.weight", "patchify_proj.weight")
    audio_inner, audio_cin = first(shapes, "audio_proj_in.weight", "audio_patchify_proj.weight")
    heads, head = _heads(shapes, "attn1", inner, VIDEO_HEAD)
    audio_heads, audio_head = _heads(shapes, "audio_attn1", audio_inner, AUDIO_HEAD)
    b0 = "transformer_blocks.0."
    two_zero = has_any(shapes, "caption_projection.linear_1.weight")  # LTX-2.0 projects the caption in the model
    cfg = {
        **RELEASE, "image_model": "ltxav",
        "in_channels": cin, "audio_in_channels": audio_cin,
        "num_attention_heads": heads, "attention_head_dim": head,
        "audio_num_attention_heads": audio_heads, "audio_attention_head_dim": audio_head,
        "cross_attention_dim": first(shapes, f"{b0}attn2.to_k.weight")[1],
        "audio_cross_attention_dim": first(shapes, f"{b0}audio_attn2.to_k.weight")[1],
        "num_layers": blocks(shapes, "transformer_blocks."),
        "apply_gated_attention": has_any(shapes, f"{b0}attn1.to_gate_logits.weight"),
        "cross_attention_adaln": has_any(shapes, f"{b0}prompt_scale_shift_table"),
        "use_prompt_adaln_single": has_any(shapes, "prompt_adaln.linear.weight", "prompt_adaln_single.linear.weight"),
        "ff_bias": has_any(shapes, f"{b0}ff.net.0.proj.bias"),
        "audio_ff_bias": has_any(shapes, f"{b0}audio_ff.net.0.proj.bias"),
        "use_keyframes_abs_pos_embedding": has_any(shapes, "keyframes_abs_pos_embedding"),
        "caption_proj_before_connector": not two_zero, "caption_projection_first_linear": False,
        **_connector_config(shapes),
    }
    if two_zero:
        cfg["caption_channels"] = first(shapes, "caption_projection.linear_1.weight")[1]
    return cfg


FAMILIES = (
    Family(
        name="ltx-2", title="LTX-2.3",
        aliases=("ltx-2.3",),  # Unsloth's own name for it
        arch=Architecture(
            diffusers_class="LTX2VideoTransformer3DModel",
            diffusers_markers=(("audio_proj_in.weight", "av_cross_attn_video_scale_shift.linear.weight"),),
            comfy_markers=(),
            comfy_model="LTXAV", comfy_key_map=ltx2_to_comfy, unet_config=config, min_comfy="0.33.0",
            version_decides=True,  # 0.12.1's LTXAV is LTX-2.0's
            int8_exclude_extra=("audio", "av_cross_attn", "adaln"),
            companion=Companion(
                what="LTX-2.3's text connectors (the video and audio embeddings connectors)", prefix=CONNECTORS,
                comfy_prefixes=("video_embeddings_connector.", "audio_embeddings_connector."),
                where="diffusers keeps them in the pipeline's connectors component (Lightricks/LTX-2.3), ComfyUI "
                      "checkpoints in the diffusion model",
                # the text projections in that file (video_ / audio_text_proj_in) are the text encoder's in ComfyUI
                repo_file="connectors/diffusion_pytorch_model.safetensors",
                keep=("video_connector.", "audio_connector."), local_name="LTX-2.3-connectors.safetensors"),
        ),
        hosting=Hosting(base_repos=("Lightricks/LTX-2.3",), repos={"unsloth/LTX-2.3-FP8": ("fp8",)}, video=True),
    ),
)
