"""Strict decoders for the values inside torchao's per-tensor JSON (dtypes, granularities, enums, the envelope of
activation-quantization settings), the pieces every codec's ``from_json`` is built from. What is one scheme's own
(its activation settings class, fp8's mm config) is decoded by its scheme module (``ACT_KWARGS``), never here.

torchao's own ``object_from_dict`` resolves any ``torch.<name>`` attribute and any allowed class by name; a
stranger's header deserves less trust, so only the few types the weight kinds' codecs need are understood, with
each field type-checked. The encoder output is what torchao itself writes, so torchao can read our files.
"""
from __future__ import annotations


import torch
from torchao.quantization import PerRow, PerTensor

from .codec import row_block_accepted as block_accepted

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
          "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2, "int8": torch.int8}
LOGICAL = (torch.bfloat16, torch.float16, torch.float32)  # what a weight dequantizes to


class DecodeError(ValueError):
    pass


def _need(cond, what):
    if not cond:
        raise DecodeError(what)


def _obj(v, expected_type):
    _need(isinstance(v, dict) and v.get("_type") == expected_type, f"expected {expected_type}, found {str(v)[:80]}")
    d = v.get("_data")
    return d


def _opt_float(v, name):
    _need(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)), f"{name} must be a number")
    return None if v is None else float(v)


def _bool(v, name, default=False):
    if v is None:
        return default
    _need(isinstance(v, bool), f"{name} must be true/false")
    return v


def decode_dtype(v):
    d = _obj(v, "torch.dtype")
    _need(isinstance(d, str) and d in DTYPES, f"unsupported dtype {str(d)[:40]}")
    return DTYPES[d]


def decode_granularity(v):
    _need(isinstance(v, dict), "granularity must be an object")
    if v.get("_type") == "PerRow":
        d = v.get("_data") or {}
        _need(isinstance(d, dict), "PerRow data")
        dim = d.get("dim", -1)
        _need(isinstance(dim, int) and not isinstance(dim, bool), "PerRow dim")
        return PerRow(dim=dim)
    if v.get("_type") == "PerTensor":
        return PerTensor()
    raise DecodeError(f"unsupported granularity {str(v.get('_type'))[:40]}")


def decode_enum(v, enum_cls, type_name):
    d = _obj(v, type_name)
    _need(isinstance(d, str) and d in enum_cls.__members__, f"unknown {type_name} {str(d)[:40]}")
    return enum_cls[d]


def decode_act_kwargs(v, decoders: dict):
    """``act_quant_kwargs``: null, or ``{"_type": class name, "_data": {...}}`` of a class ``decoders`` names
    ({class name: decode(_data)}: the weight kind's own, from its scheme module's ``ACT_KWARGS``)."""
    if v is None:
        return None
    _need(isinstance(v, dict), "act_quant_kwargs must be an object")
    t = v.get("_type")
    d = v.get("_data")
    _need(isinstance(d, dict), "act_quant_kwargs data")
    decode = decoders.get(t) if isinstance(t, str) else None
    _need(decode is not None, f"unsupported act_quant_kwargs type {str(t)[:40]}")
    return decode(d)


def _block_size(v, qdata, per_tensor_ok: bool = False):
    _need(isinstance(v, list) and len(v) == 2 and all(isinstance(i, int) and not isinstance(i, bool) for i in v),
          "block_size must be two integers")
    _need(block_accepted(v, tuple(qdata.shape), per_tensor_ok),
          f"block_size {v} is not per-row for data {tuple(qdata.shape)}")
    return v


# The names codecs call
need, bool_, block_size, obj, opt_float = _need, _bool, _block_size, _obj, _opt_float


def block_orig_dtype(d: dict):
    orig = decode_dtype(d.get("orig_dtype"))
    _need(orig in LOGICAL, f"orig_dtype {orig}")
    return orig


def swizzled(d: dict) -> bool:
    return _bool(d.get("is_swizzled_scales"), "is_swizzled_scales")
