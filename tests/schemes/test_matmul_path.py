"""Every device gets a working matmul, chosen at load and stated on the node (issue 14, item 5).

The decision (``prequant_core.schemes.devices.choose``) is a pure function of the weight's kind and the device, tested here
for each device class; the weight-only path is compared with its reference (rows dequantized, ``F.linear``), the
quantized path with torchao's own ``quantize_``; the loader node's text and its Linears carry the same choice.
"""
from __future__ import annotations

import os

import pytest
import torch

from conftest import BASE_ID, dense_of, sample
from prequant_core.schemes import devices, qtensor
from prequant_core import schemes
from prequant_core.errors import ValidationError

NONE = "(none: use path or hub_repo)"
Q, WO = devices.QUANTIZED, devices.WEIGHT_ONLY

CPU = devices.Device("cpu")
MPS = devices.Device("mps")
XPU = devices.Device("xpu")
ROCM = devices.Device("cuda", capability=(9, 4), hip=True, name="MI300X")
H100 = devices.Device("cuda", capability=(9, 0), name="H100")
L4 = devices.Device("cuda", capability=(8, 9), name="L4")
A100 = devices.Device("cuda", capability=(8, 0), name="A100")
RTX3090 = devices.Device("cuda", capability=(8, 6), name="RTX 3090")
T4 = devices.Device("cuda", capability=(7, 5), name="T4")
V100 = devices.Device("cuda", capability=(7, 0), name="V100")
P100 = devices.Device("cuda", capability=(6, 0), name="P100")
UNKNOWN_CUDA = devices.Device("cuda", capability=None)


@pytest.mark.parametrize("device,fp8,int8", [
    (H100, Q, Q), (L4, Q, Q),  # fp8 tensor cores (>= 8.9)
    (A100, WO, Q), (RTX3090, WO, Q), (T4, WO, Q),  # int8 GEMM, no fp8
    (V100, WO, WO), (P100, WO, WO), (UNKNOWN_CUDA, WO, WO),  # neither (or a driver that cannot say)
    (ROCM, WO, WO), (MPS, WO, WO), (XPU, WO, WO),
    (CPU, WO, Q),  # torch._int_mm runs on CPUs; fp8 would be emulated
])
def test_choice_per_device(device, fp8, int8):
    a, b = devices.choose("float8", True, device), devices.choose("int8", True, device)
    assert (a.path, b.path) == (fp8, int8)
    for c in (a, b):
        assert device.label() in c.reason and c.path in c.text()


@pytest.mark.parametrize("device", [H100, A100, CPU, MPS, ROCM])
@pytest.mark.parametrize("kind", ["int8", "float8"])
def test_weight_only_schemes_always_run_weight_only(device, kind):
    c = devices.choose(kind, False, device)
    assert c.path == WO and ("weight-only file" in c.reason or "no float8 dtype" in c.reason)
    assert devices.choose(kind, False, device, override=Q).path == WO  # nothing to quantize activations with


@pytest.mark.parametrize("device,as_bytes", [(MPS, True), (XPU, True), (CPU, False), (H100, False), (ROCM, False)])
def test_fp8_codes_kept_as_bytes_where_no_float8_dtype(device, as_bytes):
    for dynamic in (True, False):
        c = devices.choose("float8", dynamic, device, override=Q)
        assert c.codes_as_bytes is as_bytes and ("kept as bytes" in c.text()) is as_bytes
        if as_bytes:
            assert c.path == WO  # not even a forced quantized path can run without the dtype
    assert devices.choose("int8", True, device).codes_as_bytes is False


def test_override_both_ways_and_said_so():
    assert devices.choose("float8", True, CPU, override=Q).path == Q
    assert devices.choose("int8", True, H100, override=WO).path == WO
    assert devices.ENV in devices.choose("float8", True, CPU, override=Q).reason
    assert devices.override_from_env({}) is None
    assert devices.override_from_env({devices.ENV: "auto"}) is None
    assert devices.override_from_env({devices.ENV: " Weight_Only "}) == WO
    assert devices.override_from_env({devices.ENV: "quantized"}) == Q
    with pytest.raises(ValidationError) as e:
        devices.override_from_env({devices.ENV: "fast"})
    assert e.value.found == "fast" and "weight-only" in e.value.expected and e.value.fix


def test_describe_reads_the_device():
    d = devices.describe("cpu")
    assert d == devices.Device("cpu") and d.label() == "CPU"
    assert "compute capability 8.6" in RTX3090.label() and "ROCm" in ROCM.label()
    with pytest.raises(ValueError):
        devices.choose("int4", True, CPU)


# ---------------------------------------------------------------------------------------------------------------
# The two paths, layer by layer, on the real ComfyUI ops
# ---------------------------------------------------------------------------------------------------------------

def _linear(ops, scheme, out_f=96, in_f=64, seed=0):
    """A Linear of this pack's ops (``nodes/ops.py``) carrying a quantized weight, plus its dense weight."""
    import comfy.ops
    g = torch.Generator().manual_seed(seed)
    dense = (torch.randn(out_f, in_f, generator=g) / 8).to(torch.bfloat16)
    if scheme.startswith("int8"):
        dense[3] = 0  # an all-zero row (torchao's per-row fp8 turns one into NaN codes with scale 0, in every path)
    lin = ops.make_ops(comfy.ops.disable_weight_init).Linear(in_f, out_f, bias=True, device="meta")
    lin.bias = torch.nn.Parameter(torch.randn(out_f, generator=g).to(torch.bfloat16), requires_grad=False)
    ops.set_quantized(lin, "weight", schemes.quantize_weight(dense, scheme))
    return lin, dense


@pytest.fixture(scope="module")
def pack_ops(comfy):
    _, pack = comfy
    return pack.nodes.ops


def test_fast_dequantize_is_the_reference_dequantize():
    """Every fp8 code and a spread of int8 codes: ``dequantize_rows`` == ``qtensor.dequantize`` bit for bit."""
    fp8 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    fp8 = fp8[~torch.isnan(fp8.to(torch.float32))].reshape(2, -1)
    i8 = torch.arange(-128, 128, dtype=torch.int8).reshape(2, -1)
    scale = torch.tensor([[3.1e-4], [7.7e-1]], dtype=torch.float32)
    for q in (fp8, i8):
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            a, b = qtensor.dequantize_rows(q, scale, dt), qtensor.dequantize(q, scale, dt)
            assert a.dtype == dt and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (q.dtype, dt)


@pytest.mark.parametrize("scheme", schemes.names())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_weight_only_path_equals_dequantize_then_linear(pack_ops, scheme, dtype):
    lin, dense = _linear(pack_ops, scheme)
    lin.prequant_matmul = WO
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.inference_mode():
        out = lin(x)
    ref = torch.nn.functional.linear(x, qtensor.dequantize_parts(lin.prequant_parts(), lin.prequant_spec, dtype),
                                     lin.bias.to(dtype))
    assert out.dtype == dtype
    if dtype == torch.float32 and not schemes.get(scheme)[0].block_size:
        # per-row scales applied to the output columns: same product, float32-level rounding
        exact = torch.nn.functional.linear(x, lin.weight.to(dtype)) * lin.weight_scale.reshape(-1) + lin.bias.float()
        assert torch.equal(out, exact), scheme
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5), (scheme, (out - ref).abs().max().item())
    else:
        assert torch.equal(out, ref), scheme
    # and it is the dense layer up to the weight rounding (a wrong scale or row order would be far off)
    dense_out = torch.nn.functional.linear(x.float(), dense.float(), lin.bias.float())
    rel = ((out.float() - dense_out).norm() / dense_out.norm()).item()
    assert rel < (0.15 if scheme == "nvfp4" else 0.05), (scheme, rel)  # nvfp4: 4-bit codes


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_the_two_paths_differ_only_by_activation_rounding(comfy, pack_ops, scheme):
    """Forcing the quantized path runs torchao's dynamic-activation matmul: a different (coarser) result than
    weight-only, both close to the dense layer. Guards against one path silently running the other."""
    lin, dense = _linear(pack_ops, scheme)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        lin.prequant_matmul = WO
        wo = lin(x)
        lin.prequant_matmul = Q
        qu = lin(x)
    ref = torch.nn.functional.linear(x.to(torch.bfloat16), qtensor.join(lin.weight, lin.weight_scale,
                                     lin.prequant_spec), lin.bias).to(x.dtype)
    assert torch.equal(qu, ref)
    assert not torch.equal(wo, qu)


def test_quantized_path_equals_torchao_quantize_(comfy, pack_ops):
    """The quantized path computes exactly what torchao's ``quantize_`` with the scheme's config computes (int8 here:
    torchao's fp8 module config asserts a CUDA GPU of compute capability >= 8.9, see bench/gpu_check.py)."""
    from torchao.quantization import quantize_
    lin, dense = _linear(pack_ops, "int8")
    lin.prequant_matmul = Q
    ref = torch.nn.Linear(64, 96, bias=True, dtype=torch.bfloat16)
    with torch.no_grad():
        ref.weight.copy_(dense)
        ref.bias.copy_(lin.bias)
    quantize_(ref, schemes.torchao_config("int8"))
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(lin(x), ref(x))


def test_fp8_as_bytes_is_the_same_layer(comfy, pack_ops):
    """fp8 codes kept as uint8 (Apple MPS has no float8 dtype; exercised here on the CPU): same output, same bytes,
    same dequantized weight, and a LoRA-style patch round trip keeps the byte form and equals the fp8 form."""
    a, _ = _linear(pack_ops, "fp8", seed=4)
    b, _ = _linear(pack_ops, "fp8", seed=4)
    a.prequant_matmul = b.prequant_matmul = WO
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(5))
    fp8_bytes = b.weight.numel() * b.weight.element_size()
    b.prequant_keep_bytes()
    assert b.weight.dtype == torch.uint8 and b.weight.numel() * b.weight.element_size() == fp8_bytes
    assert torch.equal(b.weight, a.weight.view(torch.uint8))
    with torch.inference_mode():
        assert torch.equal(a(x), b(x))
        b.prequant_matmul = a.prequant_matmul = Q  # a forced quantized path still finds typed codes
        assert torch.equal(a(x), b(x))
    da, db = dense_of(a), dense_of(b)
    assert torch.equal(da, db)
    patched = da.clone()
    patched[5] += 0.01
    for m, before in ((a, da), (b, db)):  # rows the patch left alike keep their codes and scales
        m.prequant_assign(m.prequant_quantize_dense(patched, m.prequant_parts(), (patched == before).all(dim=1)),
                          m.prequant_spec)
    assert b.weight.dtype == torch.uint8 and torch.equal(b.weight, a.weight.view(torch.uint8))
    assert torch.equal(a.weight_scale, b.weight_scale)


def test_choose_matmul_for_an_apple_gpu_keeps_fp8_as_bytes(comfy, pack_ops, monkeypatch):
    monkeypatch.delenv(devices.ENV, raising=False)
    a, _ = _linear(pack_ops, "fp8", seed=6)
    b, _ = _linear(pack_ops, "int8", seed=7)
    ref = torch.nn.functional.linear
    got = pack_ops.choose_matmul(torch.nn.Sequential(a, b), torch.device("mps"))
    assert [c.path for c in got] == [WO, WO] and [c.codes_as_bytes for c in got] == [True, False]
    assert a.weight.dtype == torch.uint8 and b.weight.dtype == torch.int8
    assert "kept as bytes" in pack_ops.matmul_summary(got)
    x = torch.randn(2, 64)
    with torch.inference_mode():  # the layer runs (here on the CPU) from its bytes, exactly as the fp8 reference
        out = a(x)
    codes = a.weight.view(torch.float8_e4m3fn).to(torch.float32)
    assert torch.equal(out, ref(x, codes) * a.weight_scale.reshape(-1) + a.bias.float())
    with torch.inference_mode():  # and in half precision: rows dequantized from the bytes, exactly
        xb = x.to(torch.bfloat16)
        w = qtensor.dequantize(a.weight.view(torch.float8_e4m3fn), a.weight_scale, torch.bfloat16)
        assert torch.equal(a(xb), ref(xb, w, a.bias.to(torch.bfloat16)))


def test_unset_path_is_decided_on_first_call_and_kept(comfy, pack_ops):
    lin, _ = _linear(pack_ops, "fp8")
    assert lin.prequant_matmul is None
    with torch.inference_mode():
        lin(torch.randn(2, 64))
    assert lin.prequant_matmul == WO  # fp8 on this CPU


def test_choose_matmul_marks_every_quantized_linear(pack_ops, monkeypatch):
    a, _ = _linear(pack_ops, "fp8", seed=1)
    b, _ = _linear(pack_ops, "int8", seed=2)
    c, _ = _linear(pack_ops, "int8-weight-only", seed=3)
    m = torch.nn.Sequential(a, b, c, torch.nn.Linear(4, 4))
    got = pack_ops.choose_matmul(m, torch.device("cpu"))
    assert [x.path for x in got] == [WO, Q, WO] and (a.prequant_matmul, b.prequant_matmul) == (WO, Q)
    assert c.prequant_matmul == WO and not hasattr(m[3], "prequant_matmul")
    text = pack_ops.matmul_summary(got)
    assert "fp8 on CPU" in text and "int8 matmul supported" in text and "int8-weight-only file" in text
    monkeypatch.setenv(devices.ENV, "weight-only")
    pack_ops.choose_matmul(m, torch.device("cpu"))
    assert b.prequant_matmul == WO
    monkeypatch.setenv(devices.ENV, "bogus")
    with pytest.raises(ValidationError):
        pack_ops.choose_matmul(m, torch.device("cpu"))


# ---------------------------------------------------------------------------------------------------------------
# Through the loader node: the path on the node's text is the path the model runs
# ---------------------------------------------------------------------------------------------------------------

def _load(comfy, path, scheme):
    nodes, _ = comfy
    with torch.inference_mode():
        return nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(NONE, path=str(path), scheme=scheme,
                                                                           base_model_id=BASE_ID)


def _paths(model):
    return {m.prequant_matmul for m in model.model.diffusion_model.modules() if getattr(m, "prequant_spec", None)}


@pytest.mark.parametrize("scheme,expected", [("fp8", WO), ("int8", Q), ("fp8-weight-only", WO)])
def test_node_states_the_path_it_runs(comfy, prequant_files, allow_dir, monkeypatch, scheme, expected):
    monkeypatch.delenv(devices.ENV, raising=False)
    path = prequant_files(scheme)
    allow_dir(os.path.dirname(path))
    res = _load(comfy, path, scheme)
    model, text = res["result"][0], res["ui"]["text"][0]
    assert _paths(model) == {expected}
    assert f"matmul: {expected} matmul" in text and "on CPU" in text
    assert res["ui"]["prequant"][0]["matmul"] == model.prequant_matmul
    assert torch.isfinite(sample(model, steps=1)).all()


def test_node_override_runs_the_forced_path(comfy, prequant_files, allow_dir, monkeypatch):
    """PREQUANT_MATMUL=quantized on a CPU: the fp8 file runs torchao's (emulated) fp8 matmul, said on the node, and
    its output differs from the default weight-only run of the same file."""
    path = prequant_files("fp8")
    allow_dir(os.path.dirname(path))
    monkeypatch.delenv(devices.ENV, raising=False)
    default = _load(comfy, path, "fp8")["result"][0]
    monkeypatch.setenv(devices.ENV, "quantized")
    res = _load(comfy, path, "fp8")
    forced = res["result"][0]
    assert _paths(forced) == {Q} and f"{devices.ENV}=quantized" in res["ui"]["text"][0]
    a, b = sample(default, steps=1), sample(forced, steps=1)
    assert not torch.equal(a, b)
    assert ((a - b).norm() / a.norm()).item() < 0.1


# ---------------------------------------------------------------------------------------------------------------
# ComfyUI's memory management and LoRA on the weight-only path (fp8 on this CPU)
# ---------------------------------------------------------------------------------------------------------------

def test_weight_only_low_vram_partial_load_matches_full_load(comfy, prequant_files, allow_dir, monkeypatch):
    import comfy.model_management as mm
    from conftest import load_path
    monkeypatch.delenv(devices.ENV, raising=False)
    path = prequant_files("fp8")
    allow_dir(os.path.dirname(path))
    full_model = load_path(comfy, path)
    assert _paths(full_model) == {WO}
    full = sample(full_model)
    model = load_path(comfy, path)
    mm.unload_all_models()
    with torch.inference_mode():
        model.load(model.load_device, lowvram_model_memory=1, force_patch_weights=False, full_load=False)
    assert [n for n, m in model.model.diffusion_model.named_modules() if getattr(m, "comfy_cast_weights", False)]
    assert torch.equal(full, sample(model))


def test_weight_only_stock_lora(comfy, prequant_files, allow_dir, monkeypatch):
    """LoraLoaderModelOnly on a weight-only model: the LoRA acts, strength 0 is exact, unpatching restores codes."""
    import comfy.model_management as mm
    import folder_paths
    from conftest import load_path, make_lora as _make_lora
    nodes, _ = comfy
    monkeypatch.delenv(devices.ENV, raising=False)
    path = prequant_files("fp8")
    allow_dir(os.path.dirname(path))
    model = load_path(comfy, path)
    base = sample(model)
    qkv = model.model.diffusion_model.layers[0].attention.qkv
    assert qkv.prequant_matmul == WO
    orig_w, orig_s = qkv.weight.detach().clone(), qkv.weight_scale.detach().clone()
    lora_dir = folder_paths.get_folder_paths("loras")[0]
    os.makedirs(lora_dir, exist_ok=True)
    _make_lora(model, os.path.join(lora_dir, "tiny_zimage_lora_wo.safetensors"), seed=5)
    loader = nodes.NODE_CLASS_MAPPINGS["LoraLoaderModelOnly"]()
    with torch.inference_mode():
        lora_model = loader.load_lora_model_only(model, "tiny_zimage_lora_wo.safetensors", 1.0)[0]
        zero_model = loader.load_lora_model_only(model, "tiny_zimage_lora_wo.safetensors", 0.0)[0]
    with_lora = sample(lora_model)
    assert torch.isfinite(with_lora).all() and not torch.equal(with_lora, base)
    assert torch.equal(sample(zero_model), base)
    mm.unload_all_models()
    assert torch.equal(qkv.weight.view(torch.uint8), orig_w.view(torch.uint8)) and torch.equal(qkv.weight_scale, orig_s)
    assert torch.equal(sample(model), base)
