"""Quantizing dense tensors one at a time (row blocks for big weights): the one implementation shared by
the builder and load-time quantization; bit for bit ``schemes.quantize_weight`` behind ``schemes.LayerFilter``."""
from __future__ import annotations

import sys
from typing import Callable, Iterable, Mapping

import torch

from .. import schemes


ProgressFn = Callable[[int, int], None]  # (done, total): per tensor, used by quantize_tensors





def is_linear_weight(key: str, t) -> bool:
    """A Linear weight: a 2-D ``*.weight`` tensor (transformers here have no 2-D non-Linear weights)."""
    return key.endswith(".weight") and len(tuple(t.shape)) == 2


QUANT_CHUNK_ELEMS = 1 << 20  # quantize big weights this many elements at a time (fp32 temporaries: 4 MB each)
_TRIM: list = []


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``; a no-op elsewhere).

    glibc serves the mid-size temporaries of quantization (float32 copies of a row block, a few MB) from its heap
    and keeps the freed pages: measured on a bf16 10240 x 3840 Linear (78 MB), ~320 MB of RSS growth while
    quantizing it without trimming whatever the block size, ~60 MB with trimming and 1 M-element blocks (its 39 MB
    of int8 codes included). Trimming changes no allocator setting, so it is safe inside ComfyUI too.
    """
    if not _TRIM:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes
                fn = ctypes.CDLL("libc.so.6").malloc_trim
                fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _TRIM.append(fn)
    if _TRIM[0] is not None:
        _TRIM[0](0)


def quantize_rows(weight: torch.Tensor, scheme: str, *, dtype: torch.dtype | None = None,
                  chunk_elems: int = QUANT_CHUNK_ELEMS):
    """``schemes.quantize_weight(weight.to(dtype))`` computed in row blocks: bit for bit the same tensor.

    Per-row quantization treats every row on its own (its scale comes from that row's amax alone), so quantizing
    row blocks into one preallocated code tensor is exact; it bounds the cast and torchao's float32 temporaries to
    one block (a whole 10240 x 3840 Linear would otherwise cost several times its size).
    """
    rows, cols = weight.shape
    step = max(1, chunk_elems // max(cols, 1))

    def block(i):
        b = weight[i:i + step]
        if dtype is not None and b.dtype != dtype:
            b = b.to(dtype)
        return schemes.quantize_weight(b.contiguous(), scheme)

    def whole():
        w = weight if dtype is None or weight.dtype == dtype else weight.to(dtype)
        return schemes.quantize_weight(w.contiguous(), scheme)

    if rows <= step:
        return whole()
    first = block(0)
    spec = _row_block_spec(first, cols)
    if spec is None:
        return whole()
    qdata = torch.empty((rows, cols), dtype=first.qdata.dtype)
    qdata[:first.qdata.shape[0]].copy_(first.qdata)
    scales, zps = [first.scale], [getattr(first, "zero_point", None)]
    del first
    for i in range(step, rows, step):
        part = block(i)
        if _row_block_spec(part, cols) != spec:
            return whole()
        qdata[i:i + part.qdata.shape[0]].copy_(part.qdata)
        scales.append(part.scale)
        zps.append(getattr(part, "zero_point", None))
        del part
        release_free_memory()
    return _assemble(spec, qdata, torch.cat(scales), None if zps[0] is None else torch.cat(zps), cols)


def _row_block_spec(t, cols: int):
    """The non-tensor attributes of a per-row quantized block (equal for every block of one weight), or None when
    the block holds something this does not know how to assemble."""
    from torchao.quantization.quantize_.workflows import Float8Tensor, Int8Tensor
    extra = [n for n in (getattr(t, "optional_tensor_data_names", None) or [])
             if n != "zero_point" and getattr(t, n, None) is not None]
    if extra or type(t) not in (Int8Tensor, Float8Tensor) or list(t.block_size) != [1, cols]:
        return None
    if isinstance(t, Int8Tensor):
        return (Int8Tensor, t.dtype, t.act_quant_kwargs, getattr(t, "reduce_range", False))
    return (Float8Tensor, t.dtype, t.act_quant_kwargs, t.mm_config, t.kernel_preference)


def _assemble(spec, qdata, scale, zero_point, cols):
    from torchao.quantization.quantize_.workflows import Int8Tensor
    if spec[0] is Int8Tensor:
        _, dtype, act, reduce_range = spec
        return Int8Tensor(qdata, scale, [1, cols], dtype, zero_point=zero_point, act_quant_kwargs=act,
                          reduce_range=reduce_range)
    cls, dtype, act, mm_config, kernel_preference = spec
    return cls(qdata, scale, [1, cols], mm_config=mm_config, act_quant_kwargs=act,
               kernel_preference=kernel_preference, dtype=dtype)


def quantize_one(key: str, v: torch.Tensor, flt: schemes.LayerFilter,
                 dtype: torch.dtype | None = torch.bfloat16, *, chunk_elems: int = QUANT_CHUNK_ELEMS) -> tuple[object, bool]:
    """(tensor to store, skipped) for one dense tensor: float tensors cast to ``dtype``; a Linear weight the filter
    admits quantized exactly as ``schemes.quantize_weight`` does. ``skipped`` is True for a Linear weight left dense."""
    cast = dtype is not None and v.is_floating_point() and v.dtype != dtype
    if is_linear_weight(key, v):
        probe = torch.empty(v.shape, dtype=dtype, device="meta") if cast else v
        if flt.reason_skipped(key[: -len(".weight")], probe) is None:
            return quantize_rows(v, flt.scheme, dtype=dtype if cast else None, chunk_elems=chunk_elems), False
        return (v.to(dtype) if cast else v), True
    return (v.to(dtype) if cast else v), False


def quantize_items(items: Iterable[tuple[str, torch.Tensor]], flt: schemes.LayerFilter, *, total: int,
                   dtype: torch.dtype | None = torch.bfloat16,
                   progress: ProgressFn | None = None) -> tuple[dict, list[str]]:
    """Quantize a stream of (key, dense tensor); each input tensor can be freed as soon as it is consumed."""
    out, skipped = {}, []
    with torch.no_grad():
        for i, (k, v) in enumerate(items):
            q, was_skipped = quantize_one(k, v, flt, dtype)
            del v
            release_free_memory()
            if was_skipped:
                skipped.append(k)
            out[k] = q
            if progress:
                progress(i + 1, total)
    return out, skipped


def quantize_tensors(tensors: Mapping, scheme: str, *, min_features: int = schemes.DEFAULT_MIN_FEATURES,
                     exclude: Iterable[str] = (), progress: ProgressFn | None = None,
                     dtype: torch.dtype | None = torch.bfloat16) -> tuple[dict, list[str]]:
    """Quantize every Linear weight the filter admits; cast other float tensors to ``dtype``.

    The in-memory form of what ``build`` writes: loading a built file gives these tensors bit for bit.
    """
    flt = schemes.LayerFilter(schemes.normalize(scheme), min_features, tuple(exclude))
    return quantize_items(tensors.items(), flt, total=len(tensors), dtype=dtype, progress=progress)


