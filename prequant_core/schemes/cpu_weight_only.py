"""Weight-only matmuls in float32 on a CPU: a block of weight rows decoded at a time, straight into its output columns.

ComfyUI computes in float32 on a CPU. Dequantizing a whole weight per call there costs a fresh float32 copy of it
(4 bytes a weight, page-faulted in on every call: ~40 ms for a 10240 x 3840 layer) and, for float8 codes, PyTorch's
element-at-a-time float8 -> float32 conversion (~3 ns a weight): at 1056 tokens that made the fp8 / NVFP4 / MXFP8
steps 1.3-1.5x ComfyUI's dense one. Here a block of rows (``BLOCK_ELEMENTS`` weights) is decoded into a small
buffer that stays in cache and multiplied into its columns of the output (the BLAS writes in place, with the output's
row stride): the weights are the same numbers, bit for bit, and the output is the whole-weight matmul's up to the
order the BLAS sums a block of rows in (another shape to it: on some CPUs a few outputs in a hundred differ in their
last float32 bits; tests/schemes/test_cpu_weight_only.py), while the layer's transient float32 copy shrinks from the
whole weight to one block.

float8 codes are widened through fp16 bit patterns, which the CPU converts with vector instructions: e5m2 *is*
fp16's top byte; e4m3's sign, exponent and mantissa land in fp16's fields when shifted by 7, which reads as the code's
value / 256 (fp16's exponent bias is 8 more than e4m3's; e4m3's subnormals become fp16 subnormals alike), and times
256 is exact. The one e4m3 code fp16's fields cannot carry, NaN (bytes 0x7f / 0xff), is looked for in each block and
put back, so a NaN weight reaches the output as before.
"""
from __future__ import annotations

from typing import Callable

import torch

BLOCK_ELEMENTS = 2 ** 21  # weights per block: 8 MiB in float32 (546 rows of 3840): in cache, and BLAS-sized

Fill = Callable[[int, int, torch.Tensor], None]  # fill(i, j, out): weight rows i:j as float32 into out [j - i, K]


def applies(input: torch.Tensor, codes: torch.Tensor) -> bool:
    """float32 on a CPU, run eagerly and without a gradient to carry. Under torch.compile (ComfyUI's
    TorchCompileModel) the whole-weight form stays, one graph the compiler fuses as it likes, where the block loop and
    its per-block NaN test would break the graph; an input that needs a gradient (a training node) keeps ``F.linear``,
    as the BLAS writing into the output in place records none."""
    return (input.dtype == torch.float32 and input.device.type == "cpu" and codes.device.type == "cpu"
            and not (input.requires_grad and torch.is_grad_enabled())
            and not getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)())


def block_rows(k: int) -> int:
    return max(1, BLOCK_ELEMENTS // max(k, 1))


def blocked(input: torch.Tensor, codes: torch.Tensor, make_fill: Callable[[], Fill | None],
            bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """``linear`` for a weight whose codes are ``codes`` [rows, ...], where it ``applies`` and ``make_fill`` gives a
    fill; None otherwise (the caller dequantizes the whole weight)."""
    fill = make_fill() if applies(input, codes) else None
    return None if fill is None else linear(input, codes.shape[0], fill, bias)


def linear(input: torch.Tensor, rows: int, fill: Fill, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(input, W, bias)`` for the weight W [rows, K] that ``fill`` writes a block of rows of at a time."""
    k = input.shape[-1]
    block = block_rows(k)
    x = input.reshape(-1, k)
    out = torch.empty(x.shape[0], rows, dtype=torch.float32)
    buf = torch.empty(min(block, rows), k, dtype=torch.float32)
    for i in range(0, rows, block):
        j = min(i + block, rows)
        w = buf[:j - i]
        fill(i, j, w)
        if bias is None:
            torch.mm(x, w.t(), out=out[:, i:j])
        else:  # F.linear's addmm, a block of the bias at a time
            torch.addmm(bias[i:j], x, w.t(), out=out[:, i:j])
    return out.reshape(*input.shape[:-1], rows)


def fp8_rows(codes: torch.Tensor, e5m2: bool) -> Fill:
    """A fill widening float8 codes (or their bytes) [rows, K] to float32, exactly (see the module's text)."""
    src = codes.view(torch.int8)

    def fill(i: int, j: int, out: torch.Tensor) -> None:
        rows = src[i:j]
        b = torch.empty(out.shape, dtype=torch.int16)
        b.copy_(rows)  # sign-extended: the sign bit lands in bit 15 (and, for e4m3, again in bit 14)
        if e5m2:
            b.bitwise_left_shift_(8)
            out.copy_(b.view(torch.float16))
            return
        b.bitwise_left_shift_(7)
        b.bitwise_and_(~0x4000)
        out.copy_(b.view(torch.float16))
        out.mul_(256.0)
        # e4m3 NaN is byte 0x7f (the largest int8) or 0xff (the largest uint8): two cheap maxima over the bytes
        if rows.numel() and (int(rows.max()) == 0x7F or int(rows.view(torch.uint8).max()) == 0xFF):
            out[(rows.view(torch.uint8) & 0x7F) == 0x7F] = float("nan")
    return fill


def codes_rows(codes: torch.Tensor, table: str = "e4m3") -> Fill | None:
    """A fill for per-row codes (int8, float8, or float8 kept as bytes decoded by ``table``) as float32 values."""
    if codes.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return fp8_rows(codes, codes.dtype == torch.float8_e5m2)
    if codes.dtype == torch.uint8:
        return fp8_rows(codes, table == "e5m2") if table in ("e4m3", "e5m2") else None
    return lambda i, j, out: out.copy_(codes[i:j])
