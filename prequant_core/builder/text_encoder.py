"""Pre-cast text encoders in Unsloth's format (``unsloth_prequant_text_encoder_state_dict_v1``) from a dense encoder
file: ComfyUI's own (e.g. ``qwen_3_4b.safetensors``) or one with the transformers class's names. The cast is the one
Unsloth's builder applies through diffusers' layerwise casting: every Linear / Conv module's weight and bias stored as
``float8_e4m3fn`` with no scale, except modules whose dotted name matches diffusers' skip patterns (``pos_embed``,
``patch_embed``, ``norm``, ``^proj_in$``, ``^proj_out$``), the encoder's float32-kept modules, its Embeddings and an
output projection tied to the input embedding. Read one tensor at a time; written atomically."""
from __future__ import annotations

import os
import re
from typing import Mapping

import torch

from .. import families
from ..errors import BuildError
from ..families import encoders
from ..formats.checkpoint import LAYERWISE_CAST
from ..formats.dense_sources import SafetensorsSource
from ..text_encoders.checks import STORAGE_DTYPE
from . import writers
from .recipe import Target

SKIP_PATTERNS = ("pos_embed", "patch_embed", "norm", "^proj_in$", "^proj_out$")


def cast_keys(kind: encoders.EncoderKind, shapes: Mapping[str, tuple]) -> set[str]:
    """The keys (transformers names) the layerwise cast stores as float8: a module's weight and bias when the module
    is a Linear / Conv (its weight has 2 or more dimensions) that no skip rule names."""
    tied_out = {k.rsplit(".", 1)[0] if "." in k else "" for k, _ in kind.tied if k.startswith("lm_head")}
    skip = SKIP_PATTERNS + tuple(re.escape(m) for m in kind.keep_dense) + tuple(f"^{re.escape(m)}$" for m in tied_out)
    out = set()
    for k, shape in shapes.items():
        mod, _, attr = k.rpartition(".")
        if attr not in ("weight", "bias"):
            continue
        if any(re.search(p, mod) for p in skip) or mod.rsplit(".", 1)[-1] in kind.embeddings:
            continue
        weight = shapes.get(f"{mod}.weight")
        if weight is not None and len(weight) >= 2:
            out.add(k)
    return out


def _encoder_for(family: str, component: str | None) -> tuple[families.Family, families.HostedEncoder]:
    fam = families.get(family)
    for e in fam.hosting.text_encoders:
        if component in (None, "auto", e.component):
            return fam, e
    raise BuildError(f"{fam.title} has no hosted text encoder" + (f" named {component}" if component else "") + ".",
                     expected=", ".join(e.component for e in fam.hosting.text_encoders) or "a family with one",
                     found=str(component), fix="Pick the family's encoder component, or another family.")


def _writable(family: str, component: str | None, input_path: str | None):
    """The family's hosted encoder, when this builder writes its form (the fp8 layerwise cast)."""
    fam, hosted = _encoder_for(family, component)
    kind = encoders.for_class(hosted.te_class)
    if hosted.scheme == "fp8" and not kind.hostable:
        raise BuildError(f"{fam.title}'s {hosted.component} is a {kind.name}, which this pack does not build yet (no "
                         f"map to ComfyUI {kind.min_comfy}'s class); nothing was written.", path=input_path,
                         expected="a family whose encoder the node can load", found=f"{fam.name}: {kind.name}",
                         fix=f"Use Unsloth's hosted file from {hosted.repo}.")
    if hosted.scheme != "fp8":
        raise BuildError(f"{fam.title}'s {hosted.component} ({kind.name}) is hosted as an {hosted.scheme} ConvRot "
                         "file, which this builder does not write (it writes the fp8 layerwise cast); nothing was "
                         "written.", path=input_path, expected="a family whose encoder is hosted as fp8",
                         found=f"{fam.name}: {hosted.scheme}",
                         fix=f"Use Unsloth's {hosted.filename or 'hosted file'} from {hosted.repo}.")
    return fam, hosted, kind


def build_text_encoder(input_path: str, target: Target, *, family: str, component: str | None = None,
                       base_model_id: str | None = None, progress=None) -> str:
    """From a dense encoder file (ComfyUI's own, or one with the transformers class's names); the target's container
    None: safetensors."""
    _writable(family, component, input_path)  # before the input is opened
    return build_text_encoder_from(SafetensorsSource([os.path.abspath(input_path)], path=input_path), target,
                                   family=family, component=component, base_model_id=base_model_id, progress=progress)


def detect_comfy_encoder(keys) -> tuple[encoders.EncoderKind, str] | None:
    """The encoder a ComfyUI state dict holds (a ``CLIP``'s in-memory weights), and the prefix its keys carry there
    before ComfyUI's file names (``gemma2_2b.transformer.``): the first kind whose markers all stand under one
    prefix."""
    keys = list(keys)
    for kind in encoders.KINDS:
        if not kind.hostable or not kind.markers:
            continue
        first = kind.markers[0]
        for k in keys:
            if k.endswith(first):
                prefix = k[: -len(first)]
                if all(prefix + m in keys for m in kind.markers):
                    return kind, prefix
    return None


def family_for_kind(kind: encoders.EncoderKind) -> str | None:
    """The first family whose hosted encoder is this kind."""
    for fam in families.FAMILIES.values():
        if any(e.te_class in kind.te_classes for e in fam.hosting.text_encoders):
            return fam.name
    return None


def build_text_encoder_from(src, target: Target, *, family: str, component: str | None = None,
                            base_model_id: str | None = None, progress=None) -> str:
    """From a dense source (``formats.dense_sources``: a file, or a ``CLIP``'s weights in memory; its ``path`` names it
    in errors) holding ComfyUI's names or the transformers class's; the target's container None: safetensors."""
    input_path = getattr(src, "path", None)
    fam, hosted, kind = _writable(family, component, input_path)
    infos = src.infos()
    wrong = kind.mismatches(infos)
    if wrong:  # the input is another encoder: refused before anything is cast or written under this family's name
        other = encoders.identify(infos)
        home = family_for_kind(other) if other is not None else None
        raise BuildError(f"The input is not a {kind.name}, which is {fam.title}'s {hosted.component}; nothing was "
                         "written.", path=input_path, expected=f"a {kind.name} ({hosted.te_class})",
                         found=(f"a {other.name}: " if other is not None else "") + "; ".join(wrong),
                         fix=(f"Pick the family whose encoder it is ({home})" if home else
                              "Pick the family whose encoder it is") + ", or give this family's own encoder.")
    comfy_names = not kind.missing_markers(infos)
    rename = kind.from_comfy if comfy_names else str
    shapes = {rename(k): tuple(i.shape) for k, i in infos.items() if k not in ("spiece_model", "tekken_model")}
    for copy, of in kind.tied:
        if copy not in shapes and of in shapes:
            shapes[copy] = shapes[of]
    if not any(k.rsplit(".", 2)[-2] in kind.embeddings for k in shapes if k.count(".") >= 1):
        raise BuildError(f"The input has no token embedding ({' / '.join(kind.embeddings)}): a {kind.name} without "
                         "it cannot encode a prompt; nothing was written.", path=input_path,
                         expected=f"the encoder's full state dict, with its {kind.embeddings[0]}",
                         found=f"{len(shapes)} tensors without one", fix="Build from the complete encoder file.")
    lacking = [k for k in kind.needs if k not in shapes]
    if lacking:
        raise BuildError(f"The input has no {', '.join(lacking)}, which Unsloth's loader needs for a {kind.name} "
                         f"({hosted.te_class}); nothing was written.", path=input_path,
                         expected="the encoder's full state dict (the transformers checkpoint's weights)",
                         found=f"{len(shapes)} tensors without {', '.join(lacking)} (ComfyUI's files drop it)",
                         fix="Build from the model repo's own text-encoder weights (e.g. a merged shard file).")
    to_cast = cast_keys(kind, shapes)
    out: dict = {}
    total = len(infos)
    for i, (k, t) in enumerate(src.items()):
        if k in ("spiece_model", "tekken_model"):
            continue
        name = rename(k)
        if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise BuildError(f"Tensor '{k[:80]}' is {str(t.dtype).replace('torch.', '')}: the input must be a dense "
                             "(bf16 / fp16 / fp32) encoder.", path=input_path, fix="Use the dense encoder file.")
        t = t.to(torch.bfloat16)  # Unsloth's builder loads the encoder in bf16 before casting
        out[name] = t.to(STORAGE_DTYPE) if name in to_cast else t
        if progress:
            progress("cast", i + 1, total, name)
    for copy, of in kind.tied:
        if copy not in out and of in out:
            out[copy] = out[of]
    meta = {"base_model_id": base_model_id or fam.hosting.base_repos[0], "family": fam.name, "scheme": "fp8",
            "component": hosted.component, "te_class": hosted.te_class, "torch_dtype": "bfloat16",
            "cast_backend": LAYERWISE_CAST, "torch_version": str(torch.__version__)}
    try:
        import transformers
        meta["transformers_version"] = str(transformers.__version__)
    except ImportError:
        pass
    return writers.write_checkpoint(target.dest, out, meta, container=target.container or "safetensors",
                                    overwrite=target.overwrite, progress=progress)


def default_filename(family: str, component: str | None, container: str) -> str:
    from ..text_encoders import sources as encoder_sources
    _, hosted = _encoder_for(family, component)
    ext = ".pt" if container == "pt" else ".safetensors"
    return next(n for n in encoder_sources.filenames(hosted.repo, hosted.component, "fp8") if n.endswith(ext))
