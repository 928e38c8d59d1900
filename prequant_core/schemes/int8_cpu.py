"""torchao's dynamic int8 linear on a CPU, with the integer matmul done by a kernel that is exact and fast.

torchao's CPU int8 linear quantizes the activations per token, multiplies the int8 codes and scales the int32 result.
For the multiplication torchao 0.18 takes an int32 ``torch.matmul`` on a CPU (``torchao.kernel.intmm.safe_int_mm``:
no BLAS, a widened copy of the whole weight per call). Two exact ways round it, tried in this order:

* ``torch._int_mm``: oneDNN's int8 x int8 -> int32 matmul. On CPUs with int8 dot-product instructions (VNNI, AMX) it
  sums in int32, exactly, at several times a float32 matmul's speed, reading the int8 weight where it lies (measured
  on this project's CI CPU, bench/RESULTS-cpu.md). Without them oneDNN may add pairs of products in saturating 16-bit
  registers, so the kernel is used only once it has returned the exact sums of the worst case (codes of magnitude 127
  and 128 everywhere) on this machine (``native_exact``), and only where it is not slower than the float32 pieces on
  a small probe (``native_chosen``: a CPU without those instructions may run a slow generic kernel; both are exact,
  so the choice never changes a number).
* exact float32 pieces: every product of two int8 codes is an integer of magnitude at most 2**14, so a float32 matmul
  over at most 1024 of them sums integers below 2**24 in any order: every partial sum is exact, whatever the BLAS,
  and the int32 sum of those pieces is the same integer. One block of weight rows is widened at a time.

What follows the sums is torchao's own scaling, in its order: the output is bit for bit torchao's
(tests/schemes/test_int8_cpu.py). Anything other than torchao's symmetric per-token activation quantization without
pre-scaling goes to torchao itself.
"""
from __future__ import annotations

import time

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


# (rows, columns, output features) of the check: one token (oneDNN's matrix-vector kernel), an odd count, a block's
# worth; columns past 1024 and not a multiple of 4 (the dot-product instructions take 4 codes at a time)
_CHECK_SHAPES = ((1, 1030, 48), (37, 2066, 80), (128, 1024, 64))
_native: dict = {}


def _worst_case(m: int, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes whose neighbouring products are all +-127*128 or 127*127: any 16-bit pair sum saturates, and a
    kernel that shifts signed codes to unsigned (oneDNN's s8 handling) meets 255 * 127 too."""
    a = torch.full((m, k), 127, dtype=torch.int8)
    a[1::2] = -128
    a[2::3, ::2] = -127
    w = torch.full((n, k), -128, dtype=torch.int8)
    w[1::2] = 127
    w[::3, 1::2] = -127
    g = torch.Generator().manual_seed(m * k + n)
    a[-1] = torch.randint(-128, 128, (k,), generator=g, dtype=torch.int8)
    w[-1] = torch.randint(-128, 128, (k,), generator=g, dtype=torch.int8)
    return a, w


def native_exact(kernel=None) -> bool:
    """Whether ``kernel`` (``torch._int_mm``) returns the exact int32 sums on this machine's CPU, checked once per
    process on ``_worst_case`` codes against float64 sums (exact: every sum here is below 2**53)."""
    kernel = kernel or torch._int_mm
    if kernel in _native:
        return _native[kernel]
    ok = True
    try:
        for m, k, n in _CHECK_SHAPES:
            a, w = _worst_case(m, k, n)
            want = (a.double() @ w.double().t()).to(torch.int32)
            got = kernel(a, w.t())
            ok = ok and got.dtype == torch.int32 and torch.equal(got, want)
    except (RuntimeError, NotImplementedError):  # a torch build without a CPU int8 matmul
        ok = False
    _native[kernel] = ok
    return ok


_PROBE = (64, 2048, 2048)  # tokens, columns, output features: a few milliseconds either way
_chosen: dict = {}


def _best_of(fn, runs: int = 3) -> float:
    fn()  # first call: kernel code generated, pages touched
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def native_chosen(kernel=None) -> bool:
    """Whether the CPU int8 linear takes ``kernel`` (``torch._int_mm``): exact here (``native_exact``) and not slower
    than the float32 pieces on a ``_PROBE``-sized product, timed once per process (best of three each)."""
    kernel = kernel or torch._int_mm
    if kernel not in _chosen:
        ok = native_exact(kernel)
        if ok:
            g = torch.Generator().manual_seed(0)
            m, k, n = _PROBE
            a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
            w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
            ok = _best_of(lambda: kernel(a, w.t())) <= _best_of(lambda: int_mm_pieces(a, w))
        _chosen[kernel] = ok
    return _chosen[kernel]


def int_mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``a [M, K] int8 @ w [N, K].T int8`` as int32 [M, N], the exact integer sums: ``int_mm_native`` where
    ``native_chosen``, else ``int_mm_pieces``."""
    if a.device.type == "cpu" and native_chosen():
        return int_mm_native(a, w)
    return int_mm_pieces(a, w)


def int_mm_native(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The sums by ``torch._int_mm`` (exact only where ``native_exact`` says so)."""
    return torch._int_mm(a.contiguous(), w.t())


def int_mm_pieces(a: torch.Tensor, w: torch.Tensor, rows: int = ROW_BLOCK) -> torch.Tensor:
    """The sums by float32 matmuls over ``K_BLOCK`` columns and ``rows`` weight rows at a time (float64 where float32
    matmuls are not exact): exact on any BLAS."""
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
           mm=int_mm) -> torch.Tensor:
    """``torch.nn.functional.linear(input, <the Int8Tensor of qdata, scale, spec>, bias)`` for a CPU int8 weight with
    dynamic activation quantization: the same tensor, bit for bit, whichever exact integer matmul ``mm`` is."""
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
    c = mm(x.reshape(-1, x.shape[-1]), qdata)
    y = (c.to(mid) * xs.reshape(-1, 1).to(mid)).to(out_dtype)
    y = (y * scale.flatten()).reshape(*x.shape[:-1], qdata.shape[0])
    if bias is not None:
        y += bias
    return y.to(out_dtype)
