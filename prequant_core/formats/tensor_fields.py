"""The boundary for what a quantized tensor from a stranger's file carries besides its bytes.

A pickled torchao tensor subclass brings its attributes with it: torch restores the pickled ``__dict__`` as it is, so
a file can add any attribute (a ConvRot group the metadata never declares) or put a string where torchao expects its
quantization kwargs, and that reaches arithmetic at sampling time. Every quantized tensor a reader returns passes
here first: exactly the attributes its class has, each of the type and value range this pack's code handles; anything
else is a ``CorruptCheckpointError`` naming the file, the tensor, the field, what was expected and what was found.
Shapes, dtypes and values of the parts are checked next by ``validate_tensors``.
"""
from __future__ import annotations

import dataclasses

import torch

from ..errors import CorruptCheckpointError
from ..safe_text import escape

LOGICAL = (torch.bfloat16, torch.float16, torch.float32)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


class _Bad(Exception):
    def __init__(self, field: str, expected: str, found):
        super().__init__(field)
        self.field, self.expected, self.found = field, expected, found


def _found(v) -> str:
    return f"{type(v).__name__} {escape(repr(v)[:80])}"


def _need(ok: bool, field: str, expected: str, value) -> None:
    if not ok:
        raise _Bad(field, expected, _found(value))


def _bool(v, field):
    _need(isinstance(v, bool), field, "true or false", v)


def _int(v, field, allowed=None):
    _need(isinstance(v, int) and not isinstance(v, bool) and (allowed is None or v in allowed), field,
          f"an integer{'' if allowed is None else ' in ' + str(sorted(allowed))}", v)


def _enum(v, cls, field):
    _need(isinstance(v, cls), field, f"a {cls.__name__}", v)


def _opt_float(v, field, lo=None):
    _need(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
                        and abs(v) != float("inf") and (lo is None or v >= lo)), field,
          "none or a finite number" + ("" if lo is None else f" >= {lo}"), v)


def _scalar(v, field):
    _need(v is None or (isinstance(v, torch.Tensor) and type(v) is torch.Tensor and v.dtype == torch.float32
                        and v.numel() == 1), field, "none or one float32 number", v)


def _granularity(v, field):
    from torchao.quantization import PerRow, PerTensor
    _need(type(v) in (PerRow, PerTensor) or (isinstance(v, (list, tuple)) and len(v) == 2
                                             and all(type(g) in (PerRow, PerTensor) for g in v)),
          field, "PerRow / PerTensor granularity", v)
    for g in (v if isinstance(v, (list, tuple)) else (v,)):
        if type(g) is PerRow:
            _int(g.dim, field + ".dim", {-1, 1})


def _mm_config(v, field):
    from torchao.float8.inference import Float8MMConfig
    if v is None:
        return
    _need(type(v) is Float8MMConfig, field, "a Float8MMConfig or none", v)
    for f in ("emulate", "use_fast_accum", "pad_inner_dim"):
        _bool(getattr(v, f), f"{field}.{f}")


def block_accepted(v, shape, whole_ok: bool = False) -> bool:
    """The block shapes this pack reads, for pickled weights (here) and torchao's JSON (torchao_json): ``[1, K]``,
    one block per row; with ``whole_ok`` (fp8 holding one scale) also the whole weight ``[N, K]``, the stale per-tensor
    fp8 of Unsloth's older builds, decoded so that Info can describe it and validation can name it stale."""
    if not (isinstance(v, (list, tuple)) and len(v) == 2
            and all(isinstance(i, int) and not isinstance(i, bool) for i in v)):
        return False
    return (v[0] == 1 and len(shape) > 0 and v[1] == shape[-1]) or (whole_ok and list(v) == list(shape))


def _block(v, field, shape, whole_ok=False):
    _need(block_accepted(v, shape, whole_ok), field, f"[1, {shape[-1] if len(shape) else -1}] (one block per row)", v)


def _dataclass_of(v, cls, field):
    _need(type(v) is cls and dataclasses.is_dataclass(v), field, f"a {cls.__name__} or none", v)


def _int8_act(v, field):
    from torchao.quantization.quant_primitives import MappingType
    from torchao.quantization.quantize_.workflows.int8.int8_tensor import QuantizeTensorToInt8Kwargs
    if v is None:
        return
    _dataclass_of(v, QuantizeTensorToInt8Kwargs, field)
    _granularity(v.granularity, field + ".granularity")
    _enum(v.mapping_type, MappingType, field + ".mapping_type")
    _need(v.mapping_type == MappingType.SYMMETRIC, field + ".mapping_type", "SYMMETRIC", v.mapping_type)
    _bool(v.reduce_range, field + ".reduce_range")


def _fp8_act(v, field):
    from torchao.quantization.quantize_.common import KernelPreference
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import QuantizeTensorToFloat8Kwargs
    if v is None:
        return
    _dataclass_of(v, QuantizeTensorToFloat8Kwargs, field)
    _need(v.float8_dtype in FP8, field + ".float8_dtype", "float8_e4m3fn or float8_e5m2", v.float8_dtype)
    _granularity(v.granularity, field + ".granularity")
    _mm_config(v.mm_config, field + ".mm_config")
    _opt_float(v.hp_value_lb, field + ".hp_value_lb", 0)
    _opt_float(v.hp_value_ub, field + ".hp_value_ub", 0)
    _enum(v.kernel_preference, KernelPreference, field + ".kernel_preference")


def _nvfp4_act(v, field):
    from torchao.prototype.mx_formats.nvfp4_tensor import QuantizeTensorToNVFP4Kwargs
    if v is None:
        return
    _dataclass_of(v, QuantizeTensorToNVFP4Kwargs, field)
    _int(v.block_size, field + ".block_size", {16})
    for f in ("is_swizzled_scales", "use_triton_kernel", "use_dynamic_per_tensor_scale"):
        _bool(getattr(v, f), f"{field}.{f}")


def _mx_act(v, field):
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import QuantizeTensorToMXKwargs
    from torchao.quantization.quantize_.common import KernelPreference
    if v is None:
        return
    _dataclass_of(v, QuantizeTensorToMXKwargs, field)
    _need(v.elem_dtype in FP8, field + ".elem_dtype", "float8_e4m3fn or float8_e5m2", v.elem_dtype)
    _int(v.block_size, field + ".block_size", {32})
    _enum(v.scaling_mode, ScaleCalculationMode, field + ".scaling_mode")
    _enum(v.kernel_preference, KernelPreference, field + ".kernel_preference")
    _bool(v.is_swizzled_scales, field + ".is_swizzled_scales")


def _int8(t):
    d = t.__dict__
    _block(d.get("block_size"), "block_size", tuple(t.qdata.shape))
    _int8_act(d.get("act_quant_kwargs"), "act_quant_kwargs")
    _bool(d.get("reduce_range", False), "reduce_range")
    for f in ("act_pre_scale", "act_quant_scale", "act_quant_zero_point"):  # static activation settings
        _need(d.get(f) is None, f, "none (this pack's int8 quantizes activations dynamically)", d.get(f))


def _fp8(t):
    from torchao.quantization.quantize_.common import KernelPreference
    d = t.__dict__
    one_scale = isinstance(d.get("scale"), torch.Tensor) and d["scale"].numel() == 1 and t.qdata.ndim == 2
    _block(d.get("block_size"), "block_size", tuple(t.qdata.shape), whole_ok=one_scale)
    _mm_config(d.get("mm_config"), "mm_config")
    _fp8_act(d.get("act_quant_kwargs"), "act_quant_kwargs")
    _enum(d.get("kernel_preference"), KernelPreference, "kernel_preference")


def _nvfp4(t):
    d = t.__dict__
    _int(d.get("block_size"), "block_size", {16})
    _need(d.get("orig_dtype") in LOGICAL, "orig_dtype", "bfloat16, float16 or float32", d.get("orig_dtype"))
    _bool(d.get("is_swizzled_scales"), "is_swizzled_scales")
    _bool(d.get("use_triton_kernel"), "use_triton_kernel")
    _nvfp4_act(d.get("act_quant_kwargs"), "act_quant_kwargs")
    _scalar(d.get("per_tensor_scale"), "per_tensor_scale")
    _scalar(d.get("act_per_tensor_scale"), "act_per_tensor_scale")


def _mx(t):
    from torchao.quantization.quantize_.common import KernelPreference
    d = t.__dict__
    _need(d.get("elem_dtype") in FP8, "elem_dtype", "float8_e4m3fn or float8_e5m2 (mxfp8)", d.get("elem_dtype"))
    _int(d.get("block_size"), "block_size", {32})
    _need(d.get("orig_dtype") in LOGICAL, "orig_dtype", "bfloat16, float16 or float32", d.get("orig_dtype"))
    _enum(d.get("kernel_preference"), KernelPreference, "kernel_preference")
    _mx_act(d.get("act_quant_kwargs"), "act_quant_kwargs")
    _bool(d.get("is_swizzled_scales"), "is_swizzled_scales")


# class name -> (the attributes an instance has, the checks)
ATTRIBUTES = {
    "Int8Tensor": ({"qdata", "scale", "zero_point", "block_size", "act_quant_kwargs", "reduce_range", "act_pre_scale",
                    "act_quant_scale", "act_quant_zero_point"}, _int8),
    "Float8Tensor": ({"qdata", "scale", "block_size", "mm_config", "act_quant_kwargs", "kernel_preference"}, _fp8),
    "NVFP4Tensor": ({"qdata", "scale", "block_size", "orig_dtype", "per_tensor_scale", "act_per_tensor_scale",
                     "is_swizzled_scales", "use_triton_kernel", "act_quant_kwargs"}, _nvfp4),
    "MXTensor": ({"qdata", "scale", "elem_dtype", "block_size", "orig_dtype", "kernel_preference", "act_quant_kwargs",
                  "is_swizzled_scales"}, _mx),
}
def check_fields(key: str, t, path: str) -> None:
    """Every attribute ``t`` carries is one its class has, of the type this pack handles. (Attributes this pack
    sets itself, a ConvRot group, the legacy reader's fingerprint origin, are set after this check: a file never
    supplies them.)"""
    cls = type(t).__name__
    if cls not in ATTRIBUTES:
        return
    names, check = ATTRIBUTES[cls]
    have = set(getattr(t, "__dict__", {}))
    extra = sorted(have - names)
    try:
        if extra:
            raise _Bad(extra[0], f"only the attributes a torchao {cls} has", f"an extra attribute '{escape(extra[0][:60])}'")
        check(t)
    except _Bad as b:
        raise CorruptCheckpointError(
            f"Quantized tensor '{escape(key[:80])}' ({cls}) carries a field this pack does not accept: "
            f"'{escape(b.field)}'. A file only supplies numbers; what they mean comes from the format.", path=path,
            expected=b.expected, found=str(b.found), fix="Download or build the file again from a trusted source.") \
            from None
