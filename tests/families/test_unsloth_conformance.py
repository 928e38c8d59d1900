"""Conformance with files this pack did not make: for every family, files written the way Unsloth's builder writes
them (tests/unsloth_builder.py, which never imports this pack) for int8, fp8, whole-model NVFP4, a v3 NVFP4 layer
policy and int8 ConvRot (v2), each as a ``.pt`` and as a converted ``.safetensors``, pass validation (Unsloth's
pinned fields, the fingerprint in full mode), Prequant Info, and load into the family's diffusers class equal to
this pack quantizing the same dense weights at load (NVFP4: its exact dequantization). ComfyUI's side of the same
corpus: tests/families/test_unsloth_conformance_comfy.py.

The bugs this corpus found: the ``require_bf16`` rule (every NVFP4 file was refused), the ConvRot Hadamard
(Sylvester's ordering instead of Unsloth's regular one: relative error 0.5 against the dense model), the
fingerprint algorithm (never matched an Unsloth file), the diffusers loader dropping the rotation of ConvRot layers.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import conformance_check as cc
import unsloth_builder as ub
from conftest import ROOT
from prequant_core import families, formats
from prequant_core.formats import fingerprint
from prequant_core.load import opening, metadata
from prequant_core.errors import ValidationError
from tools import tiny_families as tf

HERE = ["z-image", *tf.TINY]  # diffusers classes in the pinned diffusers
NEWER = list(tf.DIFFUSERS_ONLY)  # diffusers 0.42 classes: checked in a subprocess
DIFFUSERS042 = os.path.join(ROOT, ".cache", "diffusers042")


def test_the_corpus_covers_every_family():
    assert set(HERE) | set(NEWER) == set(families.FAMILIES) == set(ub.FAMILIES)


def _assert_family(results: list[dict]):
    by = {(r["kind"], r["container"]): r for r in results}
    assert set(by) == {(k, c) for k in cc.KINDS for c in cc.CONTAINERS}
    int8_rel = by[("int8", "pt")]["rel_vs_dense"]
    for kind in cc.KINDS:  # the converted container holds the same weights, read bit for bit
        st = by[(kind, "safetensors")]
        assert st["same_as_pt"] and st["info_valid"] is True and st["fingerprint_verified"] is True, st
        assert st["quantized"] == by[(kind, "pt")]["quantized"] and st["tag"] == by[(kind, "pt")]["tag"]
    for (kind, container), r in sorted(by.items()):
        if container != "pt":
            continue
        print(f"\n[{r['family']}/{kind}/{container}] {len(r['quantized'])} quantized, tag v{r['tag'][-1]}; "
              f"max |file - load-time| = {r.get('max_abs_diff')}; rel. error vs dense = {r['rel_vs_dense']:.4f}")
        assert r["info_valid"] is True and r["fingerprint_verified"] is True, r
        assert r["fingerprint_count"] == len(r["quantized"]) > 0
        assert r["finite"]
        if kind == "convrot":
            # rotated back with Unsloth's matrix: as close to dense as plain int8 (Sylvester's ordering: > 0.3)
            assert r["tag"] == ub.FORMAT_V2 and r["rel_vs_dense"] < max(1.5 * int8_rel, 0.03), r
        else:
            assert r["max_abs_diff"] == 0.0, "must equal this pack quantizing the same dense weights at load"
            assert r["rel_vs_dense"] < (0.3 if kind == "nvfp4" else 0.15)
        if kind in ("int8", "fp8", "nvfp4"):
            assert r["filter_agrees"], "this pack's layer filter must pick the layers Unsloth's builder quantized"
        if kind == "policy":
            assert r["tag"] == ub.FORMAT_V3 and any("not one of Unsloth's published policies" in n for n in r["notes"])


@pytest.mark.parametrize("family", HERE)
def test_unsloth_files_load_equal_to_load_time_quantization(tmp_path, family):
    _assert_family(cc.check_family(family, str(tmp_path)))


@pytest.mark.parametrize("family", NEWER)
def test_unsloth_files_of_the_newer_diffusers_families(tmp_path, family):
    if not os.path.isfile(os.path.join(DIFFUSERS042, "diffusers", "__init__.py")):
        pytest.fail("diffusers 0.42.1 is missing at .cache/diffusers042: run scripts/setup_test_extras.sh diffusers042")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([DIFFUSERS042, ROOT, os.path.join(ROOT, "tests")]))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "conformance_check.py"), family, str(tmp_path)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    _assert_family(json.loads(p.stdout.strip().splitlines()[-1]))


# --- the rules one by one, on Unsloth-made files -------------------------------------------------------------------

@pytest.fixture(scope="module")
def flux_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("unsloth_flux")
    return str(d), cc.corpus_files("flux.1", str(d), kinds=("int8", "fp8", "nvfp4", "policy"))


def _open(path, folder, **req):
    return opening.open_checkpoint(path, metadata.Request(**req), model_dirs=[folder], fingerprint_mode="full")


def _rewrite(src: str, dst: str, edit) -> str:
    from prequant_core.formats.containers.pt import load_weights_only
    obj = load_weights_only(src, mmap=False)
    edit(obj)
    torch.save(obj, dst)
    return dst


@pytest.mark.parametrize("kind,value,ok", [("nvfp4", False, True), ("nvfp4", True, False), ("int8", False, True),
                                           ("int8", True, False), ("fp8", True, True), ("fp8", False, False)])
def test_require_bf16_is_unsloths_rule(flux_files, kind, value, ok):
    """Unsloth's own tests: nvfp4 + require_bf16 false loads, true is refused (only fp8 / mxfp8 need bf16)."""
    folder, files = flux_files
    dst = _rewrite(files[(kind, "pt")], os.path.join(folder, f"bf16-{kind}-{value}.pt"),
                   lambda o: o["metadata"].__setitem__("require_bf16", value))
    if ok:
        assert _open(dst, folder).verdict.ok
    else:
        with pytest.raises(ValidationError) as e:
            _open(dst, folder)
        assert f"require_bf16 is {value}, expected {not value}" in str(e.value)


@pytest.mark.parametrize("kind,value", [("int8", 16), ("fp8", 0), ("nvfp4", 32), ("fp8", 32)])
def test_require_divisible_is_unsloths_rule(flux_files, kind, value):
    folder, files = flux_files
    dst = _rewrite(files[(kind, "pt")], os.path.join(folder, f"div-{kind}-{value}.pt"),
                   lambda o: o["metadata"].__setitem__("require_divisible", value))
    with pytest.raises(ValidationError) as e:
        _open(dst, folder)
    want = {"int8": 0, "fp8": 16, "nvfp4": 16}[kind]
    assert f"require_divisible is {value}, expected {want}" in str(e.value)


def test_released_unsloth_files_without_the_newer_fields_load(tmp_path):
    """Releases v0.1.52 - v0.1.801 recorded no component, require_divisible or fingerprint and ran no divisibility
    filter: such files load (a missing field is accepted), their fingerprint is simply absent."""
    for kind in ("int8", "fp8"):
        p = str(tmp_path / f"FLUX.1-dev-{kind.upper()}.pt")
        meta = ub.build_file("flux.1", kind, p, version="released")
        assert "component" not in meta and "fingerprint" not in meta and "require_divisible" not in meta
        o = _open(p, str(tmp_path), scheme=kind, base_model_id="black-forest-labs/FLUX.1-dev")
        assert o.verdict.ok and o.checkpoint.metadata.get("fingerprint") is None


def test_wan_fp8_files_of_early_releases_with_their_excludes_load(tmp_path):
    """July-2026 Unsloth builds recorded exclude_name_tokens ['condition_embedder'] for Wan fp8 files; the current
    rule takes a superset of today's (empty) list."""
    p = str(tmp_path / "Wan2.2-TI2V-5B-FP8.pt")
    ub.build_file("wan2.2-ti2v-5b", "fp8", p, exclude=["condition_embedder"])
    o = _open(p, str(tmp_path), scheme="fp8")
    assert o.verdict.ok and o.checkpoint.metadata["exclude_name_tokens"] == ["condition_embedder"]
    assert not any("condition_embedder" in k for k in o.checkpoint.quantized_keys)


def test_second_expert_file_records_its_component(tmp_path):
    p = str(tmp_path / "Wan2.2-T2V-A14B-transformer_2-NVFP4.pt")
    ub.build_file("wan2.2-t2v-a14b", "nvfp4", p, component="transformer_2")
    assert _open(p, str(tmp_path), component="transformer_2").verdict.ok
    with pytest.raises(ValidationError) as e:
        _open(p, str(tmp_path))
    assert "component is 'transformer_2', expected 'transformer'" in str(e.value)


# --- the fingerprint, as Unsloth computes and checks it -------------------------------------------------------------

def test_fingerprint_equals_unsloths_for_every_kind(flux_files):
    folder, files = flux_files
    for (kind, container), p in files.items():
        ck = formats.read(p)
        mine = fingerprint.compute(ck.tensors)
        theirs = ck.metadata["fingerprint"]
        assert mine["modules"] == theirs["modules"] and mine["count"] == theirs["count"], (kind, container)
        assert mine["skipped"] == theirs["skipped"]


def test_a_changed_weight_is_refused_in_full_and_sample_mode_and_remembered_passes_skip_hashing(flux_files,
                                                                                             monkeypatch, tmp_path):
    folder, files = flux_files
    src = files[("int8", "pt")]
    ck = formats.read(src)
    key = sorted(ck.metadata["fingerprint"]["modules"])[0]
    sampled = [k for k in ck.metadata["fingerprint"]["modules"] if fingerprint.sampled(k)]

    def flip(o, k=key):
        w = o["state_dict"][k]
        w.qdata[0, 0] = -w.qdata[0, 0] - 1
    dst = _rewrite(src, os.path.join(folder, "tampered.pt"), flip)
    with pytest.raises(ValidationError) as e:
        _open(dst, folder)
    assert "fingerprint" in str(e.value) and "differ" in str(e.value) and "PREQUANT_FINGERPRINT=off" in str(e.value)
    monkeypatch.setenv("PREQUANT_FINGERPRINT", "off")
    assert opening.open_checkpoint(dst, metadata.Request(), model_dirs=[folder]).verdict.ok
    monkeypatch.setenv("PREQUANT_FINGERPRINT", "sample")
    if key in sampled:
        with pytest.raises(ValidationError):
            opening.open_checkpoint(dst, metadata.Request(), model_dirs=[folder])
    else:  # sample mode checks only keys whose md5 starts with a multiple of 8, as Unsloth's does
        assert opening.open_checkpoint(dst, metadata.Request(), model_dirs=[folder]).verdict.ok
    # a full pass is remembered by path + size + mtime: the next load does not hash again
    monkeypatch.setenv("PREQUANT_FINGERPRINT", "full")
    monkeypatch.setenv("PREQUANT_VERIFIED_DIR", str(tmp_path / "verified"))
    calls = []
    real_verify = fingerprint.verify
    monkeypatch.setattr(fingerprint, "verify", lambda *a, **k: calls.append(1) or real_verify(*a, **k))
    opening.open_checkpoint(src, metadata.Request(), model_dirs=[folder])
    opening.open_checkpoint(src, metadata.Request(), model_dirs=[folder])
    assert len(calls) == 1 and len(os.listdir(tmp_path / "verified")) == 1
    os.utime(src, ns=(1, 1))  # touched: hashed again
    opening.open_checkpoint(src, metadata.Request(), model_dirs=[folder])
    assert len(calls) == 2


# --- v3 policy ids ---------------------------------------------------------------------------------------------------

def _policy_ckpt(policy_id, counts, family="z-image", base="Tongyi-MAI/Z-Image-Turbo", version=1):
    """A Checkpoint holding exactly ``counts`` layers of each format (tiny 16x32 weights), with the policy block."""
    from prequant_core import schemes
    from prequant_core.formats.checkpoint import Checkpoint
    w = torch.randn(16, 32).to(torch.bfloat16)
    nv = schemes.quantize_weight(w, "nvfp4")
    f8 = schemes.quantize_weight(w, "fp8")
    tensors, nvf = {}, []
    for i in range(counts.get("nvfp4", 0)):
        tensors[f"n.{i}.weight"] = nv
        nvf.append(f"n.{i}")
    for i in range(counts.get("fp8", 0)):
        tensors[f"f.{i}.weight"] = f8
    for i in range(counts.get("bf16", 0)):
        tensors[f"b.{i}.weight"] = w
    pol = {"kind": "unsloth_nvfp4_layer_policy_v1", "policy_id": policy_id, "policy_version": version,
           "counts": dict(counts), "nvfp4_fqns": nvf, "activation_scales_baked": False, "gptq": False}
    meta = {"scheme": "nvfp4", "family": family, "base_model_id": base, "nvfp4_policy": pol,
            "fp8_granularity": "per_row"}
    return Checkpoint("/x/p.pt", "pt", ub.FORMAT_V3, meta, tensors)


def test_known_policy_ids_load_and_must_match_unsloths_counts():
    ok = _policy_ckpt("zimg_rg76_v1", {"nvfp4": 76, "fp8": 195, "bf16": 5})
    v = metadata.validate(ok, metadata.Request(scheme="nvfp4"), family=families.get("z-image"))
    assert v.ok and not v.notes, v.reasons
    bad = _policy_ckpt("zimg_rg76_v1", {"nvfp4": 75, "fp8": 196, "bf16": 5})
    v = metadata.validate(bad, metadata.Request(scheme="nvfp4"), family=families.get("z-image"))
    assert not v.ok and any("expected {'nvfp4': 76, 'fp8': 195, 'bf16': 5}" in r for r in v.reasons), v.reasons
    other = _policy_ckpt("qwen_p02_v1", {"nvfp4": 1, "fp8": 1}, family="z-image")
    v = metadata.validate(other, metadata.Request(scheme="nvfp4"), family=families.get("z-image"))
    assert not v.ok and any("policy for qwen-image" in r for r in v.reasons), v.reasons
    wrong_base = _policy_ckpt("qwen_p02_v1", {"nvfp4": 120, "fp8": 723, "bf16": 3}, family="qwen-image",
                              base="Qwen/Qwen-Image-2512")
    v = metadata.validate(wrong_base, metadata.Request(scheme="nvfp4"), family=families.get("qwen-image"))
    assert not v.ok and any("expected 'qwen2512_m120_attn8_v1'" in r for r in v.reasons), v.reasons


@pytest.mark.parametrize("retired,current,repo", [("zimg_f8mod_toq34_v1", "zimg_rg76_v1", "unsloth/Z-Image-Turbo-NVFP4"),
                                                  ("flux_mod_single_v1", "flux_r420_v1",
                                                   "unsloth/FLUX.1-schnell-NVFP4")])
def test_retired_policy_ids_say_the_hosted_file_was_replaced(retired, current, repo):
    ck = _policy_ckpt(retired, {"nvfp4": 2, "fp8": 3, "bf16": 1})
    v = metadata.validate(ck, metadata.Request(scheme="nvfp4"), family=None)
    assert not v.ok
    msg = " ".join(v.reasons)
    assert "retired" in msg and current in msg and repo in msg and "download the current one" in msg


def test_an_unknown_policy_id_loads_with_a_note_when_self_consistent():
    ck = _policy_ckpt("someones_own_v7", {"nvfp4": 2, "fp8": 3, "bf16": 1})
    v = metadata.validate(ck, metadata.Request(scheme="nvfp4"), family=families.get("z-image"))
    assert v.ok and any("someones_own_v7" in n and "not one of Unsloth's published policies" in n for n in v.notes)
    ck.metadata["nvfp4_policy"]["counts"]["fp8"] = 4  # not self-consistent: refused as before
    v = metadata.validate(ck, metadata.Request(scheme="nvfp4"), family=families.get("z-image"))
    assert not v.ok


# --- stale files: what Unsloth's older builders made, described by Info and refused by the loader as stale -------

@pytest.mark.parametrize("container", ["pt", "safetensors"])
def test_a_stale_per_tensor_fp8_build_is_described_and_refused_as_stale_not_corrupt(tmp_path, container):
    """Unsloth's older fp8 builds hold one scale per weight (torchao PerTensor, block_size the whole weight,
    ``fp8_granularity`` 'per_tensor'). Info and ``python -m prequant_core info`` describe such a file with an INVALID
    verdict that says it is stale and names the current per-row file; the loader refuses it with that reason as a
    ValidationError. Guards the tensor-field boundary calling it corrupt ("a field this pack does not accept:
    'block_size'") before validation could say what it is."""
    from prequant_core.report import info
    path = str(tmp_path / f"Z-Image-Turbo-FP8.{container}")
    meta = ub.build_file("z-image", "fp8", path, fp8_granularity="per_tensor")
    assert meta["fp8_granularity"] == "per_tensor"
    current = "the current file is Z-Image-Turbo-FP8.safetensors in unsloth/Z-Image-Turbo-FP8"
    r = info(path)
    assert not r.valid and r.scheme == "fp8" and r.family == "z-image"
    stale = [x for x in r.reasons if "stale per-tensor fp8 build" in x]
    assert stale and current in stale[0], r.reasons
    assert "stale" in r.to_text() and "INVALID" in r.to_text()
    with pytest.raises(ValidationError) as e:
        opening.open_checkpoint(path, metadata.Request(base_model_id=ub.FAMILIES["z-image"][1], scheme="fp8"),
                               model_dirs=[str(tmp_path)])
    assert "stale per-tensor fp8 build" in str(e.value) and current in str(e.value)
    if container == "pt":  # the command line answers the same, exit 0 (the file could be read)
        p = subprocess.run([sys.executable, "-m", "prequant_core", "info", path], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        assert "INVALID" in p.stdout and "stale per-tensor fp8 build" in p.stdout and current in p.stdout
