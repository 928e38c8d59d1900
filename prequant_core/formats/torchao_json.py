"""A strict decoder for torchao's per-tensor JSON in safetensors headers.

torchao's own ``object_from_dict`` resolves any ``torch.<name>`` attribute and any allowed class by name; a
stranger's header deserves less trust, so only the few types the weight kinds' codecs need are understood, with
each field type-checked (the value decoders: ``schemes/json_values.py``; each class's fields, and its activation
settings: its codec's ``from_json``, in its scheme module). The writer's JSON is the codec's ``to_json``: what torchao itself writes, so torchao can read our files.
"""
from __future__ import annotations

import json

import torch

from ..schemes import registry
from ..schemes.json_values import LOGICAL, DecodeError, _need


def decode_weight(entry_json: str, parts: dict):
    """Rebuild a quantized weight from its header JSON and its flattened tensors: the checks every kind shares here,
    the rest by the codec of the ``_type`` named (``Codec.from_json``)."""
    try:
        entry = json.loads(entry_json)
    except (json.JSONDecodeError, TypeError) as e:
        raise DecodeError(f"tensor entry is not JSON ({e})") from None
    _need(isinstance(entry, dict), "tensor entry must be an object")
    t = entry.get("_type")
    d = entry.get("_data")
    _need(isinstance(d, dict), "tensor entry has no _data object")
    qdata, scale = parts.get("qdata"), parts.get("scale")
    _need(isinstance(qdata, torch.Tensor) and isinstance(scale, torch.Tensor), "missing qdata or scale tensor")
    _need(qdata.ndim == 2, f"qdata must be 2-D, found {tuple(qdata.shape)}")
    codec = registry.codec_named(t) if isinstance(t, str) else None
    _need(codec is not None, f"unsupported tensor type {str(t)[:40]}")
    if codec.json_parts is not None:
        unknown = set(parts) - codec.json_parts
        _need(not unknown, f"unexpected parts {sorted(unknown)[:3]}")
    if not codec.block:
        _need(scale.dtype in LOGICAL, f"scale dtype {scale.dtype}")
        _need(scale.numel() in (1, qdata.shape[0]), f"scale {tuple(scale.shape)} does not match {qdata.shape[0]} rows")
    return codec.from_json(d, parts)
