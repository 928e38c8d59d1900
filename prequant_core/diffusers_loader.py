"""Pre-quantized transformers straight into diffusers' own classes, for people who script diffusers pipelines.

    from diffusers import FluxPipeline, FluxTransformer2DModel
    from prequant_core.diffusers_loader import load_transformer
    transformer = load_transformer(FluxTransformer2DModel, "black-forest-labs/FLUX.1-dev",
                                   "unsloth/FLUX.1-dev-FP8", scheme="fp8", device="cuda")
    pipe = FluxPipeline.from_pretrained("black-forest-labs/FLUX.1-dev", transformer=transformer, ...)

The same steps as Unsloth Studio's loader: the skeleton is built on ``meta`` with accelerate's ``init_empty_weights``
+ ``from_config`` (no dense allocation), the file's tensors go in with ``load_state_dict(strict=True, assign=True)``,
non-persistent buffers (computed, not stored, e.g. rotary or timestep frequencies) are made real on the CPU, then
``eval()`` and the device. Where the file comes from and whether it fits are decided exactly as for the ComfyUI node:
the same allowlist for local files, the same Hub filename chain and fallback (``sources`` / ``hub``), the same
validation (``metadata.validate``, fp8 kernels pinned to TORCH). Every failure is a typed ``PrequantError`` naming
the file, what was expected, what was found and what to do; nothing returns None.

``diffusers`` and ``accelerate`` are an optional extra (``requirements-diffusers.txt``); they are imported here only,
when a function of this module is called, and never by the ComfyUI nodes.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Mapping

import torch

from . import families
from .families.hub_names import normalize_repo
from .load import opening, pipeline, sources
from .request import Candidates, Request
from .context import LoadContext
from .schemes import qtensor, registry
from .errors import (CheckpointNotFoundError, CorruptCheckpointError, DependencyError, PrequantError,
                     UnknownFamilyError, UnsupportedFormatError)

EXTRA = "pip install -r requirements-diffusers.txt  (diffusers and accelerate)"


@dataclasses.dataclass
class Loaded:
    """What ``load`` returns: the model plus where it came from and what validation said."""
    model: torch.nn.Module
    path: str
    family: str
    scheme: str | None
    source: str  # "local" or "hub:<repo>@<revision>/<filename>"
    notes: list[str]


def _need(module: str):
    try:
        return __import__(module)
    except ImportError as e:
        raise DependencyError(f"The diffusers loader needs the '{module}' package.", expected=f"{module} installed",
                              found=f"ImportError: {e}", fix=EXTRA) from None


def _transformer_class(transformer_class) -> type:
    if isinstance(transformer_class, type):
        return transformer_class
    diffusers = _need("diffusers")
    cls = getattr(diffusers, str(transformer_class), None)
    if not isinstance(cls, type):
        raise UnsupportedFormatError(f"diffusers {diffusers.__version__} has no class '{transformer_class}'.",
                                     expected="a diffusers transformer class, e.g. FluxTransformer2DModel",
                                     found=str(transformer_class),
                                     fix="Pass the class itself, or update diffusers (Krea2Transformer2DModel and "
                                         "QwenImage21Transformer2DModel need diffusers 0.41 or newer).")
    return cls


def _family_for(cls: type, family: str | None, base_id: str) -> families.Family:
    """The family to plan Hub sources with. Several share a class (FLUX.2 klein / dev): the one whose base repo names
    the same model as ``base_id``, else the first. Validation uses the family the file records, unless ``family``
    is given."""
    if family:
        fam = families.get(family)
        if fam.arch.diffusers_class != cls.__name__:
            raise UnknownFamilyError(f"Family '{fam.name}' loads into {fam.arch.diffusers_class}, not {cls.__name__}.",
                                     expected=fam.arch.diffusers_class, found=cls.__name__,
                                     fix="Pass the family's diffusers class, or leave family empty.")
        return fam
    cands = [f for f in families.FAMILIES.values() if f.arch.diffusers_class == cls.__name__]
    if not cands:
        raise UnknownFamilyError(f"No registered family loads into {cls.__name__}.",
                                 expected=", ".join(sorted({f.arch.diffusers_class
                                                            for f in families.FAMILIES.values()})),
                                 found=cls.__name__, fix="Use one of the listed classes.")
    if len(cands) == 1:
        return cands[0]
    for f in cands:
        if any(families.base_tail(b) == families.base_tail(base_id) for b in f.hosting.base_repos):
            return f
    return cands[0]


def _config(cls: type, base: str, subfolder: str | None, revision: str | None, token: str | None) -> dict:
    """The transformer's config from a local folder (``<base>/<subfolder>/config.json`` or ``<base>/config.json``) or a
    Hub repo id (diffusers' own download of config.json only)."""
    local = os.path.isdir(os.path.expanduser(str(base)))
    try:
        if local:
            root = os.path.expanduser(str(base))
            sub = subfolder if subfolder and os.path.isfile(os.path.join(root, subfolder, "config.json")) else None
            if sub is None and not os.path.isfile(os.path.join(root, "config.json")):
                raise CheckpointNotFoundError(
                    "The base folder has no transformer config.", path=root,
                    expected=f"{os.path.join(root, subfolder or '', 'config.json')} or {os.path.join(root, 'config.json')}",
                    found="neither file", fix="Point base at the model folder (the one holding transformer/config.json).")
            return cls.load_config(root, subfolder=sub)
        return cls.load_config(str(base), subfolder=subfolder, revision=revision, token=token)
    except PrequantError:
        raise
    except Exception as e:  # noqa: BLE001 - diffusers raises OSError / EnvironmentError / HTTP errors alike
        raise CheckpointNotFoundError(f"Could not read the transformer config of base '{base}'.",
                                      expected=f"{'a folder' if local else 'a Hub repo'} with "
                                               f"{(subfolder + '/') if subfolder else ''}config.json",
                                      found=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}",
                                      fix="Check the base repo id / folder (and HF_TOKEN for gated repos).") from None


def _looks_like_repo(source: str) -> bool:
    try:
        normalize_repo(source)
        return True
    except PrequantError:
        return False


def _candidates(source: str | None, fam: families.Family, *, scheme, base_id, variant,
                revision) -> Candidates:
    """A local file (allowlist applies, never replaced by a download), else a Hub repo, else the family's hosted repo
    for ``scheme`` (with the base picking the variant): the ComfyUI node's order."""
    src = None if source is None else os.fspath(source)
    is_file = src is not None and (os.path.exists(os.path.expanduser(src)) or src.endswith((".safetensors", ".pt"))
                                   or not _looks_like_repo(src))
    return sources.plan(sources.Wanted(path=src if is_file else None, hub_repo=None if is_file else src,
                                       family=fam.name, scheme=scheme, variant=variant, base_model_id=base_id,
                                       revision=revision))


def _rebuild_non_persistent_buffers(model: torch.nn.Module, path: str) -> None:
    """Non-persistent buffers (rotary / timestep frequencies) are not in the file: they are what the class computes.
    The skeleton is built with ``init_empty_weights(include_buffers=False)``, so the class computes them for real on
    the CPU (in its own dtype, as ``from_pretrained`` leaves them) and they move with the model; a parameter or buffer
    still on ``meta`` after the strict load cannot be rebuilt and is refused."""
    persistent = set(model.state_dict(keep_vars=True))
    left = [n for n, b in model.named_buffers() if b.is_meta and n not in persistent]
    left += [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise CorruptCheckpointError(f"{len(left)} model tensors are neither in the file nor computed by the class: "
                                     f"{', '.join(left[:5])}", path=path,
                                     fix="Update diffusers to the version the file was built with.")


def load(transformer_class, base: str, source: str | os.PathLike | None = None, *, scheme: str | None = None,
         device: str | torch.device = "cpu", family: str | None = None, base_model_id: str | None = None,
         min_features: int | None = None, component: str = "transformer", fast_accum: bool | None = None,
         subfolder: str | None = "transformer", variant: str | None = None, revision: str | None = None,
         token: str | None = None, allow_dirs: Iterable[str] = (), memory_guard: bool = True,
         progress: Any = None) -> Loaded:
    """Load a pre-quantized transformer into ``transformer_class`` (the class or its name in ``diffusers``).

    A library's public entry, in the manner of diffusers' ``from_pretrained``: two required arguments and one
    keyword per option a caller may set (the options the node takes as inputs); inside, they become one request, one
    load context and one plan.

    ``base``: the base model (Hub repo id or local folder) whose transformer config builds the skeleton; its id (or
    the folder's last part) is the base the file must record, unless ``base_model_id`` names it. ``source``: a local
    file (inside ``allow_dirs`` or ``PREQUANT_ALLOW_LOCAL_PATH`` / ``UNSLOTH_ALLOW_LOCAL_PREQUANT_PATH``), a Hub repo
    id (``unsloth/FLUX.1-dev-FP8``), or None for the family's hosted repo for ``scheme``.
    """
    cls = _transformer_class(transformer_class)
    accelerate = _need("accelerate")
    base_id = base_model_id or str(base)
    fam = _family_for(cls, family, base_id)
    cands = _candidates(source, fam, scheme=scheme, base_id=base_id, variant=variant, revision=revision)
    request = Request(scheme=scheme, base_model_id=base_id, min_features=min_features,
                               family=fam.name if family else None, component=component, fast_accum=fast_accum)
    ctx = LoadContext.of(model_dirs=allow_dirs, token=token, progress=progress,
                         memory=opening.GUARD if memory_guard else None)
    routed = pipeline.run(cands, request, ctx)
    located, opened, notes = routed.located, routed.route.opened, list(cands.notes)
    ck = opened.checkpoint
    fam = opened.family
    want = fam.arch.diffusers_class
    if want != cls.__name__:
        raise UnknownFamilyError(f"This file is {fam.title}, which loads into {want}, not "
                                 f"{cls.__name__}.", path=ck.path, expected=cls.__name__, found=want,
                                 fix=f"Use {want} (and its base) for this file.")
    if opened.layout != "diffusers":
        raise UnsupportedFormatError("This file uses ComfyUI's key names; a diffusers class needs diffusers names.",
                                     path=ck.path, expected="a diffusers-layout file (Unsloth's main files, or one "
                                     "written by Build Prequant Checkpoint)", found=f"{opened.layout} layout",
                                     fix="Use the repo's main file, not its -ComfyUI twin.")
    config = _config(cls, str(base), subfolder, None, token)  # ``revision`` pins the pre-quantized source, not the base
    with accelerate.init_empty_weights():  # parameters on meta; buffers computed for real on the CPU
        model = cls.from_config(config)
    if fam.arch.diffusers_prepare is not None:
        try:
            if fam.arch.diffusers_prepare(model, ck.metadata):  # the file's weights are another form of the class
                notes.append(f"{fam.title}: the skeleton reshaped to the form the file records "
                             f"({', '.join(f'{k} {ck.metadata[k]}' for k in ('adaln_form', 'curve_dim', 'curve_grid') if k in ck.metadata)})")
        except ValueError as e:
            raise CorruptCheckpointError(f"The file records a form of {fam.title} that {cls.__name__} from base "
                                         f"'{base}' cannot take ({e}).", path=ck.path,
                                         fix="Check that base and file are the same model.") from None
    try:
        model.load_state_dict(ck.tensors, strict=True, assign=True)
    except RuntimeError as e:
        raise CorruptCheckpointError(f"The file's tensors do not fit {cls.__name__} built from base '{base}'.",
                                     path=ck.path, expected=f"exactly the state dict of {cls.__name__}",
                                     found=" ".join(str(e).split())[:600],
                                     fix="Check that base and file are the same model and size.") from None
    _rebuild_non_persistent_buffers(model, ck.path)
    model = model.eval().to(device)
    # read from the file's tensors: assigning them as Parameters drops the attribute that marks a rotated weight
    rotations = {k[:-len(".weight")]: g for k, v in ck.tensors.items()
                 if qtensor.is_quantized(v) and (g := qtensor.parts(v)[1].rotation)}
    notes = notes + attach_layer_formats(model, device, rotations)
    f = located.fetched
    where = f"hub:{f.repo}@{f.revision}/{f.filename}" if f else "local"
    return Loaded(model, ck.path, fam.name, metadata_scheme(ck), where, notes + list(opened.verdict.notes))


def attach_layer_formats(model: torch.nn.Module, device, rotations: Mapping[str, int] | None = None) -> list[str]:
    """What torchao's own Linear dispatch does not do for these files: ConvRot layers (``rotations``: module name
    -> group) rotate their input (a forward pre-hook), and NVFP4 / MX weights on a device without their kernels
    dequantize at matmul time (the layer's forward). Returns notes saying what was attached."""
    from .schemes import devices, rotation
    dev = devices.describe(device)
    rotations = dict(rotations or {})
    rotated = dequant = 0
    for name, m in model.named_modules():
        w = getattr(m, "weight", None)
        if not isinstance(m, torch.nn.Linear) or not qtensor.is_quantized(w):
            continue
        spec = qtensor.parts(w)[1]
        group = rotations.get(name) or spec.rotation
        if group:
            m.register_forward_pre_hook(lambda mod, args, g=group: (rotation.rotate(args[0], g), *args[1:]))
            rotated += 1
        if registry.codec(spec.kind).block and devices.choose(spec.kind, spec.dynamic, dev).path == \
                devices.WEIGHT_ONLY:
            m.forward = lambda x, mod=m: torch.nn.functional.linear(
                x, qtensor.dequantize_parts(*qtensor.parts(mod.weight), x.dtype), mod.bias)
            dequant += 1
    notes = []
    if rotated:
        notes.append(f"{rotated} ConvRot layers rotate their input (block Hadamard)")
    if dequant:
        notes.append(f"{dequant} NVFP4 / MX layers dequantize at matmul time on {dev.label()} (no native kernels)")
    return notes


def metadata_scheme(ck) -> str | None:
    s = ck.metadata.get("scheme")
    return s if isinstance(s, str) else (next(iter(ck.schemes_found())) if len(ck.schemes_found()) == 1 else None)


def load_transformer(transformer_class, base: str, source: str | os.PathLike | None = None, **kw) -> torch.nn.Module:
    """``load(...).model``: the transformer, ready for a diffusers pipeline."""
    return load(transformer_class, base, source, **kw).model
