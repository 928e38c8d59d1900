"""The scheme registry: everything that depends on a quantization scheme is read from its record, so a scheme added
as one module (tests/toy/toy_scheme.py) plus one registry line is named from a repo suffix, given its file names,
built, validated with its own rules, described by Info and given a matmul path; without the line it is unknown.
Also pins the drift bugs the registry removed. Runs in the core tier (no ComfyUI)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from prequant_core import build, families, formats, report, schemes
from prequant_core.schemes import devices, qtensor
from prequant_core.load import metadata, sources
from prequant_core.errors import ValidationError
from prequant_core.formats import containers
from prequant_core.schemes import registry
from toy import toy_scheme

REPO = "me/Z-Image-Turbo-Q8TOY"
BASE = "Tongyi-MAI/Z-Image-Turbo"


def _dense():
    g = torch.Generator().manual_seed(0)
    return {"layers.0.attention.qkv.weight": (torch.randn(64, 64, generator=g) / 8).to(torch.bfloat16),
            "layers.0.feed_forward.w1.weight": (torch.randn(80, 64, generator=g) / 8).to(torch.bfloat16),
            "layers.0.attention_norm1.weight": torch.ones(64, dtype=torch.bfloat16)}


@pytest.fixture
def with_toy(monkeypatch):
    monkeypatch.setattr(registry, "SCHEMES", (*registry.SCHEMES, toy_scheme.SCHEME))


def test_every_scheme_record_is_complete_and_unique():
    recs = registry.all_schemes()
    assert [s.name for s in recs] == ["int8", "fp8", "nvfp4", "mxfp8"]
    assert len({s.suffix.lower() for s in recs}) == len(recs) and all(s.suffix.startswith("-") for s in recs)
    assert schemes.SCHEMES == ("int8", "fp8", "nvfp4", "mxfp8", "int8-weight-only", "fp8-weight-only")
    assert schemes.BLOCK_SCHEMES == ("nvfp4", "mxfp8")
    # Unsloth's builder rules, one record each (docs/FORMAT.md section 4)
    assert {s.name: (s.require_bf16, s.require_divisible) for s in recs} == {
        "int8": (False, 0), "fp8": (True, 16), "nvfp4": (False, 16), "mxfp8": (True, 32)}
    assert {s.kind for s in recs} == set(qtensor.ROW_KINDS + qtensor.BLOCK_KINDS)


def test_a_scheme_is_unknown_without_its_registry_line(tmp_path):
    with pytest.raises(ValidationError) as e:
        schemes.normalize("q8toy")
    assert "int8 / fp8 / nvfp4 / mxfp8" in str(e.value)
    assert families.schemes_from_suffix(REPO) == () and sources.model_name(REPO) == "Z-Image-Turbo-Q8TOY"
    with pytest.raises(ValidationError):
        build.build_from_tensors(str(tmp_path / "x.safetensors"), _dense(), family=families.get("z-image"),
                                 scheme="q8toy", base_model_id=BASE, min_features=32)


def test_a_new_scheme_is_one_module_and_one_line(tmp_path, with_toy):
    # named from a repo's suffix, with its own file names (no legacy transformer_<s>.pt: legacy_pt is False)
    assert schemes.normalize("Q8TOY") == "q8toy" and "q8toy" in schemes.SCHEMES
    assert families.schemes_from_suffix(REPO) == ("q8toy",) and sources.schemes_for_repo(REPO) == ("q8toy",)
    assert sources.model_name(REPO) == "Z-Image-Turbo"
    assert sources.filenames(REPO, "q8toy") == ("Z-Image-Turbo-Q8TOY.safetensors", "Z-Image-Turbo-Q8TOY.pt")
    assert "q8toy" in containers.writes_schemes(containers.by_name("safetensors"))
    assert build.default_filename(BASE, "q8toy", "safetensors") == "Z-Image-Turbo-Q8TOY.safetensors"

    # built with its own rule: the 80-row layer does not divide by 32 and stays dense; int8 would quantize it
    dense = _dense()
    path = build.build_from_tensors(str(tmp_path / "Z-Image-Turbo-Q8TOY.safetensors"), dense,
                                    family=families.get("z-image"), scheme="q8toy", base_model_id=BASE,
                                    min_features=32)
    ck = formats.read(path)
    assert ck.metadata["scheme"] == "q8toy" and ck.metadata["require_divisible"] == 32
    extra = families.get("z-image").int8_exclude_extra
    assert ck.metadata["exclude_name_tokens"] == schemes.exclude_tokens("int8", extra)
    w = ck.tensors["layers.0.attention.qkv.weight"]
    assert qtensor.is_quantized(w) and not qtensor.is_quantized(ck.tensors["layers.0.feed_forward.w1.weight"])
    int8 = schemes.quantize_weight(dense["layers.0.attention.qkv.weight"], "int8")
    assert torch.equal(w.dequantize(), int8.dequantize())

    # validated by its own rules: the file loads as q8toy, not as int8, and a file lying about the rule is refused
    req = metadata.Request(scheme="q8toy", base_model_id=BASE)
    assert metadata.validate(ck, req).ok
    assert not metadata.validate(ck, metadata.Request(scheme="int8", base_model_id=BASE)).ok
    lying = dataclasses.replace(ck, metadata={**ck.metadata, "require_divisible": 16})
    v = metadata.validate(lying, req)
    assert not v.ok and any("require_divisible is 16, expected 32" in r and "q8toy 32" in r for r in v.reasons)

    # described by Info: the recorded scheme, and what its weights are
    r = report.info(path)
    assert r.valid and r.scheme == "q8toy" and dict(r.rows())["Scheme"] == "q8toy (weights: int8)"

    # its weights' matmul path: int8's, on every device the int8 record's kernels allow
    kind = qtensor.kind_of(w)
    assert devices.choose(kind, True, devices.Device("cpu")).path == devices.QUANTIZED
    assert devices.choose(kind, True, devices.Device("cuda", (7, 0))).path == devices.WEIGHT_ONLY


def test_the_drift_bugs_stay_fixed():
    # -MXFP8 is not read as -FP8 (the model name kept an "-MX" and the scheme auto refused "Expected: int8 or fp8")
    assert sources.model_name("unsloth/Z-Image-Turbo-MXFP8") == "Z-Image-Turbo"
    assert families.schemes_from_suffix("me/Model-MXFP8") == ("mxfp8",)
    assert families.schemes_from_suffix("me/Model-FP8") == ("fp8", "int8")
    for s in registry.all_schemes():  # every scheme's suffix names it, and <Model> is the name without it
        assert families.schemes_from_suffix(f"me/Model{s.suffix}")[0] == s.name
        assert sources.model_name(f"me/Model{s.suffix}") == "Model"
    # the nvfp4 bf16 rule is Unsloth's (true for fp8 and mxfp8 only)
    assert not schemes.rules("nvfp4").require_bf16 and schemes.rules("mxfp8").require_bf16
    # weight-only is a property of a scheme, not a record of its own
    assert schemes.get("fp8-weight-only") == (registry.lookup("fp8")[0], True)
    assert schemes.rules("fp8-weight-only").fast_accum is None and schemes.rules("fp8").fast_accum is True
    with pytest.raises(ValidationError):
        schemes.normalize("nvfp4-weight-only")
