"""What makes a pre-cast text-encoder file loadable for a request: Unsloth's checks (format tag, scheme, component,
base model with its equivalence groups, ``te_class``) and this pack's (a class it can hand to ComfyUI, the family's
own encoder, the storage its tag promises and nothing torchao). Two tags: v1, the fp8 layerwise storage cast; the
int8 ConvRot form (Qwen-Image 2.1's Qwen3-VL-8B), every decoder projection ComfyUI's ``int8_tensorwise`` with
ConvRot, checked through the same per-layer rules and value boundary as ComfyUI-native transformer files."""
from __future__ import annotations

import re

import torch

from .. import families
from ..families import HostedEncoder, base_matches, normalize_base
from ..families import encoders as kinds
from ..formats.checkpoint import KNOWN_FORMATS, LAYERWISE_CAST, TEXT_ENCODER_FORMAT_INT8_CONVROT, TEXT_ENCODER_FORMAT_V1
from ..schemes import qtensor
from ..request import Request, Verdict

FORMAT_V1 = TEXT_ENCODER_FORMAT_V1
FORMAT_INT8_CONVROT = TEXT_ENCODER_FORMAT_INT8_CONVROT
FORMATS = (FORMAT_V1, FORMAT_INT8_CONVROT)
SCHEME_OF_FORMAT = {FORMAT_V1: "fp8", FORMAT_INT8_CONVROT: "int8"}  # each tag holds one storage scheme
SCHEMES = tuple(SCHEME_OF_FORMAT.values())
QUANT_SUFFIX, SCALE_SUFFIX = ".comfy_quant", ".weight_scale"
INT8_FORMAT = "int8_tensorwise"
# a decoder projection of a layer stack (``...layers.N.self_attn.q_proj`` / ``mlp.down_proj``): the int8 form
# quantizes every one (Unsloth refuses a file leaving one dense: it would outgrow the memory it is priced at)
DECODER_PROJECTION = re.compile(r"\.layers\.\d+\.(self_attn|mlp)\.\w+_proj$")
STORAGE_DTYPE = torch.float8_e4m3fn
CAST_BACKEND = LAYERWISE_CAST
COMPONENTS = ("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4")
ANY_COMPONENT = "auto"  # the text-encoder loader with no component or family given: whichever the file records


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
    # the bases whose encoder weights are byte-identical (Unsloth compared every shard's sha256), from each family's
    # record (Hosting.shared_encoders): one file serves them all
    return any(a in g and b in g for g in families.encoder_groups())


def hosted_for(family: str | None, component: str | None = None) -> HostedEncoder | None:
    """The family's hosted encoder (the one named ``component``, else its first)."""
    if not family:
        return None
    fam = families.get(family)
    for e in fam.hosting.text_encoders:
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
        reasons.append(f"format tag {_text(tag)!r} is not a pre-cast text encoder's (expected '{FORMAT_V1}' or "
                       f"'{FORMAT_INT8_CONVROT}')")
    for field in ("scheme", "base_model_id", "component", "te_class", "family", "cast_backend", "torch_dtype"):
        v = m.get(field)
        if v is not None and not isinstance(v, str):
            reasons.append(f"metadata '{field}' is {type(v).__name__} {_text(v)!r}, expected a string")
    if reasons and any("metadata '" in r for r in reasons):
        return Verdict(False, reasons)

    scheme = m.get("scheme")
    want = SCHEME_OF_FORMAT.get(tag)
    if want is not None and scheme != want:
        reasons.append(f"scheme {_text(scheme)!r}: a '{tag}' file is {want}")
    elif want is None and scheme not in SCHEMES:
        reasons.append(f"scheme {_text(scheme)!r}: a pre-cast text encoder is fp8 (layerwise storage cast) or int8 "
                       "(ConvRot)")
    asked = str(req.scheme or "").strip().lower()
    if asked not in ("", "auto") and asked != scheme:
        reasons.append(f"scheme is {_text(scheme)!r}, requested '{req.scheme}' (text encoders are hosted as fp8, "
                       "Qwen-Image 2.1's as int8 ConvRot)")
    if tag != FORMAT_INT8_CONVROT and m.get("cast_backend") not in (None, CAST_BACKEND):
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
                       f"(known: {', '.join(c for k in kinds.KINDS for c in k.te_classes)})")
    if req.family:
        hosted = hosted_for(req.family, comp if is_encoder_component(comp) else None)
        if hosted is not None and kind is not None and te_class not in kinds.for_class(hosted.te_class).te_classes:
            reasons.append(f"{families.get(req.family).title}'s {hosted.component} is a "
                           f"{kinds.for_class(hosted.te_class).name}, this file holds a {kind.name} ({te_class})")

    if kind is not None:
        reasons += class_reasons(kind, te_class, ckpt.tensors)
    quantized = [k for k, v in ckpt.tensors.items() if qtensor.is_quantized(v)]
    if quantized:
        reasons.append(f"{len(quantized)} torchao-quantized tensors (e.g. '{_text(quantized[0])}'): a pre-cast "
                       "encoder holds plain tensors only")
    stored = [v for v in ckpt.tensors.values() if isinstance(v, torch.Tensor) and not qtensor.is_quantized(v)]
    if tag == FORMAT_INT8_CONVROT:
        reasons += int8_convrot_reasons(ckpt)
        return Verdict(not reasons, reasons, notes)
    other_fp8 = sorted({str(v.dtype) for v in stored if v.dtype.is_floating_point and v.element_size() == 1
                        and v.dtype != STORAGE_DTYPE})
    if other_fp8:
        reasons.append(f"weights stored as {', '.join(other_fp8)}: the layerwise cast stores float8_e4m3fn")
    if not any(v.dtype == STORAGE_DTYPE for v in stored):
        reasons.append("no float8 weight: not a pre-cast (layerwise fp8) encoder")
    return Verdict(not reasons, reasons, notes)


def class_reasons(kind, te_class, tensors) -> list[str]:
    """Why the tensors are not the class the file records, the encoder they are where one record fits. Labelled as
    one encoder, holding another's, a file would load as the other: ComfyUI picks its class from the keys, so a
    Qwen3-4B labelled HiDream's Llama-3.1-8B became a Qwen3 giving 2560-wide conditioning where 4096 belongs
    (issue 58; round 5: a Gemma2 built as Z-Image's Qwen3)."""
    why = kind.mismatches(tensors)
    if not why:
        return []
    other = kinds.identify(tensors)
    they = f" (they are a {other.name}'s)" if other is not None and other is not kind else ""
    # every name in ``why`` is a record's (a layer prefix and key): nothing from the file but numbers
    return [f"te_class {_text(te_class)!r} says {kind.name}, but the tensors are not a {kind.name}'s{they}: "
            + "; ".join(why)]


def int8_layers(tensors) -> list[str]:
    """The layers an int8 ConvRot encoder quantizes (each has a ``.comfy_quant`` entry)."""
    return sorted(k[: -len(QUANT_SUFFIX)] for k in tensors if k.endswith(QUANT_SUFFIX))


def int8_convrot_reasons(ckpt) -> list[str]:
    """Why an int8 ConvRot encoder file does not hold what its tag promises. Each quantized layer goes through the
    ComfyUI-native rules (``int8_tensorwise`` with ConvRot: int8 ``[out, in]`` codes, a float32 per-row scale, a
    power-of-4 group dividing the input width) and the value boundary every reader's weights pass (a NaN, infinite,
    negative or absurd scale is corrupt bytes: raised, not a reason). From a header-only read (Info without
    verification: the tensors are on ``meta``) the layers' blobs are the metadata's ``quant`` record and only shapes
    and dtypes are checked; the values are checked where the bytes are read (the load, ``verify``)."""
    from ..formats import comfy_layout as cf
    from ..schemes.native_layout import Stored
    from ..formats.containers.comfy_native import layer_config
    from ..formats.validate_tensors import check_quantized
    t, path, m = ckpt.tensors, ckpt.path, ckpt.metadata
    layers = int8_layers(t)
    reasons: list[str] = []
    if not layers:
        return ["no int8 ConvRot layer (no '.comfy_quant' entry): not an int8 ConvRot text encoder"]
    orphans = sorted({k[: -len(SCALE_SUFFIX)] for k in t if k.endswith(SCALE_SUFFIX)} - set(layers))
    if orphans:
        reasons.append(f"'{_text(orphans[0])}{SCALE_SUFFIX}' belongs to no quantized layer (no .comfy_quant entry)")
    groups: set = set()
    quant = m.get("quant") if isinstance(m.get("quant"), dict) else {}
    for layer in layers:
        blob = t[layer + QUANT_SUFFIX]
        header_only = blob.is_meta
        cfg = {k: quant.get(k) for k in ("format", "convrot", "convrot_groupsize")} if header_only else \
            layer_config(blob, layer, path)
        if not isinstance(cfg.get("format"), str):
            reasons.append("the metadata's quant record names no format")
            break
        if cfg["format"] != INT8_FORMAT or not cfg.get("convrot"):
            reasons.append(f"layer '{_text(layer)}' is {_text(cfg['format'])!r}"
                           f"{' with ConvRot' if cfg.get('convrot') else ' without ConvRot'}: this encoder form "
                           f"stores {INT8_FORMAT} with ConvRot")
            continue
        w = t.get(layer + ".weight")
        if not isinstance(w, torch.Tensor):
            reasons.append(f"layer '{_text(layer)}' has a .comfy_quant entry but no weight")
            continue
        q, _, group = cf.to_weight(cf.layout(INT8_FORMAT),
                                   Stored(layer, path, cfg, w, {"weight_scale": t.get(layer + SCALE_SUFFIX)}))
        check_quantized(layer + ".weight", q, path, read_data=not (header_only or w.is_meta))
        groups.add(group)
    declared = quant.get("convrot_groupsize")
    if len(groups) > 1:
        reasons.append(f"layers use different ConvRot groups ({', '.join(map(str, sorted(groups)))})")
    elif declared is not None and groups and groups != {declared}:
        reasons.append(f"metadata quant.convrot_groupsize is {_text(declared)}, the layers use {next(iter(groups))}")
    if "lm_head.weight" in t:
        reasons.append("it holds an lm_head: Unsloth's int8 ConvRot encoder drops it (hidden states only)")
    quantized = set(layers)
    dense = sorted(k[: -len(".weight")] for k, v in t.items() if k.endswith(".weight") and isinstance(v, torch.Tensor)
                   and v.ndim == 2 and v.is_floating_point() and DECODER_PROJECTION.search(k[: -len(".weight")])
                   and k[: -len(".weight")] not in quantized)
    if dense:
        reasons.append(f"{len(dense)} decoder projection(s) left unquantized, e.g. '{_text(dense[0])}'")
    fp8 = sorted({str(v.dtype) for v in t.values() if isinstance(v, torch.Tensor) and v.is_floating_point()
                  and v.element_size() == 1})
    if fp8:
        reasons.append(f"float8 tensors ({', '.join(fp8)}) in an int8 ConvRot encoder")
    return reasons


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
