"""What makes a pre-cast text-encoder file loadable for a request: Unsloth's checks (format tag, scheme, component,
base model with its equivalence groups, ``te_class``) and this pack's (a class it can hand to ComfyUI, the family's
own encoder, fp8 layerwise storage and nothing torchao)."""
from __future__ import annotations

import torch

from .. import families
from ..families import HostedEncoder, base_tail, normalize_base
from ..families import encoders as kinds
from ..formats.checkpoint import KNOWN_FORMATS, LAYERWISE_CAST, TEXT_ENCODER_FORMAT_V1
from ..schemes import qtensor
from .metadata import Request, Verdict, base_matches

FORMAT_V1 = TEXT_ENCODER_FORMAT_V1
FORMATS = (FORMAT_V1,)
SCHEMES = ("fp8",)  # v1 hosts the layerwise fp8 storage cast only
STORAGE_DTYPE = torch.float8_e4m3fn
CAST_BACKEND = LAYERWISE_CAST
COMPONENTS = ("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4")
ANY_COMPONENT = "auto"  # the text-encoder loader with no component or family given: whichever the file records

# Bases whose encoder weights are byte-identical (Unsloth compared every shard's sha256): one file serves them all.
# Unsloth's table as of its 2026-08-25 re-check (Qwen-Image-2512 republishes Qwen-Image's four shards; the Krea 2 pair).
EQUIVALENT_BASES = (
    frozenset({"qwen/qwen-image", "qwen/qwen-image-2512",
               "hunyuanvideo-community/hunyuanimage-2.1-diffusers"}),  # Qwen2.5-VL-7B
    frozenset({"krea/krea-2-turbo", "krea/krea-2-raw"}),  # Qwen3-4B
    frozenset({"black-forest-labs/flux.1-schnell", "black-forest-labs/flux.1-dev", "black-forest-labs/flux.1-krea-dev",
               "hidream-ai/hidream-i1-full"}),  # T5-XXL (HiDream's text_encoder_3)
    frozenset({"tongyi-mai/z-image-turbo", "tongyi-mai/z-image"}),  # Qwen3-4B
)


def is_encoder_component(component) -> bool:
    return isinstance(component, str) and component in COMPONENTS


def asks_for_encoder(request) -> bool:
    return is_encoder_component(request.component) or request.component == ANY_COMPONENT


def is_encoder_file(ckpt) -> bool:
    """Tagged as a pre-cast encoder, or (untagged) recording what only an encoder build records."""
    if ckpt.format_tag in FORMATS:
        return True
    m = ckpt.metadata
    return ckpt.format_tag is None and ("te_class" in m or m.get("cast_backend") == CAST_BACKEND)


def same_base(found: str, wanted: str) -> bool:
    """The same repo (Unsloth's rule: exact, or the same last path part), or two bases of one equivalence group."""
    if base_matches(found, wanted):
        return True
    a, b = normalize_base(found), normalize_base(wanted)
    return any(a in g and b in g for g in EQUIVALENT_BASES)


def bases_served(base: str) -> list[str]:
    """The other bases a file built from ``base`` serves (its equivalence group)."""
    b = normalize_base(base)
    for g in EQUIVALENT_BASES:
        if b in g or any(base_tail(x) == base_tail(b) for x in g):
            return sorted(x for x in g if x != b and base_tail(x) != base_tail(b))
    return []


def hosted_for(family: str | None, component: str | None = None) -> HostedEncoder | None:
    """The family's hosted encoder (the one named ``component``, else its first)."""
    if not family:
        return None
    fam = families.get(family)
    for e in fam.text_encoders:
        if component in (None, e.component):
            return e
    return None


def _text(v) -> str:
    return str(v)[:80]


def validate(ckpt, req: Request) -> Verdict:
    m = ckpt.metadata
    reasons: list[str] = []
    notes: list[str] = []
    tag = ckpt.format_tag
    if tag in KNOWN_FORMATS:
        return Verdict(False, [f"a transformer checkpoint ('{tag}'), not a text encoder: load it with Load Prequant "
                               "Transformer"])
    if tag not in FORMATS:
        reasons.append(f"format tag {_text(tag)!r} is not a pre-cast text encoder's (expected '{FORMAT_V1}')")
    for field in ("scheme", "base_model_id", "component", "te_class", "family", "cast_backend", "torch_dtype"):
        v = m.get(field)
        if v is not None and not isinstance(v, str):
            reasons.append(f"metadata '{field}' is {type(v).__name__} {_text(v)!r}, expected a string")
    if reasons and any("metadata '" in r for r in reasons):
        return Verdict(False, reasons)

    scheme = m.get("scheme")
    if scheme not in SCHEMES:
        reasons.append(f"scheme {_text(scheme)!r}: a pre-cast text encoder is fp8 (layerwise storage cast)")
    if req.scheme and str(req.scheme).strip().lower() not in ("auto", *SCHEMES):
        reasons.append(f"scheme is {_text(scheme)!r}, requested '{req.scheme}' (text encoders are hosted as fp8 only)")
    if m.get("cast_backend") not in (None, CAST_BACKEND):
        reasons.append(f"cast_backend {_text(m['cast_backend'])!r}: only '{CAST_BACKEND}' storage casts are known")

    comp = m.get("component")
    if comp not in COMPONENTS:
        reasons.append(f"component {_text(comp)!r} is not a text encoder's ({', '.join(COMPONENTS)})")
    elif is_encoder_component(req.component) and comp != req.component:
        reasons.append(f"component is '{comp}', requested '{req.component}'")

    base = m.get("base_model_id")
    if req.base_model_id:
        if not base:
            reasons.append(f"the file records no base_model_id; refused for base '{req.base_model_id}'")
        elif not same_base(base, req.base_model_id):
            reasons.append(f"base model is '{_text(base)}', requested '{req.base_model_id}'")
        elif not base_matches(base, req.base_model_id):
            notes.append(f"built from {base}; its {comp} is byte-identical to {req.base_model_id}'s (one file serves "
                         "both)")

    te_class = m.get("te_class")
    kind = kinds.for_class(te_class)
    if te_class is None:
        reasons.append("the file records no te_class (the transformers class of the encoder)")
    elif kind is None:
        reasons.append(f"te_class {_text(te_class)!r} is not an encoder this pack can hand to ComfyUI "
                       f"(known: {', '.join(kinds.known_classes())})")
    if req.family:
        hosted = hosted_for(req.family, comp if is_encoder_component(comp) else None)
        if hosted is not None and kind is not None and te_class not in kinds.for_class(hosted.te_class).te_classes:
            reasons.append(f"{families.get(req.family).title}'s {hosted.component} is a "
                           f"{kinds.for_class(hosted.te_class).name}, this file holds a {kind.name} ({te_class})")

    quantized = [k for k, v in ckpt.tensors.items() if qtensor.is_quantized(v)]
    if quantized:
        reasons.append(f"{len(quantized)} torchao-quantized tensors (e.g. '{_text(quantized[0])}'): a pre-cast "
                       "encoder holds plain tensors only")
    stored = [v for v in ckpt.tensors.values() if isinstance(v, torch.Tensor) and not qtensor.is_quantized(v)]
    other_fp8 = sorted({str(v.dtype) for v in stored if v.dtype.is_floating_point and v.element_size() == 1
                        and v.dtype != STORAGE_DTYPE})
    if other_fp8:
        reasons.append(f"weights stored as {', '.join(other_fp8)}: the layerwise cast stores float8_e4m3fn")
    if not any(v.dtype == STORAGE_DTYPE for v in stored):
        reasons.append("no float8 weight: not a pre-cast (layerwise fp8) encoder")
    return Verdict(not reasons, reasons, notes)


def fp8_share(tensors) -> tuple[int, int, int, int]:
    """(fp8 tensors, their bytes, other tensors, their bytes), from shapes and dtypes."""
    n8 = b8 = n = b = 0
    for v in tensors.values():
        size = v.numel() * v.element_size()
        if v.dtype == STORAGE_DTYPE:
            n8, b8 = n8 + 1, b8 + size
        else:
            n, b = n + 1, b + size
    return n8, b8, n, b
