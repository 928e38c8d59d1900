"""The scheme registry: everything that depends on a quantization scheme is read from its record, so a scheme added
as one module (tests/toy/toy_scheme.py) plus one registry line is named from a repo suffix, given its file names,
built, validated with its own rules, described by Info and given a matmul path; without the line it is unknown.
A scheme whose weights are a kind of their own (tests/toy/toy_kind.py: its own tensor class and codec) is the same
one module and one line: listed, written, read, validated, described, fingerprinted and given a matmul path.
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
from prequant_core.errors import CorruptCheckpointError
from prequant_core.formats import validate_tensors
from prequant_core.formats.containers import safetensors_container
from toy import toy_kind, toy_scheme

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
    assert sources.filenames(REPO, "q8toy") == ("Z-Image-Turbo-Q8TOY.safetensors", "Z-Image-Turbo-Q8TOY.pt",
                                               "Z-Image-Turbo-Q8TOY-ComfyUI.safetensors")  # a twin trails
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


@pytest.fixture
def with_toy_kind(monkeypatch):
    monkeypatch.setattr(registry, "SCHEMES", (*registry.SCHEMES, toy_kind.SCHEME))


def _q4toy_file(tmp_path, name="Z-Image-Turbo-Q4TOY.safetensors"):
    return build.build_from_tensors(str(tmp_path / name), _dense(), family=families.get("z-image"), scheme="q4toy",
                                    base_model_id=BASE, min_features=32)


def test_a_new_weight_kind_is_unknown_without_its_registry_line():
    t = toy_kind.quantize(_dense()["layers.0.attention.qkv.weight"])
    assert not qtensor.is_quantized(t) and qtensor.scheme_of(t) is None
    assert "int4toy" not in registry.kinds() and "int4toy" not in qtensor.ROW_KINDS
    with pytest.raises(ValueError):
        devices.choose("int4toy", False, devices.Device("cpu"))


def test_a_new_weight_kind_is_one_module_and_one_line(tmp_path, with_toy_kind):
    # listed: a scheme name, a weight kind (per row: no block size), the safetensors container only
    assert "q4toy" in schemes.SCHEMES and "int4toy" in registry.kinds() and "int4toy" in qtensor.ROW_KINDS
    assert "q4toy" in containers.writes_schemes(containers.by_name("safetensors"))
    assert "q4toy" not in containers.writes_schemes(containers.by_name("pt"))

    # written and read back: its own tensor class, the codes its own quantizer made, through torchao-style JSON
    dense = _dense()
    path = _q4toy_file(tmp_path)
    ck = formats.read(path)
    w = ck.tensors["layers.0.attention.qkv.weight"]
    want = toy_kind.quantize(dense["layers.0.attention.qkv.weight"])
    assert type(w) is toy_kind.ToyInt4Tensor and qtensor.kind_of(w) == "int4toy" and qtensor.scheme_of(w) == "q4toy"
    assert torch.equal(w.qdata, want.qdata) and torch.equal(w.scale, want.scale)
    assert int(w.qdata.abs().max()) <= toy_kind.LEVELS and ck.metadata["scheme"] == "q4toy"
    # its parts are the pack's common currency: dequantize, fuse and slice rows exactly
    ts, spec = qtensor.parts(w)
    assert torch.equal(qtensor.dequantize_parts(ts, spec, torch.float32), want.dequantize(torch.float32))
    fused = qtensor.cat_rows([w, w])
    assert type(fused) is toy_kind.ToyInt4Tensor and tuple(fused.shape) == (128, 64)
    assert torch.equal(qtensor.slice_rows(fused, 64, 64).qdata, w.qdata)

    # validated: by the file's own rules, and a stranger's copy with codes beyond 4 bits or an extra field refused
    req = metadata.Request(scheme="q4toy", base_model_id=BASE)
    assert metadata.validate(ck, req).ok and not metadata.validate(ck, metadata.Request(scheme="int8")).ok
    bad = dict(ck.tensors)
    bad["layers.0.attention.qkv.weight"] = toy_kind.ToyInt4Tensor(w.qdata.clone().index_fill_(1, torch.tensor([0]), 9),
                                                                 w.scale, w.orig_dtype)
    safetensors_container.write(str(tmp_path / "bad.safetensors"), bad, ck.metadata)
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(str(tmp_path / "bad.safetensors"))
    assert "4-bit codes beyond +-7" in str(e.value) and "bad.safetensors" in str(e.value)
    extra = toy_kind.ToyInt4Tensor(w.qdata, w.scale, w.orig_dtype)
    extra.__dict__["prequant_rotation"] = 16
    with pytest.raises(CorruptCheckpointError) as e:
        validate_tensors.check_quantized("layers.0.attention.qkv.weight", extra, "x.safetensors")
    assert "(ToyInt4Tensor) carries a field" in str(e.value) and "prequant_rotation" in str(e.value)

    # described by Info, sizes from its own parts, and fingerprinted: verified as built, a changed code caught
    r = report.info(path, verify_fingerprint=True)
    assert r.valid and r.scheme == "q4toy" and r.schemes_found == ["q4toy"]
    assert r.quantized_count == 2 and r.fingerprint_count == 2 and r.fingerprint_verified is True
    assert r.quantized_bytes == sum(p.numel() * p.element_size() for k, t in ck.tensors.items()
                                    if qtensor.is_quantized(t) for p in qtensor.parts(t)[0])
    changed = dict(ck.tensors)
    changed["layers.0.attention.qkv.weight"] = toy_kind.ToyInt4Tensor(w.qdata.clone().neg_(), w.scale, w.orig_dtype)
    safetensors_container.write(str(tmp_path / "changed.safetensors"), changed, ck.metadata)
    r2 = report.info(str(tmp_path / "changed.safetensors"), verify_fingerprint=True)
    assert r2.fingerprint_verified is False and not r2.valid

    # given a matmul path: weight-only everywhere (no quantized kernel is recorded), the codec's own arithmetic
    for dev in (devices.Device("cpu"), devices.Device("cuda", (12, 0)), devices.Device("mps")):
        c = devices.choose("int4toy", toy_kind.CODEC.dynamic(w), dev)
        assert c.path == devices.WEIGHT_ONLY and "q4toy" in c.text(), dev
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(5))
    got = registry.codec("int4toy").weight_only_linear(x, ts, spec, None, "e4m3")
    assert torch.equal(got, torch.nn.functional.linear(x, want.dequantize(torch.float32)))


def test_prequant_core_has_no_import_cycle():
    # module-level and in-function imports alike: a cycle is a layering knot, however late it is tied
    cycles = _import_cycles()
    assert cycles == [], cycles


def _import_cycles() -> list:
    import ast
    import os
    import prequant_core
    root = os.path.dirname(os.path.dirname(prequant_core.__file__))
    mods = {}
    for d, _, fs in os.walk(os.path.join(root, "prequant_core")):
        for f in fs:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), root)[:-3].replace(os.sep, ".")
                mods[rel[:-9] if rel.endswith(".__init__") else rel] = os.path.join(d, f)
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.endswith("__init__.py") else m.rsplit(".", 1)[0]
        for n in ast.walk(ast.parse(open(p, encoding="utf-8").read())):
            if isinstance(n, ast.ImportFrom):
                base = pkg.split(".")[:len(pkg.split(".")) - n.level + 1] if n.level else []
                b = ".".join(base + ([n.module] if n.module else [])) if n.level else (n.module or "")
                targets = [f"{b}.{a.name}" if f"{b}.{a.name}" in mods else b for a in n.names]
            elif isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            else:
                continue
            graph[m].update(t for t in targets if t in mods and t != m)
    found, state = [], {}

    def visit(m, stack):
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                found.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack + [t])
        state[m] = 2
    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


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
