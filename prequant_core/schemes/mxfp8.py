"""mxfp8: float8_e4m3fn weights in blocks of 32 with power-of-two (e8m0) block scales, activations quantized the
same way at each matmul (torchao ``MXDynamicActivationMXWeightConfig``, prototype)."""
from __future__ import annotations

import torch

from . import codec as c_
from .codec import Codec, QSpec
from . import field_checks as c, native_layout as nl
from .record import Scheme

BLOCK = 32
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
LOGICAL = (torch.bfloat16, torch.float16, torch.float32)
MAX_EXPONENT = 246  # 448 x 2^(246 - 127) is finite in bf16 / float32


def config(weight_only: bool = False):
    import torch
    from torchao.prototype.mx_formats import MXDynamicActivationMXWeightConfig
    return MXDynamicActivationMXWeightConfig(activation_dtype=torch.float8_e4m3fn, weight_dtype=torch.float8_e4m3fn)


def quantize(weight, cfg):
    """torchao's MX module handler: the weight as an ``MXTensor`` with the config's activation settings."""
    from torchao.prototype.mx_formats.mx_tensor import MXTensor, QuantizeTensorToMXKwargs
    from .codec import require_block_torchao
    require_block_torchao()
    act = QuantizeTensorToMXKwargs(elem_dtype=cfg.activation_dtype, block_size=cfg.block_size,
                                   kernel_preference=cfg.kernel_preference, is_swizzled_scales=True,
                                   scaling_mode=cfg.scaling_mode)
    return MXTensor.to_mx(weight, cfg.weight_dtype, block_size=cfg.block_size, kernel_preference=cfg.kernel_preference,
                          act_quant_kwargs=act, is_swizzled_scales=True, scaling_mode=cfg.scaling_mode)


def decode_act(d: dict):
    """torchao's JSON ``_data`` of ``QuantizeTensorToMXKwargs`` -> the object (``json_values.decode_act_kwargs``)."""
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import QuantizeTensorToMXKwargs
    from torchao.quantization.quantize_.common import KernelPreference
    from . import json_values as j
    j.need(d.get("block_size", BLOCK) == BLOCK, "MX activation block size must be 32")
    return QuantizeTensorToMXKwargs(
        elem_dtype=j.decode_dtype(d.get("elem_dtype")), block_size=BLOCK,
        scaling_mode=j.decode_enum(d.get("scaling_mode"), ScaleCalculationMode, "ScaleCalculationMode"),
        kernel_preference=j.decode_enum(d.get("kernel_preference"), KernelPreference, "KernelPreference"),
        is_swizzled_scales=j.bool_(d.get("is_swizzled_scales"), "is_swizzled_scales"))


ACT_KWARGS = {"QuantizeTensorToMXKwargs": decode_act}  # the activation settings its weights may carry


def _act_check(v, field):
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import QuantizeTensorToMXKwargs
    from torchao.quantization.quantize_.common import KernelPreference
    if v is None:
        return
    c.dataclass_of(v, QuantizeTensorToMXKwargs, field)
    c.need(v.elem_dtype in FP8, field + ".elem_dtype", "float8_e4m3fn or float8_e5m2", v.elem_dtype)
    c.int_(v.block_size, field + ".block_size", {BLOCK})
    c.enum(v.scaling_mode, ScaleCalculationMode, field + ".scaling_mode")
    c.enum(v.kernel_preference, KernelPreference, field + ".kernel_preference")
    c.bool_(v.is_swizzled_scales, field + ".is_swizzled_scales")


class MXFP8Codec(Codec):
    """torchao's ``MXTensor`` (float8 elements) as ``(codes e4m3 as bytes [out, in], block exponents e8m0 as bytes
    [out, in/32])``: bytes decoded through tables, so the same parts run on devices with no float8 dtype."""
    kind, type_name, block = "mxfp8", "MXTensor", BLOCK
    fields = frozenset({"qdata", "scale", "elem_dtype", "block_size", "orig_dtype", "kernel_preference",
                        "act_quant_kwargs", "is_swizzled_scales"})
    fingerprint_fields = ("qdata", "scale")
    pickled = ("torchao.prototype.mx_formats.mx_tensor:MXTensor",
               "torchao.prototype.mx_formats.mx_tensor:QuantizeTensorToMXKwargs",
               "torchao.prototype.mx_formats.config:ScaleCalculationMode",
               "torchao.quantization.quantize_.common.kernel_preference:KernelPreference")

    def tensor_type(self):
        from torchao.prototype.mx_formats.mx_tensor import MXTensor
        return MXTensor

    def parts(self, t):
        c_.require_block_torchao()
        q = t.qdata
        if t.elem_dtype not in FP8 or q.ndim != 2:
            raise ValueError(f"MX weights with elements {t.elem_dtype} are not supported (mxfp8 only)")
        if not q.is_contiguous():
            raise ValueError("only row-major MX weights are supported")
        rows, cols = q.shape
        bs = int(t.block_size)
        if bs <= 0 or cols % bs:
            raise ValueError(f"MX weight width {cols} is not a multiple of its block size {bs}")
        s = c_.unswizzle(t.scale, rows, cols // bs) if t.is_swizzled_scales else t.scale.reshape(rows, cols // bs)
        attrs = {"act_quant_kwargs": t.act_quant_kwargs, "kernel_preference": t.kernel_preference,
                 "elem_dtype": t.elem_dtype, "block_size": bs, **c_.rotation_attrs(t)}
        return (c_.as_bytes(q), c_.as_bytes(s)), QSpec(self.kind, t.orig_dtype, tuple(sorted(attrs.items())))

    def assemble(self, tensors, spec):
        q, s = tensors
        kw = spec.as_kwargs()
        t = self.tensor_type()(q.view(kw["elem_dtype"]), s.view(torch.float8_e8m0fnu), kw["elem_dtype"],
                               kw["block_size"], spec.dtype, kw.get("kernel_preference"), kw.get("act_quant_kwargs"),
                               False)
        return c_.set_rotation(t, spec)

    def dequantize(self, tensors, spec, dtype):
        q, s = tensors
        kw = spec.as_kwargs()
        bs = kw["block_size"]
        elem = "e5m2" if kw["elem_dtype"] == torch.float8_e5m2 else "e4m3"
        # torchao's to_dtype: codes cast to the target dtype, times the block scale cast to it, in the target dtype
        data = c_.decode(c_.decode_table(elem, q.device), q).to(dtype).reshape(-1, bs)
        scale = c_.decode(c_.decode_table("e8m0", s.device), s).reshape(-1, 1).to(dtype)
        return (data * scale).reshape(q.shape)

    def float32_rows(self, tensors, spec):
        from . import cpu_weight_only
        q, s = tensors
        kw = spec.as_kwargs()
        codes = cpu_weight_only.fp8_rows(q, kw["elem_dtype"] == torch.float8_e5m2)
        e8m0, bs = c_.decode_table("e8m0", s.device), kw["block_size"]

        def fill(i, j, out):
            codes(i, j, out)
            out.view(j - i, -1, bs).mul_(c_.decode(e8m0, s[i:j]).unsqueeze(-1))
        return fill

    def quantize(self, dense, spec, like=None, keep=None):
        kw = spec.as_kwargs()
        act = kw.get("act_quant_kwargs")
        mode = {"scaling_mode": act.scaling_mode} if act is not None else {}
        t = self.tensor_type().to_mx(dense.to(spec.dtype).contiguous(), kw["elem_dtype"], kw["block_size"], **mode)
        return c_.as_bytes(t.qdata), c_.as_bytes(t.scale.reshape(dense.shape[0], -1))

    def check_fields(self, t):
        from torchao.quantization.quantize_.common import KernelPreference
        d = t.__dict__
        c.need(d.get("elem_dtype") in FP8, "elem_dtype", "float8_e4m3fn or float8_e5m2 (mxfp8)", d.get("elem_dtype"))
        c.int_(d.get("block_size"), "block_size", {BLOCK})
        c.need(d.get("orig_dtype") in LOGICAL, "orig_dtype", "bfloat16, float16 or float32", d.get("orig_dtype"))
        c.enum(d.get("kernel_preference"), KernelPreference, "kernel_preference")
        _act_check(d.get("act_quant_kwargs"), "act_quant_kwargs")
        c.bool_(d.get("is_swizzled_scales"), "is_swizzled_scales")

    def structure_problem(self, t):
        q, s = t.qdata, t.scale
        if t.elem_dtype not in FP8 or q.dtype != t.elem_dtype:
            return f"MX elements {t.elem_dtype} / data {q.dtype}: only mxfp8 (float8 elements) is supported"
        if s.dtype != torch.float8_e8m0fnu:
            return f"MX scales {s.dtype}, expected float8_e8m0fnu"
        return c_.block_scale_problem(t, q.shape[1], int(t.block_size))

    def check_values(self, key, t, tensors, path):
        from ..errors import CorruptCheckpointError
        # e8m0 byte 0xff is NaN; 247..254 make e4m3 codes overflow bf16 / float32 (448 x 2^120 > 3.4e38)
        bs = tensors[1]
        top = int(bs.max()) if bs.numel() else 0
        if top > MAX_EXPONENT and top != 0xFF:
            raise CorruptCheckpointError(
                f"A block exponent of MX weight '{key[:80]}' is {top} (2^{top - 127}): every weight of that block "
                "would be infinite.", path=path, expected=f"block exponents <= {MAX_EXPONENT}",
                found=str(top), fix="Download or build the file again.")
        c_.refuse_nan_scales(key, bool((bs == 0xFF).any()), path)
        c_.refuse_special_codes(key, tensors[0], t.elem_dtype if isinstance(t, self.tensor_type()) else
                                torch.float8_e4m3fn, path, "MX element")

    def from_json(self, d, parts):
        from . import json_values as j  # imports torchao: only when a file is read
        from torchao.quantization.quantize_.common import KernelPreference
        qdata, scale = parts["qdata"], parts["scale"]
        orig, swz = j.block_orig_dtype(d), j.swizzled(d)
        j.need(d.get("block_size") == BLOCK, f"MX block_size must be 32, found {str(d.get('block_size'))[:20]}")
        elem = j.decode_dtype(d.get("elem_dtype"))
        j.need(elem in FP8 and qdata.dtype == elem, f"MX elements {elem} / data {qdata.dtype}: only mxfp8 is read")
        if scale.dtype == torch.uint8:  # e8m0 exponents written as bytes by writers without the e8m0 dtype
            scale = scale.view(torch.float8_e8m0fnu)
        j.need(scale.dtype == torch.float8_e8m0fnu, f"MX scales {scale.dtype}, expected float8_e8m0fnu")
        kp = d.get("kernel_preference")
        return self.tensor_type()(qdata, scale, elem, BLOCK, orig,
                                  KernelPreference.AUTO if kp is None else
                                  j.decode_enum(kp, KernelPreference, "KernelPreference"),
                                  j.decode_act_kwargs(d.get("act_quant_kwargs"), ACT_KWARGS), swz)


CODEC = MXFP8Codec()


# --- ComfyUI's ``mxfp8`` (docs/FORMAT.md section 6) -----------------------------------------------------------------
# ``weight`` e4m3 [N, K], ``weight_scale`` e8m0 exponents (one per 32 inputs, as uint8 or float8_e8m0fnu) in cuBLAS
# 128x4 tiles: W = e4m3 * 2^(e - 127).

def comfy_read(layout, stored, spec):
    from torchao.quantization.quantize_.common import KernelPreference
    weight, side = stored.weight, stored.side
    bs = side.get("weight_scale")
    if weight.dtype != torch.float8_e4m3fn or bs is None or bs.dtype not in (torch.uint8, torch.float8_e8m0fnu):
        raise stored.bad("an mxfp8 layer needs e4m3 codes and uint8 / e8m0 block exponents",
                         found=f"{weight.dtype}, {None if bs is None else bs.dtype}")
    rows, blocks = weight.shape[0], weight.shape[1] // BLOCK
    want = nl.swizzled_shape(rows, blocks)
    if bs.numel() != want[0] * want[1] or weight.shape[1] % BLOCK:
        raise stored.bad("its block exponents do not fit its codes (a padded layer?)",
                         expected=f"{want[0] * want[1]} block exponents",
                         found=f"{bs.numel()} for {tuple(weight.shape)}")
    kw = spec().as_kwargs()
    t = CODEC.tensor_type()(weight, bs.contiguous().view(torch.float8_e8m0fnu).reshape(want), torch.float8_e4m3fn,
                            BLOCK, nl.LOGICAL_DTYPE, kw.get("kernel_preference", KernelPreference.AUTO),
                            kw.get("act_quant_kwargs"), True)
    return t, None, None


def comfy_from_weight(layout, t):
    """This pack's MX weight -> ComfyUI's parts, bit for bit; None unless it is torchao's tensor with swizzled
    scales (rows fused from weights of different scales, a ``QParts``, are not)."""
    if not getattr(t, "is_swizzled_scales", False):
        return None
    return {"": t.qdata.contiguous(), "_scale": t.scale.contiguous().view(torch.uint8).reshape(
        (t.qdata.shape[0] + 127) // 128 * 128, -1)}


def comfy_from_dense(layout, w):
    """torchao's quantizer (the same math as ComfyUI's), bytes in ComfyUI's order."""
    return comfy_from_weight(layout, quantize(w.to(torch.bfloat16), config()))


COMFY_LAYOUTS = (nl.ComfyLayout("mxfp8", torch.float8_e4m3fn, ("weight_scale",), "0.18.0", comfy_read,
                                comfy_from_dense, comfy_from_weight),)

# Unsloth's filter asks both dims to divide by the block (MX blocks run along the input dim only, but a file must
# hold the layers Unsloth's builder quantizes)
SCHEME = Scheme(name="mxfp8", kind="mxfp8", codec=CODEC, suffix="-MXFP8", config=config, quantize=quantize, require_bf16=True,
                require_divisible=32, block_size=32, containers=("pt",), comfy_layouts=COMFY_LAYOUTS,
                min_capability=(10, 0))
