"""The metadata record and its validation against what the caller asked for.

Rules (FORMAT.md): a missing field is accepted (older files), a present one must match; every mismatch is
collected, so the user sees all reasons at once rather than one per attempt.
"""
from __future__ import annotations

import dataclasses

from . import qtensor, schemes
from .checkpoint import FORMAT_V1, REFUSED_FORMATS, Checkpoint

FIELDS = ("base_model_id", "family", "scheme", "component", "min_features", "exclude_name_tokens", "require_bf16",
          "require_divisible", "fast_accum", "fp8_granularity", "fingerprint", "torch_dtype", "quant_backend",
          "transformer_class", "torch_version", "torchao_version", "diffusers_version")


@dataclasses.dataclass
class Request:
    scheme: str | None = None
    base_model_id: str | None = None
    min_features: int | None = None
    exclude_tokens: list[str] | None = None  # None: the scheme's defaults for the file's family
    family: str | None = None
    component: str = "transformer"


@dataclasses.dataclass
class Verdict:
    ok: bool
    reasons: list[str]
    notes: list[str] = dataclasses.field(default_factory=list)  # accepted, but worth showing (Prequant Info)


def _comfy_native_notes(ckpt: Checkpoint) -> list[str]:
    """ComfyUI-native twins are per-tensor by design: accepted, and said to be a coarser rounding."""
    coarse = [s for s, field in (("fp8", "fp8_granularity"), ("int8", "int8_granularity"))
              if ckpt.metadata.get(field) in ("per_tensor", "mixed")]
    if not coarse:
        return []
    return [f"ComfyUI-native file: its {' and '.join(coarse)} weights use one scale per tensor, a coarser rounding "
            "than a per-row file of the same model (expect small output differences from it)"]


def base_matches(found: str, wanted: str) -> bool:
    if found == wanted:
        return True
    tail = lambda s: s.rstrip("/").rsplit("/", 1)[-1].lower()  # noqa: E731
    return tail(found) == tail(wanted)


def _type_reason(field, value, types, what):
    if value is not None and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
        return f"metadata '{field}' is {type(value).__name__} {str(value)[:60]!r}, expected {what}"
    return None


def validate(ckpt: Checkpoint, req: Request, family_exclude_extra: tuple[str, ...] = ()) -> Verdict:
    m = ckpt.metadata
    reasons: list[str] = []
    tag = ckpt.format_tag
    if tag in REFUSED_FORMATS:
        reasons.append(f"format '{tag}' uses {REFUSED_FORMATS[tag]}, which this pack does not support")
    elif tag is not None and tag != FORMAT_V1 and ckpt.container in ("pt", "safetensors"):
        reasons.append(f"unknown format tag '{str(tag)[:80]}' (expected '{FORMAT_V1}')")

    for field, types, what in (("scheme", (str,), "a string"), ("base_model_id", (str,), "a string"),
                               ("family", (str,), "a string"), ("component", (str,), "a string"),
                               ("min_features", (int,), "an integer"), ("require_bf16", (bool,), "true/false"),
                               ("require_divisible", (int,), "an integer"), ("fast_accum", (bool,), "true/false/null"),
                               ("fp8_granularity", (str,), "a string"), ("exclude_name_tokens", (list,), "a list"),
                               ("fingerprint", (dict,), "an object"), ("quant_backend", (str,), "a string"),
                               ("torch_dtype", (str,), "a string")):
        r = _type_reason(field, m.get(field), types, what)
        if r:
            reasons.append(r)
    if reasons and any("metadata '" in r for r in reasons):
        return Verdict(False, reasons)

    file_scheme = m.get("scheme")
    found_schemes = ckpt.schemes_found()
    scheme = None
    if file_scheme is not None:
        try:
            scheme = schemes.normalize(file_scheme)
        except Exception as e:  # noqa: BLE001
            reasons.append(f"scheme '{file_scheme}' is not loadable: {getattr(e, 'message', e)}")
    if req.scheme:
        wanted = schemes.normalize(req.scheme)
        if scheme is not None and scheme != wanted and not (scheme.split("-")[0] == wanted.split("-")[0]
                                                            and scheme in found_schemes and wanted in found_schemes):
            reasons.append(f"scheme is '{file_scheme}', requested '{req.scheme}'")
        scheme = scheme or wanted
    if scheme is None and len(found_schemes) == 1:
        scheme = next(iter(found_schemes))
    if scheme and found_schemes and not any(f.split("-")[0] == scheme.split("-")[0] for f in found_schemes):
        reasons.append(f"metadata says scheme '{scheme}' but the weights are {sorted(found_schemes)}")
    if not found_schemes:
        reasons.append("the file holds no quantized weights (a dense checkpoint?)")
    per_tensor = [k for k, v in ckpt.tensors.items() if qtensor.is_quantized(v) and v.scale.numel() == 1
                  and v.shape[0] > 1 and qtensor.scheme_of(v).startswith("fp8")]
    native = ckpt.container == "comfyui-native"
    if per_tensor and not native:
        reasons.append(f"{len(per_tensor)} fp8 weights use one scale per tensor (e.g. '{per_tensor[0]}'): "
                       "per-tensor fp8 files are stale; use a per-row file")

    if req.base_model_id and m.get("base_model_id") is not None and not base_matches(m["base_model_id"], req.base_model_id):
        reasons.append(f"built from base '{m['base_model_id']}', requested '{req.base_model_id}'")
    if req.family and m.get("family") is not None and m["family"].lower() != req.family.lower():
        reasons.append(f"family is '{m['family']}', requested '{req.family}'")
    if m.get("component") is not None and m["component"] != req.component:
        reasons.append(f"component is '{m['component']}', expected '{req.component}'")
    if req.min_features is not None and m.get("min_features") is not None and m["min_features"] != req.min_features:
        reasons.append(f"min_features is {m['min_features']}, requested {req.min_features}")
    if m.get("quant_backend") is not None and m["quant_backend"] != "torchao":
        reasons.append(f"quant_backend is '{m['quant_backend']}', expected 'torchao'")

    if scheme:
        rule = schemes.rules(scheme)
        if m.get("require_bf16") is not None and m["require_bf16"] != rule.require_bf16:
            reasons.append(f"require_bf16 is {m['require_bf16']}, scheme {scheme} needs {rule.require_bf16}")
        if m.get("require_divisible") is not None and m["require_divisible"] != rule.require_divisible:
            reasons.append(f"require_divisible is {m['require_divisible']}, scheme {scheme} needs {rule.require_divisible}")
        if "fast_accum" in m and m["fast_accum"] is not None and m["fast_accum"] != rule.fast_accum:
            reasons.append(f"fast_accum is {m['fast_accum']}, scheme {scheme} needs {rule.fast_accum}")
        gran = m.get("fp8_granularity")
        if scheme.startswith("fp8") and gran is not None and gran != "per_row" and not native:
            reasons.append(f"fp8_granularity is '{gran}': per-tensor fp8 files are stale; rebuild per_row")
        expected_ex = req.exclude_tokens if req.exclude_tokens is not None else \
            schemes.exclude_tokens(scheme, family_exclude_extra)
        found_ex = m.get("exclude_name_tokens")
        if found_ex is not None and sorted(set(map(str, found_ex))) != sorted(set(expected_ex)):
            reasons.append(f"exclude_name_tokens {sorted(map(str, found_ex))} differ from the expected "
                           f"{sorted(map(str, expected_ex))}")
    return Verdict(not reasons, reasons, _comfy_native_notes(ckpt) if native else [])
