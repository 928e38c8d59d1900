"""The metadata record and its validation against what the caller asked for.

Rules (FORMAT.md, and Unsloth Studio's loader as of late 2026; docs/FORMAT.md "Validation rules"): a missing field
is accepted (older files), a present one must match; every mismatch is collected, so the user sees all reasons at once
rather than one per attempt. Where Unsloth is stricter, so are we: a requested base needs a recorded base, and a
``.pt`` or ``.safetensors`` container needs its format tag.
"""
from __future__ import annotations

from ..formats import layer_policy
from ..schemes import qtensor
from .. import schemes
from ..families import base_matches, canonical
from ..formats.checkpoint import FORMAT_V1, KNOWN_FORMATS, Checkpoint
from ..request import Request, Verdict
from ..safe_text import escape

FIELDS = ("base_model_id", "family", "scheme", "component", "min_features", "exclude_name_tokens", "require_bf16",
          "require_divisible", "fast_accum", "fp8_granularity", "fingerprint", "torch_dtype", "quant_backend",
          "transformer_class", "torch_version", "torchao_version", "diffusers_version")


def _comfy_native_notes(ckpt: Checkpoint) -> list[str]:
    """What a ComfyUI-native file is (formats per layer, which ComfyUI reads it natively), and what is read but not
    used: per-tensor scales are a coarser rounding than a per-row file; ``input_scale`` and attention configs."""
    from ..formats.containers.comfy_native import native_since
    m = ckpt.metadata
    counts = m.get("comfy_quant_formats") if isinstance(m.get("comfy_quant_formats"), dict) else {}
    notes = []
    if counts:
        per = ", ".join(f"{f}: {n} layer{'s' if n != 1 else ''}" for f, n in sorted(counts.items()))
        since = native_since(counts)
        notes.append(f"ComfyUI-native file ({per}"
                     + (f"; ConvRot on {m['comfy_convrot_layers']} of them" if m.get("comfy_convrot_layers") else "")
                     + f"): ComfyUI {since} and newer load it with their own Load Diffusion Model; this pack loads "
                       "it on older ComfyUI too, on every device (dequantized at matmul where there is no kernel)")
    coarse = [s.name for s in schemes.registry.all_schemes()
              if s.granularity_field and m.get(s.granularity_field) in ("per_tensor", "mixed")]
    if coarse:
        notes.append(f"its {' and '.join(coarse)} weights use one scale per tensor, a coarser rounding than a per-row "
                     "file of the same model (expect small output differences from it)")
    if m.get("comfy_input_scales"):
        notes.append(f"{m['comfy_input_scales']} input_scale entries (static activation scales for ComfyUI's fp8 GPU "
                     "matmul) are read and not used: this pack quantizes activations dynamically")
    if m.get("comfy_attention_configs"):
        notes.append(f"{m['comfy_attention_configs']} comfy_attention.config entries (a newer ComfyUI's attention "
                     "kernel preference) are ignored: ComfyUI's default attention runs")
    dropped = m.get("comfy_dropped_side") if isinstance(m.get("comfy_dropped_side"), dict) else {}
    for name, n in sorted(dropped.items()):
        notes.append(f"{n} {name} entries on layers whose format does not use it are ignored, as ComfyUI's own "
                     "loader ignores them (those layers compute without it there too)")
    return notes


PER_ROW = "per_row"  # the granularity value of a scheme whose files must hold one scale per row


def as_int(v) -> int | None:
    """``int(v)`` for an int or a string of one (Unsloth compares ``int()`` values), else None. Never a bool."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            return None
    return None


def pin_loaded(tensors: dict) -> int:
    """What Unsloth's loader pins on each scheme's weights at load (``Scheme.pin_loaded``; fp8: torchao's TORCH
    kernels and the activation floor), in place in ``tensors``; returns how many weights changed."""
    return sum(s.pin_loaded(tensors) for s in schemes.registry.all_schemes() if s.pin_loaded)


def _per_row_replacement(family, m: dict, scheme: str) -> str:
    """Where the current per-row ``scheme`` file of the same model is (its hosted repo and first file name), else how
    to make one. Only a refusal's text needs the Hub names, hence the import here."""
    from . import sources
    from ..errors import PrequantError
    build = "or build a per-row file from the dense model with Build Prequant Checkpoint"
    repo = None
    if family is not None:
        base = m.get("base_model_id") if isinstance(m.get("base_model_id"), str) else None
        try:
            repo = sources.hosted_repo(family.name, base_model_id=base, scheme=scheme)
        except PrequantError:  # a base the family never hosts (an excluded namesake)
            pass
    if not repo:
        return f"use a per-row {scheme} file, " + build
    return (f"the current file is {sources.filenames(repo, scheme)[0]} in {repo} (per-row; the loader's preset "
            f"downloads it), {build}")


def validate(ckpt: Checkpoint, req: Request, *, family=None) -> Verdict:
    """``family`` (a ``families.Family``, or None when the file's family is unknown): supplies its int8 exclude
    tokens and its excluded bases."""
    family_exclude_extra = family.arch.int8_exclude_extra if family is not None else ()
    m = ckpt.metadata
    reasons: list[str] = []
    notes: list[str] = []
    tag = ckpt.format_tag
    if tag is None and ckpt.container in ("pt", "safetensors"):
        where = "'format' entry" if ckpt.container == "pt" else "'unsloth_format' header entry"
        reasons.append(f"the .{ckpt.container} container has no format tag ({where}, expected '{FORMAT_V1}'): an "
                       "untagged or foreign artifact is not trusted")
    if tag is not None and tag not in KNOWN_FORMATS and ckpt.container in ("pt", "safetensors"):
        reasons.append(f"unknown format tag '{str(tag)[:80]}' (expected '{FORMAT_V1}', or its v2 / v3)")

    for field, types, what in (("scheme", (str,), "a string"), ("base_model_id", (str,), "a string"),
                               ("family", (str,), "a string"), ("component", (str,), "a string"),
                               ("min_features", (int, str), "an integer"), ("require_bf16", (bool,), "true/false"),
                               ("require_divisible", (int,), "an integer"), ("fast_accum", (bool,), "true/false/null"),
                               ("fp8_granularity", (str,), "a string"), ("exclude_name_tokens", (list, tuple), "a list"),
                               ("fingerprint", (dict,), "an object"), ("quant_backend", (str,), "a string"),
                               ("torch_dtype", (str,), "a string")):
        v = m.get(field)
        if v is not None and (not isinstance(v, types) or (isinstance(v, bool) and bool not in types)):
            reasons.append(f"metadata '{field}' is {type(v).__name__} {str(v)[:60]!r}, expected {what}")
        elif field == "min_features" and v is not None and as_int(v) is None:
            reasons.append(f"metadata 'min_features' is {str(v)[:60]!r}, expected an integer")
    if reasons and any("metadata '" in r for r in reasons):
        return Verdict(False, reasons)
    reasons += layer_policy.tag_reasons(ckpt)

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
        if scheme is not None and scheme != wanted and not (schemes.same_kind(scheme, wanted)
                                                            and scheme in found_schemes and wanted in found_schemes):
            reasons.append(f"scheme is '{file_scheme}', requested '{req.scheme}'")
        scheme = scheme or wanted
    if scheme is None and len(found_schemes) == 1:
        scheme = next(iter(found_schemes))
    if scheme and found_schemes and not any(schemes.same_kind(f, scheme) for f in found_schemes):
        reasons.append(f"metadata says scheme '{scheme}' but the weights are {sorted(found_schemes)}")
    if not found_schemes:
        reasons.append("the file holds no quantized weights (a dense checkpoint?)")
    reasons += layer_policy.policy_reasons(ckpt, scheme)
    notes += layer_policy.policy_notes(ckpt)
    reasons += layer_policy.rotation_reasons(ckpt)
    # a scheme whose files must be per row (its record's granularity): one scale per tensor is Unsloth's older build
    per_tensor: dict[str, list] = {}
    for k, v in ckpt.tensors.items():
        if qtensor.is_quantized(v) and v.scale.numel() == 1 and v.shape[0] > 1:
            rec = schemes.registry.by_kind(qtensor.kind_of(v))
            if rec.granularity == PER_ROW:
                per_tensor.setdefault(rec.name, []).append(k)
    native = ckpt.container == "comfyui-native"
    for name, keys in per_tensor.items() if not native else ():
        reasons.append(f"{len(keys)} {name} weights use one scale per tensor (e.g. '{keys[0]}'): a stale per-tensor "
                       f"{name} build (Unsloth's older builder); " + _per_row_replacement(family, m, name))

    # A family's excluded base (Tongyi-MAI/Z-Image for Z-Image-Turbo files) is another model: only a file recorded as
    # built from it may serve it, never the hosted file of its namesake.
    excluded = family.excluded_base(req.base_model_id) if family is not None else None
    if req.base_model_id and m.get("base_model_id") is None:
        if native:
            notes.append("ComfyUI-native file: it records no base model, so the requested base is not checked")
        else:
            reasons.append(f"the file records no base_model_id, requested '{req.base_model_id}' (a file without "
                           "its base cannot be trusted for a named base)")
    elif req.base_model_id and not base_matches(m["base_model_id"], req.base_model_id):
        reasons.append(f"built from base '{m['base_model_id']}', requested '{req.base_model_id}'" + (
            f" ('{excluded}' is listed as excluded for {family.title}: a different model, never served its "
            "namesake's hosted file)" if excluded else ""))
    if req.family and m.get("family") is not None and canonical(m["family"]) != canonical(req.family):
        reasons.append(f"family is '{m['family']}', requested '{req.family}'")
    if m.get("component") is not None and m["component"] != req.component:
        reasons.append(f"component is '{escape(m['component'][:60])}', expected '{req.component}' (Unsloth's "
                       "rule: an expert's file serves only that expert)")
    if req.min_features is not None and m.get("min_features") is not None and \
            as_int(m["min_features"]) != as_int(req.min_features):
        reasons.append(f"min_features is {m['min_features']}, requested {req.min_features}")
    if m.get("quant_backend") is not None and m["quant_backend"] != "torchao":
        reasons.append(f"quant_backend is '{m['quant_backend']}', expected 'torchao'")

    if scheme:
        rule = schemes.rules(scheme)
        if m.get("require_bf16") is not None and m["require_bf16"] != rule.require_bf16:
            reasons.append(f"require_bf16 is {m['require_bf16']}, expected {rule.require_bf16} for scheme {scheme} "
                           f"(Unsloth's rule: {schemes.bf16_rule_text()}, whose torchao paths take bf16 weights)")
        if m.get("require_divisible") is not None and m["require_divisible"] != rule.require_divisible:
            reasons.append(f"require_divisible is {m['require_divisible']}, expected {rule.require_divisible} for "
                           f"scheme {scheme} (Unsloth's rule: {schemes.rules_text()})")
        if req.fast_accum is not None and m.get("fast_accum") is not None and m["fast_accum"] != req.fast_accum:
            reasons.append(f"fast_accum is {m['fast_accum']}, requested {req.fast_accum}")
        gran = m.get(rule.granularity_field) if rule.fp8_granularity else None
        if gran is not None and gran != rule.fp8_granularity and not native:
            reasons.append(f"{rule.granularity_field} is '{escape(str(gran)[:40])}', expected "
                           f"'{rule.fp8_granularity}' (Unsloth's rule: per-tensor {scheme} files are stale; rebuild "
                           f"{rule.fp8_granularity})")
        expected_ex = req.exclude_tokens if req.exclude_tokens is not None else \
            schemes.exclude_tokens(scheme, family_exclude_extra)
        found_ex = m.get("exclude_name_tokens")
        # Unsloth's newer loaders accept a recorded list that is a superset of today's (more layers kept dense);
        # the order does not matter here (older Unsloth loaders compare ordered tuples: the builder writes their order)
        if found_ex is not None and not set(map(str, found_ex)) >= set(expected_ex):
            missing = [t for t in expected_ex if t not in set(map(str, found_ex))]
            reasons.append(f"exclude_name_tokens {escape(str(list(map(str, found_ex)))[:300])} lack {missing} "
                           f"(expected at least {list(expected_ex)}: Unsloth's rule, the recorded list may only "
                           "keep more layers dense than its loader's list)")
    for s in schemes.registry.all_schemes():  # the settings each scheme's weights record (fp8: the activation floor)
        if s.check_loaded:
            more_reasons, more_notes = s.check_loaded(ckpt.tensors)
            reasons += more_reasons
            notes += more_notes
    return Verdict(not reasons, reasons, notes + (_comfy_native_notes(ckpt) if native else []))
