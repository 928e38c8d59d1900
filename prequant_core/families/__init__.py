"""The one registry of model families: one module per family in this package, listed once in ``MODULES``.

A family module holds every fact about its family, in its ``Family(...)`` record(s) (a module-level ``FAMILIES``
tuple): the architecture (``Architecture``: markers, classes, the config derived from its shapes, its own diffusers ->
ComfyUI key map where ComfyUI has none, ComfyUI's renames and parameter defaults, minimum ComfyUI) and the hosting
(``Hosting``: base repos, Unsloth's hosted repos and the file names they declare, excluded bases, hosted text
encoders and the bases sharing their bytes, Unsloth's NVFP4 layer policies). Every table keyed by family elsewhere
is read from here (``nvfp4_policies``, ``encoder_groups``, ``aliases``, ``declared_filenames`` ...). Adding a family
is one new module and its name in ``MODULES`` (tests/families/test_family_registry.py); docs/DEVELOPING.md lists the files
outside the pack its tests ask for (its tiny model, its workflow, ...).

Everything ComfyUI-specific is named here as data (class and key-map names, a config derived from shapes, parameter
defaults); only ``nodes/comfy_model.py`` resolves those names against the running ComfyUI.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Iterable, Mapping

from ..errors import UnknownFamilyError
from ._base import (Architecture, ComfyParamDefault, Family, HostedEncoder, HostedFile, Hosting, KnownPolicy, Shapes,
                    base_matches, base_tail, blocks, count_blocks, first, has_any, normalize_base,
                    schemes_from_suffix)  # noqa: F401 (public names)

# Registration order is detection order (``detect`` takes the first family whose markers match):
# HunyuanVideo 1.5 before HunyuanImage 2.1, as a ComfyUI-layout HunyuanVideo 1.5 file also has HunyuanImage's
# ComfyUI markers. A name with a dot is a full module path (tests/toy/toy_family.py).
MODULES = (
    "z_image", "flux1", "flux2", "qwen_image", "lumina2", "hidream", "wan22", "hunyuan_video15", "hunyuan_image",
    "krea2", "qwen_image21", "ltx2", "minimax_h3",
)


def _policies(fams: Iterable[Family]) -> dict[str, KnownPolicy]:
    out: dict[str, KnownPolicy] = {}
    for f in fams:
        for p in f.hosting.nvfp4_policies:
            if p.policy_id in out:
                raise RuntimeError(f"NVFP4 policy '{p.policy_id}' is listed twice (families {out[p.policy_id].family} "
                                   f"and {f.name})")
            out[p.policy_id] = dataclasses.replace(p, family=f.name)
    return out


def load(modules: Iterable[str]) -> dict[str, Family]:
    """{name: Family} of ``modules``, in their order; a family, alias or NVFP4 policy id named twice is refused."""
    out: dict[str, Family] = {}
    names: set = set()
    for mod in modules:
        path = mod if "." in mod else f"{__name__}.{mod}"
        for f in importlib.import_module(path).FAMILIES:
            for n in (f.name, *f.aliases):
                if n in names:
                    raise RuntimeError(f"family name '{n}' is registered twice ({path})")
                names.add(n)
            out[f.name] = f
    _policies(out.values())  # refuses a policy id listed twice
    return out


FAMILIES: dict[str, Family] = load(MODULES)


def aliases() -> dict[str, str]:
    """{other name: family} for the names a family goes by besides its own (Unsloth's: ``ltx-2.3`` for ``ltx-2``),
    accepted wherever a family is named, in a file or a request."""
    return {a: f.name for f in FAMILIES.values() for a in f.aliases}


def canonical(name: str) -> str:
    key = str(name).strip().lower()
    return aliases().get(key, key)


def nvfp4_policies() -> dict[str, KnownPolicy]:
    """{policy id: KnownPolicy} of every family's NVFP4 layer policies (Unsloth's NVFP4_POLICIES), each naming the
    family whose record lists it (formats/layer_policy checks a v3 file against them)."""
    return _policies(FAMILIES.values())


def retired_nvfp4_policies() -> dict[str, str]:
    """{retired policy id: the id whose hosted file replaced the files built with it}."""
    return {old: p.policy_id for p in nvfp4_policies().values() for old in p.replaces}


def encoder_groups() -> tuple[frozenset, ...]:
    """The groups of bases whose text-encoder weights are byte-identical (each family's ``hosting.shared_encoders``,
    the bases under one label joined across families): one pre-cast encoder file serves every base of its group."""
    groups: dict[str, set] = {}
    for f in FAMILIES.values():
        for label, bases in f.hosting.shared_encoders.items():
            groups.setdefault(label, set()).update(normalize_base(b) for b in bases)
    return tuple(frozenset(g) for g in groups.values())


def declared_filenames(repo: str, scheme: str, component: str = "transformer",
                       base_model_id: str | None = None) -> tuple[str, ...]:
    """File names the family hosting ``repo`` declares for ``scheme`` (and ``component``, and the base where the repo
    holds one file per base; tried first), else ()."""
    low = str(repo).strip().lower()
    for fam in FAMILIES.values():
        rows = [f for f in fam.hosting.files if f.repo.lower() == low and f.component == component]
        if any(f.base is not None for f in rows):  # one file per base: the requested base picks its own
            names = {f.base: f.filename for f in rows if f.scheme == scheme}
            if base_model_id and str(base_model_id).strip():
                hit = [n for b, n in names.items() if normalize_base(b) == normalize_base(base_model_id)
                       or base_tail(b) == base_tail(base_model_id)]
                if hit:
                    return tuple(hit)
            return tuple(names.values())
        for f in rows:
            if f.scheme == scheme:
                return (f.filename,)
    return ()


def all_components() -> tuple[str, ...]:
    """Every component a registered family has, ``transformer`` first (the loader's choices)."""
    out = ["transformer"]
    for fam in FAMILIES.values():
        out += [c for c in fam.arch.components if c not in out]
    return tuple(out)


def hosted_schemes(repo: str) -> tuple[str, ...]:
    """The schemes ``repo`` holds, in the order to try them: from the hosting family's table, else from the repo
    name's suffix (empty when neither says)."""
    low = str(repo).strip().lower()
    for fam in FAMILIES.values():
        for r, sch in fam.hosting.hosted.items():
            if r.lower() == low:
                return sch
    return schemes_from_suffix(repo)


def video_hosted(repo: str) -> bool:
    """Whether a video family hosts ``repo`` (its files have no ComfyUI-format twins)."""
    low = str(repo).strip().lower()
    return any(r.lower() == low for fam in FAMILIES.values() if fam.hosting.video for r in fam.hosting.hosted)


def convrot_hosted(repo: str) -> bool:
    low = str(repo).strip().lower()
    return any(r.lower() == low for fam in FAMILIES.values() for r in fam.hosting.convrot_repos)


def classes() -> dict[str, str]:
    """{diffusers class: family}; a class shared by several families (FLUX.2 klein / dev) names the first listed."""
    out: dict[str, str] = {}
    for f in FAMILIES.values():
        out.setdefault(f.arch.diffusers_class, f.name)
    return out


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
    by_class = classes()
    if isinstance(cls, str) and cls in by_class:
        fam = FAMILIES[by_class[cls]]
        if fam.layout_of(keys):
            return fam, fam.layout_of(keys)
    matches = [(fam, fam.layout_of(keys)) for fam in FAMILIES.values()]
    matches = [(fam, layout) for fam, layout in matches if layout]
    if shapes:
        for fam, layout in matches:
            if fam.arch.shape_test is not None:
                try:
                    if fam.arch.shape_test(shapes):
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
