"""The one registry of model families: one module per family in this package, listed once in ``MODULES``.

A family module holds everything about its family: the config derived from its shapes, its own diffusers -> ComfyUI
key map (where ComfyUI has none), and its ``Family(...)`` record(s) in a module-level ``FAMILIES`` tuple (exclude
tokens, hosted repos and variants, minimum ComfyUI). Adding a family whose key map ComfyUI has is one new module,
its name in ``MODULES``, its tiny model (tools/tiny_families.py) and its workflow.

Everything ComfyUI-specific is named here as data (class and key-map names, a config derived from shapes); only
``nodes/comfy_model.py`` resolves those names against the running ComfyUI.
"""
from __future__ import annotations

import importlib
from typing import Mapping

from ..errors import UnknownFamilyError
from ._base import (Family, HostedEncoder, Shapes, base_tail, blocks, count_blocks, first, has_any, normalize_base,
                    schemes_from_suffix)  # noqa: F401 (public names)

# Registration order is detection order (``detect`` takes the first family whose markers match):
# HunyuanVideo 1.5 before HunyuanImage 2.1, as a ComfyUI-layout HunyuanVideo 1.5 file also has HunyuanImage's
# ComfyUI markers.
MODULES = (
    "z_image", "flux1", "flux2", "qwen_image", "lumina2", "hidream", "wan22", "hunyuan_video15", "hunyuan_image",
    "krea2", "qwen_image21", "ltx2", "minimax_h3",
)

# Other names a family goes by (Unsloth's own aliases): accepted wherever a family is named, in a file or a request.
ALIASES = {"ltx-2.3": "ltx-2"}


def canonical(name: str) -> str:
    key = str(name).strip().lower()
    return ALIASES.get(key, key)

FAMILIES: dict[str, Family] = {}
for _mod in MODULES:
    for _f in importlib.import_module(f"{__name__}.{_mod}").FAMILIES:
        if _f.name in FAMILIES:
            raise RuntimeError(f"family '{_f.name}' is registered twice (prequant_core.families.{_mod})")
        FAMILIES[_f.name] = _f


def declared_filenames(repo: str, scheme: str, component: str = "transformer",
                       base_model_id: str | None = None) -> tuple[str, ...]:
    """File names the family hosting ``repo`` declares for ``scheme`` (and ``component``, and the base where the repo
    holds one file per base; tried first), else ()."""
    low = str(repo).strip().lower()
    for fam in FAMILIES.values():
        for r, by_base in fam.variant_filenames.items():
            if r.lower() != low or component != "transformer":
                continue
            names = {b: v[scheme] for b, v in by_base.items() if scheme in v}
            if base_model_id and str(base_model_id).strip():
                hit = [n for b, n in names.items() if normalize_base(b) == normalize_base(base_model_id)
                       or base_tail(b) == base_tail(base_model_id)]
                if hit:
                    return tuple(hit)
            return tuple(names.values())
        if component == "transformer":
            table = fam.hub_filenames
        else:
            table = {r: by_comp.get(component, {}) for r, by_comp in fam.hub_component_filenames.items()}
        for r, by_scheme in table.items():
            if r.lower() == low and scheme in by_scheme:
                return (by_scheme[scheme],)
    return ()


def all_components() -> tuple[str, ...]:
    """Every component a registered family has, ``transformer`` first (the loader's choices)."""
    out = ["transformer"]
    for fam in FAMILIES.values():
        out += [c for c in fam.components if c not in out]
    return tuple(out)


def hosted_schemes(repo: str) -> tuple[str, ...]:
    """The schemes ``repo`` holds, in the order to try them: from the hosting family's table, else from the repo
    name's suffix (empty when neither says)."""
    low = str(repo).strip().lower()
    for fam in FAMILIES.values():
        for r, sch in fam.hosted.items():
            if r.lower() == low:
                return sch
    return schemes_from_suffix(repo)


def video_hosted(repo: str) -> bool:
    """Whether a video family hosts ``repo`` (its files have no ComfyUI-format twins)."""
    low = str(repo).strip().lower()
    return any(r.lower() == low for fam in FAMILIES.values() if fam.video for r in fam.hosted)


def convrot_hosted(repo: str) -> bool:
    low = str(repo).strip().lower()
    return any(r.lower() == low for fam in FAMILIES.values() for r in fam.convrot_repos)


CLASS_TO_FAMILY: dict[str, str] = {}
for _f in FAMILIES.values():  # a class shared by several families (FLUX.2 klein / dev) names the first listed
    CLASS_TO_FAMILY.setdefault(_f.diffusers_class, _f.name)


def get(name: str) -> Family:
    key = canonical(name)
    if key in FAMILIES:
        return FAMILIES[key]
    raise UnknownFamilyError(f"Unknown model family '{name}'.", expected=", ".join(sorted(FAMILIES)), found=str(name),
                             fix="Pick one of the supported families.")


def detect(keys, metadata: Mapping | None = None, path: str | None = None,
           shapes: Shapes | None = None) -> tuple[Family, str]:
    """(family, layout) from metadata, else from the keys (and, where families share their names, the shapes).
    Layout is 'diffusers' or 'comfyui'."""
    metadata = metadata or {}
    keys = list(keys)
    named = metadata.get("family")
    if isinstance(named, str) and canonical(named) in FAMILIES:
        fam = FAMILIES[canonical(named)]
        layout = fam.layout_of(keys)
        if layout:
            return fam, layout
    cls = metadata.get("transformer_class")
    if isinstance(cls, str) and cls in CLASS_TO_FAMILY:
        fam = FAMILIES[CLASS_TO_FAMILY[cls]]
        if fam.layout_of(keys):
            return fam, fam.layout_of(keys)
    matches = [(fam, fam.layout_of(keys)) for fam in FAMILIES.values()]
    matches = [(fam, layout) for fam, layout in matches if layout]
    if shapes:
        for fam, layout in matches:
            if fam.shape_test is not None:
                try:
                    if fam.shape_test(shapes):
                        return fam, layout
                except (KeyError, IndexError, TypeError):
                    pass
    if matches:
        return matches[0]
    raise UnknownFamilyError(
        "Could not tell which model family this checkpoint is.", path=path,
        expected="one of: " + ", ".join(sorted(FAMILIES)),
        found=(f"family '{str(named)[:80]}'" if isinstance(named, str) and named
               else f"{len(keys)} tensors, e.g. {sorted(map(str, keys))[:3]}"),
        fix="Pick the family on the node, or check that the file is a diffusion transformer.")
