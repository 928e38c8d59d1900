"""What a quantized weight is, independent of where it lives.

torchao's ``Int8Tensor`` / ``Float8Tensor`` (per-row) and ``NVFP4Tensor`` / ``MXTensor`` (per-block) are the
interchange form (what files hold once read, what torchao's configs produce). Inside a ComfyUI model the same weight
is kept as plain tensors plus a ``QSpec`` (the non-tensor attributes), because plain tensors survive ComfyUI's device
moves, inference mode, size accounting and LoRA backups, which torchao subclasses do not.

* per-row kinds (``int8``, ``float8``): ``(codes [out, in], scale [out, 1])``: ``split``/``join``.
* per-block kinds (``nvfp4``, ``mxfp8``): ``parts``/``assemble``, every part with the rows first, so that fusing and
  slicing rows is a ``cat``/``narrow`` of each part (docs/FORMAT.md section 9):
  nvfp4 ``(packed e2m1 pairs uint8 [out, in/2], block scales e4m3 as bytes [out, in/16], row scale fp32 [out, 1])``
  (torchao's single per-tensor scale repeated per row, so rows of weights with different scales can be fused);
  mxfp8 ``(codes e4m3 as bytes [out, in], block exponents e8m0 as bytes [out, in/32])``. Codes and scales are
  held as bytes and decoded through tables, so the same parts run on devices with no float8 dtype.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from torchao.prototype.mx_formats.mx_tensor import MXTensor
from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
from torchao.quantization import PerRow
from torchao.quantization.quantize_.workflows import Float8Tensor, Int8Tensor

from .. import schemes

ROW_KINDS = ("int8", "float8")
BLOCK_KINDS = ("nvfp4", "mxfp8")
NVFP4_BLOCK = 16
MXFP8_BLOCK = 32


class QParts:
    """A per-block weight that no single torchao tensor can hold: fused rows of NVFP4 weights whose per-tensor
    scales differ. Quacks like a weight where placement looks (``shape``, ``dtype``)."""

    def __init__(self, tensors: tuple, spec: "QSpec"):
        self.tensors, self.spec = tuple(tensors), spec
        q = self.tensors[0]
        self.shape = torch.Size((q.shape[0], q.shape[1] * (2 if spec.kind == "nvfp4" else 1)))
        self.dtype = spec.dtype
        self.ndim = 2

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]


QUANTIZED_TYPES = (Int8Tensor, Float8Tensor, NVFP4Tensor, MXTensor, QParts)


def is_quantized(t: Any) -> bool:
    return isinstance(t, QUANTIZED_TYPES)


def kind_of(t) -> str:
    if isinstance(t, QParts):
        return t.spec.kind
    if isinstance(t, Int8Tensor):
        return "int8"
    if isinstance(t, Float8Tensor):
        return "float8"
    if isinstance(t, NVFP4Tensor):
        return "nvfp4"
    if isinstance(t, MXTensor):
        return "mxfp8"
    raise TypeError(f"not a quantized weight: {type(t).__name__}")


@dataclasses.dataclass(frozen=True)
class QSpec:
    """Everything but the tensors: enough to rebuild the torchao tensor or to requantize a dense weight alike."""
    kind: str  # "int8" | "float8" | "nvfp4" | "mxfp8"
    dtype: torch.dtype  # logical (high precision) dtype, e.g. bfloat16
    attrs: tuple  # sorted (name, value) pairs passed back to the torchao constructor

    def as_kwargs(self) -> dict:
        return dict(self.attrs)

    @property
    def rotation(self) -> int:
        """ConvRot group size (the layer's input is rotated by a block Hadamard of this size), 0 if none."""
        return int(dict(self.attrs).get("rotation", 0) or 0)

    @property
    def dynamic(self) -> bool:
        """The weight carries dynamic activation quantization (what torchao's quantized matmul needs)."""
        return dict(self.attrs).get("act_quant_kwargs") is not None


ROTATION_ATTR = "prequant_rotation"  # set on a torchao tensor whose layer input is rotated (ConvRot, v2 files)


def _rotation(t) -> dict:
    g = getattr(t, ROTATION_ATTR, 0)
    return {"rotation": int(g)} if g else {}


def _set_rotation(t, spec: QSpec):
    if spec.rotation:
        setattr(t, ROTATION_ATTR, spec.rotation)
    return t


def _spec_attrs(t) -> dict:
    if isinstance(t, Int8Tensor):
        return {"act_quant_kwargs": t.act_quant_kwargs, "reduce_range": getattr(t, "reduce_range", False)}
    return {"mm_config": t.mm_config, "act_quant_kwargs": t.act_quant_kwargs,
            "kernel_preference": t.kernel_preference}


def split(t) -> tuple[torch.Tensor, torch.Tensor, QSpec]:
    """torchao tensor -> (qdata, per-row scale [out, 1], spec). Only per-row (or per-tensor) symmetric layouts."""
    if not isinstance(t, (Int8Tensor, Float8Tensor)):
        raise ValueError(f"{kind_of(t)} weights have per-block scales; use qtensor.parts")
    kind = "int8" if isinstance(t, Int8Tensor) else "float8"
    zp = getattr(t, "zero_point", None)
    if zp is not None and bool(torch.any(zp != 0)):
        raise ValueError("asymmetric int8 weights (non-zero zero point) are not supported")
    scale = t.scale
    rows = t.qdata.shape[0]
    if scale.numel() == 1:
        scale = scale.reshape(1, 1).expand(rows, 1).contiguous()
    scale = scale.reshape(rows, 1)
    spec = QSpec(kind, t.dtype, tuple(sorted({**_spec_attrs(t), **_rotation(t)}.items())))
    return t.qdata, scale, spec


def join(qdata: torch.Tensor, scale: torch.Tensor, spec: QSpec):
    block_size = [1, qdata.shape[-1]]
    kw = spec.as_kwargs()
    if spec.kind == "int8":
        t = Int8Tensor(qdata, scale, block_size, spec.dtype, act_quant_kwargs=kw.get("act_quant_kwargs"),
                       reduce_range=kw.get("reduce_range", False))
    else:
        t = Float8Tensor(qdata, scale, block_size, mm_config=kw.get("mm_config"),
                         act_quant_kwargs=kw.get("act_quant_kwargs"),
                         kernel_preference=kw.get("kernel_preference"), dtype=spec.dtype)
    return _set_rotation(t, spec)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def _unswizzle(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """torchao's blocked (swizzled) scale layout, which its GPU kernels read, back to row-major [rows, cols]."""
    from torchao.prototype.mx_formats.utils import from_blocked
    return from_blocked(scale.reshape(-1), rows, cols).contiguous()


BLOCK_TORCHAO = (0, 18)  # the torchao whose NVFP4Tensor / MXTensor fields this pack reads (earlier ones differ)


@functools.lru_cache(maxsize=None)
def require_block_torchao() -> None:
    """NVFP4 / MX weights need torchao's current tensor classes: say which torchao, rather than fail inside it."""
    import torchao
    from ..errors import DependencyError
    try:
        have = tuple(int(x) for x in torchao.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return
    if have < BLOCK_TORCHAO:
        raise DependencyError("NVFP4 and MXFP8 weights need a newer torchao.",
                              expected=f"torchao >= {BLOCK_TORCHAO[0]}.{BLOCK_TORCHAO[1]}",
                              found=f"torchao {torchao.__version__}",
                              fix=f"pip install -U 'torchao>={BLOCK_TORCHAO[0]}.{BLOCK_TORCHAO[1]}' in ComfyUI's "
                                  "Python environment.")


def parts(t) -> tuple[tuple, QSpec]:
    """Any quantized weight -> (plain tensors, spec); the inverse of ``assemble``. Rows come first in every part."""
    if isinstance(t, QParts):
        return t.tensors, t.spec
    if isinstance(t, (Int8Tensor, Float8Tensor)):
        q, s, spec = split(t)
        return (q, s), spec
    require_block_torchao()
    if isinstance(t, NVFP4Tensor):
        q = t.qdata
        if q.ndim != 2 or q.stride(-2) < q.stride(-1):
            raise ValueError("only 2-D, row-major NVFP4 weights are supported")
        if t.block_size != NVFP4_BLOCK:
            raise ValueError(f"NVFP4 block size {t.block_size}, expected {NVFP4_BLOCK}")
        rows, cols = q.shape[0], q.shape[1] * 2
        if cols % NVFP4_BLOCK:
            raise ValueError(f"NVFP4 weight width {cols} is not a multiple of {NVFP4_BLOCK}")
        s = _unswizzle(t.scale, rows, cols // NVFP4_BLOCK) if t.is_swizzled_scales else t.scale
        if tuple(s.shape) != (rows, cols // NVFP4_BLOCK):
            raise ValueError(f"NVFP4 block scales {tuple(s.shape)}, expected {(rows, cols // NVFP4_BLOCK)}")
        if s.dtype != torch.float8_e4m3fn or q.dtype != torch.uint8:
            raise ValueError(f"NVFP4 data {q.dtype} / scales {s.dtype}, expected uint8 / float8_e4m3fn")
        pts = t.per_tensor_scale
        if pts is not None and pts.numel() != 1:
            raise ValueError("per-expert NVFP4 scales are not supported (a 2-D Linear weight has one)")
        row = (pts.reshape(1, 1).to(torch.float32) if pts is not None else torch.ones(1, 1)).expand(rows, 1)
        attrs = {"act_quant_kwargs": t.act_quant_kwargs, "per_tensor": pts is not None,
                 "use_triton_kernel": bool(t.use_triton_kernel), **_rotation(t)}
        return (q, _as_bytes(s), row.contiguous()), QSpec("nvfp4", t.orig_dtype, tuple(sorted(attrs.items())))
    if isinstance(t, MXTensor):
        q = t.qdata
        if t.elem_dtype not in (torch.float8_e4m3fn, torch.float8_e5m2) or q.ndim != 2:
            raise ValueError(f"MX weights with elements {t.elem_dtype} are not supported (mxfp8 only)")
        if not q.is_contiguous():
            raise ValueError("only row-major MX weights are supported")
        rows, cols = q.shape
        bs = int(t.block_size)
        if bs <= 0 or cols % bs:
            raise ValueError(f"MX weight width {cols} is not a multiple of its block size {bs}")
        s = _unswizzle(t.scale, rows, cols // bs) if t.is_swizzled_scales else t.scale.reshape(rows, cols // bs)
        attrs = {"act_quant_kwargs": t.act_quant_kwargs, "kernel_preference": t.kernel_preference,
                 "elem_dtype": t.elem_dtype, "block_size": bs, **_rotation(t)}
        return (_as_bytes(q), _as_bytes(s)), QSpec("mxfp8", t.orig_dtype, tuple(sorted(attrs.items())))
    raise TypeError(f"not a quantized weight: {type(t).__name__}")


def assemble(tensors, spec: QSpec):
    """(plain tensors, spec) -> the torchao tensor (row-major scales). NVFP4 rows with different row scales have
    no torchao form: a ``QParts`` then."""
    tensors = tuple(tensors)
    if spec.kind in ROW_KINDS:
        return join(tensors[0], tensors[1], spec)
    kw = spec.as_kwargs()
    if spec.kind == "nvfp4":
        q, s, row = tensors
        if not bool((row == row[:1]).all()):
            return QParts(tensors, spec)
        pts = row[0, 0].clone() if kw.get("per_tensor") or bool(row[0, 0] != 1) else None
        t = NVFP4Tensor(q, s.view(torch.float8_e4m3fn), NVFP4_BLOCK, spec.dtype, pts,
                        act_quant_kwargs=kw.get("act_quant_kwargs"), use_triton_kernel=kw.get("use_triton_kernel",
                                                                                                False))
        return _set_rotation(t, spec)
    q, s = tensors
    t = MXTensor(q.view(kw["elem_dtype"]), s.view(torch.float8_e8m0fnu), kw["elem_dtype"], kw["block_size"],
                 spec.dtype, kw.get("kernel_preference"), kw.get("act_quant_kwargs"), False)
    return _set_rotation(t, spec)


_TABLES: dict = {}


def decode_table(name: str, device) -> torch.Tensor:
    """Decode tables (float32), built on the CPU from torch's / torchao's own conversions, copied once per device:
    ``e4m3`` and ``e8m0`` map a byte to its value, ``e2m1x2`` a packed byte to its two values (low nibble first)."""
    key = (name, str(device))
    if key not in _TABLES:
        b = torch.arange(256, dtype=torch.uint8)
        if name == "e4m3":
            t = b.view(torch.float8_e4m3fn).to(torch.float32)
        elif name == "e5m2":
            t = b.view(torch.float8_e5m2).to(torch.float32)
        elif name == "e8m0":
            from torchao.prototype.mx_formats.mx_tensor import get_fp_scale
            t = get_fp_scale(b.view(torch.float8_e8m0fnu))
        else:
            from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
            t = f4_unpacked_to_f32(unpack_uint4(b.reshape(256, 1))).reshape(256, 2)
        _TABLES[key] = t.to(device)
    return _TABLES[key]


def _decode(table: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    idx = codes.reshape(-1).to(torch.int32)
    return torch.index_select(table, 0, idx).reshape(*codes.shape, *table.shape[1:])


def dequantize_parts(tensors, spec: QSpec, dtype: torch.dtype) -> torch.Tensor:
    """The dense weight in ``dtype``, with the same arithmetic (and so the same bits) as torchao's own
    ``dequantize(dtype)`` of that weight, on any device: codes and scales are decoded through tables."""
    tensors = tuple(tensors)
    if spec.kind in ROW_KINDS:
        q, s = tensors
        if q.dtype == torch.uint8:
            q = q.view(torch.float8_e4m3fn) if q.device.type in ("cpu", "cuda") else _decode(decode_table("e4m3", q.device), q)
        return dequantize(q, s, dtype)
    if spec.kind == "nvfp4":
        q, s, row = tensors
        rows, cols = q.shape[0], q.shape[1] * 2
        vals = _decode(decode_table("e2m1x2", q.device), q).reshape(rows, cols // NVFP4_BLOCK, NVFP4_BLOCK)
        # torchao: per_tensor_scale * scale_e4m3.to(float), then data_f32 * that, then .to(dtype)
        scale = row.to(torch.float32) * _decode(decode_table("e4m3", s.device), s)
        return (vals * scale.unsqueeze(-1)).reshape(rows, cols).to(dtype)
    q, s = tensors
    kw = spec.as_kwargs()
    bs = kw["block_size"]
    elem = "e5m2" if kw["elem_dtype"] == torch.float8_e5m2 else "e4m3"
    # torchao's to_dtype: codes cast to the target dtype, times the block scale cast to it, in the target dtype
    data = _decode(decode_table(elem, q.device), q).to(dtype).reshape(-1, bs)
    scale = _decode(decode_table("e8m0", s.device), s).reshape(-1, 1).to(dtype)
    return (data * scale).reshape(q.shape)


def dense_from_parts(tensors, spec: QSpec, dtype: torch.dtype) -> torch.Tensor:
    """The weight a layer applies to its (unrotated) input: dequantized, and for a ConvRot weight ``W' H = W``."""
    if not spec.rotation:
        return dequantize_parts(tensors, spec, dtype)
    from .rotation import rotate
    return rotate(dequantize_parts(tensors, spec, torch.float32), spec.rotation).to(dtype)


def quantize_parts(dense: torch.Tensor, spec: QSpec, row_scale: torch.Tensor | None = None) -> tuple:
    """``dense`` quantized like ``spec``'s weights (LoRA-patched weights). NVFP4 uses ``row_scale`` ([out, 1], the
    per-tensor scale per row) where given, else a fresh per-tensor scale from the weight's maximum."""
    kw = spec.as_kwargs()
    if spec.kind in ROW_KINDS:
        return requantize(dense, spec)
    if spec.kind == "nvfp4":
        from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale
        dense = dense.to(torch.float32).contiguous()
        if row_scale is None:
            row_scale = per_tensor_amax_to_scale(dense.abs().max()).reshape(1, 1).expand(dense.shape[0], 1)
        row_scale = row_scale.to(device=dense.device, dtype=torch.float32).contiguous()
        s, q = nvfp4_quantize(dense, NVFP4_BLOCK, row_scale)  # broadcasts: one scale per row
        return q, _as_bytes(s), row_scale
    act = kw.get("act_quant_kwargs")
    mode = {"scaling_mode": act.scaling_mode} if act is not None else {}
    t = MXTensor.to_mx(dense.to(spec.dtype).contiguous(), kw["elem_dtype"], kw["block_size"], **mode)
    return _as_bytes(t.qdata), _as_bytes(t.scale.reshape(dense.shape[0], -1))


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


def cat_rows(weights: list):
    """Concatenate weights along the output dim. Exact for quantized weights: every part of every kind has its rows
    first, and rows carry their scales (per-block kinds too; NVFP4 rows their per-tensor scale)."""
    if not any(is_quantized(p) for p in weights):
        return torch.cat(weights, dim=0)
    split_ = [parts(p) if is_quantized(p) else None for p in weights]  # once: NVFP4 scales are unswizzled here
    kinds = {sp[1].kind if sp else "dense" for sp in split_}
    rotations = {sp[1].rotation if sp else 0 for sp in split_}
    if (len(kinds) > 1 and kinds & set(BLOCK_KINDS)) or len(rotations) > 1:
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
    if isinstance(t, (Int8Tensor, Float8Tensor)):
        return schemes.scheme_of_kind(kind_of(t), dynamic=t.act_quant_kwargs is not None)
    if isinstance(t, (NVFP4Tensor, MXTensor, QParts)):
        return schemes.scheme_of_kind(kind_of(t))
    return None
