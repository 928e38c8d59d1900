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

from prequant_core import builder, families, formats, report, schemes
from prequant_core.schemes import devices, qtensor
from prequant_core.load import metadata, sources
from prequant_core.errors import ValidationError
from prequant_core.formats import containers
from prequant_core.schemes import registry
from prequant_core.errors import CorruptCheckpointError
from prequant_core.formats import validate_tensors
from prequant_core.formats.containers import safetensors_container
from prequant_core.formats import comfy_layout, layer_policy
from prequant_core.families import hub_names
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
    assert schemes.names() == ("int8", "fp8", "nvfp4", "mxfp8", "int8-weight-only", "fp8-weight-only")
    assert tuple(s.name for s in recs if s.block_size) == ("nvfp4", "mxfp8")
    # Unsloth's builder rules, one record each (docs/FORMAT.md section 4)
    assert {s.name: (s.require_bf16, s.require_divisible) for s in recs} == {
        "int8": (False, 0), "fp8": (True, 16), "nvfp4": (False, 16), "mxfp8": (True, 32)}
    assert {s.kind for s in recs} == {c.kind for c in registry.codecs()}


def test_a_scheme_is_unknown_without_its_registry_line(tmp_path):
    with pytest.raises(ValidationError) as e:
        schemes.normalize("q8toy")
    assert "int8 / fp8 / nvfp4 / mxfp8" in str(e.value)
    assert families.schemes_from_suffix(REPO) == () and hub_names.model_name(REPO) == "Z-Image-Turbo-Q8TOY"
    with pytest.raises(ValidationError):
        builder.build_from_tensors(_dense(), builder.Target(str(tmp_path / "x.safetensors")),
                                   builder.Recipe("q8toy", family=families.get("z-image"), base_model_id=BASE,
                                                  min_features=32))


def test_a_new_scheme_is_one_module_and_one_line(tmp_path, with_toy):
    # named from a repo's suffix, with its own file names (no legacy transformer_<s>.pt: legacy_pt is False)
    assert schemes.normalize("Q8TOY") == "q8toy" and "q8toy" in schemes.names()
    assert families.schemes_from_suffix(REPO) == ("q8toy",) and sources.schemes_for_repo(REPO) == ("q8toy",)
    assert hub_names.model_name(REPO) == "Z-Image-Turbo"
    assert sources.filenames(REPO, "q8toy") == ("Z-Image-Turbo-Q8TOY.safetensors", "Z-Image-Turbo-Q8TOY.pt",
                                               "Z-Image-Turbo-Q8TOY-ComfyUI.safetensors")  # a twin trails
    assert "q8toy" in containers.writes_schemes(containers.by_name("safetensors"))
    assert builder.default_filename(BASE, "q8toy", "safetensors") == "Z-Image-Turbo-Q8TOY.safetensors"

    # built with its own rule: the 80-row layer does not divide by 32 and stays dense; int8 would quantize it
    dense = _dense()
    path = builder.build_from_tensors(dense, builder.Target(str(tmp_path / "Z-Image-Turbo-Q8TOY.safetensors")),
                                      builder.Recipe("q8toy", family=families.get("z-image"), base_model_id=BASE,
                                                     min_features=32))
    ck = formats.read(path)
    assert ck.metadata["scheme"] == "q8toy" and ck.metadata["require_divisible"] == 32
    extra = families.get("z-image").arch.int8_exclude_extra
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
    return builder.build_from_tensors(_dense(), builder.Target(str(tmp_path / name)),
                                      builder.Recipe("q4toy", family=families.get("z-image"), base_model_id=BASE,
                                                     min_features=32))


def test_a_new_weight_kind_is_unknown_without_its_registry_line():
    t = toy_kind.quantize(_dense()["layers.0.attention.qkv.weight"])
    assert not qtensor.is_quantized(t) and qtensor.scheme_of(t) is None
    assert "int4toy" not in registry.kinds() and "int4toy" not in {c.kind for c in registry.codecs()}
    with pytest.raises(ValueError):
        devices.choose("int4toy", False, devices.Device("cpu"))
    # nor its ComfyUI-native layout, its activation settings or its file rule
    assert "int4toy_rowwise" not in comfy_layout.formats()
    assert "q4toy_levels" not in {r.field for r in layer_policy.rules()}


def test_a_new_weight_kind_is_one_module_and_one_line(tmp_path, with_toy_kind):
    # listed: a scheme name, a weight kind (per row: no block size), the safetensors container only
    assert "q4toy" in schemes.names() and "int4toy" in registry.kinds() and "int4toy" in {c.kind for c in registry.codecs() if not c.block}
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


def test_a_new_schemes_native_layout_activation_settings_and_file_rule_are_the_same_module_and_line(
        tmp_path, with_toy_kind):
    """What a scheme owns besides its weights (its ComfyUI-native layout both ways, its activation-settings class,
    its file rule) comes from its module through the same registry line: no branch for it anywhere else."""
    from prequant_core.formats.containers import comfy_native
    from prequant_core.schemes import int8, json_values
    key = "layers.0.attention.qkv.weight"
    # its layout is listed with ComfyUI's formats, and is what its scheme writes
    assert comfy_layout.formats()["int4toy_rowwise"].scheme == "q4toy"
    assert comfy_native.native_format("q4toy") == "int4toy_rowwise"

    # a native file written from its pre-quantized file keeps the bytes, and reads back as its own weights
    ck = formats.read(_q4toy_file(tmp_path))
    out, layers, skipped = comfy_native.native_tensors(ck.tensors, "q4toy", min_features=32)
    assert not skipped and {c["format"] for c in layers.values()} == {"int4toy_rowwise"}
    native = str(tmp_path / "Z-Image-Turbo-Q4TOY-ComfyUI.safetensors")
    comfy_native.write_native(native, out, layers)
    back = formats.read(native)
    assert back.container == "comfyui-native" and back.metadata["scheme"] == "q4toy"
    assert back.metadata["comfy_quant_formats"] == {"int4toy_rowwise": 2}
    for k, w in ck.tensors.items():
        if qtensor.is_quantized(w):
            r = back.tensors[k]
            assert type(r) is toy_kind.ToyInt4Tensor and qtensor.scheme_of(r) == "q4toy"
            assert torch.equal(r.qdata, w.qdata) and torch.equal(r.scale, w.scale)
    v = metadata.validate(back, metadata.Request(scheme="q4toy"))
    assert v.ok, v.reasons
    assert any("ComfyUI 0.99.0 and newer" in n for n in v.notes)
    # ... and from a dense weight, quantized by the layout's own writer
    dense = _dense()
    out, layers, _ = comfy_native.native_tensors(dense, "q4toy", min_features=32)
    comfy_native.write_native(str(tmp_path / "dense-native.safetensors"), out, layers)
    got = formats.read(str(tmp_path / "dense-native.safetensors")).tensors[key]
    assert torch.equal(got.qdata, toy_kind.quantize(dense[key]).qdata)

    # its activation settings, a class of its own, are decoded from torchao-style JSON by its module alone
    w = ck.tensors[key]
    act = toy_kind.ToyActKwargs()
    with_act = {**ck.tensors, key: toy_kind.ToyInt4Tensor(w.qdata, w.scale, w.orig_dtype, act)}
    safetensors_container.write(str(tmp_path / "act.safetensors"), with_act, ck.metadata)
    got = formats.read(str(tmp_path / "act.safetensors")).tensors[key]
    assert got.act_quant_kwargs == act and qtensor.parts(got)[1].dynamic
    with pytest.raises(json_values.DecodeError):  # another scheme's module does not know the class
        json_values.decode_act_kwargs({"_type": "ToyActKwargs", "_data": {"levels": 7}}, int8.ACT_KWARGS)

    # its file rule: a block its files may declare, checked by its module, summarised by Info
    ruled = str(tmp_path / "ruled.safetensors")
    safetensors_container.write(ruled, ck.tensors, {**ck.metadata, "q4toy_levels": {"levels": 7, "layers": 2}})
    req = metadata.Request(scheme="q4toy", base_model_id=BASE)
    assert metadata.validate(formats.read(ruled), req).ok
    assert report.info(ruled).layers == "q4toy: 2 layers of 4-bit codes in -7..7"
    safetensors_container.write(ruled, ck.tensors, {**ck.metadata, "q4toy_levels": {"levels": 9, "layers": 3}})
    v = metadata.validate(formats.read(ruled), req)
    assert not v.ok and "q4toy_levels 'levels' is 9, expected 7" in v.reasons
    assert "q4toy_levels 'layers' is 3, the file holds 2 q4toy layers" in v.reasons


def test_the_scheme_table_and_the_registry_agree():
    # the names the command line knows without torch are the registry's own table: each row's module holds its record
    from prequant_core import scheme_names
    assert [(s.name, s.weight_only) for s in registry.SCHEMES] == list(scheme_names.TABLE)
    assert scheme_names.NAMES == registry.names() and scheme_names.DEFAULT == registry.SCHEMES[0].name


def test_the_recipes_list_the_files_a_scheme_and_a_layout_touch():
    """docs/DEVELOPING.md lists them: a scheme is its module and its row in scheme_names.TABLE; a ComfyUI-native
    layout is a record in its scheme's module."""
    import os
    import re
    from conftest import ROOT
    from prequant_core import scheme_names
    with open(os.path.join(ROOT, "docs", "DEVELOPING.md"), encoding="utf-8") as f:
        text = " ".join(f.read().split())
    for what, want in (("a scheme", ["prequant_core/schemes/<name>.py", "prequant_core/scheme_names.py"]),
                       ("a ComfyUI-native layout to a scheme", ["prequant_core/schemes/<name>.py"])):
        recipe = re.search(rf"Adding {what} touches (\d+) files?: (.*?)\.(?: |$)", text)
        assert recipe, f"docs/DEVELOPING.md has no 'Adding {what} touches N files: ...' recipe"
        items = re.findall(r"\((\d+)\) (\S+?)[,:;]", recipe.group(2))
        assert [int(n) for n, _ in items] == list(range(1, int(recipe.group(1)) + 1))
        assert [p for _, p in items] == want
    for name, _ in scheme_names.TABLE:  # (1) each row's module holds its record, (2) the table lists it once
        assert os.path.isfile(os.path.join(ROOT, "prequant_core", "schemes", name + ".py"))
        assert [n for n, _ in scheme_names.TABLE].count(name) == 1
    for s in registry.all_schemes():  # its layouts are its own records, each a format of its own
        assert all(f.scheme == s.name for f in comfy_layout.formats().values() if f.name in
                   {x.name for x in s.comfy_layouts})
    assert len(comfy_layout.formats()) == sum(len(s.comfy_layouts) for s in registry.all_schemes())


# What is left naming a scheme outside schemes/ and families/, with why: the one names table (torch-free), and the
# pre-cast text encoders, whose two forms are a scheme each by Unsloth's definition (fp8: the layerwise float8 cast;
# int8: ComfyUI's int8_tensorwise with ConvRot), named by the encoder modules until they get records of their own;
# a pickle's storage dtype names in the torchao v1 reader.
NAMED_OUTSIDE = {
    "prequant_core/scheme_names.py": {"int8", "fp8", "nvfp4", "mxfp8"},
    "prequant_core/text_encoders/checks.py": {"fp8", "int8", "int8_tensorwise"},
    "prequant_core/text_encoders/sources.py": {"fp8"},
    "prequant_core/builder/text_encoder.py": {"fp8"},
    "nodes/build_node.py": {"fp8"},
    "nodes/te_node.py": {"fp8"},
    "prequant_core/formats/containers/legacy_v1.py": {"int8"},
}


def test_no_module_outside_schemes_names_a_scheme():
    """No comparison, table or renaming constant keyed by a scheme, weight kind, ComfyUI format or float8 code name
    outside prequant_core/schemes/ and prequant_core/families/ (string literals that are exactly such a name)."""
    import ast
    import os
    from conftest import ROOT
    names = {*registry.names(), *registry.kinds(), *comfy_layout.formats(), "e4m3", "e5m2", "e8m0", "e2m1"}
    names |= {n.upper() for n in registry.names()}
    found = {}
    for top in ("prequant_core", "nodes"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            rel = os.path.relpath(d, ROOT).replace(os.sep, "/")
            if rel.startswith(("prequant_core/schemes", "prequant_core/families")) or "__pycache__" in rel:
                continue
            for f in files:
                if f.endswith(".py"):
                    path = f"{rel}/{f}"
                    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
                        tree = ast.parse(fh.read())
                    lits = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names}
                    if lits - NAMED_OUTSIDE.get(path, set()):
                        found[path] = sorted(lits - NAMED_OUTSIDE.get(path, set()))
    assert found == {}


def test_prequant_core_has_no_import_cycle():
    # module-level and in-function imports alike: a cycle is a layering knot, however late it is tied
    cycles = _cycles(_import_graph())
    assert cycles == [], cycles


def test_no_room_of_prequant_core_imports_one_that_imports_it():
    """A room (a package of prequant_core: load/, hub/, text_encoders/, ...; or a top-level module) uses only rooms
    below it: no two rooms import each other, however indirectly, even where no module does (the Hub once took its
    names from load/sources.py while load/locate.py downloads through the Hub)."""
    graph = _import_graph()
    rooms: dict = {}
    for m, targets in graph.items():
        room = ".".join(m.split(".")[:2])
        rooms.setdefault(room, set()).update(".".join(t.split(".")[:2]) for t in targets)
        rooms[room].discard(room)
    assert len(rooms) >= 15
    cycles = _cycles(rooms)
    assert cycles == [], cycles


# The product functions that take more than six parameters, each with why (issue 59): ComfyUI's node entry points
# (one parameter per node input, as ComfyUI calls them), torch's pickle rebuild signatures, and two public entries
MANY_PARAMETERS = {
    "nodes/load_node.py:load": "a ComfyUI node entry point: one parameter per input",
    "nodes/te_node.py:load": "a ComfyUI node entry point: one parameter per input",
    "nodes/build_node.py:build": "a ComfyUI node entry point: one parameter per input",
    "prequant_core/formats/containers/legacy_v1.py:_rebuild_tensor_v2": "torch's pickled call, its signature",
    "prequant_core/formats/containers/legacy_v1.py:_rebuild_wrapper_subclass": "torch's pickled call, its signature",
    "prequant_core/diffusers_loader.py:load": "a library entry in from_pretrained's manner: a keyword per option",
}


def test_no_product_function_takes_more_than_six_parameters_but_the_justified():
    import ast
    import os
    from conftest import ROOT
    over = {}
    for top in ("prequant_core", "nodes"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, "/")
                with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
                    tree = ast.parse(fh.read())
                for n in ast.walk(tree):
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        a = n.args
                        names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
                        if len(names) > 6:
                            over[f"{path}:{n.name}"] = len(names)
    assert set(over) == set(MANY_PARAMETERS), over
    assert sum(1 for k in over if not k.startswith(("nodes/", "prequant_core/formats/containers/legacy_v1"))) <= 1


def _import_graph() -> dict:
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
    return graph


def _cycles(graph: dict) -> list:
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
    assert hub_names.model_name("unsloth/Z-Image-Turbo-MXFP8") == "Z-Image-Turbo"
    assert families.schemes_from_suffix("me/Model-MXFP8") == ("mxfp8",)
    assert families.schemes_from_suffix("me/Model-FP8") == ("fp8", "int8")
    for s in registry.all_schemes():  # every scheme's suffix names it, and <Model> is the name without it
        assert families.schemes_from_suffix(f"me/Model{s.suffix}")[0] == s.name
        assert hub_names.model_name(f"me/Model{s.suffix}") == "Model"
    # the nvfp4 bf16 rule is Unsloth's (true for fp8 and mxfp8 only)
    assert not schemes.rules("nvfp4").require_bf16 and schemes.rules("mxfp8").require_bf16
    # weight-only is a property of a scheme, not a record of its own
    assert schemes.get("fp8-weight-only") == (registry.lookup("fp8")[0], True)
    assert schemes.rules("fp8-weight-only").fast_accum is None and schemes.rules("fp8").fast_accum is True
    with pytest.raises(ValidationError):
        schemes.normalize("nvfp4-weight-only")
