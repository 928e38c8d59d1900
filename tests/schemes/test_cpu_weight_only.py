"""The float32 weight-only matmul on a CPU, a block of weight rows at a time (prequant_core/schemes/cpu_weight_only.py).

Against the whole-weight path it replaces (the weight dequantized per call, then one ``F.linear``), on Z-Image's real
layer shapes, for every scheme: the same numbers multiplied (bit for bit the output of the same block loop over the
whole weight dequantized first), the output the same up to the order the BLAS sums in (a block of rows is another
shape to it: on some CPUs a few percent of the outputs differ in their last bits); float8 codes widened exactly
(every code); a NaN code still reaches the output; and no call allocates the whole weight in float32 any more.
"""
from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from prequant_core import schemes
from prequant_core.schemes import codec, cpu_weight_only, qtensor, registry

# Z-Image's Linear shapes (out, in): qkv fused, feed-forward up and down
SHAPES = ((11520, 3840), (10240, 3840), (3840, 10240))


def _weight(shape, scheme, seed=0):
    g = torch.Generator().manual_seed(seed)
    dense = (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)
    return qtensor.parts(schemes.quantize_weight(dense, scheme))


def _whole(x, ts, spec, bias, table="e4m3"):
    """The path before: the whole weight dequantized (per-row: the codes, scaled at the output), one F.linear."""
    if spec.kind in ("int8", "float8"):
        q = ts[0]
        w = codec.decode(codec.decode_table(table, q.device), q) if q.dtype == torch.uint8 else q.to(torch.float32)
        out = torch.nn.functional.linear(x, w) * ts[1].reshape(-1)
        return out if bias is None else out + bias
    return torch.nn.functional.linear(x, qtensor.dequantize_parts(ts, spec, torch.float32), bias)


def _blocks_of_whole(x, ts, spec, bias, table="e4m3"):
    """The block loop over the whole weight dequantized first: what the path computes if its decoding is exact."""
    rows = ts[0].shape[0]
    if spec.kind in ("int8", "float8"):
        q = ts[0]
        w = codec.decode(codec.decode_table(table, q.device), q) if q.dtype == torch.uint8 else q.to(torch.float32)
        out = cpu_weight_only.linear(x, rows, lambda i, j, o: o.copy_(w[i:j])) * ts[1].reshape(-1)
        return out if bias is None else out + bias
    w = qtensor.dequantize_parts(ts, spec, torch.float32)
    return cpu_weight_only.linear(x, rows, lambda i, j, o: o.copy_(w[i:j]), bias)


@pytest.mark.parametrize("scheme", ["fp8", "int8", "nvfp4", "mxfp8"])
def test_blocks_equal_the_whole_weight_on_real_shapes(scheme):
    for n, (rows, cols) in enumerate(SHAPES):
        ts, spec = _weight((rows, cols), scheme, seed=n)
        layout = registry.codec(spec.kind)
        g = torch.Generator().manual_seed(10 + n)
        x = torch.randn(1, 96 if n else 1056, cols, generator=g)  # one sizeable token count, keeping the test short
        bias = torch.randn(rows, generator=g) if n != 1 else None
        got = layout.weight_only_linear(x, ts, spec, bias, "e4m3")
        assert got.shape == (1, x.shape[1], rows)
        assert torch.equal(got, _blocks_of_whole(x, ts, spec, bias)), (scheme, rows, cols)
        whole = _whole(x, ts, spec, bias)
        # one F.linear of the whole weight: the same sums, perhaps in another order (float32's last bits)
        assert float((got - whole).abs().max()) <= 4e-6 * float(whole.abs().max()), (scheme, rows, cols)


def test_every_float8_code_widens_exactly():
    every = torch.arange(256, dtype=torch.uint8).reshape(2, 128)
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        codes = every.view(dtype)
        want = codes.to(torch.float32)
        for src, table in ((codes, "e4m3"), (codes.view(torch.uint8), "e5m2" if dtype == torch.float8_e5m2 else "e4m3")):
            out = torch.empty(2, 128)
            cpu_weight_only.codes_rows(src, table)(0, 2, out)
            assert torch.allclose(out, want, equal_nan=True, rtol=0, atol=0), dtype
            assert int(torch.isnan(out).sum()) == int(torch.isnan(want).sum()) > 0, dtype
    # e4m3's 0x7e is 448: the largest finite code, subnormals (bytes 1..7) are 2^-9 .. 7 * 2^-9
    assert float(torch.tensor([0x7E, 1, 7, 0x81], dtype=torch.uint8).view(torch.float8_e4m3fn)[0].float()) == 448


def test_every_packed_nvfp4_byte_decodes_as_dequantize_does():
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
    every = torch.arange(256, dtype=torch.uint8).repeat(64, 1)  # [64, 256]: 512 values per row
    scales = (torch.rand(64, 32, generator=torch.Generator().manual_seed(3)) * 4).to(torch.float8_e4m3fn)
    t = NVFP4Tensor(every, scales, 16, torch.bfloat16, torch.tensor(0.37))
    ts, spec = qtensor.parts(t)
    out = torch.empty(64, 512)
    registry.codec(spec.kind).float32_rows(ts, spec)(0, 64, out)
    assert torch.equal(out, qtensor.dequantize_parts(ts, spec, torch.float32))
    assert torch.equal(out, t.dequantize(torch.float32))


def test_a_nan_code_reaches_the_output():
    ts, spec = _weight((512, 256), "fp8")
    q = ts[0].clone()
    x = torch.randn(3, 256)
    clean = codec.weight_only_rows(x, q, ts[1])
    assert torch.isfinite(clean).all()
    q.view(torch.uint8)[5, 7] = 0x7F
    q.view(torch.uint8)[300, 9] = 0xFF
    out = codec.weight_only_rows(x, q, ts[1])
    assert torch.isnan(out[:, 5]).all() and torch.isnan(out[:, 300]).all()
    keep = torch.ones(512, dtype=torch.bool)
    keep[[5, 300]] = False
    assert torch.equal(out[:, keep], clean[:, keep])


def _largest_allocation(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        fn()
    return max((e.cpu_memory_usage for e in p.events()), default=0)


@pytest.mark.parametrize("scheme", ["fp8", "nvfp4", "mxfp8"])
def test_no_call_allocates_the_whole_weight_in_float32(scheme):
    rows, cols = 8192, 512  # blocks of 4096 rows
    ts, spec = _weight((rows, cols), scheme)
    layout = registry.codec(spec.kind)
    x = torch.randn(4, cols)
    layout.weight_only_linear(x, ts, spec, None, "e4m3")  # decode tables: built once
    largest = _largest_allocation(lambda: layout.weight_only_linear(x, ts, spec, None, "e4m3"))
    assert largest <= cpu_weight_only.block_rows(cols) * cols * 4 < rows * cols * 4, (scheme, largest)
    # the float32 compute path only: half precision still dequantizes the whole weight (what those dtypes need)
    assert _largest_allocation(lambda: layout.weight_only_linear(x.to(torch.bfloat16), ts, spec, None, "e4m3")) \
        >= rows * cols * 2


def test_under_torch_compile_the_whole_weight_form_traces_in_one_graph():
    """ComfyUI's TorchCompileModel: the blocks' NaN test reads a value, which would break the graph (fullgraph fails)."""
    ts, spec = _weight((1024, 512), "fp8")
    x = torch.randn(2, 7, 512)
    eager = codec.weight_only_rows(x, ts[0], ts[1])
    compiled = torch.compile(lambda x: codec.weight_only_rows(x, ts[0], ts[1]), backend="eager", fullgraph=True)
    assert torch.equal(compiled(x), eager)


@pytest.mark.parametrize("scheme", ["fp8", "nvfp4"])
def test_an_input_that_needs_a_gradient_still_gets_one(scheme):
    """A training node's input: the gradient flows through to it, as with the whole-weight F.linear."""
    ts, spec = _weight((256, 128), scheme)
    layout = registry.codec(spec.kind)
    x = torch.randn(3, 128, requires_grad=True)
    out = layout.weight_only_linear(x, ts, spec, None, "e4m3")
    out.sum().backward()
    w = qtensor.dequantize_parts(ts, spec, torch.float32)
    assert torch.allclose(x.grad, w.sum(0).expand(3, -1), rtol=1e-5, atol=1e-6)
