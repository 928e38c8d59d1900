"""prequant_core/load/metadata.py and schemes/nvfp4_policy.py on metadata the other tests do not give them: a stale
per-tensor fp8 file whose family hosts no per-row file for its base (or whose family is unknown), told how to make
one instead of where to download it; min_features values that are no integer; an ``nvfp4_policy`` that is not an
object, that counts a format the pack does not know or a count that is not a whole number, or that names Unsloth's
published policy with another version; and the policy's one-line summary. Real torchao tensors in a Checkpoint.
Core tier: no ComfyUI."""
from __future__ import annotations

import pytest
import torch

from prequant_core import families, schemes
from prequant_core.formats.checkpoint import FORMAT_V1, FORMAT_V3, Checkpoint
from prequant_core.load import metadata
from prequant_core.schemes import nvfp4_policy, qtensor

BUILD = "or build a per-row file from the dense model with Build Prequant Checkpoint"


def w(seed=6):
    return torch.randn(64, 64, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def per_tensor_fp8():
    v = schemes.quantize_weight(w(), "fp8")
    q, s, _ = qtensor.split(v)
    return type(v)(q, s.max().reshape(1, 1), [1, q.shape[1]], mm_config=v.mm_config,
                   act_quant_kwargs=v.act_quant_kwargs, kernel_preference=v.kernel_preference, dtype=v.dtype)


def stale_reason(meta, family):
    ck = Checkpoint(path="/m/old.pt", container="pt", format_tag=FORMAT_V1, metadata=meta,
                    tensors={"a.weight": per_tensor_fp8()})
    v = metadata.validate(ck, metadata.Request(), family=family)
    assert not v.ok
    (r,) = [r for r in v.reasons if "one scale per tensor" in r]
    return r


@pytest.mark.parametrize("family,base", [("z-image", "Tongyi-MAI/Z-Image"), (None, "someone/Some-Model")])
def test_a_stale_per_tensor_file_with_no_hosted_replacement_is_told_to_build_one(family, base):
    fam = families.get(family) if family else None
    r = stale_reason({"scheme": "fp8", "base_model_id": base}, fam)
    assert r == ("1 fp8 weights use one scale per tensor (e.g. 'a.weight'): a stale per-tensor fp8 build (Unsloth's "
                 f"older builder); use a per-row fp8 file, {BUILD}")
    # the hosted base gets the hosted file's name instead
    hosted = stale_reason({"scheme": "fp8", "base_model_id": "Tongyi-MAI/Z-Image-Turbo"}, families.get("z-image"))
    assert hosted.endswith("the current file is Z-Image-Turbo-FP8.safetensors in unsloth/Z-Image-Turbo-FP8 (per-row; "
                           f"the loader's preset downloads it), {BUILD}")


def test_min_features_that_is_no_integer():
    assert metadata.as_int(True) is None and metadata.as_int(False) is None
    assert metadata.as_int(512.0) is None and metadata.as_int(None) is None and metadata.as_int([512]) is None
    assert metadata.as_int(" 512 ") == 512 and metadata.as_int("5x") is None and metadata.as_int(512) == 512
    # a request's min_features that is no integer never matches the file's
    ck = Checkpoint(path="/m/f.pt", container="pt", format_tag=FORMAT_V1,
                    metadata={"scheme": "int8", "min_features": 512},
                    tensors={"a.weight": schemes.quantize_weight(w(), "int8")})
    assert metadata.validate(ck, metadata.Request(min_features=512)).ok
    v = metadata.validate(ck, metadata.Request(min_features=512.0))
    assert "min_features is 512, requested 512.0" in v.reasons


def policy_file(**policy):
    tensors = {"a.weight": schemes.quantize_weight(w(), "nvfp4"), "b.weight": schemes.quantize_weight(w(), "nvfp4"),
               "c.weight": schemes.quantize_weight(w(), "fp8"), "d.weight": w().clone(), "n.weight": torch.ones(64)}
    pol = {"kind": nvfp4_policy.POLICY_KIND, "policy_id": "p1", "policy_version": 1,
           "counts": {"nvfp4": 2, "fp8": 1, "bf16": 1}, "nvfp4_fqns": ["a", "b"]}
    pol.update(policy)
    return Checkpoint(path="/m/nv.pt", container="pt", format_tag=FORMAT_V3,
                      metadata={"scheme": "nvfp4", "nvfp4_policy": pol}, tensors=tensors)


def reasons(ck):
    v = metadata.validate(ck, metadata.Request())
    assert not v.ok
    return v.reasons


def test_a_policy_that_is_not_an_object_is_refused():
    ck = policy_file()
    ck.metadata["nvfp4_policy"] = ["zimg_rg76_v1"]
    assert "metadata 'nvfp4_policy' must be an object, found list" in reasons(ck)


def test_a_policy_counting_an_unknown_format_or_a_count_that_is_no_whole_number():
    r = reasons(policy_file(counts={"nvfp4": 2, "fp8": 1, "int4": 1}))
    (said,) = [x for x in r if "names format" in x]
    assert said.startswith("nvfp4_policy 'counts' names format 'int4', expected one of ")
    assert said.endswith(", bf16") and "nvfp4" in said and "fp8" in said
    assert "nvfp4_policy counts['fp8'] must be a whole number, found '1'" in \
        reasons(policy_file(counts={"nvfp4": 2, "fp8": "1", "bf16": 1}))
    assert "nvfp4_policy counts['bf16'] must be a whole number, found '-1'" in \
        reasons(policy_file(counts={"nvfp4": 2, "fp8": 1, "bf16": -1}))


def test_unsloths_published_policy_with_another_version_is_refused():
    known = families.nvfp4_policies()["zimg_rg76_v1"]
    r = reasons(policy_file(policy_id="zimg_rg76_v1", policy_version=known.version + 1))
    assert r == [f"nvfp4_policy 'policy_version' is {known.version + 1}, expected {known.version} for 'zimg_rg76_v1' "
                 "(Unsloth's published policy)"]


def test_the_policys_summary_line():
    ck = policy_file()
    assert nvfp4_policy.summary(ck.metadata["nvfp4_policy"]) == \
        "NVFP4 layer policy 'p1' v1: 2 nvfp4, 1 fp8, 1 bf16 layers"
    assert nvfp4_policy.summary({"policy_id": "x", "policy_version": 2, "counts": "many"}) == \
        "NVFP4 layer policy 'x' v2:  layers"
    assert nvfp4_policy.summary("zimg_rg76_v1") is None and nvfp4_policy.summary(None) is None
