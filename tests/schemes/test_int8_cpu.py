"""The CPU int8 linear (prequant_core.schemes.int8_cpu) is torchao's dynamic int8 linear, bit for bit, through both of
its exact integer matmuls (torch._int_mm where it is exact on this CPU, float32 pieces everywhere)."""
from __future__ import annotations

import functools

import pytest
import torch

from prequant_core.schemes import int8_cpu, qtensor
from prequant_core import schemes


def _layer(rows, cols, seed):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(rows, cols, generator=g) / cols ** 0.5).to(torch.bfloat16)
    w[1] = 0  # a zero row: scale from torchao's eps
    w[2, :3] = 40.0  # an outlier row
    q, s, spec = qtensor.split(schemes.quantize_weight(w, "int8"))
    return g, q, s, spec


def _torchao(x, q, s, spec, bias):
    return torch.nn.functional.linear(x, qtensor.join(q, s, spec), bias)


@pytest.mark.parametrize("native", [True, False], ids=["int_mm", "float32-pieces"])
@pytest.mark.parametrize("rows,cols", [(10240, 3840), (3840, 10240), (1000, 2500)])  # Z-Image's + odd
def test_equals_torchaos_int8_linear_bit_for_bit(rows, cols, native):
    """Real layer shapes and an odd one (a last block of rows and of columns shorter than the rest): every output
    element equals torchao's, with and without bias, in weight-row blocks of any size."""
    g, q, s, spec = _layer(rows, cols, rows + cols)
    x = (torch.randn(2, 77, cols, generator=g) * 3).to(spec.dtype)
    x[0, 5] = 0  # a token of zeros
    x[1, 7, :2] = 1e4  # a token whose scale an outlier sets: most of its codes round to 0
    bias = torch.randn(rows, generator=g).to(spec.dtype)
    with torch.inference_mode():
        want, want_nb = _torchao(x, q, s, spec, bias), _torchao(x, q, s, spec, None)
        mm = int8_cpu.int_mm_native if native else int8_cpu.int_mm_pieces
        small = int8_cpu.int_mm_native if native else functools.partial(int8_cpu.int_mm_pieces, rows=1000)
        assert torch.equal(int8_cpu.linear(x, q, s, spec, bias, mm=mm), want)
        assert torch.equal(int8_cpu.linear(x, q, s, spec, None, mm=small), want_nb)


def test_integer_sums_at_the_float32_limit_are_exact():
    """Codes of magnitude 127 and -128 in every position of a 1024-wide block, the largest sums the float32 pieces
    hold; a wider row sums several blocks past 2**24, which only the int32 accumulation holds."""
    a = torch.full((3, 4096), 127, dtype=torch.int8)
    a[1] = -128
    a[2, ::2] = -127
    w = torch.full((5, 4096), -128, dtype=torch.int8)
    w[3] = 127
    want = (a.double() @ w.double().t()).to(torch.int32)
    assert torch.equal(int8_cpu.int_mm_pieces(a, w), want)
    assert int(want.abs().max()) == 128 * 128 * 4096


def test_float64_when_float32_matmuls_are_not_exact(monkeypatch):
    """With float32 matmul precision lowered (bf16 / tf32 shortcuts), the sums go through float64: still exact."""
    g, q, s, spec = _layer(1536, 3072, 1)
    x = torch.randn(1, 40, 3072, generator=g).to(spec.dtype)
    want = _torchao(x, q, s, spec, None)
    prev = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        assert not int8_cpu.exact_float32()
        assert torch.equal(int8_cpu.linear(x, q, s, spec, None), want)
    finally:
        torch.set_float32_matmul_precision(prev)
    assert int8_cpu.exact_float32()


def test_weight_only_int8_goes_to_torchao():
    """A weight without activation quantization (weight-only int8) is not this path's: torchao's linear runs."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(256, 512, generator=g).to(torch.bfloat16)
    q, s, spec = qtensor.split(schemes.quantize_weight(w, "int8"))
    wo = qtensor.QSpec(spec.kind, spec.dtype, tuple((k, None if k == "act_quant_kwargs" else v) for k, v in spec.attrs))
    assert spec.dynamic and not wo.dynamic
    x = torch.randn(4, 512, generator=g).to(torch.bfloat16)
    assert not int8_cpu._symmetric_dynamic(wo.as_kwargs().get("act_quant_kwargs"))
    assert torch.equal(int8_cpu.linear(x, q, s, wo), _torchao(x, q, s, wo, None))


def test_this_cpus_int_mm_passes_the_check_and_is_the_default():
    """The CI CPU (AVX-512 VNNI) sums int8 exactly in torch._int_mm: the check passes and the linear takes it."""
    assert int8_cpu.native_exact()
    a, w = int8_cpu._worst_case(40, 3000, 24)
    assert torch.equal(int8_cpu.int_mm(a, w), int8_cpu.int_mm_pieces(a, w))


def _saturating_int_mm(a, b):
    """What an int8 kernel without dot-product instructions may compute: neighbouring products added in a
    saturating 16-bit register (x86 ``pmaddubsw`` on codes shifted to unsigned), then summed in int32."""
    ua = a.to(torch.int32) + 128  # signed codes shifted to unsigned, as oneDNN does for s8 activations
    prods = ua[:, :, None] * b.to(torch.int32)[None, :, :]  # [M, K, N]
    k = prods.shape[1] - prods.shape[1] % 2
    pairs = (prods[:, 0:k:2] + prods[:, 1:k:2]).clamp(-32768, 32767)
    total = pairs.sum(1) + (prods[:, k:].sum(1) if k < prods.shape[1] else 0)
    return (total - 128 * b.to(torch.int32).sum(0)).to(torch.int32)  # the shift's compensation, exact


def test_a_saturating_kernel_is_refused_and_the_pieces_take_over():
    """A kernel that is right on ordinary codes but saturates on the worst case is caught by the check."""
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-20, 20, (8, 64), generator=g, dtype=torch.int8)
    w = torch.randint(-20, 20, (16, 64), generator=g, dtype=torch.int8)
    assert torch.equal(_saturating_int_mm(a, w.t()), torch._int_mm(a, w.t()))  # small codes: exact
    assert not int8_cpu.native_exact(_saturating_int_mm)
    assert not int8_cpu.native_exact(lambda a, b: (_ for _ in ()).throw(RuntimeError("no CPU kernel")))


def test_an_exact_but_slower_kernel_is_not_chosen():
    """Both ways are exact, so the faster one runs: a kernel that returns the right sums but takes far longer than the
    float32 pieces on the probe (a generic kernel on a CPU without int8 dot products) is passed over."""
    import time

    def slow(a, b):
        time.sleep(0.05)
        return torch._int_mm(a, b)
    assert int8_cpu.native_exact(slow)
    assert not int8_cpu.native_chosen(slow)
    assert not int8_cpu.native_chosen(_saturating_int_mm)  # and an inexact one never is
