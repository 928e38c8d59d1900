"""What a quantized weight is, independent of where it lives.

torchao's ``Int8Tensor`` / ``Float8Tensor`` are the interchange form (what files hold once read, what torchao's
configs produce). Inside a ComfyUI model the same weight is kept as plain tensors (``qdata``, ``scale``) plus a
``QSpec`` (the non-tensor attributes), because plain tensors survive ComfyUI's device moves, inference mode,
size accounting and LoRA backups, which torchao subclasses do not. ``split``/``join`` convert losslessly.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from torchao.quantization import PerRow
from torchao.quantization.quantize_.workflows import Float8Tensor, Int8Tensor

QUANTIZED_TYPES = (Int8Tensor, Float8Tensor)


def is_quantized(t: Any) -> bool:
    return isinstance(t, QUANTIZED_TYPES)


@dataclasses.dataclass(frozen=True)
class QSpec:
    """Everything but the tensors: enough to rebuild the torchao tensor or to requantize a dense weight alike."""
    kind: str  # "int8" | "float8"
    dtype: torch.dtype  # logical (high precision) dtype, e.g. bfloat16
    attrs: tuple  # sorted (name, value) pairs passed back to the torchao constructor

    def as_kwargs(self) -> dict:
        return dict(self.attrs)


def _spec_attrs(t) -> dict:
    if isinstance(t, Int8Tensor):
        return {"act_quant_kwargs": t.act_quant_kwargs, "reduce_range": getattr(t, "reduce_range", False)}
    return {"mm_config": t.mm_config, "act_quant_kwargs": t.act_quant_kwargs,
            "kernel_preference": t.kernel_preference}


def split(t) -> tuple[torch.Tensor, torch.Tensor, QSpec]:
    """torchao tensor -> (qdata, per-row scale [out, 1], spec). Only per-row (or per-tensor) symmetric layouts."""
    kind = "int8" if isinstance(t, Int8Tensor) else "float8"
    zp = getattr(t, "zero_point", None)
    if zp is not None and bool(torch.any(zp != 0)):
        raise ValueError("asymmetric int8 weights (non-zero zero point) are not supported")
    scale = t.scale
    rows = t.qdata.shape[0]
    if scale.numel() == 1:
        scale = scale.reshape(1, 1).expand(rows, 1).contiguous()
    scale = scale.reshape(rows, 1)
    spec = QSpec(kind, t.dtype, tuple(sorted(_spec_attrs(t).items())))
    return t.qdata, scale, spec


def join(qdata: torch.Tensor, scale: torch.Tensor, spec: QSpec):
    block_size = [1, qdata.shape[-1]]
    kw = spec.as_kwargs()
    if spec.kind == "int8":
        return Int8Tensor(qdata, scale, block_size, spec.dtype, act_quant_kwargs=kw.get("act_quant_kwargs"),
                          reduce_range=kw.get("reduce_range", False))
    return Float8Tensor(qdata, scale, block_size, mm_config=kw.get("mm_config"),
                        act_quant_kwargs=kw.get("act_quant_kwargs"),
                        kernel_preference=kw.get("kernel_preference"), dtype=spec.dtype)


def requantize(dense: torch.Tensor, spec: QSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a dense weight per row the way ``spec``'s tensors were made (used for LoRA-patched weights)."""
    kw = spec.as_kwargs()
    dense = dense.to(spec.dtype)
    if spec.kind == "int8":
        t = Int8Tensor.from_hp(dense, granularity=PerRow(), act_quant_kwargs=kw.get("act_quant_kwargs"))
    else:
        t = Float8Tensor.from_hp(dense, granularity=PerRow(), mm_config=kw.get("mm_config"),
                                 kernel_preference=kw.get("kernel_preference"),
                                 act_quant_kwargs=kw.get("act_quant_kwargs"))
    q, s, _ = split(t)
    return q, s


def dequantize(qdata: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (qdata.to(torch.float32) * scale.to(torch.float32)).to(dtype)


def cat_rows(parts: list):
    """Concatenate weights along the output dim. Exact for per-row quantized tensors: rows carry their scales."""
    if not any(is_quantized(p) for p in parts):
        return torch.cat(parts, dim=0)
    if not all(is_quantized(p) for p in parts):
        raise ValueError("cannot fuse quantized and dense rows into one weight")
    splits = [split(p) for p in parts]
    if any(sp[2] != splits[0][2] for sp in splits[1:]):
        raise ValueError("cannot fuse weights quantized with different settings")
    return join(torch.cat([s[0] for s in splits]), torch.cat([s[1] for s in splits]), splits[0][2])


def slice_rows(t, start: int, length: int):
    if not is_quantized(t):
        return t.narrow(0, start, length)
    q, s, spec = split(t)
    return join(q.narrow(0, start, length).contiguous(), s.narrow(0, start, length).contiguous(), spec)


def nbytes(t) -> int:
    if is_quantized(t):
        q, s, _ = split(t)
        return q.numel() * q.element_size() + s.numel() * s.element_size()
    return t.numel() * t.element_size()


def dense_nbytes(t) -> int:
    """Size the same weight would have unquantized (its logical dtype)."""
    return t.numel() * torch.empty((), dtype=t.dtype).element_size()


def scheme_of(t) -> str | None:
    if isinstance(t, Int8Tensor):
        return "int8" if t.act_quant_kwargs is not None else "int8-weight-only"
    if isinstance(t, Float8Tensor):
        return "fp8" if t.act_quant_kwargs is not None else "fp8-weight-only"
    return None
