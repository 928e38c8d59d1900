"""Applying a diffusers <-> ComfyUI key map to a state dict that may hold per-row quantized weights.

A map entry is ``diffusers_key -> comfy_key`` or ``diffusers_key -> (comfy_key, (dim, offset, length))`` (a row
slice of a fused ComfyUI weight, e.g. ``to_q/to_k/to_v`` -> ``qkv``), the form ComfyUI's own maps use.
Per-row quantized rows carry their own scales, so fusing and splitting them is exact. A fused weight is a copy:
the parts' pages of a memory-mapped file are given back once it is made (``pages.release``), so the file's rows are
not resident twice.
"""
from __future__ import annotations

from typing import Mapping

from . import pages, qtensor
from .errors import CorruptCheckpointError


def to_comfy(tensors: Mapping, key_map: Mapping, *, path: str | None = None) -> dict:
    out: dict = {}
    fused: dict[str, list] = {}
    unknown = []
    for k, v in tensors.items():
        target = key_map.get(k)
        if target is None:
            unknown.append(k)
        elif isinstance(target, str):
            out[target] = v
        else:
            name, (dim, offset, length) = target
            if dim != 0:
                raise CorruptCheckpointError(f"Key map fuses '{k}' along dim {dim}; only row fusion is supported.",
                                             path=path)
            if v.shape[0] != length:
                raise CorruptCheckpointError(f"'{k}' has {v.shape[0]} rows, the fused '{name}' expects {length}.",
                                             path=path, fix="The file does not match the model config it implies.")
            fused.setdefault(name, []).append((offset, k, v))
    if unknown:
        raise CorruptCheckpointError(
            f"{len(unknown)} tensors have no place in the model: {', '.join(sorted(unknown)[:5])}"
            + (" ..." if len(unknown) > 5 else ""), path=path,
            fix="The checkpoint's family or size does not match; check the family and base model.")
    for name, parts in fused.items():
        parts.sort(key=lambda p: p[0])
        pos = 0
        for offset, k, v in parts:
            if offset != pos:
                raise CorruptCheckpointError(f"Fused weight '{name}' is missing rows {pos}..{offset} "
                                             f"(a part such as to_q/to_k/to_v is absent).", path=path)
            pos += v.shape[0]
        try:
            out[name] = qtensor.cat_rows([v for _, _, v in parts])
        except ValueError as e:
            raise CorruptCheckpointError(f"Cannot fuse '{name}': {e}.", path=path) from None
        pages.release(_plain_parts(v for _, _, v in parts))
    return out


def _plain_parts(weights):
    for w in weights:
        if qtensor.is_quantized(w):
            yield from qtensor.parts(w)[0]
        else:
            yield w


def to_diffusers(tensors: Mapping, key_map: Mapping) -> dict:
    """The reverse: ComfyUI-layout state dict -> diffusers layout (fused weights split by rows)."""
    out = {}
    for dk, target in key_map.items():
        if isinstance(target, str):
            if target in tensors:
                out[dk] = tensors[target]
        else:
            name, (dim, offset, length) = target
            if name in tensors:
                out[dk] = qtensor.slice_rows(tensors[name], offset, length)
    return out
