"""A family this pack does not ship, as one module: "toy-dit", a tiny transformer with its own key names, hosted by
Unsloth-style repos. Every fact about it is here: its architecture (markers, classes, config from shapes, int8
exclusions, a ComfyUI parameter default) and its hosting (base, repos and the schemes each holds, a declared file
name, an excluded base, a ConvRot repo, a hosted text encoder whose bytes it shares with Z-Image, an NVFP4 layer
policy and the one it replaced). tests/families/test_family_registry.py adds it with one registry line (``families.MODULES``)
and follows it through naming, detection, Hub file names, building, validation, Info, the encoder and policy checks;
without the line it is unknown."""
from __future__ import annotations

import dataclasses

from prequant_core.families import (Architecture, ComfyParamDefault, Family, HostedEncoder, HostedFile, Hosting,
                                    KnownPolicy, Shapes, count_blocks)


@dataclasses.dataclass
class ToyParams:
    """Stands for a ComfyUI parameter class (``comfy.ldm.<model>.model.<Model>Params``) with a field newer releases
    added (``ComfyParamDefault``)."""
    dim: int = 0
    toy_axes: list | None = None


def config(shapes: Shapes) -> dict:
    dim, in_ch = shapes["toy_in.weight"]
    return {"image_model": "toy", "dim": dim, "in_channels": in_ch, "depth": count_blocks(shapes, "toy_blocks.")}


FAMILIES = (
    Family(
        name="toy-dit", title="Toy DiT",
        aliases=("toydit-1",),
        arch=Architecture(
            diffusers_class="ToyDiTTransformer2DModel",
            diffusers_markers=(("toy_in.weight", "toy_blocks.0.attn.to_q.weight"),),
            comfy_markers=(("toy_in.weight", "toy_blocks.0.attn.qkv.weight"),),
            comfy_model="ToyDiT", comfy_key_map=None, unet_config=config,
            int8_exclude_extra=("toy_in",),
            comfy_params=(ComfyParamDefault("toy.toy_family", "ToyParams", "toy_axes", lambda cfg: [cfg["dim"]]),),
            min_comfy="9.9.0",
        ),
        hosting=Hosting(
            base_repos=("toy-org/Toy-DiT",),
            # the suffix says fp8 first; the repo really holds int8 only
            repos={"unsloth/Toy-DiT-FP8": ("int8",), "unsloth/Toy-DiT-NVFP4": ("nvfp4",)},
            files=(HostedFile("unsloth/Toy-DiT-FP8", "int8", "toy_dit_int8.safetensors"),),
            excluded_bases=("toy-org/toy-dit-raw",),
            convrot_repos=("unsloth/Toy-DiT-FP8",),
            text_encoders=(HostedEncoder("text_encoder", "Qwen3ForCausalLM", "unsloth/Toy-DiT-FP8", "LUMINA2"),),
            shared_encoders={"Qwen3-4B": ("toy-org/toy-dit",)},  # the same Qwen3-4B bytes as Z-Image's
            nvfp4_policies=(
                KnownPolicy("toy_r8_v1", 1, "toy-org/toy-dit", {"nvfp4": 8, "fp8": 4, "bf16": 1},
                            "unsloth/Toy-DiT-NVFP4", replaces=("toy_old_v1",)),
            ),
            video=True,
        ),
    ),
)
