"""ComfyUI's weight patches cut to a block of the weight's rows, so a quantized layer can be patched a few rows at a
time: dequantize a block, ComfyUI's own ``calculate_weight`` on it, requantize it, next block.

A patch is row-local when every output row of the patched weight depends on the same row of the weight and of the
patch only: a plain LoRA (``up @ down``: row i of the difference is row i of ``up`` times ``down``), a ``diff`` or a
``set``, with or without an ``offset`` along the rows (a LoRA on ``to_k`` patches rows of ComfyUI's fused ``qkv``)
and ``strength_model``. Everything else (DoRA's norms, LoHa / LoKr / OFT and other adapters, a conversion
``function`` such as a row permutation, padding) is left whole: ``row_local`` says no and the layer is patched in one
block, as ComfyUI would. So is a kind whose rows are requantized together (the codec's ``rows_alone``: NVFP4). Cutting changes no number: each element is the same sum of the same products (the
LoRA's rank-deep dot products; checked on the real layer shapes, tests/nodes/test_lora_rows.py).
"""
from __future__ import annotations

import logging

import torch

import comfy.lora
import comfy.weight_adapter

from prequant_core.families import pages
from prequant_core.schemes import qtensor, registry

BLOCK_ELEMENTS = 2 << 20  # weight elements per block: an 8 MiB float32 copy (546 rows of 3840, 204 of 10240)


def rows_per_block(columns: int) -> int:
    return max(16, BLOCK_ELEMENTS // max(columns, 1))


def _row_span(offset, n: int) -> tuple[int, int] | None:
    """The weight rows [start, stop) a patch covers, or None when its offset is not along the rows."""
    if offset is None:
        return 0, n
    dim, start, length = offset
    return (start, start + length) if dim == 0 else None


def _cut(v, a: int, b: int):
    """The patch value ``v`` restricted to its own rows [a, b), or None when it is not row-local."""
    if isinstance(v, comfy.weight_adapter.LoRAAdapter):
        w = v.weights
        up = w[0]
        if len(w) < 6 or up.ndim != 2 or any(x is not None for x in w[3:6]):  # mid weights, DoRA, reshape
            return None
        return comfy.weight_adapter.LoRAAdapter(v.loaded_keys, (up[a:b], *w[1:]))
    if isinstance(v, tuple) and len(v) == 1:  # ("diff" implied)
        return (v[0][a:b],)
    if isinstance(v, tuple) and len(v) == 2 and v[0] in ("diff", "set") and isinstance(v[1], tuple):
        data = v[1]
        if v[0] == "diff" and len(data) > 1 and isinstance(data[1], dict) and data[1].get("pad_weight"):
            return None
        return v[0], (data[0][a:b], *data[1:])
    return None


def row_local(patches, n: int) -> bool:
    """Whether every patch of a weight of ``n`` rows can be cut by rows (see the module's text)."""
    for p in patches:
        _, v, _, offset, function = p[:5]
        span = _row_span(offset, n)
        if function is not None or span is None or _cut(v, 0, 1) is None:
            return False
        rows = _rows_of(v)
        if rows.ndim < 1 or rows.shape[0] != span[1] - span[0]:
            return False
    return True


def _rows_of(v):
    """The patch tensor whose first dim runs along the weight's rows."""
    if isinstance(v, comfy.weight_adapter.LoRAAdapter):
        return v.weights[0]
    return v[0] if len(v) == 1 else v[1][0]


def for_rows(patches, start: int, stop: int, n: int) -> list:
    """The patches of a weight of ``n`` rows as they apply to its rows [start, stop), offsets made relative to the
    block; a patch that touches none of those rows is left out. Only for ``row_local`` patches."""
    out = []
    for p in patches:
        strength, v, strength_model, offset, function = p[:5]
        lo, hi = _row_span(offset, n)
        a, b = max(lo, start), min(hi, stop)
        if a >= b:
            continue
        block_offset = None if (a, b) == (start, stop) else (0, a - start, b - a)
        out.append((strength, _cut(v, a - lo, b - lo), strength_model, block_offset, function))
    return out


def blocks(patches, n: int, rows: int) -> list[tuple[int, int, list]]:
    """``(start, stop, patches)`` for each block of rows the layer is patched in: blocks of ``rows`` where every patch
    is row-local, else the whole weight with its patches as they are."""
    if n <= rows or not row_local(patches, n):
        return [(0, n, list(patches))]
    return [(s, min(s + rows, n), for_rows(patches, s, min(s + rows, n), n)) for s in range(0, n, rows)]


class _OncePerLayer(logging.Filter):
    """ComfyUI logs a patch it cannot apply (a rank that does not fit, a shape mismatch) from ``calculate_weight``:
    once per call, so once per block of rows here. The same message passes once per layer."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def filter(self, record):
        msg = record.getMessage()
        if msg in self.seen:
            return False
        self.seen.add(msg)
        return True


def patched_parts(op, originals, patches, key, device=None, give_back_pages: bool = True) -> tuple:
    """A quantized Linear's parts ``originals`` with ComfyUI ``patches`` applied: per block of rows, one float32 copy
    of the block patched by ComfyUI's own ``calculate_weight``, its unchanged rows found (they keep their codes and
    scales), then requantized like the layer. The same bytes whether the patch is merged once (nodes/patcher.py) or
    applied per call in low-VRAM mode (nodes/ops.py). ``give_back_pages``: each block's file pages are given back
    once it is done (the merge, whose originals live on only in the backup; not per call)."""
    spec = op.prequant_spec
    n = originals[0].shape[0]
    if any(t.ndim == 0 or t.shape[0] != n for t in originals) or not registry.codec(spec.kind).rows_alone:
        cuts = [(0, n, patches)]  # a part not laid out by rows, or rows requantized together: one block
    else:
        cuts = blocks(patches, n, rows_per_block(getattr(op, "in_features", originals[0].shape[-1])))
    # on the root logger's handlers: ComfyUI logs from the root (0.33) or from a module's logger (0.12.1's
    # comfy.weight_adapter.lora), whose records reach the root's handlers but not the root logger's own filters
    filters = [(h, _OncePerLayer()) for h in logging.getLogger().handlers]  # one each: a handler sees each record
    for h, once in filters:
        h.addFilter(once)
    try:
        return _patched_blocks(op, originals, cuts, key, device, give_back_pages)
    finally:
        for h, once in filters:
            h.removeFilter(once)


def _patched_blocks(op, originals, cuts, key, device, give_back_pages):
    spec, n = op.prequant_spec, originals[0].shape[0]
    new = None
    maps = pages.file_mappings() if give_back_pages else None
    for start, stop, block_patches in cuts:
        # moved to the device once per block, for the dense copy and the comparison
        parts = tuple((t if len(cuts) == 1 else t[start:stop]).to(device or t.device) for t in originals)
        dense = qtensor.dense_from_parts(parts, spec, torch.float32)
        if len(cuts) == 1:  # the whole layer: compared a few rows at a time, not against a second float32 copy
            out = comfy.lora.calculate_weight(block_patches, dense, key)
            same = qtensor.rows_unchanged(out, parts, spec)
        else:  # a block: its copy costs less than dequantizing it again
            before = dense.clone()
            out = comfy.lora.calculate_weight(block_patches, dense, key)
            same = (out == before).all(dim=1)
            del before
        del dense
        got = op.prequant_quantize_dense(out, parts, same)
        del out, parts
        if give_back_pages:  # the block's file pages are done with (unpatch reads them again): not a whole layer's
            pages.release([t if len(cuts) == 1 else t[start:stop] for t in originals], maps)
        if len(cuts) == 1:
            return got
        if new is None:
            new = tuple(torch.empty((n, *g.shape[1:]), dtype=g.dtype, device=g.device) for g in got)
        for dst, g in zip(new, got):
            if g.element_size() == 1:  # byte views: index copies have no float8 kernels on every device
                dst, g = dst.view(torch.uint8), g.view(torch.uint8)
            dst[start:stop] = g
    return new
