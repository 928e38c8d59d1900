"""The CPU int8 linear (prequant_core.schemes.int8_cpu) is torchao's dynamic int8 linear, bit for bit, without torch._int_mm."""
from __future__ import annotations

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


@pytest.mark.parametrize("rows,cols", [(10240, 3840), (3840, 10240), (1000, 2500)])  # Z-Image's + odd
def test_equals_torchaos_int8_linear_bit_for_bit(rows, cols):
    """Real layer shapes and an odd one (a last block of rows and of columns shorter than the rest): every output
    element equals torchao's, with and without bias, in weight-row blocks of any size."""
    g, q, s, spec = _layer(rows, cols, rows + cols)
    x = (torch.randn(2, 77, cols, generator=g) * 3).to(spec.dtype)
    x[0, 5] = 0  # a token of zeros
    x[1, 7, :2] = 1e4  # a token whose scale an outlier sets: most of its codes round to 0
    bias = torch.randn(rows, generator=g).to(spec.dtype)
    with torch.inference_mode():
        want, want_nb = _torchao(x, q, s, spec, bias), _torchao(x, q, s, spec, None)
        assert torch.equal(int8_cpu.linear(x, q, s, spec, bias), want)
        assert torch.equal(int8_cpu.linear(x, q, s, spec, None, rows=1000), want_nb)


def test_integer_sums_at_the_float32_limit_are_exact():
    """Codes of magnitude 127 and -128 in every position of a 1024-wide block, the largest sums the float32 pieces
    hold; a wider row sums several blocks past 2**24, which only the int32 accumulation holds."""
    a = torch.full((3, 4096), 127, dtype=torch.int8)
    a[1] = -128
    a[2, ::2] = -127
    w = torch.full((5, 4096), -128, dtype=torch.int8)
    w[3] = 127
    assert torch.equal(int8_cpu.int_mm(a, w), torch._int_mm(a, w.t()))
    assert int(int8_cpu.int_mm(a, w).abs().max()) == 128 * 128 * 4096


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
