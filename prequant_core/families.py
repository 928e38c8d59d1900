"""The one registry of model families. Adding a family is one ``Family(...)`` entry plus its test.

Everything ComfyUI-specific is named here as data (class and key-map names, a config derived from shapes); only
``nodes/comfy_model.py`` resolves those names against the running ComfyUI.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Mapping

from .errors import UnknownFamilyError

Shapes = Mapping[str, tuple]


def count_blocks(shapes: Shapes, prefix: str) -> int:
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    idx = {int(m.group(1)) for k in shapes for m in [pat.match(k)] if m}
    return max(idx) + 1 if idx else 0


Marker = "str | tuple[str, ...]"  # a key, or keys that must all be present


def _has(keys: set, marker) -> bool:
    return all(k in keys for k in ((marker,) if isinstance(marker, str) else marker))


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    title: str
    diffusers_class: str
    base_repos: tuple[str, ...]
    hosted_repos: tuple[str, ...]
    int8_exclude_extra: tuple[str, ...]
    diffusers_markers: tuple  # keys only a diffusers-layout file of this family has (a key, or a tuple: all of them)
    comfy_markers: tuple  # the same for a ComfyUI-layout file; empty where both layouts are the same
    # Class name(s) in comfy.supported_models. Several: the first whose own ``unet_config`` matches the derived config
    # (ComfyUI's own rule), e.g. FLUX.1 dev (guidance embedder) vs schnell (none).
    comfy_model: str | tuple[str, ...]
    # diffusers -> ComfyUI key map, {diffusers key: comfy key | (comfy key, (0, offset, length)) | (.., .., permutation)}:
    # a str names a function in comfy.utils taking the unet config (ComfyUI's own map), a callable is our own map in
    # prequant_core.keymaps, None means the diffusers names already are ComfyUI's.
    comfy_key_map: str | Callable[[Mapping], dict] | None
    comfy_unet_config: Callable[[Shapes, dict], dict]  # ComfyUI unet config from the file's shapes (either layout)
    # Skeleton entries a checkpoint may lack because ComfyUI's module has them but never uses them.
    fill_missing: Mapping[str, str] = dataclasses.field(default_factory=dict)
    min_comfy: str = "0.3.75"  # oldest ComfyUI whose model class runs this family

    @property
    def comfy_models(self) -> tuple[str, ...]:
        return (self.comfy_model,) if isinstance(self.comfy_model, str) else tuple(self.comfy_model)

    def layout_of(self, keys) -> str | None:
        keys = set(keys)
        if any(_has(keys, m) for m in self.diffusers_markers):
            return "diffusers"
        if any(_has(keys, m) for m in self.comfy_markers):
            return "comfyui"
        return None


def first(shapes: Shapes, *keys: str) -> tuple:
    """Shape of the first key present: configs are derived from files in either key layout."""
    for k in keys:
        if k in shapes:
            return shapes[k]
    raise KeyError(keys[0])


def _z_image_config(shapes: Shapes, meta: dict) -> dict:
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


FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family(
        name="z-image", title="Z-Image", diffusers_class="ZImageTransformer2DModel",
        base_repos=("Tongyi-MAI/Z-Image-Turbo",), hosted_repos=("unsloth/Z-Image-Turbo-FP8",),
        int8_exclude_extra=(),
        diffusers_markers=("all_x_embedder.2-1.weight", "layers.0.attention.to_q.weight"),
        comfy_markers=("x_embedder.weight", "layers.0.attention.qkv.weight"),
        comfy_model="ZImage", comfy_key_map="z_image_to_diffusers", comfy_unet_config=_z_image_config,
        fill_missing={"norm_final.weight": "ones"},
    ),
]}

CLASS_TO_FAMILY = {f.diffusers_class: f.name for f in FAMILIES.values()}


def get(name: str) -> Family:
    key = str(name).strip().lower()
    if key in FAMILIES:
        return FAMILIES[key]
    raise UnknownFamilyError(f"Unknown model family '{name}'.", expected=", ".join(sorted(FAMILIES)), found=str(name),
                             fix="Pick one of the supported families.")


def detect(keys, metadata: Mapping | None = None, path: str | None = None) -> tuple[Family, str]:
    """(family, layout) from metadata, else from the keys. Layout is 'diffusers' or 'comfyui'."""
    metadata = metadata or {}
    keys = list(keys)
    named = metadata.get("family")
    if isinstance(named, str) and named.strip().lower() in FAMILIES:
        fam = FAMILIES[named.strip().lower()]
        layout = fam.layout_of(keys)
        if layout:
            return fam, layout
    cls = metadata.get("transformer_class")
    if isinstance(cls, str) and cls in CLASS_TO_FAMILY:
        fam = FAMILIES[CLASS_TO_FAMILY[cls]]
        if fam.layout_of(keys):
            return fam, fam.layout_of(keys)
    for fam in FAMILIES.values():
        layout = fam.layout_of(keys)
        if layout:
            return fam, layout
    raise UnknownFamilyError(
        "Could not tell which model family this checkpoint is.", path=path,
        expected="one of: " + ", ".join(sorted(FAMILIES)),
        found=(f"family '{named}'" if named else f"{len(keys)} tensors, e.g. {sorted(keys)[:3]}"),
        fix="Pick the family on the node, or check that the file is a diffusion transformer.")
