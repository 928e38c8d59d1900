"""Every pre-quantized file users already have: legacy torchao-v1 int8 ``.pt`` files, ComfyUI-native twins, and
the v2/v3 containers we refuse.

The legacy file is produced by the real torchao 0.14.1 (installed beside the current one at .cache/torchao014 by
scripts/setup_dev.sh) in a subprocess; nothing here mocks torchao or ComfyUI.
"""
from __future__ import annotations

import json
import os
import pickle
import pickletools
import subprocess
import sys
import types
import zipfile

import pickle_asm as asm
import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import BASE_ID, ROOT, sample
from prequant_core import builder, errors, families, formats, schemes
from prequant_core.load import opening, metadata
from prequant_core.schemes import qtensor
from prequant_core.builder import writers
from prequant_core.formats.checkpoint import FORMAT_V1, FORMAT_V2, FORMAT_V3
from prequant_core.formats.containers import legacy_v1
from tools import tiny_models

NONE = "(none: use path or hub_repo)"
TORCHAO014 = os.path.join(ROOT, ".cache", "torchao014")
V1_CLASSES = ("torchao.quantization.linear_activation_quantized_tensor LinearActivationQuantizedTensor",
              "torchao.dtypes.affine_quantized_tensor AffineQuantizedTensor",
              "torchao.dtypes.uintx.plain_layout PlainAQTTensorImpl")


def _env014() -> dict:
    if not os.path.isfile(os.path.join(TORCHAO014, "torchao", "__init__.py")):
        pytest.fail("torchao 0.14.1 is missing at .cache/torchao014: run scripts/setup_dev.sh "
                    "(it runs: .venv/bin/python -m pip install --no-deps --target .cache/torchao014 torchao==0.14.1)")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([TORCHAO014, ROOT])
    return env


def load_path(comfy, path, **kw):
    nodes, _ = comfy
    with torch.inference_mode():  # as ComfyUI runs every node
        return nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(NONE, path=str(path), **kw)["result"][0]


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("legacy_formats")


@pytest.fixture(scope="module")
def dense_out(comfy, zimage_dense):
    """The dense bf16 model's sample: the yardstick for how far each rounding moves the output."""
    _, pack = comfy
    return sample(pack.nodes.comfy_model.build_patcher(families.get("z-image"), "diffusers", dict(zimage_dense)))


@pytest.fixture(scope="module")
def legacy(zimage_dense, folder):
    """A legacy int8 .pt written by the real torchao 0.14.1 (v1 classes), plus 0.14.1's own codes and scales."""
    dense = tiny_models.save_dense_safetensors(zimage_dense, str(folder / "dense.safetensors"))
    out, codes = folder / "transformer_int8.pt", folder / "codes014.safetensors"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_legacy_int8.py"), dense, str(out),
                        "--codes", str(codes)], env=_env014(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-3000:]
    os.unlink(dense)
    c = load_file(str(codes))
    keys = sorted(k[: -len(".int_data")] for k in c if k.endswith(".int_data"))
    return types.SimpleNamespace(path=str(out), keys=keys, q={k: c[k + ".int_data"] for k in keys},
                                 s={k: c[k + ".scale"] for k in keys})


# ---- 1. legacy torchao-v1 int8 .pt --------------------------------------------------------------------------------

def _pickle_globals(path) -> set:
    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    return {arg for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}


def test_fixture_is_a_real_torchao_v1_file(legacy, zimage_dense):
    globs = _pickle_globals(legacy.path)
    assert set(V1_CLASSES) <= globs, sorted(globs)
    from torch.torch_version import TorchVersion
    with pytest.raises(pickle.UnpicklingError, match="LinearActivationQuantizedTensor"), \
            torch.serialization.safe_globals([TorchVersion]):
        torch.load(legacy.path, weights_only=True)  # what current torch + torchao alone make of it
    # the same layers our int8 scheme quantizes
    flt = schemes.LayerFilter("int8", exclude=tuple(schemes.exclude_tokens("int8")))
    picked = {k for k in tiny_models.linear_weight_keys(zimage_dense)
              if flt.reason_skipped(k[: -len(".weight")], zimage_dense[k]) is None}
    assert set(legacy.keys) == picked and len(picked) > 10
    assert all(legacy.s[k].dtype == torch.bfloat16 and legacy.s[k].numel() == legacy.q[k].shape[0]
               for k in legacy.keys), "0.14.1 stores one bf16 scale per row"


def test_legacy_reads_bit_exact(legacy, zimage_dense):
    ck = formats.read(legacy.path)
    assert ck.container == "legacy-pt" and ck.format_tag == FORMAT_V1
    assert sorted(ck.quantized_keys) == legacy.keys
    want_act = schemes.quantize_weight(zimage_dense[legacy.keys[0]], "int8").act_quant_kwargs
    for k in legacy.keys:
        t = ck.tensors[k]
        assert qtensor.scheme_of(t) == "int8" and t.act_quant_kwargs == want_act
        assert t.dtype == torch.bfloat16 and tuple(t.shape) == tuple(zimage_dense[k].shape)
        assert torch.equal(t.qdata, legacy.q[k]), f"{k}: codes differ from torchao 0.14.1's"
        assert t.scale.dtype == torch.float32 and t.scale.shape == (t.shape[0], 1)
        assert torch.equal(t.scale.reshape(-1).to(torch.bfloat16), legacy.s[k]) and \
            torch.equal(t.scale.reshape(-1), legacy.s[k].float()), f"{k}: scales differ from torchao 0.14.1's"
    for k, v in zimage_dense.items():
        if k not in legacy.keys:
            assert torch.equal(ck.tensors[k], v), k
    assert ck.metadata["torchao_version"] == "0.14.1" and type(ck.metadata["torch_version"]) is str
    # the copying read (no mmap) decodes to the same tensors
    ck2 = legacy_v1.read_legacy_v1(legacy.path, mmap=False)
    assert all(torch.equal(ck2.tensors[k].qdata, ck.tensors[k].qdata) for k in legacy.keys)
    opened = opening.open_checkpoint(legacy.path, metadata.Request(scheme="int8", base_model_id=BASE_ID),
                                    model_dirs=[os.path.dirname(legacy.path)])
    assert opened.verdict.ok and opened.family.name == "z-image" and opened.layout == "diffusers"


def test_legacy_sampler_output(comfy, legacy, zimage_dense, prequant_files, allow_dir, folder, dense_out):
    """Through the loader node inside ComfyUI: the legacy file runs exactly like a current int8 file holding the same
    codes; against current torchao quantizing the dense weights itself it differs only by 0.14.1's rounding."""
    fam = families.get("z-image")
    allow_dir(folder, os.path.dirname(prequant_files("int8")))
    out = sample(load_path(comfy, legacy.path, base_model_id=BASE_ID, scheme="int8"))
    assert torch.isfinite(out).all()

    # a current-format file (safetensors, current torchao Int8Tensor) holding torchao 0.14.1's codes and scales
    spec = qtensor.split(schemes.quantize_weight(zimage_dense[legacy.keys[0]], "int8"))[2]
    same = {k: (qtensor.join(legacy.q[k], legacy.s[k].float().reshape(-1, 1), spec) if k in legacy.keys else v)
            for k, v in zimage_dense.items()}
    meta = builder.make_metadata(builder.Recipe("int8", family=fam, base_model_id=BASE_ID, min_features=512,
                                                exclude=schemes.exclude_tokens("int8")),
                                 same)
    same_path = writers.write_checkpoint(str(folder / "same-codes-INT8.safetensors"), same, meta, overwrite=True)
    same_out = sample(load_path(comfy, same_path, base_model_id=BASE_ID, scheme="int8"))
    os.unlink(same_path)
    assert (out - same_out).abs().max().item() == 0.0, "legacy file must run exactly like the same codes in a v1 file"

    # current torchao quantizing the same dense weights (what build_from_tensors writes)
    cur = formats.read(prequant_files("int8"))
    differ = sum(int((cur.tensors[k].qdata != legacy.q[k]).sum()) for k in legacy.keys)
    total = sum(legacy.q[k].numel() for k in legacy.keys)
    max_step = max(int((cur.tensors[k].qdata.int() - legacy.q[k].int()).abs().max()) for k in legacy.keys)
    scales_equal = all(torch.equal(cur.tensors[k].scale.reshape(-1), legacy.s[k].float()) for k in legacy.keys)
    ref = sample(load_path(comfy, prequant_files("int8"), base_model_id=BASE_ID, scheme="int8"))
    dense = dense_out
    rel, mx = rel_err(out, ref), (out - ref).abs().max().item()
    rel_legacy_dense, rel_cur_dense = rel_err(out, dense), rel_err(ref, dense)
    print(f"\n[legacy v1 vs current torchao int8] codes differing: {differ}/{total} ({100 * differ / total:.2f} %), "
          f"max step {max_step}, scales equal: {scales_equal}; sample rel err {rel:.2e}, max abs diff {mx:.3e}; "
          f"vs dense bf16: legacy {rel_legacy_dense:.2e}, current {rel_cur_dense:.2e}")
    assert scales_equal and max_step <= 1, "0.14.1 and current torchao may differ by one rounding step at most"
    # two roundings of the same weights, each about as far from dense as the other: their gap is of that order
    assert rel_legacy_dense < 1.25 * rel_cur_dense, "legacy codes must be about as close to dense as current ones"
    assert 0 < rel < 2 * rel_cur_dense, "legacy and current int8 differ by more than two int8 roundings would"


# crafted pickles: a tiny assembler for protocol-2 opcodes, so every byte of the payload is visible here

_g, _s, _int = asm.global_, asm.string, asm.int32
MARK, TUPLE, TUPLE1, REDUCE, POP, EMPTY_DICT, SETITEMS, STOP, NEWOBJ, BUILD = \
    asm.MARK, asm.TUPLE, asm.TUPLE1, asm.REDUCE, asm.POP, asm.EMPTY_DICT, asm.SETITEMS, asm.STOP, asm.NEWOBJ, asm.BUILD
LAQT = _g(*V1_CLASSES[0].split(" "))
AQT = _g(*V1_CLASSES[1].split(" "))


def _container(weight: bytes) -> bytes:
    return (b"\x80\x02" + EMPTY_DICT + MARK + _s("format") + _s(FORMAT_V1) + _s("metadata") + EMPTY_DICT
            + _s("state_dict") + EMPTY_DICT + MARK + _s("w.weight") + weight + SETITEMS + SETITEMS + STOP)


def _v1_weight_with(payload: bytes) -> bytes:
    """A LinearActivationQuantizedTensor rebuild as torch.save writes it, whose state carries ``payload``."""
    return (_g("torch._tensor", "_rebuild_from_type_v2") + MARK + _g("torch._utils", "_rebuild_wrapper_subclass")
            + LAQT + MARK + LAQT + _g("torch", "bfloat16") + MARK + _int(4) + _int(4) + TUPLE + MARK + _int(4)
            + _int(1) + TUPLE + _int(0) + _g("torch.serialization", "_get_layout") + _s("torch.strided") + TUPLE1
            + REDUCE + _g("torch", "device") + _s("cpu") + TUPLE1 + REDUCE + b"\x89" + TUPLE
            + EMPTY_DICT + MARK + _s("input_quant_func") + payload + SETITEMS + TUPLE + REDUCE)


def _call(module, name, *args: str) -> bytes:
    return _g(module, name) + MARK + b"".join(_s(a) for a in args) + TUPLE + REDUCE


def _payloads(marker: str) -> dict:
    touch = f"touch {marker}"
    return {
        "os.system in a v1 weight": _container(_v1_weight_with(_call("posix", "system", touch))),
        "builtins.exec in a v1 weight": _container(_v1_weight_with(
            _call("builtins", "exec", f"open({marker!r}, 'w').close()"))),
        "subprocess in a v1 weight": _container(_v1_weight_with(
            _g("subprocess", "call") + MARK + _s("touch") + _s(marker) + b"l" + TUPLE1 + REDUCE)),
        "getattr smuggling": _container(_v1_weight_with(
            _g("builtins", "getattr") + MARK + _g("os", "path") + _s("join") + TUPLE + REDUCE)),
        "torchao v1 class called with a payload": _container(LAQT + POP + AQT + MARK + _s(touch) + TUPLE + REDUCE),
        "torchao activation function called": _container(LAQT + POP + _call(
            "torchao.quantization.quant_api", "_int8_symm_per_token_reduced_range_quant", touch)),
        "torchao function outside the list": _container(LAQT + POP + _call(
            "torchao.quantization.quant_api", "quantize_", touch)),
        "torchao class instantiated directly": _container(LAQT + POP + AQT + MARK + _s(touch) + TUPLE + NEWOBJ),
    }


LIVE = ("os.system in a v1 weight", "builtins.exec in a v1 weight", "subprocess in a v1 weight")


@pytest.mark.parametrize("case", list(_payloads("M")))
def test_crafted_legacy_pickles_are_refused_without_running(folder, tmp_path, case):
    marker = tmp_path / "PWNED"
    path = asm.write_pt(folder / "evil-int8.pt", _payloads(str(marker))[case])
    with pytest.raises(errors.UnsafeCheckpointError) as e:
        formats.read(path)
    assert not marker.exists(), "the payload ran"
    msg = str(e.value)
    assert "Nothing from it was executed" in msg and "evil-int8.pt" in msg
    if case.endswith("in a v1 weight"):
        assert "legacy" in msg, "the v1 names must route it to the legacy reader, which refuses it"
        assert {"os.system": "posix.system", "builtins.exec": "builtins.exec",
                "subprocess": "subprocess.call"}[case.split(" in ")[0]] in msg


def test_crafted_payloads_are_live(folder, tmp_path):
    """Control: plain pickle with torchao 0.14.1 importable runs these payloads, so the refusals above are real."""
    results = {}
    for case in LIVE:
        marker = tmp_path / f"m{len(results)}"
        blob = tmp_path / f"p{len(results)}.pkl"
        blob.write_bytes(_payloads(str(marker))[case])
        results[case] = (blob, marker)
    code = ("import pickle, sys\nfor p in sys.argv[1:]:\n    try:\n        pickle.loads(open(p, 'rb').read())\n"
            "    except Exception as e:\n        print(p, type(e).__name__, e)\n")
    subprocess.run([sys.executable, "-c", code, *[str(b) for b, _ in results.values()]], env=_env014(),
                   capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    for case, (_, marker) in results.items():
        assert marker.exists(), f"control: '{case}' did not run under plain pickle"


@pytest.mark.parametrize("case", ["tensor past its storage", "state set on a tensor", "a dtype called",
                                  "a tensor written as a dict", "copyreg extension"])
def test_malformed_legacy_pickles_are_corrupt(folder, case):
    storage = (_g("torch._utils", "_rebuild_tensor_v2") + MARK + MARK + _s("storage") + _g("torch", "FloatStorage")
               + _s("0") + _s("cpu") + _int(2) + TUPLE + b"Q")
    tensor = lambda n: (storage + _int(0) + MARK + _int(n) + TUPLE + MARK + _int(1) + TUPLE + b"\x89"  # noqa: E731
                        + _g("collections", "OrderedDict") + b")" + REDUCE + TUPLE + REDUCE)
    body = {"tensor past its storage": tensor(3),
            "state set on a tensor": tensor(2) + EMPTY_DICT + MARK + _s("_backward_hooks") + _int(1) + SETITEMS + BUILD,
            "a dtype called": _g("torch", "int8") + MARK + TUPLE + REDUCE,
            "a tensor written as a dict": tensor(2) + _int(0) + _int(5) + b"s",
            "copyreg extension": b"\x82\x01"}[case]
    path = asm.write_pt(folder / "bad-int8.pt", _container(LAQT + POP + body))
    with pytest.raises(errors.CorruptCheckpointError) as e:
        formats.read(path)
    assert "legacy" in str(e.value)
    # control: the same archive with a well-formed tensor reads
    ok = asm.write_pt(folder / "ok-int8.pt", _container(LAQT + POP + tensor(2)))
    assert torch.equal(formats.read(ok).tensors["w.weight"], torch.ones(2))


# ---- 3. v2 / v3 containers ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tag,feature", [(FORMAT_V2, "activation_rotation"), (FORMAT_V3, "nvfp4_policy")])
@pytest.mark.parametrize("container", ["pt", "safetensors"])
def test_v2_v3_tags_without_their_fields_are_refused_naming_them(comfy, prequant_files, folder, allow_dir, tag, feature,
                                                     container):
    from prequant_core.formats.containers.safetensors_container import flatten
    ck = formats.read(prequant_files("int8"))  # any v1 file; re-tagged below
    path = folder / f"Z-Image-Turbo-INT8-{tag[-2:]}.{container}"
    if container == "pt":
        torch.save({"format": tag, "metadata": ck.metadata, "state_dict": ck.tensors}, path)
    else:
        flat, header = flatten(ck.tensors, format_tag=tag, metadata=ck.metadata)
        save_file(flat, str(path), metadata=header)
    assert formats.read(str(path)).format_tag == tag
    with pytest.raises(errors.ValidationError) as e:
        opening.open_checkpoint(str(path), metadata.Request(scheme="int8"), model_dirs=[str(folder)])
    # v2 / v3 files load (tests/schemes/test_block_formats*.py); a tag whose fields are absent is refused, saying which
    assert f"format tag is '{tag}'" in str(e.value) and f"'{feature}'" in str(e.value)
    allow_dir(folder)
    with pytest.raises(errors.PrequantError) as e:  # the node says the same
        load_path(comfy, path)
    assert feature in str(e.value)


# ---- 2. ComfyUI-native twins ----------------------------------------------------------------------------------------

def _blob(cfg) -> torch.Tensor:
    return torch.tensor(list(json.dumps(cfg).encode()), dtype=torch.uint8)


def write_twin(path, plain: dict, layers: dict, *, style="comfy_quant", prefix="") -> str:
    """A ComfyUI-native file: ``layers`` = {layer: (weight codes, weight_scale, format)}; ``plain`` as is."""
    sd = {prefix + k: v.contiguous() for k, v in plain.items()}
    header = {}
    for layer, (w, s, fmt) in layers.items():
        sd[prefix + layer + ".weight"] = w.contiguous()
        if style == "scaled_fp8":
            sd[prefix + layer + ".scale_weight"] = s.contiguous()
        else:
            sd[prefix + layer + ".weight_scale"] = s.contiguous()
        if style == "comfy_quant":
            sd[prefix + layer + ".comfy_quant"] = _blob(fmt if isinstance(fmt, dict) else {"format": fmt})
    if style == "metadata":
        header["_quantization_metadata"] = json.dumps(
            {"format_version": "1.0", "layers": {prefix + k: {"format": f} for k, (_, _, f) in layers.items()}})
    if style == "scaled_fp8":
        sd[prefix + "scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    save_file(sd, str(path), metadata=header or None)
    return str(path)


@pytest.fixture(scope="module")
def comfy_dense(comfy, zimage_dense):
    return tiny_models.zimage_comfy_layout(zimage_dense)


@pytest.fixture(scope="module")
def comfy_ref(comfy, prequant_files):
    """(path, sample) of our own ComfyUI-layout file per scheme, quantized by current torchao (per row)."""
    cache = {}

    def get(scheme):
        if scheme not in cache:
            path = prequant_files(scheme, "safetensors", "comfyui")
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("PREQUANT_ALLOW_LOCAL_PATH", os.path.dirname(path))
                cache[scheme] = (path, sample(load_path(comfy, path, scheme=scheme)))
        return cache[scheme]
    return get


@pytest.fixture(scope="module")
def comfy_layers(comfy, prequant_files):
    """Which ComfyUI-layout Linears our int8 / fp8 schemes quantize (the twins quantize the same ones)."""
    return {s: sorted(k[: -len(".weight")] for k in formats.read(prequant_files(s, "safetensors", "comfyui"))
                      .quantized_keys) for s in ("int8", "fp8")}


def comfy_int8(w: torch.Tensor):
    """ComfyUI's int8_tensorwise rounding: per-row absmax / 127, codes in -127..127."""
    w = w.float()
    s = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
    return torch.round(w / s).clamp(-127, 127).to(torch.int8), s


def comfy_fp8(w: torch.Tensor):
    """ComfyUI's float8_e4m3fn rounding: one scale per tensor, absmax / 448."""
    w = w.float()
    s = (w.abs().max().clamp(min=1e-12) / 448.0).reshape(())
    return (w / s).clamp(-448, 448).to(torch.float8_e4m3fn), s


def _twin_parts(dense: dict, layers: list, quant):
    plain = {k: v for k, v in dense.items() if k[: -len(".weight")] not in layers or not k.endswith(".weight")}
    return plain, {layer: quant(dense[layer + ".weight"]) for layer in layers}


def test_comfy_int8_twin_same_codes_is_exact(comfy, comfy_ref, allow_dir, folder):
    """A twin holding our int8 file's codes and per-row scales runs bit-identically to that file."""
    ref_path, ref = comfy_ref("int8")
    ours = formats.read(ref_path)
    plain = {k: v for k, v in ours.tensors.items() if not qtensor.is_quantized(v)}
    layers = {k[: -len(".weight")]: (*qtensor.split(v)[:2], "int8_tensorwise") for k, v in ours.tensors.items()
              if qtensor.is_quantized(v)}
    path = write_twin(folder / "Z-Image-Turbo-INT8-ComfyUI.safetensors", plain, layers)
    ck = formats.read(path)
    assert ck.container == "comfyui-native" and ck.metadata["int8_granularity"] == "per_row"
    for k, v in ours.tensors.items():
        got = ck.tensors[k]
        if qtensor.is_quantized(v):
            assert qtensor.split(got)[2] == qtensor.split(v)[2], "must run with our int8 scheme's settings"
            assert torch.equal(got.qdata, v.qdata) and torch.equal(got.scale, v.scale)
        else:
            assert torch.equal(got, v)
    allow_dir(folder)
    out = sample(load_path(comfy, path, scheme="int8"))
    assert (out - ref).abs().max().item() == 0.0


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_comfy_twin_matches_runtime_quantization(comfy, comfy_dense, comfy_layers, comfy_ref, allow_dir, folder,
                                                 dense_out, scheme):
    """A twin rounded the ComfyUI way (int8: per-row absmax/127; fp8: one scale per tensor) loads without
    dequantizing and its samples stay within that rounding of our runtime-quantized (per-row) file."""
    layers = comfy_layers[scheme]
    fmt, quant = {"int8": ("int8_tensorwise", comfy_int8), "fp8": ("float8_e4m3fn", comfy_fp8)}[scheme]
    plain, parts = _twin_parts(comfy_dense, layers, quant)
    path = write_twin(folder / f"Z-Image-Turbo-{scheme.upper()}-ComfyUI.safetensors", plain,
                      {k: (q, s, fmt) for k, (q, s) in parts.items()})
    opened = opening.open_checkpoint(path, metadata.Request(scheme=scheme), model_dirs=[str(folder)])
    assert opened.verdict.ok, opened.verdict.reasons
    assert opened.layout == "comfyui" and opened.checkpoint.metadata["scheme"] == scheme
    for layer, (q, s) in parts.items():
        t = opened.checkpoint.tensors[layer + ".weight"]
        assert qtensor.scheme_of(t) == scheme and torch.equal(t.qdata, q), "codes must be the file's, undequantized"
        assert torch.equal(t.scale, s.expand(t.shape[0], 1) if s.numel() == 1 else s)
    if scheme == "fp8":
        assert opened.checkpoint.metadata["fp8_granularity"] == "per_tensor"
        assert any("coarser rounding" in n for n in opened.verdict.notes), opened.verdict.notes
    else:  # per-row int8: only what the file is (its formats, which ComfyUI reads it natively)
        assert [n for n in opened.verdict.notes if "coarser" in n] == []
        assert any("ComfyUI-native file (int8_tensorwise" in n and "0.27.0" in n for n in opened.verdict.notes)

    _, ref = comfy_ref(scheme)
    allow_dir(folder)
    out = sample(load_path(comfy, path, scheme=scheme))
    w_err = max(rel_err(qtensor.dequantize(q, s.reshape(-1, 1) if s.numel() > 1 else s, torch.float32),
                        comfy_dense[k + ".weight"]) for k, (q, s) in parts.items())
    rel, twin_dense, ours_dense = rel_err(out, ref), rel_err(out, dense_out), rel_err(ref, dense_out)
    print(f"\n[ComfyUI-native {fmt}] sample rel err vs our per-row {scheme} file: {rel:.2e} "
          f"(max abs {(out - ref).abs().max().item():.3e}); vs dense bf16: twin {twin_dense:.2e}, "
          f"our per-row file {ours_dense:.2e}; worst weight rounding rel err {w_err:.2e}")
    assert torch.isfinite(out).all()
    # int8 twins round per row like ours (absmax/127 instead of /127.5): about as close to dense. fp8 twins use one
    # scale per tensor: coarser, so a looser bound, but still the same order as the per-row file's own error.
    factor = {"int8": 1.25, "fp8": 1.5}[scheme]
    assert twin_dense < factor * ours_dense, (twin_dense, ours_dense)
    assert 0 < rel < (1 + factor) * ours_dense, rel


def test_comfy_twin_older_markings_read_the_same(comfy_dense, comfy_layers, folder):
    """``_quantization_metadata`` header, legacy ``scaled_fp8`` marker, ``model.diffusion_model.`` prefix and a scalar
    int8 scale all decode to the same tensors as the per-layer ``comfy_quant`` form."""
    layers = comfy_layers["fp8"][:6]
    plain, parts = _twin_parts(comfy_dense, layers, comfy_fp8)
    fp8 = {k: (q, s, "float8_e4m3fn") for k, (q, s) in parts.items()}
    base = formats.read(write_twin(folder / "t-quant.safetensors", plain, fp8))
    for style, prefix in (("metadata", ""), ("scaled_fp8", ""), ("comfy_quant", "model.diffusion_model.")):
        ck = formats.read(write_twin(folder / f"t-{style}.safetensors", plain, fp8, style=style, prefix=prefix))
        assert ck.container == "comfyui-native"
        assert ck.metadata["comfy_quant_style"] == {"metadata": "_quantization_metadata"}.get(style, style)
        assert sorted(ck.tensors) == sorted(base.tensors), style
        for k, v in base.tensors.items():
            got = ck.tensors[k]
            assert type(got) is type(v) and torch.equal(got.qdata if qtensor.is_quantized(v) else got,
                                                        v.qdata if qtensor.is_quantized(v) else v), (style, k)
            if qtensor.is_quantized(v):
                assert torch.equal(got.scale, v.scale)
    # int8 with one scale per tensor: repeated per row, and said to be coarser
    w = comfy_dense[layers[0] + ".weight"].float()
    s = w.abs().max() / 127.0
    q = torch.round(w / s).clamp(-127, 127).to(torch.int8)
    ck = formats.read(write_twin(folder / "t-int8-scalar.safetensors", plain, {layers[0]: (q, s.reshape(()),
                                                                                       "int8_tensorwise")}))
    t = ck.tensors[layers[0] + ".weight"]
    assert torch.equal(t.qdata, q) and torch.equal(t.scale, s.reshape(1, 1).expand(q.shape[0], 1))
    assert ck.metadata["int8_granularity"] == "per_tensor"
    v = metadata.validate(ck, metadata.Request())
    assert any("int8" in n and "coarser" in n for n in v.notes)


@pytest.mark.parametrize("cfg,error,named", [
    # a format the pack reads, with parts that are not that format's: refused as damaged, the format named
    ({"format": "nvfp4"}, errors.CorruptCheckpointError, "nvfp4 layer needs uint8 codes"),
    # a format the pack does not know: refused as unsupported, by name
    ({"format": "int3_magic"}, errors.UnsupportedFormatError, "'int3_magic'"),
])
def test_comfy_twin_other_formats_refused_by_name(comfy, comfy_dense, comfy_layers, folder, allow_dir, cfg, error,
                                                  named):
    layers = comfy_layers["int8"][:2]
    plain, parts = _twin_parts(comfy_dense, layers, comfy_int8)
    twin = {layers[0]: (*parts[layers[0]], "int8_tensorwise"), layers[1]: (*parts[layers[1]], cfg)}
    path = write_twin(folder / "Z-Image-Turbo-X-ComfyUI.safetensors", plain, twin)
    with pytest.raises(error) as e:
        formats.read(path)
    assert named in str(e.value)
    allow_dir(folder)
    with pytest.raises(error) as e:
        load_path(comfy, path)
    assert named in str(e.value)
