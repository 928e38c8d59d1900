"""Family -> ComfyUI's own model class, built on ``meta`` and filled by assignment (never a dense allocation)."""
from __future__ import annotations

import dataclasses
import logging

import torch

import comfy.model_management as mm
import comfy.ops
import comfy.supported_models
import comfy.utils

from prequant_core.families import keymap
from prequant_core.schemes import quantize
from prequant_core.load import placement
from prequant_core.formats.checkpoint import Checkpoint
from prequant_core.errors import CheckpointNotFoundError, ComfyVersionError
from prequant_core.families import Family

from .ops import choose_matmul, is_prequant_linear, make_ops, matmul_summary, set_quantized
from .patcher import patcher_for

log = logging.getLogger("prequant")


def comfy_version() -> str:
    try:
        import comfyui_version
        return str(comfyui_version.__version__)
    except Exception:  # noqa: BLE001 - a distribution without the version file
        return "unknown"


def _older_than(version: str, wanted: str) -> bool:
    """``version`` < ``wanted`` as dotted numbers; False where either does not parse (an unknown version is not
    refused for being old: the class lookup still decides)."""
    def nums(v):
        try:
            return tuple(int(p) for p in str(v).strip().lstrip("v").split(".")[:3])
        except ValueError:
            return None
    a, b = nums(version), nums(wanted)
    return a is not None and b is not None and a < b


def _needs_newer(family: Family, what: str, path: str | None = None) -> ComfyVersionError:
    need = family.arch.min_comfy
    return ComfyVersionError(f"This ComfyUI ({comfy_version()}) {what}; {family.title} needs ComfyUI "
                             f"{need} or newer.", path=path,
                             expected=f"ComfyUI >= {need}", found=f"ComfyUI {comfy_version()}",
                             fix=f"Update ComfyUI to {need} or newer.")


def model_class_for(family: Family, unet_config: dict):
    """The family's class in comfy.supported_models; with several candidates, the first whose own ``unet_config``
    matches (ComfyUI's rule, e.g. FLUX.1 dev vs schnell by the guidance embedder)."""
    found = [c for c in (getattr(comfy.supported_models, n, None) for n in family.comfy_models) if c is not None]
    if not found:
        raise _needs_newer(family, f"has no model class for {family.title} ('{', '.join(family.comfy_models)}')")
    if len(found) == 1:
        return found[0]
    for cls in found:
        if all(unet_config.get(k) == v for k, v in cls.unet_config.items()):
            return cls
    return found[0]


def check_loadable(family: Family) -> None:
    """Refuse, before anything is downloaded or read, a family this ComfyUI (or this pack) cannot build."""
    _check_version(family)
    if family.arch.unet_config is None:
        model_config_for(family, {})
    model_class_for(family, {})


def _check_version(family: Family, path: str | None = None) -> None:
    """Refuse a ComfyUI older than the family's ``min_comfy`` where the version decides (a family not mapped yet, or
    one whose class an older ComfyUI has in another form)."""
    if (family.arch.unet_config is None or family.arch.version_decides) and \
            _older_than(comfy_version(), family.arch.min_comfy):
        # an older ComfyUI may have a class of that name that cannot host this model (0.12.1's LTXAV is LTX-2.0's:
        # 6 modulation rows, no gated attention), so the version decides before the class lookup
        raise _needs_newer(family, f"has no class that hosts {family.title} ('{', '.join(family.comfy_models)}' "
                                   f"as {family.arch.min_comfy} has it)", path)


def _param_fields(module: str, cls: str) -> set:
    import dataclasses
    import importlib
    try:
        return {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), cls))}
    except (ImportError, AttributeError, TypeError):
        return set()


def complete_for_this_comfyui(family: Family, unet_config: dict) -> dict:
    """Fields that a newer ComfyUI's model parameters require and an older one's refuse (the family's
    ``arch.comfy_params``: 0.12.1 added FLUX's ``txt_ids_dims`` and HunyuanVideo's ``meanflow_sum``): set, with the
    value ComfyUI's own detection gives the same weights, only where this ComfyUI's parameter class has the field."""
    cfg = dict(unet_config)
    for p in family.arch.comfy_params:
        if p.field not in cfg and p.field in _param_fields(p.module, p.params):
            cfg[p.field] = p.value(cfg)
    return cfg


def model_config_for(family: Family, tensors: dict, path: str | None = None):
    _check_version(family, path)
    if family.arch.unet_config is None:  # registered for Info / build / Hub / diffusers, not yet mapped into ComfyUI
        model_class_for(family, {})  # this ComfyUI lacks the class: "needs ComfyUI <min_comfy> or newer"
        raise ComfyVersionError(f"This ComfyUI ({comfy_version()}) has the {family.title} class, but this version of "
                                f"ComfyUI-Prequant cannot load {family.title} into it yet.",
                                expected=f"a ComfyUI-Prequant release that maps {family.title}",
                                found=f"ComfyUI {comfy_version()}",
                                fix="Update ComfyUI-Prequant, or load the repo's -ComfyUI twin with ComfyUI's own loader.")
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    unet_config = complete_for_this_comfyui(family, family.config_from_shapes(shapes, path))
    cls = model_class_for(family, unet_config)
    return cls(dict(unet_config)), unet_config


def key_map_for(family: Family, unet_config: dict, path: str | None = None, model_config=None) -> dict | None:
    """The family's diffusers -> ComfyUI map with ComfyUI's row functions named (data); None: same names. With
    ``model_config`` its targets are this ComfyUI's names: the maps name a family's original release (FLUX's q/k norm
    ``.scale``), and ComfyUI's own ``process_unet_state_dict`` says what each version calls them (0.33's RMSNorm
    ``.weight``), in both directions (loading a file, building from a loaded MODEL)."""
    km = family.arch.comfy_key_map
    if km is None:
        return None
    if callable(km):
        out = km(unet_config)
    else:
        fn = getattr(comfy.utils, km, None)
        if fn is None:
            raise _needs_newer(family, f"cannot convert diffusers-layout {family.title} files (no comfy.utils.{km})",
                               path)
        out = keymap.named(fn(unet_config))  # its functions (comfy.utils.swap_scale_shift) by name
    return out if model_config is None else _in_this_comfyuis_names(out, model_config)


def _in_this_comfyuis_names(key_map: dict, model_config) -> dict:
    parsed = keymap.parse_map(key_map)
    names = {t.name: t.name for t in parsed.values()}
    try:  # ComfyUI's renames are key moves: fed the names as values, it says where each one goes
        moved = model_config.process_unet_state_dict(dict(names))
    except Exception:  # noqa: BLE001 - one that looks at values: this ComfyUI renames nothing by name
        return key_map
    rename = {old: new for new, old in moved.items() if isinstance(old, str) and old != new}
    if not rename:
        return key_map
    return {dk: dataclasses.replace(t, name=rename.get(t.name, t.name)) for dk, t in parsed.items()}


def diffusers_to_comfy(family: Family, tensors: dict, unet_config: dict, path: str | None = None, model_config=None,
                       sources: dict | None = None) -> dict:
    """Diffusers-layout tensors under ComfyUI's names (this ComfyUI's, with its ``model_config``); ``sources``
    collects which file tensors each fused weight was made from (a LoRA's backup of them, nodes/patcher.py)."""
    key_map = key_map_for(family, unet_config, path, model_config)
    if key_map is None:
        return dict(tensors)
    tensors, key_map = keymap.apply_row_permutations(tensors, key_map, path=path)
    return keymap.to_comfy(tensors, key_map, path=path, sources=sources)


def check_companion(model, tensors: dict, family: Family, path: str | None = None) -> None:
    """Refuse a file without the weights its family's ComfyUI class holds beside the transformer (LTX-2.3's text
    connectors), naming them: the placement's own check would call it a damaged file, which it is not."""
    c = family.arch.companion
    if c is None or any(k.startswith(c.comfy_prefixes) for k in tensors):
        return
    wanted = [k for k in placement.expected_entries(model) if k.startswith(c.comfy_prefixes)]
    if wanted:
        raise CheckpointNotFoundError(
            f"ComfyUI's {family.comfy_models[0]} runs {c.what} inside its diffusion model; this {family.title} file "
            f"holds the transformer only ({c.where}).", path=path,
            expected=f"{len(wanted)} tensors under {', '.join(c.comfy_prefixes)}", found="none",
            fix=f"Put them into ComfyUI/models/prequant/ as {c.local_name} (the {c.repo_file} of "
                f"{family.hosting.base_repos[0]}); Load Prequant Transformer fetches that file itself otherwise.")


def check_names_match(model, tensors: dict, family: Family, path: str | None = None) -> None:
    """Refuse, as a version mismatch rather than a damaged file, tensors whose names differ from this ComfyUI's
    model only by renames a known ComfyUI release made in this family's model (``family.arch.comfy_renames``: 0.33's
    FLUX q/k norms ``.scale`` -> ``.weight``). Any other difference (a tensor renamed as no release renamed it, one
    missing, one extra) is a damaged file: left to the placement's own check, which names the tensors. Comparing
    module names alone took a damaged file (``q.bias`` stored as ``q.scale``) for a ComfyUI update."""
    expected = set(placement.expected_entries(model))
    missing = sorted(k for k in expected if k not in tensors and k not in (family.arch.fill_missing or {}))
    unexpected = {k for k in tensors if k not in expected}
    if not missing or not unexpected:
        return
    pairs = []  # (this ComfyUI's name, the name given, the rename between them)
    for k in missing:
        module, _, attr = k.rpartition(".")
        hit = next(((f"{module}.{other}", r) for r in family.arch.comfy_renames
                    for other in [r.counterpart(module, attr)] if other and f"{module}.{other}" in unexpected), None)
        if hit is None:
            return
        unexpected.discard(hit[0])
        pairs.append((k, *hit))
    if unexpected:
        return
    ours, theirs, r = pairs[0]
    want, given = ours.rpartition(".")[2], theirs.rpartition(".")[2]
    if want == r.old:  # this ComfyUI predates the rename: the file (or the pack's map) names them as newer ones do
        fix = (f"Update ComfyUI to {r.since} or newer (it names {r.what} '.{r.new}', as given here), or use a file "
               f"written for ComfyUI before {r.since}.")
    else:  # this ComfyUI renamed them and the pack did not carry the names over
        fix = "Update ComfyUI-Prequant (or use the ComfyUI version the pack's README lists as tested)."
    raise ComfyVersionError(
        f"This ComfyUI ({comfy_version()}) names {len(pairs)} of {family.title}'s tensors differently from the "
        f"checkpoint as this pack maps it (e.g. '{ours}' where it gives '{theirs}'): ComfyUI {r.since} renamed "
        f"{r.what} from '.{r.old}' to '.{r.new}'. A ComfyUI and pack version mismatch, not a damaged file.",
        path=path, expected=f"ComfyUI {comfy_version()}'s names ('.{want}')", found=f"'.{given}'", fix=fix)


def build_patcher(family: Family, layout: str, tensors: dict, *, path: str | None = None, dtype=torch.bfloat16,
                  plain: bool = False):
    """Checkpoint tensors (either layout, quantized or a mix) -> a ModelPatcher around ComfyUI's model class."""
    model_config, unet_config = model_config_for(family, tensors, path)
    fused_from_file: dict = {}
    if layout == "comfyui":  # ComfyUI's own renames for original-release names (key moves only)
        tensors = model_config.process_unet_state_dict(dict(tensors))
    else:
        tensors = diffusers_to_comfy(family, tensors, unet_config, path, model_config, fused_from_file)
    load_device = mm.get_torch_device()
    offload_device = mm.unet_offload_device()
    manual_cast = mm.unet_manual_cast(dtype, load_device, model_config.supported_inference_dtypes)
    model_config.set_inference_dtype(dtype, manual_cast)
    base_ops = comfy.ops.manual_cast if manual_cast is not None else comfy.ops.disable_weight_init
    model_config.custom_operations = make_ops(base_ops)
    # Only the diffusion model's layers take device=meta; model_sampling and buffers stay real.
    model = model_config.get_model({}, "", device=torch.device("meta"))
    check_companion(model.diffusion_model, tensors, family, path)
    check_names_match(model.diffusion_model, tensors, family, path)
    held = placement.assign(model.diffusion_model, tensors, path=path, fill_missing=family.arch.fill_missing,
                            hold_quantized=True, cast_plain=dtype)
    for sub, attr, t in held:
        set_quantized(sub, attr, t)
    for key, parts in fused_from_file.items():  # a LoRA's backup of these rows can be the file (nodes/patcher.py)
        mod_name, _, attr = key.rpartition(".")
        sub = model.diffusion_model.get_submodule(mod_name)
        if attr == "weight" and is_prequant_linear(sub):
            sub.prequant_fused_from, sub.prequant_fused_file = parts, path
    placement.check_complete(model.diffusion_model, path)
    # The matmul each quantized Linear runs is fixed now, for the device it will compute on (never mid-sampling).
    matmul = choose_matmul(model.diffusion_model, load_device)
    model.diffusion_model.to(offload_device)
    model.device = offload_device
    size = mm.module_size(model)  # plain int8/fp8 storage: real bytes, not dense-equivalent
    patcher = patcher_for(model, load_device=load_device, offload_device=offload_device, size=size, plain=plain)
    patcher.prequant_matmul = matmul_summary(matmul)
    quantize.release_free_memory()  # the load's temporaries (the file's parsed header, fusing), kept by glibc's heap
    return patcher


def load_checkpoint_as_model(ckpt: Checkpoint, family: Family, layout: str, *, request=None, companion=None):
    """The judged checkpoint -> ComfyUI's MODEL; ``companion`` (``companion_source.Found``): the weights the family's
    class also holds, from their own file (LTX-2.3's text connectors). With the load's ``request``, ComfyUI can load
    the file again itself (``cached_patcher_init``, as its own loaders register): the non-dynamic copy a sampler needs
    for hooked conds under DynamicVRAM, the per-device copies of its multi-GPU nodes."""
    tensors = {**ckpt.tensors, **companion.tensors} if companion is not None else ckpt.tensors
    patcher = build_patcher(family, layout, tensors, path=ckpt.path)
    if request is not None:
        patcher.cached_patcher_init = (reload_patcher, (ckpt.path, request, companion and companion.path))
    return patcher


def reload_patcher(path: str, request, companion_path: str | None = None, disable_dynamic: bool = False):
    """ComfyUI's ``cached_patcher_init`` factory: the file (and its companion's) opened, judged and loaded again
    through the same checks as the node's load (its own folder allowed: the node allowed it before);
    ``disable_dynamic``: a plain ModelPatcher."""
    import os
    from prequant_core.errors import reading
    from prequant_core.load import companion_source
    from prequant_core.load.opening import open_checkpoint
    with torch.inference_mode(False), torch.no_grad():
        opened = open_checkpoint(path, request, model_dirs=[os.path.dirname(os.path.realpath(path))])
        tensors = opened.checkpoint.tensors
        if companion_path:
            tensors = {**tensors, **companion_source.read(opened.family, companion_path)}
        with reading(opened.checkpoint.path, "loaded", parsing=False):
            patcher = build_patcher(opened.family, opened.layout, tensors, path=opened.checkpoint.path,
                                    plain=disable_dynamic)
    patcher.cached_patcher_init = (reload_patcher, (path, request, companion_path))
    return patcher
