"""Krea 2 (Turbo): Krea2Transformer2DModel (diffusers >= 0.41). No ComfyUI version testable here has ComfyUI's Krea2
class (ComfyUI 0.38.1), so the ComfyUI loader refuses it naming that version; Info, verify, build, Hub resolution and
the diffusers loader (prequant_core.diffusers_loader) handle it. No int8 extras: docs/FORMAT.md (section 4) lists
family tokens only for qwen-image(-edit), hunyuanvideo-1.5 and ltx-2."""
from __future__ import annotations

from ._base import Family, HostedEncoder

FAMILIES = (
    Family(
        name="krea-2", title="Krea 2", diffusers_class="Krea2Transformer2DModel",
        base_repos=("krea/Krea-2-Turbo",), hosted_repos={"unsloth/Krea-2-Turbo-FP8": ("fp8", "int8")},
        # Qwen3-VL-4B (diffusers' Krea2Pipeline: Qwen3VLModel, twelve hidden layers tapped); ComfyUI's type krea2
        text_encoders=(HostedEncoder("text_encoder", "Qwen3VLModel", "unsloth/Krea-2-Turbo-FP8", "KREA2",
                                     comfy_file="qwen3vl_4b_fp8_scaled.safetensors"),),
        int8_exclude_extra=(),
        diffusers_markers=(("text_fusion.projector.weight", "time_mod_proj.weight"),), comfy_markers=(),
        comfy_model="Krea2", comfy_key_map=None, unet_config=None, min_comfy="0.38.1",
        excluded_bases=("krea/krea-2-raw",),
    ),
)
