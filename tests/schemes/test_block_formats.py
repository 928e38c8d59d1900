"""NVFP4 / MXFP8 weights, v3 layer policies and v2 ConvRot rotations in the core (no ComfyUI).

Dequantization is compared with torchao's own ``dequantize`` bit for bit; validation refusals must name the field,
what was expected and what was found; the builder's NVFP4 files must pass the same rules.
"""
from __future__ import annotations

import math

import pytest
import torch

from prequant_core import builder, families, formats, schemes
from prequant_core.formats import layer_policy
from prequant_core.schemes import nvfp4_policy
from prequant_core.load import metadata
from prequant_core.schemes import qtensor, rotation
from prequant_core.builder import writers
from prequant_core.formats.checkpoint import FORMAT_V1, FORMAT_V2, FORMAT_V3, Checkpoint
from prequant_core.errors import BuildError, CorruptCheckpointError

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _nvfp4(w, *, per_tensor: bool, swizzled: bool):
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale
    pts = per_tensor_amax_to_scale(w.float().abs().max()) if per_tensor else None
    return NVFP4Tensor.to_nvfp4(w, per_tensor_scale=pts, is_swizzled_scales=swizzled)


@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("per_tensor", [False, True])
def test_nvfp4_dequantization_is_torchaos_bit_for_bit(per_tensor, swizzled):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(144, 256, generator=g) * 3).to(torch.bfloat16)  # 144 rows: swizzled scales are padded to 256
    w[0, :16] = 0  # an all-zero block
    t = _nvfp4(w, per_tensor=per_tensor, swizzled=swizzled)
    ts, spec = qtensor.parts(t)
    assert ts[0].dtype == torch.uint8 and tuple(ts[1].shape) == (144, 16) and tuple(ts[2].shape) == (144, 1)
    for dt in DTYPES:
        assert torch.equal(_bits(qtensor.dequantize_parts(ts, spec, dt)), _bits(t.dequantize(dt))), dt
    # every one of the 256 packed bytes decodes as torchao decodes it
    every = torch.arange(256, dtype=torch.uint8).repeat(16, 1)  # [16, 256] -> 512 values per row
    t2 = type(t)(every, torch.full((16, 32), 1.0).to(torch.float8_e4m3fn), 16, torch.bfloat16)
    assert torch.equal(qtensor.dequantize_parts(*qtensor.parts(t2), torch.float32), t2.dequantize(torch.float32))


def test_mxfp8_dequantization_is_torchaos_bit_for_bit():
    w = (torch.randn(64, 256, generator=torch.Generator().manual_seed(1)) * 5).to(torch.bfloat16)
    t = schemes.quantize_weight(w, "mxfp8")
    ts, spec = qtensor.parts(t)
    for dt in (torch.bfloat16, torch.float32):
        assert torch.equal(_bits(qtensor.dequantize_parts(ts, spec, dt)), _bits(t.dequantize(dt))), dt


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp8"])
def test_parts_assemble_slice_and_requantize_round_trip(scheme):
    w = torch.randn(96, 128, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    t = schemes.quantize_weight(w, scheme)
    ts, spec = qtensor.parts(t)
    back = qtensor.assemble(ts, spec)
    assert torch.equal(back.dequantize(torch.float32), t.dequantize(torch.float32))
    half = qtensor.slice_rows(t, 32, 48)
    assert torch.equal(half.dequantize(torch.float32), t.dequantize(torch.float32)[32:80])
    again = qtensor.quantize_parts(w, spec, ts)
    assert all(torch.equal(a, b) for a, b in zip(again, ts)), "requantizing the same weight gives the same parts"
    assert qtensor.nbytes(t) == sum(p.numel() * p.element_size() for p in ts)


def test_fusing_nvfp4_rows_with_different_per_tensor_scales_is_exact():
    a = schemes.quantize_weight(torch.randn(64, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16),
                                "nvfp4")
    b = schemes.quantize_weight((torch.randn(32, 128, generator=torch.Generator().manual_seed(4)) * 1e-3)
                                .to(torch.bfloat16), "nvfp4")
    fused = qtensor.cat_rows([a, b])
    assert isinstance(fused, qtensor.QParts) and tuple(fused.shape) == (96, 128)
    want = torch.cat([a.dequantize(torch.float32), b.dequantize(torch.float32)])
    assert torch.equal(qtensor.dequantize_parts(*qtensor.parts(fused), torch.float32), want)
    same = qtensor.cat_rows([a, a])  # equal scales: still one torchao tensor
    assert type(same).__name__ == "NVFP4Tensor"


def test_fusing_nvfp4_with_fp8_rows_gives_the_exact_dense_rows():
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    a, b = schemes.quantize_weight(w, "nvfp4"), schemes.quantize_weight(w, "fp8")
    fused = qtensor.cat_rows([a, b])
    assert not qtensor.is_quantized(fused) and fused.dtype == torch.bfloat16
    assert torch.equal(fused, torch.cat([a.dequantize(torch.bfloat16), b.dequantize(torch.bfloat16)]))


def test_hadamard_is_orthogonal_symmetric_and_a_kronecker_power_of_h4():
    for g in (4, 16, 64, 256):
        h = rotation.hadamard(g, dtype=torch.float64)
        assert torch.allclose(h @ h, torch.eye(g, dtype=torch.float64), atol=1e-12) and torch.equal(h, h.T)
        assert torch.equal(h.abs(), torch.full((g, g), 1 / math.sqrt(g), dtype=torch.float64))
    h16 = rotation.hadamard(16, dtype=torch.float64) * 4
    h4 = rotation.hadamard(4, dtype=torch.float64) * 2
    assert torch.equal(h16, torch.kron(h4, h4))
    for bad in (2, 8, 32, 0, -4, True, 16.0):
        assert not rotation.is_power_of_4(bad)
    x = torch.randn(3, 128, dtype=torch.float64)
    assert torch.allclose(rotation.rotate(rotation.rotate(x, 64), 64), x, atol=1e-12)  # H H = I, block-wise


# ---------------------------------------------------------------------------------------------------------------
# Validation of the v3 policy block and the v2 rotation fields


def _ckpt(tensors, meta, tag) -> Checkpoint:
    return Checkpoint(path="/x/file.pt", container="pt", format_tag=tag, metadata=meta, tensors=tensors)


def _policy_file():
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    tensors = {"a.weight": schemes.quantize_weight(w, "nvfp4"), "b.weight": schemes.quantize_weight(w, "nvfp4"),
               "c.weight": schemes.quantize_weight(w, "fp8"), "d.weight": w.clone(), "n.weight": torch.ones(64)}
    meta = {"scheme": "nvfp4", "nvfp4_policy": {
        "kind": nvfp4_policy.POLICY_KIND, "policy_id": "p1", "policy_version": 1,
        "counts": {"nvfp4": 2, "fp8": 1, "bf16": 1}, "nvfp4_fqns": ["a", "b"], "activation_scales_baked": False,
        "gptq": False}}
    return tensors, meta


def test_a_well_formed_policy_file_is_valid():
    tensors, meta = _policy_file()
    v = metadata.validate(_ckpt(tensors, meta, FORMAT_V3), metadata.Request())
    assert v.ok, v.reasons


@pytest.mark.parametrize("change,words", [
    (lambda m: m["nvfp4_policy"].update(kind="other_policy"), ["'kind'", "other_policy", nvfp4_policy.POLICY_KIND]),
    (lambda m: m["nvfp4_policy"].update(policy_id=""), ["'policy_id'", "non-empty"]),
    (lambda m: m["nvfp4_policy"].update(policy_version=0), ["'policy_version'", ">= 1", "0"]),
    (lambda m: m["nvfp4_policy"].update(policy_version=True), ["'policy_version'", "True"]),
    (lambda m: m["nvfp4_policy"]["counts"].update(fp8=2), ["counts['fp8'] is 2", "holds 1"]),
    (lambda m: m["nvfp4_policy"]["counts"].update(nvfp4=3), ["counts['nvfp4'] is 3", "holds 2"]),
    (lambda m: m["nvfp4_policy"]["counts"].update(bf16=9), ["counts['bf16'] is 9", "only 1"]),
    (lambda m: m["nvfp4_policy"].update(counts={}), ["'counts'", "non-empty"]),
    (lambda m: m["nvfp4_policy"].update(nvfp4_fqns=["a", "a"]), ["more than once", "a"]),
    (lambda m: m["nvfp4_policy"].update(nvfp4_fqns=["a", ""]), ["non-empty layer names"]),
    (lambda m: m["nvfp4_policy"].update(nvfp4_fqns=["a", "c"]), ["not NVFP4 weights", "'c'"]),
    (lambda m: m["nvfp4_policy"].update(nvfp4_fqns=["a"]), ["lists 1 nvfp4 layers", "counts['nvfp4'] is 2"]),
    (lambda m: m["nvfp4_policy"].update(gptq="yes"), ["'gptq'", "true/false"]),
    (lambda m: m.update(scheme="fp8"), ["scheme 'nvfp4'", "found 'fp8'"]),
    (lambda m: m.update(activation_rotation=rotation.KIND, activation_rotation_fqns=["c"]), ["both"]),
])
def test_policy_refusals_name_field_expected_and_found(change, words):
    tensors, meta = _policy_file()
    change(meta)
    v = metadata.validate(_ckpt(tensors, meta, FORMAT_V3), metadata.Request())
    text = " | ".join(v.reasons)
    assert not v.ok and all(w in text for w in words), text


def test_tags_follow_what_the_metadata_declares():
    tensors, meta = _policy_file()
    v = metadata.validate(_ckpt(tensors, meta, FORMAT_V1), metadata.Request())
    assert not v.ok and any(FORMAT_V3 in r and "nvfp4_policy" in r for r in v.reasons)
    meta.pop("nvfp4_policy")
    v = metadata.validate(_ckpt(tensors, meta, FORMAT_V3), metadata.Request())
    assert any(f"expected '{FORMAT_V1}'" in r for r in v.reasons)
    # mixed formats with no policy to say which is which
    assert any("without an 'nvfp4_policy'" in r for r in v.reasons)


def _rotation_file(group=16, fqns=("a",)):
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    tensors = {"a.weight": schemes.quantize_weight(w, "int8"), "b.weight": schemes.quantize_weight(w, "int8"),
               "d.weight": w.clone()}
    meta = {"scheme": "int8", "activation_rotation": rotation.KIND, "activation_rotation_group": group,
            "activation_rotation_fqns": list(fqns)}
    return tensors, meta


@pytest.mark.parametrize("meta_change,words", [
    ({"activation_rotation": "random_rotation_v9"}, ["random_rotation_v9", rotation.KIND]),
    ({"activation_rotation_group": 32}, ["activation_rotation_group", "power of 4", "32"]),
    ({"activation_rotation_group": True}, ["activation_rotation_group", "bool"]),
    ({"activation_rotation_group": 256}, ["input width 64", "256"]),
    ({"activation_rotation_fqns": []}, ["activation_rotation_fqns", "non-empty"]),
    ({"activation_rotation_fqns": ["a", "a"]}, ["more than once"]),
    ({"activation_rotation_fqns": ["zz"]}, ["'zz'", "no weight"]),
    ({"activation_rotation_fqns": ["d"]}, ["'d'", "not a quantized Linear"]),
])
def test_rotation_refusals_name_field_expected_and_found(meta_change, words):
    tensors, meta = _rotation_file()
    meta.update(meta_change)
    v = metadata.validate(_ckpt(tensors, meta, FORMAT_V2), metadata.Request())
    text = " | ".join(v.reasons)
    assert not v.ok and all(w in text for w in words), text


def test_a_rotation_list_of_many_bad_names_is_refused_naming_the_first_five():
    """A stranger's list may be long: the refusal names five of its bad entries, not thousands."""
    tensors, meta = _rotation_file(fqns=[f"zz{i}" for i in range(8)])
    reasons = layer_policy.rotation_reasons(_ckpt(tensors, meta, FORMAT_V2))
    assert [r.split("'")[1] for r in reasons] == [f"zz{i}" for i in range(5)]
    assert all("no weight in the file" in r for r in reasons)


def test_valid_rotation_marks_only_the_listed_weights():
    tensors, meta = _rotation_file()
    ck = _ckpt(tensors, meta, FORMAT_V2)
    assert metadata.validate(ck, metadata.Request()).ok
    assert layer_policy.mark_rotations(ck) == 1
    assert qtensor.parts(ck.tensors["a.weight"])[1].rotation == 16
    assert qtensor.parts(ck.tensors["b.weight"])[1].rotation == 0
    # the mark survives slicing and fusing rows (the key maps' operations)
    assert qtensor.parts(qtensor.slice_rows(ck.tensors["a.weight"], 0, 8))[1].rotation == 16
    assert "16" in layer_policy.summary(meta) and "1 layers" in layer_policy.summary(meta)


# ---------------------------------------------------------------------------------------------------------------
# Reading hostile block tensors, and the builder


def test_nan_block_scale_and_bad_shapes_are_refused_with_the_tensor_named(tmp_path):
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    t = schemes.quantize_weight(w, "nvfp4")
    t.scale.view(torch.uint8).reshape(-1)[3] = 0x7F  # e4m3 NaN
    p = tmp_path / "nan.pt"
    torch.save({"format": FORMAT_V1, "metadata": {"scheme": "nvfp4"}, "state_dict": {"blk.proj.weight": t}}, p)
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(str(p))
    assert "blk.proj.weight" in str(e.value) and "NaN" in str(e.value)
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
    short = NVFP4Tensor(t.qdata, t.scale.reshape(-1)[:10].clone(), 16, torch.bfloat16, t.per_tensor_scale,
                        is_swizzled_scales=True)
    p2 = tmp_path / "short.pt"
    torch.save({"format": FORMAT_V1, "metadata": {"scheme": "nvfp4"}, "state_dict": {"blk.proj.weight": short}}, p2)
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(str(p2))
    assert "blk.proj.weight" in str(e.value) and "block scales (10,)" in str(e.value)


def test_builder_writes_whole_model_nvfp4_pt_that_passes_the_rules(tmp_path):
    from tools import tiny_models
    dense = tiny_models.zimage_dense(seed=0)
    fam = families.get("z-image")
    res = builder.build(dense, builder.Target(str(tmp_path / "Z-Image-Turbo-NVFP4.pt")),
                        builder.Recipe("nvfp4", family=fam, base_model_id="Tongyi-MAI/Z-Image-Turbo"))
    ck = formats.read(res.path)
    assert ck.format_tag == FORMAT_V1 and ck.metadata["scheme"] == "nvfp4" and ck.schemes_found() == {"nvfp4"}
    assert ck.metadata["require_divisible"] == 16 and ck.metadata["require_bf16"] is False  # Unsloth: fp8 / mxfp8 only
    v = metadata.validate(ck, metadata.Request(scheme="nvfp4", base_model_id="Tongyi-MAI/Z-Image-Turbo"), family=fam)
    assert v.ok, v.reasons
    fp8 = builder.build(dense, builder.Target(str(tmp_path / "Z-Image-Turbo-FP8.pt")),
                        builder.Recipe("fp8", family=fam))
    print(f"\n[nvfp4] file {res.file_bytes} bytes, fp8 file {fp8.file_bytes} bytes "
          f"({res.file_bytes / fp8.file_bytes:.2f}x)")
    assert res.file_bytes < fp8.file_bytes
    with pytest.raises(BuildError) as e:
        builder.build(dense, builder.Target(str(tmp_path / "Z-Image-Turbo-NVFP4.safetensors")),
                      builder.Recipe("nvfp4", family=fam))
    assert ".pt" in str(e.value) and "safetensors" in str(e.value)


def test_block_schemes_never_land_in_a_container_that_cannot_hold_them(tmp_path):
    from tools import tiny_models
    dense = tiny_models.zimage_dense(seed=0)
    fam = families.get("z-image")
    # the container follows the file name when not given
    p = builder.build_from_tensors(dense, builder.Target(str(tmp_path / "Z-NVFP4.pt")),
                                   builder.Recipe("nvfp4", family=fam, base_model_id="b/Z"))
    assert formats.read(p).schemes_found() == {"nvfp4"}
    with pytest.raises(BuildError):
        builder.build_from_tensors(dense, builder.Target(str(tmp_path / "Z-NVFP4.safetensors")),
                                   builder.Recipe("nvfp4", family=fam, base_model_id="b/Z"))
    q = {"blk.proj.weight": schemes.quantize_weight(torch.ones(64, 64, dtype=torch.bfloat16), "nvfp4")}
    with pytest.raises(BuildError) as e:  # the writer itself refuses too
        writers.write_checkpoint(str(tmp_path / "w.safetensors"), q, {"scheme": "nvfp4"}, container="safetensors")
    assert "nvfp4" in str(e.value) and ".pt" in str(e.value)
    assert not list(tmp_path.glob("*.safetensors")) and not list(tmp_path.glob(".*"))


@pytest.mark.parametrize("family,repo", [("z-image", "unsloth/Z-Image-Turbo-NVFP4"),
                                         ("flux.1", "unsloth/FLUX.1-schnell-NVFP4"),
                                         ("qwen-image", "unsloth/Qwen-Image-2512-NVFP4"),
                                         ("qwen-image-2.1", "unsloth/Qwen-Image-2.1-NVFP4")])
def test_family_plus_nvfp4_plans_the_nvfp4_repo_and_fp8_keeps_its_own(family, repo):
    from prequant_core.load import sources
    nv = sources.plan(sources.Wanted(family=family, scheme="nvfp4"))
    assert [c.repo for c in nv.candidates] == [repo] and f"{repo.split('/')[1]}.pt" in nv.candidates[0].filenames
    fp8 = sources.plan(sources.Wanted(family=family, scheme="fp8"))
    assert all(c.repo.endswith("-FP8") for c in fp8.candidates)
    assert families.hosted_schemes(repo) == ("nvfp4",)
    assert any(p.repo == repo and p.scheme == "nvfp4" for p in sources.presets())


@pytest.mark.parametrize("kind", ["nvfp4", "mxfp8"])
def test_block_kinds_run_natively_on_blackwell_only_and_dequantize_everywhere_else(kind):
    from prequant_core.schemes import devices as d
    native = d.choose(kind, True, d.Device("cuda", (10, 0), name="B200"))
    assert native.path == d.QUANTIZED and f"native {kind}" in native.text()
    for dev in (d.Device("cuda", (9, 0)), d.Device("cuda", (8, 6)), d.Device("cuda", (10, 0), hip=True),
                d.Device("cpu"), d.Device("mps"), d.Device("xpu")):
        c = d.choose(kind, True, dev)
        assert c.path == d.WEIGHT_ONLY and "dequantized at matmul" in c.text() and not c.codes_as_bytes, dev
    assert d.choose(kind, False, d.Device("cuda", (10, 0))).path == d.WEIGHT_ONLY  # no activation settings
    assert d.choose(kind, True, d.Device("cuda", (10, 0)), d.WEIGHT_ONLY).path == d.WEIGHT_ONLY
