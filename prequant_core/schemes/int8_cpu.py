"""torchao's dynamic int8 linear on a CPU, with the integer matmul done exactly in float32 pieces.

torchao's CPU int8 linear quantizes the activations per token, multiplies the int8 codes with ``torch._int_mm`` and
scales the int32 result. ``torch._int_mm`` on a CPU is an order of magnitude slower than a float32 matmul of the same
shape (measured: 1.29 s against 0.09 s for 80 x 3072 @ 3072 x 4096), and it needs the whole weight at once. Every
product of two int8 codes is an integer of magnitude at most 2**14, so a float32 matmul over at most 1024 of them sums
integers below 2**24 in any order: every partial sum is exact, whatever the BLAS. The int32 sum of those pieces is
therefore the very integer ``torch._int_mm`` returns, and what follows is torchao's own scaling, in its order: the
output is bit for bit torchao's (tests/test_int8_cpu.py), several times sooner, with one block of weight rows widened
at a time.

Anything other than torchao's symmetric per-token activation quantization without pre-scaling goes to torchao itself.
"""
from __future__ import annotations

import torch
from torchao.quantization.quant_primitives import MappingType
from torchao.quantization.quantize_.common.quantize_tensor_kwargs import _choose_quant_func_and_quantize_tensor

from .codec import QSpec

K_BLOCK = 1024  # 1024 * 128 * 128 = 2**24: the largest sum of int8 products float32 still holds exactly
ROW_BLOCK = 2048  # weight rows widened to float32 at a time (8 MiB per 1024 columns)


def exact_float32() -> bool:
    """Whether float32 matmuls are computed in float32 (not bf16 / tf32 shortcuts a user may have switched on)."""
    if torch.get_float32_matmul_precision() != "highest":
        return False
    mkl = getattr(getattr(getattr(torch.backends, "mkldnn", None), "matmul", None), "fp32_precision", None)
    return mkl in (None, "ieee", "none")


def int_mm(a: torch.Tensor, w: torch.Tensor, rows: int = ROW_BLOCK) -> torch.Tensor:
    """``a [M, K] int8 @ w [N, K].T int8`` as int32 [M, N], equal to ``torch._int_mm(a, w.t())``."""
    m, k = a.shape
    n = w.shape[0]
    wide = torch.float32 if exact_float32() else torch.float64  # float64 holds every int8 dot product exactly
    kb = K_BLOCK if wide is torch.float32 else k
    out = torch.zeros(m, n, dtype=torch.int32, device=a.device)
    pieces = [(j, a[:, j:j + kb].to(wide)) for j in range(0, k, kb)]
    for i in range(0, n, rows):
        for j, af in pieces:
            part = af @ w[i:i + rows, j:j + kb].to(wide).t()
            out[:, i:i + rows] += part.to(torch.int32)
    return out


def _symmetric_dynamic(kw) -> bool:
    return kw is not None and getattr(kw, "mapping_type", None) == MappingType.SYMMETRIC


def linear(input: torch.Tensor, qdata: torch.Tensor, scale: torch.Tensor, spec: QSpec, bias=None,
           rows: int = ROW_BLOCK) -> torch.Tensor:
    """``torch.nn.functional.linear(input, <the Int8Tensor of qdata, scale, spec>, bias)`` for a CPU int8 weight with
    dynamic activation quantization: the same tensor, bit for bit."""
    kw = spec.as_kwargs().get("act_quant_kwargs")
    if not _symmetric_dynamic(kw):  # torchao itself, on the tensor the int8 codec would assemble
        from torchao.quantization.quantize_.workflows import Int8Tensor
        weight = Int8Tensor(qdata, scale, [1, qdata.shape[-1]], spec.dtype, act_quant_kwargs=kw,
                            reduce_range=spec.as_kwargs().get("reduce_range", False))
        return torch.nn.functional.linear(input, weight, bias)
    out_dtype = input.dtype
    act = _choose_quant_func_and_quantize_tensor(input, kw, scale=None, zero_point=None)
    x, xs = act.qdata, act.scale
    # torchao: fp16 activation scales are widened to float32 so the int32 sums cannot overflow them
    mid = torch.float if xs.dtype == torch.half else xs.dtype
    c = int_mm(x.reshape(-1, x.shape[-1]), qdata, rows)
    y = (c.to(mid) * xs.reshape(-1, 1).to(mid)).to(out_dtype)
    y = (y * scale.flatten()).reshape(*x.shape[:-1], qdata.shape[0])
    if bias is not None:
        y += bias
    return y.to(out_dtype)
