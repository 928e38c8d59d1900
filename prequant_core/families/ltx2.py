"""LTX-2.3 (family ``ltx-2``, as Unsloth names it; ``ltx-2.3`` is accepted too): LTX2VideoTransformer3DModel (diffusers
>= 0.39; LTX-2.3's gated attention, 9-row modulation tables and prompt modulation need 0.42.1 here), a joint
audio + video transformer. ComfyUI's LTXAV class hosts LTX-2 in 0.12.1 but not 2.3's layers (9 modulation rows,
``prompt_scale_shift_table``, the attention gate logits); the ComfyUI loader names the version that does. Info,
verify, build, Hub resolution and the diffusers loader handle it. Unsloth hosts it in fp8 only, under the derived
names (``LTX-2.3-FP8.safetensors``, ``.pt``, ``transformer_fp8.pt``); int8 builds exclude the audio branch, the
audio-video cross attention and the modulation (``ltx-2`` tokens, docs/FORMAT.md section 4)."""
from __future__ import annotations

from ._base import Architecture, Family, Hosting

FAMILIES = (
    Family(
        name="ltx-2", title="LTX-2.3",
        aliases=("ltx-2.3",),  # Unsloth's own name for it
        arch=Architecture(
            diffusers_class="LTX2VideoTransformer3DModel",
            diffusers_markers=(("audio_proj_in.weight", "av_cross_attn_video_scale_shift.linear.weight"),),
            comfy_markers=(),
            comfy_model="LTXAV", comfy_key_map=None, unet_config=None, min_comfy="0.38.1",
            int8_exclude_extra=("audio", "av_cross_attn", "adaln"),
        ),
        hosting=Hosting(base_repos=("Lightricks/LTX-2.3",), repos={"unsloth/LTX-2.3-FP8": ("fp8",)}, video=True),
    ),
)
