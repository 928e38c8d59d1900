"""The conformance corpus for one family: files made by ``unsloth_builder`` (Unsloth's builder restated) for every
kind x container, each validated (fingerprint included), described by Info, loaded into the family's diffusers class
by ``prequant_core.diffusers_loader``, and compared with this pack quantizing the same dense weights at load.

Used in-process by tests/families/test_unsloth_conformance.py and, for families whose diffusers class needs diffusers 0.42,
as ``python tests/conformance_check.py FAMILY FOLDER`` in a subprocess with that diffusers first on the path (prints
one JSON list).
"""
from __future__ import annotations

import copy
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (HERE, os.path.dirname(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import unsloth_builder as ub  # noqa: E402
from prequant_core import diffusers_loader, families, report, schemes
from prequant_core.load import opening, metadata
from prequant_core.schemes import qtensor  # noqa: E402
from tools import tiny_families as tf  # noqa: E402

KINDS = ("int8", "fp8", "nvfp4", "policy", "convrot")
CONTAINERS = ("pt", "safetensors")


def corpus_files(family: str, folder: str, kinds=KINDS) -> dict:
    """{(kind, container): path}, each kind built once and written in both containers (the safetensors file as
    Unsloth's converter makes it from the pickle)."""
    out = {}
    stem = ub.FAMILIES[family][1].rsplit("/", 1)[-1]
    for kind in kinds:
        paths = [os.path.join(folder, f"{stem}-{kind.upper()}.{c}") for c in CONTAINERS]
        if not all(os.path.exists(p) for p in paths):
            ub.build_file(family, kind, paths)
        for c, p in zip(CONTAINERS, paths):
            out[(kind, c)] = p
    return out


_DENSE: dict = {}


def _dense(family: str) -> torch.nn.Module:
    """The family's tiny model as diffusers loads it in bf16 (a fresh copy each call; built once)."""
    if family not in _DENSE:
        m = tf.any_diffusers_model(family, 0, torch.float32)
        m.load_state_dict({k: v.to(torch.bfloat16) for k, v in m.state_dict().items()}, assign=True)
        _DENSE.clear()
        _DENSE[family] = m.eval()
    return copy.deepcopy(_DENSE[family])


def load_time_reference(family: str, ck, kind: str) -> torch.nn.Module:
    """The dense model with this pack's load-time quantization of the same weights: the scheme's filter and
    ``schemes.quantize_weight``; NVFP4 layers as torchao dequantizes them (no NVFP4 matmul off Blackwell). For a v3
    policy file the layer formats come from the file's own policy (Unsloth's assignment is data, not a rule)."""
    m = _dense(family)
    fam = families.get(family)
    scheme = ub.KINDS[kind]
    flt = schemes.LayerFilter(scheme, schemes.DEFAULT_MIN_FEATURES,
                              tuple(schemes.exclude_tokens(scheme, fam.arch.int8_exclude_extra)))
    pol = ck.metadata.get("nvfp4_policy") or {}
    nv = set(pol.get("nvfp4_fqns") or ())
    for name, mod in list(m.named_modules()):
        if not isinstance(mod, torch.nn.Linear):
            continue
        w = mod.weight.detach()
        if kind == "policy":
            fmt = "nvfp4" if name in nv else ("fp8" if qtensor.is_quantized(ck.tensors.get(name + ".weight")) else None)
        else:
            fmt = scheme if flt.reason_skipped(name, w) is None else None
        if fmt is None:
            continue
        q = schemes.quantize_weight(w, fmt)
        mod.weight = torch.nn.Parameter(q.dequantize(torch.bfloat16) if fmt == "nvfp4" else q, requires_grad=False)
    return m


def _same_tensors(a: dict, b: dict) -> bool:
    if set(a) != set(b):
        return False
    for k, v in a.items():
        w = b[k]
        if qtensor.is_quantized(v) != qtensor.is_quantized(w):
            return False
        if qtensor.is_quantized(v):
            (pa, sa), (pb, sb) = qtensor.parts(v), qtensor.parts(w)
            if sa != sb or len(pa) != len(pb) or not all(torch.equal(x, y) for x, y in zip(pa, pb)):
                return False
        elif v.dtype != w.dtype or not torch.equal(v, w):
            return False
    return True


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def check_family(family: str, folder: str, kinds=KINDS) -> list[dict]:
    os.makedirs(folder, exist_ok=True)
    files = corpus_files(family, folder, kinds)
    fam = families.get(family)
    base_id = ub.FAMILIES[family][1]
    base_dir = os.path.join(folder, "bases", base_id.rsplit("/", 1)[-1])
    tf.any_diffusers_model(family).save_config(os.path.join(base_dir, "transformer"))
    with torch.no_grad():
        dense_out = tf.diffusers_forward(family, _dense(family))
    refs: dict = {}
    results = []
    for (kind, container), path in sorted(files.items()):
        scheme = ub.KINDS[kind]
        r = {"family": family, "kind": kind, "container": container, "file": os.path.basename(path)}
        opened = opening.open_checkpoint(path, metadata.Request(scheme=scheme, base_model_id=base_id, family=family),
                                        model_dirs=[folder], fingerprint_mode="full")
        ck = opened.checkpoint
        r["notes"] = list(opened.verdict.notes)
        r["tag"] = ck.format_tag
        r["quantized"] = sorted(ck.quantized_keys)
        rep = report.info(path, {"scheme": scheme, "base_model_id": base_id}, verify_fingerprint=True)
        r["info_valid"], r["fingerprint_verified"] = rep.valid, rep.fingerprint_verified
        r["fingerprint_count"] = len((ck.metadata.get("fingerprint") or {}).get("modules") or {})
        if container != "pt":
            # the same weights in the other container: read bit for bit as from the pickle (the forward after reading
            # is the same code, run once per kind on the pickle)
            twin = opening.open_checkpoint(files[(kind, "pt")], metadata.Request(), model_dirs=[folder]).checkpoint
            r["same_as_pt"] = _same_tensors(ck.tensors, twin.tensors)
            results.append(r)
            continue
        loaded = diffusers_loader.load(fam.arch.diffusers_class, base_dir, path, scheme=scheme, allow_dirs=[folder])
        with torch.no_grad():
            got = tf.diffusers_forward(family, loaded.model)
            if kind != "convrot":
                if kind not in refs:  # this pack quantizing the same dense weights at load: one per kind
                    ref = load_time_reference(family, ck, kind)
                    flt = schemes.LayerFilter(scheme, schemes.DEFAULT_MIN_FEATURES,
                                              tuple(schemes.exclude_tokens(scheme, fam.arch.int8_exclude_extra)))
                    selected = sorted(n + ".weight" for n, mod in ref.named_modules()
                                      if isinstance(mod, torch.nn.Linear) and flt.reason_skipped(n, mod.weight) is None)
                    refs[kind] = (tf.diffusers_forward(family, ref), selected)
                want, selected = refs[kind]
                if kind != "policy":  # the layers Unsloth's filter quantized are the ones this pack's filter picks
                    r["filter_agrees"] = selected == r["quantized"]
                r["max_abs_diff"] = (got.float() - want.float()).abs().max().item()
        r["rel_vs_dense"] = _rel(got, dense_out)
        r["finite"] = bool(torch.isfinite(got.float()).all())
        results.append(r)
    return results


if __name__ == "__main__":
    print(json.dumps(check_family(sys.argv[1], sys.argv[2])))
