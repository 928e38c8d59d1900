"""What a v2 (ConvRot) or v3 (layer policy) file declares about its layers, checked against what it holds
(docs/FORMAT.md section 9). The rotation rules are here; a scheme's own file rules (the v3 NVFP4 layer policy:
``schemes/nvfp4_policy.py``) are found through the registry (``Scheme.file_rules``) and handed the file's facts.
Every reason names the field, what was expected and what was found; nothing about a layer changes before all of them
pass."""
from __future__ import annotations

from .. import families
from ..schemes import qtensor, registry, rotation
from ..schemes.file_rules import FileFacts, layer_names
from .checkpoint import FORMAT_V1, FORMAT_V2, FORMAT_V3, LAYERWISE_CAST, TEXT_ENCODER_FORMAT_V1, Checkpoint
from ..safe_text import escape


def rules() -> list:
    """Every registered scheme's file rules, in the registry's order."""
    return [r for s in registry.all_schemes() for r in s.file_rules]


def _policies() -> list:
    return [r for r in rules() if r.layer_policy]


def safe(v, n: int = 60) -> str:
    return escape(str(v)[:n])


def _fields(rs) -> str:
    return " / ".join(f"'{r.field}'" for r in rs) or "layer policy"


def expected_tag(meta: dict) -> str:
    if meta.get("cast_backend") == LAYERWISE_CAST:
        return TEXT_ENCODER_FORMAT_V1
    if any(meta.get(r.field) is not None for r in _policies()):
        return FORMAT_V3
    if meta.get("activation_rotation"):
        return FORMAT_V2
    return FORMAT_V1


def tag_reasons(ckpt: Checkpoint) -> list[str]:
    """v3 exactly when a layer policy is declared, v2 exactly when a rotation is, never both."""
    m, tag = ckpt.metadata, ckpt.format_tag
    policies = _policies()
    declared = [r for r in policies if m.get(r.field) is not None]
    if declared and m.get("activation_rotation"):
        return [f"metadata declares both '{declared[0].field}' and 'activation_rotation': a file is either a v3 "
                f"{declared[0].title} or a v2 ConvRot file, never both"]
    want = expected_tag(m)
    if tag is not None and tag in (FORMAT_V1, FORMAT_V2, FORMAT_V3) and tag != want:
        why = {FORMAT_V3: f"it declares {_fields(declared)}", FORMAT_V2: "it declares 'activation_rotation'",
               FORMAT_V1: f"it declares neither {_fields(policies)} nor 'activation_rotation'"}[want]
        return [f"format tag is '{tag}', expected '{want}' because {why}"]
    return []


def _facts(ckpt: Checkpoint, kinds: dict) -> FileFacts:
    layer_kinds, plain = {}, 0
    for k, v in ckpt.tensors.items():
        if qtensor.is_quantized(v):
            if k.endswith(".weight"):
                layer_kinds[k[: -len(".weight")]] = qtensor.kind_of(v)
        elif k.endswith(".weight") and getattr(v, "ndim", 0) == 2:
            plain += 1
    return FileFacts(metadata=ckpt.metadata, kinds=kinds, layer_kinds=layer_kinds, plain_weights=plain,
                     scheme_kinds={s.name: s.kind for s in registry.all_schemes()}, families=families)


def _kinds(ckpt: Checkpoint) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for v in ckpt.tensors.values():
        if qtensor.is_quantized(v):
            k = qtensor.kind_of(v)
            kinds[k] = kinds.get(k, 0) + 1
    return kinds


def policy_notes(ckpt: Checkpoint) -> list[str]:
    m = ckpt.metadata
    declared = [r for r in rules() if m.get(r.field) is not None]
    if not declared:
        return []
    facts = _facts(ckpt, _kinds(ckpt))
    return [n for r in declared for n in r.notes(m[r.field], facts)]


def policy_reasons(ckpt: Checkpoint, scheme: str | None) -> list[str]:
    """Each declared block of a scheme's file rules, checked by its rule against what the file holds; without a
    layer policy, a file mixing per-block weights with others is refused (nothing says which layer is which)."""
    m = ckpt.metadata
    kinds = _kinds(ckpt)
    declared = [r for r in rules() if m.get(r.field) is not None]
    if not any(r.layer_policy for r in declared):
        block = [k for k in kinds if registry.codec(k).block]
        # a ComfyUI-native file says each layer's format in its own entry: a mix needs no policy block there
        if block and len(kinds) > 1 and ckpt.container != "comfyui-native":
            return [f"the file mixes {' and '.join(sorted(kinds))} weights without an {_fields(_policies())} block "
                    "saying which layer is which"]
    if not declared:
        return []
    facts = _facts(ckpt, kinds)
    return [x for r in declared for x in r.reasons(m[r.field], facts, scheme)]


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
    fqns = layer_names(m.get("activation_rotation_fqns"), "activation_rotation_fqns", reasons)
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
    """One line for Info: a scheme's file rule (the NVFP4 policy: layers per format) or the rotation."""
    for r in rules():
        line = r.summary(meta[r.field]) if meta.get(r.field) is not None else None
        if line:
            return line
    if meta.get("activation_rotation"):
        fq = meta.get("activation_rotation_fqns")
        n = len(fq) if isinstance(fq, (list, tuple)) else "?"
        return (f"ConvRot: {n} layers' inputs rotated by a block Hadamard of "
                f"{meta.get('activation_rotation_group', rotation.DEFAULT_GROUP)}")
    return None
