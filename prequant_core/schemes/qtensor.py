"""What a quantized weight is, independent of where it lives: one dispatch over the weight kinds' codecs.

torchao's tensors (``Int8Tensor`` / ``Float8Tensor`` per row, ``NVFP4Tensor`` / ``MXTensor`` per block, and any
kind a scheme module adds) are the interchange form (what files hold once read, what torchao's configs produce).
Inside a ComfyUI model the same weight is kept as plain tensors plus a ``QSpec`` (the non-tensor attributes),
because plain tensors survive ComfyUI's device moves, inference mode, size accounting and LoRA backups, which
torchao subclasses do not. Every part has its rows first, so fusing and slicing rows is a ``cat`` / ``narrow`` of
each part (docs/FORMAT.md section 9). What the parts of each kind are, and how they are decoded, is its codec's
(``codec.py``, held by the scheme modules); this module asks the registry which codec a weight has.
"""
from __future__ import annotations

from typing import Any

import torch

from . import registry
from .codec import (BLOCK_TORCHAO, ROTATION_ATTR, QParts, QSpec, decode_table,  # noqa: F401 - re-exported
                    dequantize_rows, require_block_torchao)


def codec_of(t):
    """The codec of a quantized weight (torchao tensor or ``QParts``); TypeError for anything else."""
    if isinstance(t, QParts):
        return registry.codec(t.spec.kind)
    c = registry.codec_of(t)
    if c is None:
        raise TypeError(f"not a quantized weight: {type(t).__name__}")
    return c


def is_quantized(t: Any) -> bool:
    return isinstance(t, QParts) or registry.codec_of(t) is not None


def kind_of(t) -> str:
    return codec_of(t).kind


def parts(t) -> tuple[tuple, QSpec]:
    """Any quantized weight -> (plain tensors, spec); the inverse of ``assemble``. Rows come first in every part."""
    if isinstance(t, QParts):
        return t.tensors, t.spec
    return codec_of(t).parts(t)


def assemble(tensors, spec: QSpec):
    """(plain tensors, spec) -> the torchao tensor (row-major scales), or a ``QParts`` where no torchao tensor holds
    the parts (NVFP4 rows with different row scales)."""
    return registry.codec(spec.kind).assemble(tuple(tensors), spec)


def split(t) -> tuple[torch.Tensor, torch.Tensor, QSpec]:
    """A per-row weight -> (codes, per-row scale [out, 1], spec)."""
    c = codec_of(t)
    if c.block:
        raise ValueError(f"{c.kind} weights have per-block scales; use qtensor.parts")
    (q, s), spec = c.parts(t)
    return q, s, spec


def join(qdata: torch.Tensor, scale: torch.Tensor, spec: QSpec):
    return assemble((qdata, scale), spec)


def dequantize_parts(tensors, spec: QSpec, dtype: torch.dtype) -> torch.Tensor:
    """The dense weight in ``dtype``, with the same arithmetic (and so the same bits) as torchao's own
    ``dequantize(dtype)`` of that weight, on any device: codes and scales are decoded through tables."""
    return registry.codec(spec.kind).dequantize(tuple(tensors), spec, dtype)


def dense_from_parts(tensors, spec: QSpec, dtype: torch.dtype) -> torch.Tensor:
    """The weight a layer applies to its (unrotated) input: dequantized, and for a ConvRot weight ``W' H = W``."""
    if not spec.rotation:
        return dequantize_parts(tensors, spec, dtype)
    from .rotation import rotate
    return rotate(dequantize_parts(tensors, spec, torch.float32), spec.rotation).to(dtype)


def rows_unchanged(dense: torch.Tensor, tensors, spec: QSpec, chunk: int = 256) -> torch.Tensor:
    """Which rows of ``dense`` still equal the weight ``tensors`` hold (``dense_from_parts``, compared exactly), a
    few rows at a time: a LoRA patch needs the answer but not a second full float32 copy of the layer to get it.
    Every part of every kind has its rows first (``cat_rows``), so a slice of rows of each part is that slice's
    weight."""
    n = dense.shape[0]
    if any(t.ndim == 0 or t.shape[0] != n for t in tensors):
        return (dense == dense_from_parts(tensors, spec, dense.dtype).to(dense.device)).all(dim=1)
    out = torch.empty(n, dtype=torch.bool, device=dense.device)
    for i in range(0, n, chunk):
        ref = dense_from_parts(tuple(t[i:i + chunk] for t in tensors), spec, dense.dtype).to(dense.device)
        out[i:i + chunk] = (dense[i:i + chunk] == ref).all(dim=1)
    return out


def quantize_parts(dense: torch.Tensor, spec: QSpec, like: tuple | None = None,
                   keep: torch.Tensor | None = None) -> tuple:
    """``dense`` quantized like ``spec``'s weights (LoRA-patched weights). ``like``: the parts being replaced, whose
    per-row side values (NVFP4's row scale) stand, for every row or with ``keep`` for those rows only."""
    return registry.codec(spec.kind).quantize(dense, spec, like, keep)


def dequantize(qdata: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (qdata.to(torch.float32) * scale.to(torch.float32)).to(dtype)


def cat_rows(weights: list):
    """Concatenate weights along the output dim. Exact for quantized weights: every part of every kind has its rows
    first, and rows carry their scales (per-block kinds too; NVFP4 rows their per-tensor scale)."""
    if not any(is_quantized(p) for p in weights):
        return torch.cat(weights, dim=0)
    split_ = [parts(p) if is_quantized(p) else None for p in weights]  # once: NVFP4 scales are unswizzled here
    kinds = {sp[1].kind if sp else "dense" for sp in split_}
    rotations = {sp[1].rotation if sp else 0 for sp in split_}
    if (len(kinds) > 1 and any(registry.codec(k).block for k in kinds - {"dense"})) or len(rotations) > 1:
        # A layer policy (v3) may give the parts of one fused ComfyUI weight different formats, a ConvRot file (v2)
        # may rotate some of them only (FLUX's linear1 is q, k, v and the MLP input). No quantized form holds that,
        # so the fused weight is the exact dense rows, each part dequantized (and rotated back: W' H = W) in the
        # parts' logical dtype: the numbers each part's own matmul would have applied to the unrotated input.
        dtype = next(p.dtype for p in weights if is_quantized(p))
        return torch.cat([dense_from_parts(*sp, dtype) if sp else p.to(dtype) for p, sp in zip(weights, split_)])
    if not all(split_):
        raise ValueError("cannot fuse quantized and dense rows into one weight")
    spec = split_[0][1]
    if any(sp[1] != spec for sp in split_[1:]):
        kinds = sorted({sp[1].kind for sp in split_})
        raise ValueError("cannot fuse weights quantized with different settings" +
                         (f" ({' and '.join(kinds)})" if len(kinds) > 1 else ""))
    return assemble([torch.cat([sp[0][i] for sp in split_]) for i in range(len(split_[0][0]))], spec)


def slice_rows(t, start: int, length: int):
    if not is_quantized(t):
        return t.narrow(0, start, length)
    ts, spec = parts(t)
    return assemble([p.narrow(0, start, length).contiguous() for p in ts], spec)


def nbytes(t) -> int:
    if is_quantized(t):
        return sum(p.numel() * p.element_size() for p in parts(t)[0])
    return t.numel() * t.element_size()


def dense_nbytes(t) -> int:
    """Size the same weight would have unquantized (its logical dtype)."""
    return t.numel() * torch.empty((), dtype=t.dtype).element_size()


def scheme_of(t) -> str | None:
    """The scheme name a weight's file records (``int8`` or ``int8-weight-only``), or None for a plain tensor."""
    if isinstance(t, QParts):
        c, dynamic = registry.codec(t.spec.kind), True
    else:
        c = registry.codec_of(t)
        if c is None:
            return None
        dynamic = c.dynamic(t)
    s = registry.by_kind(c.kind)
    return s.label(weight_only=not dynamic and s.weight_only)
