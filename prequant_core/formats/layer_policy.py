"""What a v2 (ConvRot) or v3 (NVFP4 layer policy) file declares about its layers, checked against what it holds
(docs/FORMAT.md section 9). Every reason names the field, what was expected and what was found; nothing about a
layer changes before all of them pass."""
from __future__ import annotations

import dataclasses

from ..schemes import qtensor, rotation
from .checkpoint import FORMAT_V1, FORMAT_V2, FORMAT_V3, LAYERWISE_CAST, TEXT_ENCODER_FORMAT_V1, Checkpoint
from ..safe_text import escape

POLICY_KIND = "unsloth_nvfp4_layer_policy_v1"


def policy_formats() -> dict:
    """A policy's format names (the scheme names) -> what the file's weights are (qtensor.kind_of); "bf16" layers
    are plain weights."""
    from ..schemes import registry
    return {**{s.name: s.kind for s in registry.all_schemes()}, "bf16": None}


@dataclasses.dataclass(frozen=True)
class KnownPolicy:
    """An NVFP4 layer policy Unsloth publishes: which model it was tuned for and how many layers of each format it
    gives (its loader refuses a file whose id, version or counts differ from the policy it resolves for the file's
    family and base)."""
    policy_id: str
    version: int
    family: str
    base: str  # lower-case, as Unsloth keys its table
    counts: dict
    repo: str  # where the hosted file built with it lives


# Unsloth's current NVFP4_POLICIES (docs/FORMAT.md section 9), in its order
KNOWN_POLICIES = {p.policy_id: p for p in (
    KnownPolicy("zimg_rg76_v1", 1, "z-image", "tongyi-mai/z-image-turbo", {"nvfp4": 76, "fp8": 195, "bf16": 5},
                "unsloth/Z-Image-Turbo-NVFP4"),
    KnownPolicy("flux_r420_v1", 1, "flux.1", "black-forest-labs/flux.1-schnell", {"nvfp4": 187, "fp8": 312, "bf16": 3},
                "unsloth/FLUX.1-schnell-NVFP4"),
    KnownPolicy("qwen21_r020_v1", 1, "qwen-image-2.1", "qwen/qwen-image-2.1", {"nvfp4": 48, "fp8": 181, "bf16": 3},
                "unsloth/Qwen-Image-2.1-NVFP4"),
    KnownPolicy("qwen2512_m120_attn8_v1", 1, "qwen-image", "qwen/qwen-image-2512",
                {"nvfp4": 600, "fp8": 243, "bf16": 3}, "unsloth/Qwen-Image-2512-NVFP4"),
    KnownPolicy("qwen_p02_v1", 1, "qwen-image", "qwen/qwen-image", {"nvfp4": 120, "fp8": 723, "bf16": 3},
                "unsloth/Qwen-Image-FP8"),
)}
# Policies Unsloth retired: id -> the id whose hosted file replaced the files built with it
RETIRED_POLICIES = {"zimg_f8mod_toq34_v1": "zimg_rg76_v1", "flux_mod_single_v1": "flux_r420_v1"}


def safe(v, n: int = 60) -> str:
    return escape(str(v)[:n])


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _names(v, field: str, reasons: list[str]) -> list[str] | None:
    if not isinstance(v, (list, tuple)) or not v:
        reasons.append(f"metadata '{field}' must be a non-empty list of layer names, found {type(v).__name__} "
                       f"{str(v)[:60]!r}")
        return None
    bad = [x for x in v if not isinstance(x, str) or not x]
    if bad:
        reasons.append(f"metadata '{field}' must hold non-empty layer names, found {str(bad[0])[:60]!r}")
        return None
    seen: set = set()
    dup = sorted({x for x in v if x in seen or seen.add(x)})  # one pass: a hostile list may hold millions
    if dup:
        reasons.append(f"metadata '{field}' names layers more than once: {', '.join(dup[:3])}")
        return None
    return list(v)


def expected_tag(meta: dict) -> str:
    if meta.get("cast_backend") == LAYERWISE_CAST:
        return TEXT_ENCODER_FORMAT_V1
    if meta.get("nvfp4_policy") is not None:
        return FORMAT_V3
    if meta.get("activation_rotation"):
        return FORMAT_V2
    return FORMAT_V1


def tag_reasons(ckpt: Checkpoint) -> list[str]:
    """v3 exactly when a policy is declared, v2 exactly when a rotation is, never both."""
    m, tag = ckpt.metadata, ckpt.format_tag
    if m.get("nvfp4_policy") is not None and m.get("activation_rotation"):
        return ["metadata declares both 'nvfp4_policy' and 'activation_rotation': a file is either a v3 NVFP4 "
                "policy or a v2 ConvRot file, never both"]
    want = expected_tag(m)
    if tag is not None and tag in (FORMAT_V1, FORMAT_V2, FORMAT_V3) and tag != want:
        why = {FORMAT_V3: "it declares 'nvfp4_policy'", FORMAT_V2: "it declares 'activation_rotation'",
               FORMAT_V1: "it declares neither 'nvfp4_policy' nor 'activation_rotation'"}[want]
        return [f"format tag is '{tag}', expected '{want}' because {why}"]
    return []


def _known_policy_reasons(pol: dict, meta: dict) -> tuple[list[str], list[str]]:
    """Unsloth's rule for a policy id it publishes (the id, version and counts of the policy it resolves for the
    file's family and base), a retired id's refusal with where the replacement lives, and a note for an id this pack
    does not know (a newer Unsloth's, or a user's own: loaded when the block agrees with the file)."""
    pid = pol.get("policy_id")
    if pid in RETIRED_POLICIES:
        new = KNOWN_POLICIES[RETIRED_POLICIES[pid]]
        return [f"nvfp4_policy 'policy_id' is '{pid}', a policy Unsloth retired: the hosted file built with it was "
                f"replaced by one built with '{new.policy_id}' (repo {new.repo}). Delete this file and download "
                f"the current one (preset or hub_repo {new.repo}, scheme nvfp4)"], []
    known = KNOWN_POLICIES.get(pid)
    if known is None:
        return [], [f"NVFP4 layer policy '{safe(pid)}' is not one of Unsloth's published policies (a newer release's, "
                    "or a custom build): loaded because its counts and layer list agree with the file"]
    reasons = []
    if pol.get("policy_version") != known.version:
        reasons.append(f"nvfp4_policy 'policy_version' is {safe(pol.get('policy_version'))}, expected {known.version} "
                       f"for '{pid}' (Unsloth's published policy)")
    fam, base = meta.get("family"), meta.get("base_model_id")
    if isinstance(fam, str) and fam.strip().lower() != known.family:
        reasons.append(f"nvfp4_policy '{pid}' is Unsloth's policy for {known.family}, but the file's family is "
                       f"'{safe(fam)}'")
    elif isinstance(base, str) and base.strip():
        b = base.strip().replace("\\", "/").rstrip("/").lower()
        same_family = [p for p in KNOWN_POLICIES.values() if p.family == known.family]
        for_base = [p for p in same_family if p.base == b or p.base.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1]]
        if for_base and for_base[0].policy_id != pid:
            reasons.append(f"nvfp4_policy 'policy_id' is '{pid}', expected '{for_base[0].policy_id}' for base "
                           f"'{safe(base)}' (the policy Unsloth resolves for that base)")
    counts = pol.get("counts") if isinstance(pol.get("counts"), dict) else {}
    have = {k: v for k, v in counts.items() if v}
    if not reasons and have != known.counts:
        reasons.append(f"nvfp4_policy 'counts' is {safe(have)}, expected {known.counts} for '{pid}' (Unsloth's "
                       "published policy)")
    return reasons, []


def policy_notes(ckpt: Checkpoint) -> list[str]:
    pol = ckpt.metadata.get("nvfp4_policy")
    return _known_policy_reasons(pol, ckpt.metadata)[1] if isinstance(pol, dict) else []


def policy_reasons(ckpt: Checkpoint, scheme: str | None) -> list[str]:
    """The ``nvfp4_policy`` block, and a per-format layer count equal to what the file holds."""
    pol = ckpt.metadata.get("nvfp4_policy")
    kinds: dict[str, int] = {}
    for v in ckpt.tensors.values():
        if qtensor.is_quantized(v):
            k = qtensor.kind_of(v)
            kinds[k] = kinds.get(k, 0) + 1
    if pol is None:
        block = [k for k in kinds if k in qtensor.BLOCK_KINDS]
        # a ComfyUI-native file says each layer's format in its own entry: a mix needs no policy block there
        if block and len(kinds) > 1 and ckpt.container != "comfyui-native":
            return [f"the file mixes {' and '.join(sorted(kinds))} weights without an 'nvfp4_policy' block saying "
                    "which layer is which"]
        return []
    reasons: list[str] = []
    if not isinstance(pol, dict):
        return [f"metadata 'nvfp4_policy' must be an object, found {type(pol).__name__}"]
    if pol.get("kind") != POLICY_KIND:
        reasons.append(f"nvfp4_policy 'kind' is {str(pol.get('kind'))[:60]!r}, expected '{POLICY_KIND}'")
    if not isinstance(pol.get("policy_id"), str) or not pol.get("policy_id"):
        reasons.append(f"nvfp4_policy 'policy_id' must be a non-empty string, found {str(pol.get('policy_id'))[:60]!r}")
    ver = pol.get("policy_version")
    if not _int(ver) or ver < 1:
        reasons.append(f"nvfp4_policy 'policy_version' must be an integer >= 1, found {str(ver)[:30]!r}")
    for flag in ("activation_scales_baked", "gptq"):
        if flag in pol and not isinstance(pol[flag], bool):
            reasons.append(f"nvfp4_policy '{flag}' must be true/false, found {str(pol[flag])[:30]!r}")
    if scheme is not None and scheme != "nvfp4":
        reasons.append(f"a file with an nvfp4_policy must have scheme 'nvfp4', found '{scheme}'")
    counts = pol.get("counts")
    if not isinstance(counts, dict) or not counts:
        reasons.append(f"nvfp4_policy 'counts' must be a non-empty object (format -> layers), found "
                       f"{str(counts)[:60]!r}")
        counts = None
    fqns = _names(pol.get("nvfp4_fqns"), "nvfp4_policy.nvfp4_fqns", reasons)
    if counts is not None:
        formats = policy_formats()
        for fmt, n in counts.items():
            if fmt not in formats:
                reasons.append(f"nvfp4_policy 'counts' names format '{str(fmt)[:30]}', expected one of "
                               f"{', '.join(formats)}")
            elif not _int(n) or n < 0:
                reasons.append(f"nvfp4_policy counts['{fmt}'] must be a whole number, found {str(n)[:30]!r}")
        if reasons:
            return reasons
        for fmt, kind in formats.items():
            if kind is None:
                continue
            have, say = kinds.get(kind, 0), counts.get(fmt, 0)
            if have != say:
                reasons.append(f"nvfp4_policy counts['{fmt}'] is {say}, the file holds {have} {fmt} layers")
        plain = sum(1 for k, v in ckpt.tensors.items()
                    if not qtensor.is_quantized(v) and k.endswith(".weight") and getattr(v, "ndim", 0) == 2)
        if counts.get("bf16", 0) > plain:
            reasons.append(f"nvfp4_policy counts['bf16'] is {counts['bf16']}, the file holds only {plain} plain "
                           "2-D weights")
        if fqns is not None and len(fqns) != counts.get("nvfp4", 0):
            reasons.append(f"nvfp4_policy lists {len(fqns)} nvfp4 layers in 'nvfp4_fqns', counts['nvfp4'] is "
                           f"{counts.get('nvfp4', 0)}")
    if fqns is not None:
        notnv = [f for f in fqns if not (qtensor.is_quantized(ckpt.tensors.get(f + ".weight"))
                                         and qtensor.kind_of(ckpt.tensors[f + ".weight"]) == "nvfp4")]
        if notnv:
            reasons.append(f"nvfp4_policy.nvfp4_fqns names {len(notnv)} layers that are not NVFP4 weights in the "
                           f"file, e.g. '{notnv[0][:80]}'")
    if not reasons:
        reasons += _known_policy_reasons(pol, ckpt.metadata)[0]
    return reasons


def rotation_reasons(ckpt: Checkpoint) -> list[str]:
    """``activation_rotation`` / ``_group`` / ``_fqns``: each listed layer exists, is a quantized Linear weight,
    and its input width divides by the group."""
    m = ckpt.metadata
    kind = m.get("activation_rotation")
    if not kind:
        return []
    if kind != rotation.KIND:
        return [f"activation_rotation is {str(kind)[:60]!r}, expected '{rotation.KIND}' (the only rotation this pack "
                "rebuilds)"]
    reasons: list[str] = []
    group = m.get("activation_rotation_group", rotation.DEFAULT_GROUP)
    if not rotation.is_power_of_4(group) or group > rotation.MAX_GROUP:
        reasons.append(f"activation_rotation_group must be an integer power of 4 up to {rotation.MAX_GROUP} (4, 16, "
                       f"64, 256, 1024; Unsloth and ComfyUI use 256), found {type(group).__name__} "
                       f"{safe(group, 30)!r}")
    fqns = _names(m.get("activation_rotation_fqns"), "activation_rotation_fqns", reasons)
    if reasons:
        return reasons
    for f in fqns:
        w = ckpt.tensors.get(f + ".weight")
        if w is None:
            reasons.append(f"activation_rotation_fqns names '{f[:80]}', which has no weight in the file")
        elif not qtensor.is_quantized(w) or len(w.shape) != 2:
            reasons.append(f"activation_rotation_fqns names '{f[:80]}', which is not a quantized Linear weight")
        elif w.shape[1] % group:
            reasons.append(f"activation_rotation_fqns names '{f[:80]}' with input width {w.shape[1]}, not divisible "
                           f"by the rotation group {group}")
        if len(reasons) >= 5:
            break
    return reasons


def mark_rotations(ckpt: Checkpoint) -> int:
    """After ``rotation_reasons`` passed: tag each rotated weight with its group, which its ``QSpec`` then carries
    through key maps, fusing and into the ComfyUI Linear. Returns how many were tagged."""
    m = ckpt.metadata
    if not m.get("activation_rotation"):
        return 0
    group = m.get("activation_rotation_group", rotation.DEFAULT_GROUP)
    for f in m["activation_rotation_fqns"]:
        setattr(ckpt.tensors[f + ".weight"], qtensor.ROTATION_ATTR, group)
    return len(m["activation_rotation_fqns"])


def summary(meta: dict) -> str | None:
    """One line for Info: the policy (layers per format) or the rotation."""
    pol = meta.get("nvfp4_policy")
    if isinstance(pol, dict):
        counts = pol.get("counts") if isinstance(pol.get("counts"), dict) else {}
        per = ", ".join(f"{n} {fmt}" for fmt, n in counts.items())
        return f"NVFP4 layer policy '{str(pol.get('policy_id'))[:60]}' v{pol.get('policy_version')}: {per} layers"
    if meta.get("activation_rotation"):
        fq = meta.get("activation_rotation_fqns")
        n = len(fq) if isinstance(fq, (list, tuple)) else "?"
        return (f"ConvRot: {n} layers' inputs rotated by a block Hadamard of "
                f"{meta.get('activation_rotation_group', rotation.DEFAULT_GROUP)}")
    return None
