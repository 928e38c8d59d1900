"""NVFP4's file rule: Unsloth's v3 layer policy (docs/FORMAT.md section 9). A v3 file's ``nvfp4_policy`` block says
which layers are NVFP4 and how many layers of each format the file holds; it is checked against what the file holds
and, for a policy Unsloth publishes, against the policy it resolves for the file's family and base (each family's
record lists its own: ``Hosting.nvfp4_policies``, read through the family registry the checks are handed). Every
reason names the field, what was expected and what was found. ``formats/layer_policy.py`` runs it through the
registry (``Scheme.file_rules``)."""
from __future__ import annotations

from ..safe_text import escape
from .file_rules import FileFacts, FileRule, is_int, layer_names

FIELD = "nvfp4_policy"
POLICY_KIND = "unsloth_nvfp4_layer_policy_v1"
SCHEME = KIND = "nvfp4"  # the scheme the policy's files are, and the kind of their NVFP4 weights
PLAIN = "bf16"  # the policy's name for layers kept as plain weights


def safe(v, n: int = 60) -> str:
    return escape(str(v)[:n])


def _known_policy_reasons(pol: dict, facts: FileFacts) -> tuple[list[str], list[str]]:
    """Unsloth's rule for a policy id it publishes (the id, version and counts of the policy it resolves for the
    file's family and base), a retired id's refusal with where the replacement lives, and a note for an id this pack
    does not know (a newer Unsloth's, or a user's own: loaded when the block agrees with the file)."""
    meta = facts.metadata
    pid = pol.get("policy_id")
    # Unsloth's NVFP4_POLICIES (docs/FORMAT.md section 9): each family's module lists its own (Hosting.nvfp4_policies)
    policies, retired = facts.families.nvfp4_policies(), facts.families.retired_nvfp4_policies()
    if pid in retired:
        new = policies[retired[pid]]
        return [f"nvfp4_policy 'policy_id' is '{pid}', a policy Unsloth retired: the hosted file built with it was "
                f"replaced by one built with '{new.policy_id}' (repo {new.repo}). Delete this file and download "
                f"the current one (preset or hub_repo {new.repo}, scheme nvfp4)"], []
    known = policies.get(pid)
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
        same_family = [p for p in policies.values() if p.family == known.family]
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


def notes(pol, facts: FileFacts) -> list[str]:
    return _known_policy_reasons(pol, facts)[1] if isinstance(pol, dict) else []


def reasons(pol, facts: FileFacts, scheme: str | None) -> list[str]:
    """The ``nvfp4_policy`` block, and a per-format layer count equal to what the file holds."""
    if not isinstance(pol, dict):
        return [f"metadata 'nvfp4_policy' must be an object, found {type(pol).__name__}"]
    out: list[str] = []
    if pol.get("kind") != POLICY_KIND:
        out.append(f"nvfp4_policy 'kind' is {str(pol.get('kind'))[:60]!r}, expected '{POLICY_KIND}'")
    if not isinstance(pol.get("policy_id"), str) or not pol.get("policy_id"):
        out.append(f"nvfp4_policy 'policy_id' must be a non-empty string, found {str(pol.get('policy_id'))[:60]!r}")
    ver = pol.get("policy_version")
    if not is_int(ver) or ver < 1:
        out.append(f"nvfp4_policy 'policy_version' must be an integer >= 1, found {str(ver)[:30]!r}")
    for flag in ("activation_scales_baked", "gptq"):
        if flag in pol and not isinstance(pol[flag], bool):
            out.append(f"nvfp4_policy '{flag}' must be true/false, found {str(pol[flag])[:30]!r}")
    if scheme is not None and scheme != SCHEME:
        out.append(f"a file with an nvfp4_policy must have scheme 'nvfp4', found '{scheme}'")
    counts = pol.get("counts")
    if not isinstance(counts, dict) or not counts:
        out.append(f"nvfp4_policy 'counts' must be a non-empty object (format -> layers), found "
                   f"{str(counts)[:60]!r}")
        counts = None
    fqns = layer_names(pol.get("nvfp4_fqns"), "nvfp4_policy.nvfp4_fqns", out)
    if counts is not None:
        # a policy's format names are the scheme names (-> what the file's weights are); PLAIN layers are plain
        formats = {**facts.scheme_kinds, PLAIN: None}
        for fmt, n in counts.items():
            if fmt not in formats:
                out.append(f"nvfp4_policy 'counts' names format '{str(fmt)[:30]}', expected one of "
                           f"{', '.join(formats)}")
            elif not is_int(n) or n < 0:
                out.append(f"nvfp4_policy counts['{fmt}'] must be a whole number, found {str(n)[:30]!r}")
        if out:
            return out
        for fmt, kind in formats.items():
            if kind is None:
                continue
            have, say = facts.kinds.get(kind, 0), counts.get(fmt, 0)
            if have != say:
                out.append(f"nvfp4_policy counts['{fmt}'] is {say}, the file holds {have} {fmt} layers")
        plain = facts.plain_weights
        if counts.get(PLAIN, 0) > plain:
            out.append(f"nvfp4_policy counts['bf16'] is {counts[PLAIN]}, the file holds only {plain} plain "
                       "2-D weights")
        if fqns is not None and len(fqns) != counts.get(SCHEME, 0):
            out.append(f"nvfp4_policy lists {len(fqns)} nvfp4 layers in 'nvfp4_fqns', counts['nvfp4'] is "
                       f"{counts.get(SCHEME, 0)}")
    if fqns is not None:
        notnv = [f for f in fqns if facts.layer_kinds.get(f) != KIND]
        if notnv:
            out.append(f"nvfp4_policy.nvfp4_fqns names {len(notnv)} layers that are not NVFP4 weights in the "
                       f"file, e.g. '{notnv[0][:80]}'")
    if not out:
        out += _known_policy_reasons(pol, facts)[0]
    return out


def summary(pol) -> str | None:
    """One line for Info: the policy and its layers per format."""
    if not isinstance(pol, dict):
        return None
    counts = pol.get("counts") if isinstance(pol.get("counts"), dict) else {}
    per = ", ".join(f"{n} {fmt}" for fmt, n in counts.items())
    return f"NVFP4 layer policy '{str(pol.get('policy_id'))[:60]}' v{pol.get('policy_version')}: {per} layers"


RULE = FileRule(field=FIELD, title="NVFP4 policy", reasons=reasons, notes=notes, summary=summary, layer_policy=True)
