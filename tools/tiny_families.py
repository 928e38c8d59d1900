"""Tiny models of every supported family's real architecture, in diffusers layout (the layout of Unsloth's files),
with seeded random weights; plus what ComfyUI's sampler needs to run each (latent shape, conditioning) and, to prove
our key maps, the same forward pass through diffusers' own class for comparison.

Dims are the smallest at which ComfyUI's and diffusers' versions agree and Linears still get quantized
(``min_features`` 512): hidden 512 with the family's real head width (128), one block of each kind. Where ComfyUI
hard-codes a size the tiny model keeps it: HunyuanImage's ByT5 mapper (1472 in, 2048 wide) and its two text-refiner
blocks. Lumina 2 (96-wide heads, grouped-query attention) needs 1152 = 12 heads with 6 k/v heads: ComfyUI fuses
q/k/v into one Linear, which cannot be half quantized, so k/v (6 * 96 = 576 rows) must reach min_features as q
does, as in the real model (8 * 96 = 768); its FFN width 4 * 1152 is a multiple of 256 as both codes require.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from .tiny_models import randomize_


@dataclasses.dataclass(frozen=True)
class Tiny:
    family: str
    base_model_id: str
    diffusers_class: str
    kwargs: dict
    latent: tuple  # ComfyUI latent shape for sampling
    cond: Callable[[torch.Generator], tuple]  # -> (cross_attn, extra conditioning dict), as ComfyUI's encoders give
    # diffusers forward with ComfyUI's inputs -> ComfyUI-shaped model output; None where not written
    reference: Callable | None = None
    file_stem: str = ""  # the hosted file name stem, e.g. "FLUX.1-dev"


def _randn(g, *shape):
    return torch.randn(*shape, generator=g)


# ---------------------------------------------------------------------------------------------------------------
# Conditioning as ComfyUI's text encoders produce it (shapes scaled down where the tiny model allows)

def _flux1_cond(g):
    return _randn(g, 1, 8, 512), {"pooled_output": _randn(g, 1, 768), "guidance": 4.0}


def _flux2_cond(g):
    # ComfyUI pads FLUX.2 text to 512 tokens (model_base.Flux2.extra_conds); 4.0 is exact in bf16
    return _randn(g, 1, 8, 512), {"pooled_output": None, "guidance": 4.0}  # its encoders give no pooled vector


def _qwen_cond(g):
    return _randn(g, 1, 8, 512), {}


def _lumina2_cond(g):
    return _randn(g, 1, 8, 512), {}


def _hidream_cond(g):
    # context = T5 tokens, conditioning_llama3 = [B, llama layers, tokens, dim], pooled_output = CLIP-L + CLIP-G
    return _randn(g, 1, 8, 512), {"conditioning_llama3": _randn(g, 1, 2, 8, 512), "pooled_output": _randn(g, 1, 256)}


def _hunyuan_image_cond(g):
    return _randn(g, 1, 8, 512), {"conditioning_byt5small": _randn(g, 1, 4, 1472)}


def _wan_cond(g):
    return _randn(g, 1, 8, 512), {}  # UMT5-XXL tokens (4096 wide in the real model)


def _hunyuan_video15_cond(g):
    # Qwen2.5-VL tokens + ByT5 glyph tokens, as ComfyUI's HunyuanVideo 1.5 text encoder gives them (no pooled vector)
    return _randn(g, 1, 8, 512), {"conditioning_byt5small": _randn(g, 1, 4, 1472), "pooled_output": None}


# ---------------------------------------------------------------------------------------------------------------
# diffusers reference forwards: (diffusers model, ComfyUI latent x, sigma, cross_attn, extras) -> ComfyUI output
# (the velocity ComfyUI's diffusion model returns for that latent, in ComfyUI's latent layout)

def _pack2(x):  # [B, C, H, W] -> [B, HW/4, C*4] (FLUX.1 / Qwen-Image latent packing)
    b, c, h, w = x.shape
    return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)


def _unpack2(x, c, h, w):
    b = x.shape[0]
    return x.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def _ids(h, w, n_axes=3):
    """Image position ids as ComfyUI's FLUX builds them: (index 0, row, column[, 0])."""
    ids = torch.zeros(h, w, n_axes)
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    return ids.reshape(h * w, n_axes)


def _flux1_ref(m, x, sigma, ctx, extra):
    b, c, h, w = x.shape
    out = m(hidden_states=_pack2(x), encoder_hidden_states=ctx, pooled_projections=extra["pooled_output"],
            timestep=sigma, img_ids=_ids(h // 2, w // 2), txt_ids=torch.zeros(ctx.shape[1], 3),
            guidance=torch.tensor([extra["guidance"]]) if m.config.guidance_embeds else None, return_dict=False)[0]
    return _unpack2(out, c, h, w)


def _flux2_ref(m, x, sigma, ctx, extra):
    b, c, h, w = x.shape
    ctx = torch.nn.functional.pad(ctx, (0, 0, 512 - ctx.shape[1], 0))  # as ComfyUI pads (left)
    img_ids = _ids(h, w, 4)
    txt_ids = torch.zeros(ctx.shape[1], 4)
    txt_ids[:, 3] = torch.arange(ctx.shape[1])
    out = m(hidden_states=x.flatten(2).transpose(1, 2), encoder_hidden_states=ctx, timestep=sigma,
            img_ids=img_ids[None], txt_ids=txt_ids[None],
            guidance=torch.tensor([extra["guidance"]]) if m.config.guidance_embeds else None, return_dict=False)[0]
    return out.transpose(1, 2).reshape(b, c, h, w)


def _qwen_ref(m, x, sigma, ctx, extra):
    b, c, t, h, w = x.shape  # ComfyUI's Qwen-Image latent is 5-D (Wan 2.1 format, one frame)
    out = m(hidden_states=_pack2(x[:, :, 0]), encoder_hidden_states=ctx, timestep=sigma,
            img_shapes=[[(1, h // 2, w // 2)]], return_dict=False)[0]
    return _unpack2(out, c, h, w)[:, :, None]


def _lumina2_ref(m, x, sigma, ctx, extra):
    # Lumina runs time from noise (0) to image (1) and predicts image - noise: ComfyUI feeds 1 - t and negates
    out = m(hidden_states=x, timestep=1.0 - sigma, encoder_hidden_states=ctx,
            encoder_attention_mask=torch.ones(ctx.shape[:2], dtype=torch.bool), return_dict=False)[0]
    return -out


def _hidream_ref(m, x, sigma, ctx, extra):
    # ComfyUI: t = 1000 * sigma, conditioning_llama3 [B, layers, tokens, dim], output negated (as diffusers' pipeline)
    out = m(hidden_states=x, timesteps=sigma * 1000, encoder_hidden_states_t5=ctx,
            encoder_hidden_states_llama3=extra["conditioning_llama3"].movedim(1, 0),
            pooled_embeds=extra["pooled_output"], return_dict=False)[0]
    return -out


def _hunyuan_image_ref(m, x, sigma, ctx, extra):
    # ComfyUI: t = 1000 * sigma; byt5 tokens go after the MLLM tokens there and before them in diffusers, which
    # attention (no text positions) does not see
    byt5 = extra["conditioning_byt5small"]
    out = m(hidden_states=x, timestep=sigma * 1000, encoder_hidden_states=ctx,
            encoder_attention_mask=torch.ones(ctx.shape[:2]), encoder_hidden_states_2=byt5,
            encoder_attention_mask_2=torch.ones(byt5.shape[:2]), return_dict=False)[0]
    return out


def _wan_ref(m, x, sigma, ctx, extra):
    # ComfyUI: t = 1000 * sigma, flow velocity out, as diffusers' Wan pipeline
    return m(hidden_states=x, timestep=sigma * 1000, encoder_hidden_states=ctx, return_dict=False)[0]


def _hunyuan_video15_ref(m, x, sigma, ctx, extra):
    # ComfyUI feeds [latent, 32 zero image-condition channels, a zero mask channel] (text to video) and no vision
    # tokens; diffusers' t2v gets all-zero image embeds, which it masks out. Text tokens carry no positions in either,
    # so the token order (ByT5 first in ComfyUI) does not matter.
    b, c, t, h, w = x.shape
    xin = torch.cat([x, torch.zeros(b, m.config.in_channels - c, t, h, w, dtype=x.dtype)], dim=1)
    byt5 = extra["conditioning_byt5small"]
    return m(hidden_states=xin, timestep=sigma * 1000, encoder_hidden_states=ctx,
             encoder_attention_mask=torch.ones(ctx.shape[:2]), encoder_hidden_states_2=byt5,
             encoder_attention_mask_2=torch.ones(byt5.shape[:2]),
             image_embeds=torch.zeros(b, 4, m.config.image_embed_dim, dtype=x.dtype), return_dict=False)[0]


_WAN = dict(patch_size=(1, 2, 2), attention_head_dim=128, freq_dim=256, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", eps=1e-6)

TINY: dict[str, Tiny] = {t.family: t for t in [
    Tiny("flux.1", "black-forest-labs/FLUX.1-dev", "FluxTransformer2DModel",
         dict(in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=128, num_attention_heads=4,
              joint_attention_dim=512, pooled_projection_dim=768, guidance_embeds=True),
         (1, 16, 16, 16), _flux1_cond, _flux1_ref, "FLUX.1-dev"),
    Tiny("flux.2-klein", "black-forest-labs/FLUX.2-klein-4B", "Flux2Transformer2DModel",
         dict(in_channels=128, num_layers=1, num_single_layers=1, attention_head_dim=128, num_attention_heads=4,
              joint_attention_dim=512, guidance_embeds=False),
         (1, 128, 8, 8), _flux2_cond, _flux2_ref, "FLUX.2-klein-4B"),
    Tiny("flux.2-dev", "black-forest-labs/FLUX.2-dev", "Flux2Transformer2DModel",
         dict(in_channels=128, num_layers=1, num_single_layers=1, attention_head_dim=128, num_attention_heads=4,
              joint_attention_dim=512, guidance_embeds=True),
         (1, 128, 8, 8), _flux2_cond, _flux2_ref, "FLUX.2-dev"),
    Tiny("qwen-image", "Qwen/Qwen-Image", "QwenImageTransformer2DModel",
         dict(in_channels=64, out_channels=16, num_layers=1, attention_head_dim=128, num_attention_heads=4,
              joint_attention_dim=512),
         (1, 16, 1, 16, 16), _qwen_cond, _qwen_ref, "Qwen-Image"),
    Tiny("lumina-2", "Alpha-VLLM/Lumina-Image-2.0", "Lumina2Transformer2DModel",
         dict(hidden_size=1152, num_layers=1, num_refiner_layers=1, num_attention_heads=12, num_kv_heads=6,
              axes_dim_rope=(32, 32, 32), cap_feat_dim=512, multiple_of=256),
         (1, 16, 16, 16), _lumina2_cond, _lumina2_ref, "Lumina-Image-2.0"),
    Tiny("hidream-i1", "HiDream-ai/HiDream-I1-Full", "HiDreamImageTransformer2DModel",
         dict(patch_size=2, in_channels=16, out_channels=16, num_layers=1, num_single_layers=1,
              attention_head_dim=128, num_attention_heads=4, caption_channels=[512, 512], text_emb_dim=256,
              num_routed_experts=4, num_activated_experts=2, axes_dims_rope=(64, 32, 32),
              max_resolution=(128, 128), llama_layers=[0, 1]),
         (1, 16, 16, 16), _hidream_cond, _hidream_ref, "HiDream-I1-Full"),
    Tiny("hunyuanimage-2.1", "hunyuanvideo-community/HunyuanImage-2.1-Diffusers", "HunyuanImageTransformer2DModel",
         dict(in_channels=64, out_channels=64, num_attention_heads=4, attention_head_dim=128, num_layers=1,
              num_single_layers=1, num_refiner_layers=2, text_embed_dim=512, text_embed_2_dim=1472,
              guidance_embeds=False, rope_axes_dim=(64, 64)),
         (1, 64, 8, 8), _hunyuan_image_cond, _hunyuan_image_ref, "HunyuanImage-2.1"),
    # Video: latents [B, C, frames, H, W]; two latent frames
    Tiny("wan2.2-ti2v-5b", "Wan-AI/Wan2.2-TI2V-5B-Diffusers", "WanTransformer3DModel",
         dict(_WAN, num_attention_heads=4, in_channels=48, out_channels=48, text_dim=512, ffn_dim=1024, num_layers=1),
         (1, 48, 2, 8, 8), _wan_cond, _wan_ref, "Wan2.2-TI2V-5B"),
    Tiny("wan2.2-t2v-a14b", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "WanTransformer3DModel",
         dict(_WAN, num_attention_heads=4, in_channels=16, out_channels=16, text_dim=512, ffn_dim=1024, num_layers=1),
         (1, 16, 2, 8, 8), _wan_cond, _wan_ref, "Wan2.2-T2V-A14B"),
    # ComfyUI hard-codes the ByT5 mapper (1472 in, 2048 wide) and two refiner blocks, as the released model has;
    # the SigLIP projection keeps its real 1152 width (ComfyUI's HunyuanVideo15 class is matched on it)
    Tiny("hunyuanvideo-1.5", "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v",
         "HunyuanVideo15Transformer3DModel",
         dict(in_channels=65, out_channels=32, num_attention_heads=4, attention_head_dim=128, num_layers=1,
              num_refiner_layers=2, text_embed_dim=512, text_embed_2_dim=1472, image_embed_dim=1152),
         (1, 32, 2, 4, 4), _hunyuan_video15_cond, _hunyuan_video15_ref, "HunyuanVideo-1.5-Diffusers-480p_t2v"),
]}


# The released models' diffusers configs (transformer/config.json), for shape-only checks on the meta device: our
# config derivation, key maps and quantization filter at real size, against ComfyUI's own detection.
REAL: dict[str, dict] = {
    "flux.1": dict(in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128, num_attention_heads=24,
                   joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True),  # FLUX.1 [dev]
    "flux.2-klein": dict(in_channels=128, num_layers=5, num_single_layers=20, attention_head_dim=128,
                         num_attention_heads=24, joint_attention_dim=7680, guidance_embeds=False),
    "flux.2-dev": dict(in_channels=128, num_layers=8, num_single_layers=48, attention_head_dim=128,
                       num_attention_heads=48, joint_attention_dim=15360, guidance_embeds=True),
    "qwen-image": dict(in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128, num_attention_heads=24,
                       joint_attention_dim=3584),
    "lumina-2": dict(hidden_size=2304, num_layers=26, num_refiner_layers=2, num_attention_heads=24, num_kv_heads=8,
                     axes_dim_rope=(32, 32, 32), cap_feat_dim=2304, multiple_of=256),
    "hidream-i1": dict(patch_size=2, in_channels=16, out_channels=16, num_layers=16, num_single_layers=32,
                       attention_head_dim=128, num_attention_heads=20, caption_channels=[4096, 4096],
                       text_emb_dim=2048, num_routed_experts=4, num_activated_experts=2, axes_dims_rope=(64, 32, 32),
                       max_resolution=(128, 128), llama_layers=list(range(32)) + [31] * 16),
    "hunyuanimage-2.1": dict(in_channels=64, out_channels=64, num_attention_heads=28, attention_head_dim=128,
                             num_layers=20, num_single_layers=40, num_refiner_layers=2, text_embed_dim=3584,
                             text_embed_2_dim=1472, guidance_embeds=False, rope_axes_dim=(64, 64)),
    # Wan-AI/Wan2.2-TI2V-5B-Diffusers and -T2V-A14B-Diffusers transformer/config.json (A14B: both experts)
    "wan2.2-ti2v-5b": dict(_WAN, num_attention_heads=24, in_channels=48, out_channels=48, text_dim=4096,
                           ffn_dim=14336, num_layers=30),
    "wan2.2-t2v-a14b": dict(_WAN, num_attention_heads=40, in_channels=16, out_channels=16, text_dim=4096,
                            ffn_dim=13824, num_layers=40),
    # hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v (720p_t2v: the same shapes)
    "hunyuanvideo-1.5": dict(in_channels=65, out_channels=32, num_attention_heads=16, attention_head_dim=128,
                             num_layers=54, num_refiner_layers=2, text_embed_dim=3584, text_embed_2_dim=1472,
                             image_embed_dim=1152),
}


# ---------------------------------------------------------------------------------------------------------------
# Families whose ComfyUI class no ComfyUI testable here has (registered with unet_config=None): their diffusers
# classes (as these configs use them) need diffusers >= 0.41 (tests run them with diffusers 0.42.1 from
# .cache/diffusers042, see tests/test_diffusers_loader.py). Hidden 512 with 128-wide heads, one block of each kind.

def _krea2_forward(m, g, dtype):
    n_txt, h, w = 6, 4, 4
    pos = torch.zeros(n_txt + h * w, 3)
    pos[n_txt:, 1] = torch.arange(h).repeat_interleave(w)
    pos[n_txt:, 2] = torch.arange(w).repeat(h)
    cfg = m.config
    return m(hidden_states=_randn(g, 1, h * w, cfg.in_channels).to(dtype),
             encoder_hidden_states=_randn(g, 1, n_txt, cfg.num_text_layers, cfg.text_hidden_dim).to(dtype),
             timestep=torch.tensor([0.7]), position_ids=pos, return_dict=False)[0]


def _krea2_record(m) -> dict:
    """Inputs as ComfyUI's Krea2 takes them (a [1, 16, 8, 8] latent, sigma 0.7, text as [1, n, layers * dim]) and the
    diffusers model's velocity for them, in ComfyUI's latent layout (2x2 patches, the same sigma as timestep:
    ComfyUI's FLUX-type sampling feeds sigma, diffusers scales it by 1000 inside, as ComfyUI's embedding does)."""
    g = torch.Generator().manual_seed(3)
    cfg = m.config
    c, h, w, n_txt = cfg.in_channels // 4, 8, 8, 6
    x = _randn(g, 1, c, h, w)
    ctx = _randn(g, 1, n_txt, cfg.num_text_layers * cfg.text_hidden_dim)
    hp, wp = h // 2, w // 2
    pos = torch.zeros(n_txt + hp * wp, 3)
    pos[n_txt:, 1] = torch.arange(hp).repeat_interleave(wp)
    pos[n_txt:, 2] = torch.arange(wp).repeat(hp)
    tokens = _pack2(x)
    with torch.no_grad():
        out = m(hidden_states=tokens, encoder_hidden_states=ctx.reshape(1, n_txt, cfg.num_text_layers, -1),
                timestep=torch.tensor([0.7]), position_ids=pos, return_dict=False)[0]
    return {"x": x, "context": ctx, "sigma": torch.tensor([0.7]), "output": _unpack2(out, c, h, w)}


def _qwen21_forward(m, g, dtype):
    n_txt, h, w = 6, 4, 4  # one target image of 4x4 latent tokens: 4 image slots of 2x2 tokens after the text
    cfg = m.config
    return m(hidden_states=_randn(g, 1, h * w, cfg.in_channels).to(dtype),
             encoder_hidden_states=_randn(g, 1, n_txt, cfg.context_in_dim).to(dtype), timestep=torch.tensor([0.7]),
             img_shapes=[[(1, h, w)]], img_mask=torch.tensor([[False] * n_txt + [True] * (h * w // 4)]),
             return_dict=False)[0]


def _ltx2_forward(m, g, dtype):
    """Video and audio tokens together (LTX-2.3 denoises both in one pass), the prompt modulation's sigma, RoPE
    coordinates from the latent sizes; both outputs, flattened into one tensor."""
    cfg = m.config
    frames, h, w, n_audio, n_txt = 2, 4, 4, 5, 6
    video, audio = m(hidden_states=_randn(g, 1, frames * h * w, cfg.in_channels).to(dtype),
                     audio_hidden_states=_randn(g, 1, n_audio, cfg.audio_in_channels).to(dtype),
                     encoder_hidden_states=_randn(g, 1, n_txt, cfg.cross_attention_dim).to(dtype),
                     audio_encoder_hidden_states=_randn(g, 1, n_txt, cfg.audio_cross_attention_dim).to(dtype),
                     timestep=torch.full((1, frames * h * w), 700.0), audio_timestep=torch.full((1, n_audio), 700.0),
                     sigma=torch.tensor([0.7]), num_frames=frames, height=h, width=w, audio_num_frames=n_audio,
                     return_dict=False)
    return torch.cat([video.flatten(), audio.flatten()])


def _ltx2_connectors(m) -> dict:
    """A tiny ``connectors`` component (diffusers' LTX2TextConnectors, LTX-2.3's per-modality form) of ``m``'s widths,
    seed 1: the text connectors ComfyUI's LTXAV holds in its diffusion model and Unsloth's transformer file lacks;
    its video / audio connectors' tensors under ``connectors.`` (prequant_core.families.ltx2.CONNECTORS)."""
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
    cfg = m.config
    torch.manual_seed(1)
    c = LTX2TextConnectors(caption_channels=64, text_proj_in_factor=2, per_modality_projections=True,
                           video_hidden_dim=cfg.cross_attention_dim, audio_hidden_dim=cfg.audio_cross_attention_dim,
                           video_connector_num_attention_heads=cfg.cross_attention_dim // 128,
                           video_connector_attention_head_dim=128, video_connector_num_layers=1,
                           audio_connector_num_attention_heads=cfg.audio_cross_attention_dim // 128,
                           audio_connector_attention_head_dim=128, audio_connector_num_layers=1, rope_type="split")
    return {f"connectors.{k}": v for k, v in c.state_dict().items() if k.startswith(("video_connector.",
                                                                                       "audio_connector."))}


def _ltx2_record(m) -> dict:
    """Inputs as ComfyUI's LTXAV takes them (a video latent [1, C, F, H, W], an audio latent [1, c, T, 16] whose
    channels x bins are the audio width, sigma 0.7, the text already through its connectors: video then audio
    widths) and diffusers' outputs for them, as its LTX-2.3 pipeline calls the class (the timestep and the prompt
    sigma both 1000 * sigma, each stream's cross-attention timestep the other's, 25 frames per second: ComfyUI's
    default frame rate). The video velocity in ComfyUI's layout; the audio's too (ComfyUI's block feeds its
    video-to-audio attention the video after the audio-to-video update, diffusers the video before it, so only the
    video stream is held equal)."""
    g = torch.Generator().manual_seed(3)
    cfg = m.config
    c, f, h, w, t, n_txt = cfg.in_channels, 2, 4, 4, 5, 6
    bins = 16
    vx = _randn(g, 1, c, f, h, w)
    ax = _randn(g, 1, cfg.audio_in_channels // bins, t, bins)
    ctx = _randn(g, 1, n_txt, cfg.cross_attention_dim + cfg.audio_cross_attention_dim)
    sigma = 0.7

    def forward():
        with torch.no_grad():
            video, audio = m(
                hidden_states=vx.flatten(2).transpose(1, 2), audio_hidden_states=ax.transpose(1, 2).flatten(2),
                encoder_hidden_states=ctx[..., :cfg.cross_attention_dim],
                audio_encoder_hidden_states=ctx[..., cfg.cross_attention_dim:],
                timestep=torch.full((1, f * h * w), 1000 * sigma), audio_timestep=torch.full((1, t), 1000 * sigma),
                sigma=torch.tensor([1000 * sigma]), use_cross_timestep=True, fps=25.0, num_frames=f, height=h, width=w,
                audio_num_frames=t, return_dict=False)
        return video.transpose(1, 2).reshape(vx.shape), audio.reshape(1, t, -1, bins).transpose(1, 2)
    video, audio = forward()
    kept = {k: v.clone() for k, v in m.state_dict().items()}
    with torch.no_grad():  # the audio-to-video gate zeroed: then both forwards feed video-to-audio the same video
        for k, v in m.state_dict().items():
            if k in LTX2_A2V_GATE or k.endswith(LTX2_A2V_GATE_ROW):
                v[-1 if k.endswith(LTX2_A2V_GATE_ROW) else slice(None)] = 0
        _, gated_audio = forward()
    m.load_state_dict(kept)
    return {"x": vx, "audio_x": ax, "context": ctx, "sigma": torch.tensor([sigma]), "output": video,
            "audio_output_without_a2v": gated_audio, **{"dense." + k: v for k, v in _ltx2_connectors(m).items()}}


# what makes LTX-2.3's audio-to-video gate zero (diffusers' names): the gate embedding's linear, and each block
# table's last row (the gate's row of ``video_a2v_cross_attn_scale_shift_table``)
LTX2_A2V_GATE = ("av_cross_attn_video_a2v_gate.linear.weight", "av_cross_attn_video_a2v_gate.linear.bias")
LTX2_A2V_GATE_ROW = ".video_a2v_cross_attn_scale_shift_table"


def _h3_forward(m, g, dtype):
    """The packed sequence MiniMax-H3 denoises: text rows, then video rows (patchified), then audio rows, one noise
    level; both outputs, flattened into one tensor."""
    cfg = m.config
    n_txt, (f, h, w), n_audio = 6, (2, 2, 2), 4
    patch = cfg.in_channels * cfg.patch_size[0] * cfg.patch_size[1] * cfg.patch_size[2]
    n_video = f * h * w
    seq = n_txt + n_video + n_audio
    pos = torch.zeros(seq, 3, dtype=torch.long)
    grid = torch.stack(torch.meshgrid(torch.arange(f), torch.arange(h), torch.arange(w), indexing="ij"), -1)
    pos[n_txt:n_txt + n_video] = grid.reshape(-1, 3)
    pos[n_txt + n_video:, 0] = torch.arange(n_audio)
    tags = torch.tensor([1] * n_txt + [0] * n_video + [2] * n_audio)
    video, audio = m(hidden_states=_randn(g, 1, n_video, patch).to(dtype),
                     audio_hidden_states=_randn(g, 1, n_audio, cfg.audio_in_channels).to(dtype),
                     encoder_hidden_states=_randn(g, 1, n_txt, cfg.text_dim).to(dtype),
                     timestep=torch.tensor([0.7]), timestep_indices=torch.zeros(seq, dtype=torch.long),
                     token_tags=tags, position_ids=pos, video_indices=torch.arange(n_txt, n_txt + n_video),
                     audio_indices=torch.arange(n_txt + n_video, seq), text_indices=torch.arange(n_txt),
                     return_dict=False)
    return torch.cat([video.flatten(), audio.flatten()])


def _h3_curve(m, dim: int = 8, grid: int = 33):
    """The pruned ("curve") adaLN form Unsloth's MiniMax-H3 files hold, fitted here the way the form is defined:
    ``u(t) = silu(time_embedder(time_proj(t)))`` on a grid of t in [0, 1] is centred and projected on its top
    ``dim`` right singular vectors B (``table = (u - mean) B``), each modulation weight folded onto B (``W B``) with
    the mean in its bias (``b + W mean``); then the model is reshaped to that form as the loader does
    (prequant_core.families.minimax_h3.curve_form) and the folded values assigned."""
    from prequant_core.families import minimax_h3
    with torch.no_grad():
        t = torch.linspace(0.0, 1.0, grid)
        u = torch.nn.functional.silu(m.time_embedder(m.time_proj(t).float())).float()
        mean = u.mean(0)
        basis = torch.linalg.svd(u - mean, full_matrices=False).Vh[:dim].T  # (time_embed_dim, dim)
        table = (u - mean) @ basis
        linears = {f"transformer_blocks.{i}.adaln_proj.linear": b.adaln_proj.linear
                   for i, b in enumerate(m.transformer_blocks)}
        linears["norm_out.linear"] = m.norm_out.linear
        folded = {}
        for name, lin in linears.items():
            w = lin.weight.float()
            folded[name + ".weight"] = w @ basis
            folded[name + ".bias"] = lin.bias.float() + w @ mean
        minimax_h3.curve_form(m, {"adaln_form": "curve", "curve_dim": dim, "curve_grid": grid,
                                  "adaln_out_dtype": "bfloat16"})
        m.load_state_dict({**{k: v for k, v in m.state_dict().items() if k not in folded and k != minimax_h3.TABLE},
                           **folded, minimax_h3.TABLE: table}, strict=True, assign=True)
    return m


DENSE_FORM = "dense_form"  # a record input asking for the class as built rather than its hosted form


def _h3_record(m, inputs: dict | None = None) -> dict:
    """MiniMax-H3's class on the packed sequence ComfyUI's MiniMaxH3 builds (``inputs``, laid out by the ComfyUI side
    with ComfyUI's own PackedLayout: text, audio, video rows, their rotary positions, modality tags and distinct
    timesteps; tests/families/test_families.py ``_h3_inputs``): the video and audio velocity rows, in ComfyUI's row order.
    All in float32: the curve form's cast of the block modulation to the stack's dtype (bfloat16 as hosted) is left
    out, as a float32 ComfyUI model computes it. Without inputs: nothing (the record then holds the weights only,
    ``dense_from_subprocess``)."""
    if inputs is None:
        return {}
    for block in m.transformer_blocks:
        block.adaln_proj.prequant_out_dtype = None  # (absent in the dense form: nothing to leave out)
    with torch.no_grad():
        video, audio = m(hidden_states=inputs["video_rows"][None], audio_hidden_states=inputs["audio_rows"][None],
                         encoder_hidden_states=inputs["context"], timestep=inputs["timestep"],
                         timestep_indices=inputs["timestep_indices"], token_tags=inputs["token_tags"],
                         position_ids=inputs["position_ids"], video_indices=inputs["video_indices"],
                         audio_indices=inputs["audio_indices"], text_indices=inputs["text_indices"], return_dict=False)
    return {"output": video[0], "audio_output": audio[0]}


@dataclasses.dataclass(frozen=True)
class TinyDiffusersOnly:
    family: str
    base_model_id: str
    diffusers_class: str
    kwargs: dict
    forward: Callable  # (diffusers model, generator, dtype) -> output
    file_stem: str = ""
    # the form the hosted files hold, from the freshly built class (MiniMax-H3's pruned adaLN)
    hosted_form: Callable | None = None
    # (model) -> {"x", "context", "sigma", "output"}: ComfyUI-shaped inputs and the class's output for them, where
    # ComfyUI has the family's class (tools/diffusers_check.py forward); with ``layout``, (model, inputs) -> outputs
    # for inputs the ComfyUI side lays out with ComfyUI's own code (MiniMax-H3's packed sequence)
    record: Callable | None = None
    layout: bool = False


DIFFUSERS_ONLY: dict[str, TinyDiffusersOnly] = {t.family: t for t in [
    TinyDiffusersOnly("krea-2", "krea/Krea-2-Turbo", "Krea2Transformer2DModel",
                      # ComfyUI 0.33's Krea2: FFN width int(2/3 * dim) * 4 rounded up to 128 (1408 at 512), two
                      # layer-wise and two refiner text blocks, as the release has
                      dict(in_channels=64, num_layers=1, attention_head_dim=128, num_attention_heads=4,
                           num_key_value_heads=4, intermediate_size=1408, text_hidden_dim=512, num_text_layers=2,
                           text_num_attention_heads=4, text_num_key_value_heads=4, text_intermediate_size=1408,
                           num_layerwise_text_blocks=2, num_refiner_text_blocks=2),
                      _krea2_forward, "Krea-2-Turbo", record=_krea2_record),
    TinyDiffusersOnly("qwen-image-2.1", "Qwen/Qwen-Image-2.1", "QwenImage21Transformer2DModel",
                      dict(in_channels=64, num_layers=1, attention_head_dim=128, num_attention_heads=4,
                           context_in_dim=512),
                      _qwen21_forward, "Qwen-Image-2.1"),
    # LTX-2.3's layer kinds: gated attention, 9-row modulation and prompt modulation in both branches, no caption
    # projection (2.3 projects the text in its connector); the audio branch 512 wide too, so that its Linears are
    # quantized in fp8 and excluded by name in int8 (Unsloth's "audio" token); audio latents of 8 channels x 16 bins
    # (128 wide), the only audio latent ComfyUI's LTXAV unpacks
    TinyDiffusersOnly("ltx-2", "Lightricks/LTX-2.3", "LTX2VideoTransformer3DModel",
                      dict(in_channels=64, out_channels=64, num_attention_heads=4, attention_head_dim=128,
                           cross_attention_dim=512, audio_in_channels=128, audio_out_channels=128,
                           audio_num_attention_heads=4, audio_attention_head_dim=128, audio_cross_attention_dim=512,
                           num_layers=1, caption_channels=512, gated_attn=True, cross_attn_mod=True,
                           audio_gated_attn=True, audio_cross_attn_mod=True, use_prompt_embeddings=False,
                           rope_type="split"),  # the release's RoPE form (prequant_core.families.ltx2.RELEASE)
                      _ltx2_forward, "LTX-2.3", record=_ltx2_record),
    # the pruned adaLN as hosted (8-dimensional curve on a 33-point grid; the release: 8 on 1025)
    TinyDiffusersOnly("minimax-h3", "MiniMaxAI/MiniMax-H3", "MiniMaxH3Transformer3DModel",
                      dict(num_attention_heads=4, attention_head_dim=128, hidden_size=512, num_layers=1,
                           num_refiner_layers=1, ffn_dim=1024, in_channels=16, audio_in_channels=32, text_dim=384,
                           freq_dim=256, time_embed_hidden_dim=512, time_embed_dim=256),
                      _h3_forward, "MiniMax-H3", hosted_form=_h3_curve, record=_h3_record,
                      layout=True),
]}


def diffusers_forward(family: str, model, seed: int = 0, dtype=torch.bfloat16):
    """One forward pass of the family's diffusers class on seeded inputs (cast to ``dtype``), for any registered
    family: the sampler-shaped inputs of ``TINY`` through its reference, or the ``DIFFUSERS_ONLY`` forward."""
    g = torch.Generator().manual_seed(seed)
    if family in DIFFUSERS_ONLY:
        return DIFFUSERS_ONLY[family].forward(model, g, dtype)
    if family == "z-image":
        x = _randn(g, 16, 1, 16, 16).to(dtype)
        cap = _randn(g, 12, model.config.cap_feat_dim).to(dtype)
        return model([x], torch.tensor([0.3]), [cap], return_dict=False)[0][0]
    t = TINY[family]
    ctx, extra = t.cond(g)
    cast = lambda v: v.to(dtype) if isinstance(v, torch.Tensor) else v  # noqa: E731
    x = _randn(g, *t.latent).to(dtype)
    return t.reference(model, x, torch.tensor([0.7], dtype=dtype), cast(ctx), {k: cast(v) for k, v in extra.items()})


def tiny_kwargs(family: str) -> dict:
    """The tiny diffusers config of any registered family (Z-Image's lives in tools.tiny_models)."""
    if family == "z-image":
        from .tiny_models import ZIMAGE_TINY
        return dict(ZIMAGE_TINY)
    return dict((DIFFUSERS_ONLY.get(family) or TINY[family]).kwargs)


def any_diffusers_model(family: str, seed: int = 0, dtype=torch.float32, hosted: bool = True):
    """Seeded tiny diffusers model of any registered family (including Z-Image and the diffusers-only ones), in the
    form the hosted files hold (``hosted``; else the class as built: MiniMax-H3's dense adaLN)."""
    import diffusers
    from prequant_core import families
    cls = getattr(diffusers, families.get(family).arch.diffusers_class)
    m = randomize_(cls(**tiny_kwargs(family)), seed)
    form = getattr(DIFFUSERS_ONLY.get(family), "hosted_form", None) if hosted else None
    return (form(m) if form else m).to(dtype).eval()


def meta_state_dict(family: str, real: bool = True, dtype=torch.bfloat16, **overrides) -> dict:
    """The family's diffusers state dict on the meta device (shapes and dtypes only, no memory)."""
    import diffusers
    t = TINY[family]
    with torch.device("meta"):
        m = getattr(diffusers, t.diffusers_class)(**{**(REAL[family] if real else t.kwargs), **overrides})
    return {k: v.to(dtype) for k, v in m.state_dict().items()}


def diffusers_model(family: str, seed: int = 0, dtype=torch.float32, **overrides):
    import diffusers
    t = TINY[family]
    m = getattr(diffusers, t.diffusers_class)(**{**t.kwargs, **overrides})
    return randomize_(m, seed).to(dtype).eval()


def dense(family: str, seed: int = 0, dtype=torch.bfloat16, **overrides) -> dict:
    """Dense state dict in diffusers layout, cast to ``dtype`` (bf16: what the builder quantizes)."""
    m = diffusers_model(family, seed, torch.float32, **overrides)
    return {k: v.to(dtype).contiguous() for k, v in m.state_dict().items()}


def forward_record(family: str, inputs: dict | None = None) -> dict:
    """A ``DIFFUSERS_ONLY`` family's tiny model (seed 0, ``dense.`` + its keys) and one forward pass of its class
    (``x``, ``context``, ``sigma``, ``output``), made in a subprocess with diffusers 0.42.1 first on the path
    (``.cache/diffusers042``; the pinned diffusers lacks the class): ``tools/diffusers_check.py forward``.
    ``inputs``: tensors the record takes from the caller (MiniMax-H3: the packed layout ComfyUI's model builds)."""
    import os
    import subprocess
    import sys
    import tempfile
    from safetensors.torch import load_file
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    side = os.path.join(root, ".cache", "diffusers042")
    dev_py = os.path.join(root, ".venv", "bin", "python")
    path = os.path.join(tempfile.mkdtemp(prefix="tiny-"), f"{family}.safetensors")
    extra = []
    if inputs is not None:
        from safetensors.torch import save_file
        extra = [os.path.join(os.path.dirname(path), "inputs.safetensors")]
        save_file({k: v.contiguous() for k, v in inputs.items()}, extra[0])
    p = subprocess.run([dev_py if os.path.exists(dev_py) else sys.executable, "-m", "tools.diffusers_check", "forward",
                        family, path, *extra], cwd=root, env=dict(os.environ, PYTHONPATH=os.pathsep.join([side, root])),
                       capture_output=True, text=True, timeout=600)
    if p.returncode:
        raise RuntimeError(f"tools.diffusers_check forward {family} failed:\n{p.stderr[-3000:]}")
    return load_file(path)


def dense_from_subprocess(family: str, dtype=torch.bfloat16) -> dict:
    """A ``DIFFUSERS_ONLY`` family's tiny dense state dict (seed 0), from ``forward_record``."""
    rec = forward_record(family)
    return {k[len("dense."):]: v.to(dtype).contiguous() for k, v in rec.items() if k.startswith("dense.")}


def conditioning(family: str, seed: int = 0):
    """(cross_attn, extras): ComfyUI conditioning ``[[cross_attn, extras]]`` for the family's tiny model."""
    return TINY[family].cond(torch.Generator().manual_seed(seed))


def sample(model, family: str, steps: int = 2, seed: int = 0):
    """A deterministic KSampler run (euler / simple, cfg 1) of the family's tiny latent through ComfyUI's own
    sampling code (imported here, when called: this module also serves ComfyUI-free tools)."""
    import comfy.sample
    ctx, extra = conditioning(family, seed)
    cond = [[ctx, dict(extra)]]
    latent = torch.zeros(TINY[family].latent)
    noise = torch.randn(latent.shape, generator=torch.Generator().manual_seed(seed + 1))
    with torch.inference_mode():
        return comfy.sample.sample(model, noise, steps, 1.0, "euler", "simple", cond, cond, latent, seed=seed,
                                   disable_pbar=True)
