"""nvfp4: 4-bit e2m1 weights in blocks of 16 with e4m3 block scales and one fp32 tensor scale, activations
quantized the same way at each matmul (torchao ``NVFP4DynamicActivationNVFP4WeightConfig``, prototype)."""
from __future__ import annotations

import torch

from . import codec as c_, nvfp4_policy
from .codec import Codec, QParts, QSpec
from . import field_checks as c, native_layout as nl
from .record import Scheme

BLOCK = 16
LOGICAL = (torch.bfloat16, torch.float16, torch.float32)
MAX_TENSOR_SCALE = 1e35  # 6 x 448 x this stays below bf16's / float32's largest value (3.4e38)


def config(weight_only: bool = False):
    from torchao.prototype.mx_formats import NVFP4DynamicActivationNVFP4WeightConfig
    return NVFP4DynamicActivationNVFP4WeightConfig(use_triton_kernel=False, use_dynamic_per_tensor_scale=True)


def quantize(weight, cfg):
    """torchao's NVFP4 module handler (dynamic mode) without its Blackwell assert: a per-tensor scale from the
    weight's maximum, swizzled block scales, the activation settings the config implies."""
    import torch
    from torchao.prototype.mx_formats.nvfp4_tensor import (NVFP4Tensor, QuantizeTensorToNVFP4Kwargs,
                                                           per_tensor_amax_to_scale)
    from .codec import require_block_torchao
    require_block_torchao()
    pts = per_tensor_amax_to_scale(torch.max(torch.abs(weight))) if cfg.use_dynamic_per_tensor_scale else None
    act = QuantizeTensorToNVFP4Kwargs(use_dynamic_per_tensor_scale=cfg.use_dynamic_per_tensor_scale,
                                      use_triton_kernel=cfg.use_triton_kernel, is_swizzled_scales=True)
    t = NVFP4Tensor.to_nvfp4(weight, per_tensor_scale=pts, is_swizzled_scales=True, use_triton_kernel=False,
                             act_quant_kwargs=act)
    t.use_triton_kernel = cfg.use_triton_kernel
    return t


def decode_act(d: dict):
    """torchao's JSON ``_data`` of ``QuantizeTensorToNVFP4Kwargs`` -> the object (``json_values.decode_act_kwargs``)."""
    from torchao.prototype.mx_formats.nvfp4_tensor import QuantizeTensorToNVFP4Kwargs
    from . import json_values as j
    j.need(d.get("block_size", BLOCK) == BLOCK, "NVFP4 activation block size must be 16")
    return QuantizeTensorToNVFP4Kwargs(
        block_size=BLOCK, is_swizzled_scales=j.bool_(d.get("is_swizzled_scales"), "is_swizzled_scales"),
        use_triton_kernel=j.bool_(d.get("use_triton_kernel"), "use_triton_kernel"),
        use_dynamic_per_tensor_scale=j.bool_(d.get("use_dynamic_per_tensor_scale"), "use_dynamic_per_tensor_scale"))


ACT_KWARGS = {"QuantizeTensorToNVFP4Kwargs": decode_act}  # the activation settings its weights may carry


def _act_check(v, field):
    from torchao.prototype.mx_formats.nvfp4_tensor import QuantizeTensorToNVFP4Kwargs
    if v is None:
        return
    c.dataclass_of(v, QuantizeTensorToNVFP4Kwargs, field)
    c.int_(v.block_size, field + ".block_size", {BLOCK})
    for f in ("is_swizzled_scales", "use_triton_kernel", "use_dynamic_per_tensor_scale"):
        c.bool_(getattr(v, f), f"{field}.{f}")


class NVFP4Codec(Codec):
    """torchao's ``NVFP4Tensor`` as ``(packed e2m1 pairs uint8 [out, in/2], block scales e4m3 as bytes [out, in/16],
    row scale fp32 [out, 1])``: torchao's one per-tensor scale repeated per row, so rows of weights with different
    scales can be fused (a ``QParts`` then: no torchao tensor holds them)."""
    kind, type_name, block = "nvfp4", "NVFP4Tensor", BLOCK
    rows_alone = False  # the rows a patch changes share one fresh row scale, from the maximum over all of them
    fields = frozenset({"qdata", "scale", "block_size", "orig_dtype", "per_tensor_scale", "act_per_tensor_scale",
                        "is_swizzled_scales", "use_triton_kernel", "act_quant_kwargs"})
    fingerprint_fields = ("qdata", "scale", "per_tensor_scale")
    json_parts = frozenset({"qdata", "scale", "per_tensor_scale", "act_per_tensor_scale"})
    pickled = ("torchao.prototype.mx_formats.nvfp4_tensor:NVFP4Tensor",
               "torchao.prototype.mx_formats.nvfp4_tensor:QuantizeTensorToNVFP4Kwargs")

    def tensor_type(self):
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
        return NVFP4Tensor

    def parts(self, t):
        c_.require_block_torchao()
        q = t.qdata
        if q.ndim != 2 or q.stride(-2) < q.stride(-1):
            raise ValueError("only 2-D, row-major NVFP4 weights are supported")
        if t.block_size != BLOCK:
            raise ValueError(f"NVFP4 block size {t.block_size}, expected {BLOCK}")
        rows, cols = q.shape[0], q.shape[1] * 2
        if cols % BLOCK:
            raise ValueError(f"NVFP4 weight width {cols} is not a multiple of {BLOCK}")
        s = c_.unswizzle(t.scale, rows, cols // BLOCK) if t.is_swizzled_scales else t.scale
        if tuple(s.shape) != (rows, cols // BLOCK):
            raise ValueError(f"NVFP4 block scales {tuple(s.shape)}, expected {(rows, cols // BLOCK)}")
        if s.dtype != torch.float8_e4m3fn or q.dtype != torch.uint8:
            raise ValueError(f"NVFP4 data {q.dtype} / scales {s.dtype}, expected uint8 / float8_e4m3fn")
        pts = t.per_tensor_scale
        if pts is not None and pts.numel() != 1:
            raise ValueError("per-expert NVFP4 scales are not supported (a 2-D Linear weight has one)")
        row = (pts.reshape(1, 1).to(torch.float32) if pts is not None else torch.ones(1, 1)).expand(rows, 1)
        attrs = {"act_quant_kwargs": t.act_quant_kwargs, "per_tensor": pts is not None,
                 "use_triton_kernel": bool(t.use_triton_kernel), **c_.rotation_attrs(t)}
        return (q, c_.as_bytes(s), row.contiguous()), QSpec(self.kind, t.orig_dtype, tuple(sorted(attrs.items())))

    def torchao_form(self, tensors):
        row = tensors[2]
        return bool((row == row[:1]).all())

    def assemble(self, tensors, spec):
        q, s, row = tensors
        if not self.torchao_form(tensors):
            return QParts(tensors, spec, tensors[0].shape[1] * 2)  # two codes a byte
        kw = spec.as_kwargs()
        pts = row[0, 0].clone() if kw.get("per_tensor") or bool(row[0, 0] != 1) else None
        t = self.tensor_type()(q, s.view(torch.float8_e4m3fn), BLOCK, spec.dtype, pts,
                               act_quant_kwargs=kw.get("act_quant_kwargs"),
                               use_triton_kernel=kw.get("use_triton_kernel", False))
        return c_.set_rotation(t, spec)

    def dequantize(self, tensors, spec, dtype):
        q, s, row = tensors
        rows, cols = q.shape[0], q.shape[1] * 2
        vals = c_.decode(c_.decode_table("e2m1x2", q.device), q).reshape(rows, cols // BLOCK, BLOCK)
        # torchao: per_tensor_scale * scale_e4m3.to(float), then data_f32 * that, then .to(dtype)
        scale = row.to(torch.float32) * c_.decode(c_.decode_table("e4m3", s.device), s)
        return (vals * scale.unsqueeze(-1)).reshape(rows, cols).to(dtype)

    def float32_rows(self, tensors, spec):
        q, s, row = tensors
        pairs, e4m3 = c_.decode_table("e2m1x2h", q.device), c_.decode_table("e4m3", s.device)

        def fill(i, j, out):
            halves = torch.index_select(pairs, 0, q[i:j].reshape(-1).to(torch.int32))
            out.copy_(halves.view(torch.float16).view(out.shape))
            scale = row[i:j].to(torch.float32) * c_.decode(e4m3, s[i:j])  # dequantize's arithmetic, on these rows
            out.view(j - i, -1, BLOCK).mul_(scale.unsqueeze(-1))
        return fill

    def quantize(self, dense, spec, like=None, keep=None):
        """Rows of ``like`` (all of them, or those in ``keep``) keep their row scale; every other row gets one from
        the maximum of the rows that change."""
        from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale
        dense = dense.to(torch.float32).contiguous()
        if like is not None and keep is None:
            row_scale = like[2]  # the same rows again (a LoRA applied per call): their scales stand
        else:
            changed = dense if keep is None else dense[~keep.to(dense.device)]
            fresh = per_tensor_amax_to_scale(changed.abs().max()) if changed.numel() else torch.ones(())
            row_scale = fresh.reshape(1, 1).expand(dense.shape[0], 1).to(dense.device)
            if like is not None:
                row_scale = torch.where(keep[:, None].to(dense.device), like[2].to(dense.device), row_scale)
        row_scale = row_scale.to(device=dense.device, dtype=torch.float32).contiguous()
        s, q = nvfp4_quantize(dense, BLOCK, row_scale)  # broadcasts: one scale per row
        return q, c_.as_bytes(s), row_scale

    def check_fields(self, t):
        d = t.__dict__
        c.int_(d.get("block_size"), "block_size", {BLOCK})
        c.need(d.get("orig_dtype") in LOGICAL, "orig_dtype", "bfloat16, float16 or float32", d.get("orig_dtype"))
        c.bool_(d.get("is_swizzled_scales"), "is_swizzled_scales")
        c.bool_(d.get("use_triton_kernel"), "use_triton_kernel")
        _act_check(d.get("act_quant_kwargs"), "act_quant_kwargs")
        c.scalar(d.get("per_tensor_scale"), "per_tensor_scale")
        c.scalar(d.get("act_per_tensor_scale"), "act_per_tensor_scale")

    def side_tensors(self, t):
        pts = getattr(t, "per_tensor_scale", None)
        return [] if pts is None else [(pts, " (per-tensor scale)")]

    def structure_problem(self, t):
        q, s = t.qdata, t.scale
        block = int(t.block_size)
        if q.dtype != torch.uint8 or s.dtype != torch.float8_e4m3fn or block != BLOCK:
            return f"data {q.dtype}, scales {s.dtype}, block {block}: expected uint8, float8_e4m3fn, 16"
        pts = t.per_tensor_scale
        if pts is not None and (not isinstance(pts, torch.Tensor) or pts.numel() != 1):
            return "a per-tensor scale that is not one number"
        return c_.block_scale_problem(t, q.shape[1] * 2, block)

    def check_values(self, key, t, tensors, path):
        from ..errors import CorruptCheckpointError
        pts = t.per_tensor_scale if isinstance(t, self.tensor_type()) else None
        if pts is not None:
            c_.check_scale_finite(key, pts.reshape(1), path)
            p = float(pts.reshape(()))
            # codes x block scale reach 6 x 448; above this bound a weight is infinite in bf16 / float32
            if not 0 <= p <= MAX_TENSOR_SCALE or (p == 0 and bool(tensors[0].any())):
                raise CorruptCheckpointError(
                    f"The per-tensor scale of NVFP4 weight '{key[:80]}' is {p:g}: "
                    + ("negative" if p < 0 else "zero, though the codes are not" if p == 0 else "so large that its "
                       "weights would be infinite") + ".", path=path,
                    expected=f"0 < per-tensor scale <= {MAX_TENSOR_SCALE:g}", found=f"{p:g}",
                    fix="Download or build the file again.")
        bs = tensors[1]
        if (bs & 0x80).any():  # a negative block scale flips the sign of its 16 weights
            raise CorruptCheckpointError(f"A block scale of NVFP4 weight '{key[:80]}' is negative.", path=path,
                                         expected="block scales >= 0", found="a negative e4m3 scale",
                                         fix="Download or build the file again.")
        c_.refuse_nan_scales(key, bool(((bs & 0x7F) == 0x7F).any()), path)  # e4m3 bytes 0x7f / 0xff are NaN

    def from_json(self, d, parts):
        from . import json_values as j  # imports torchao: only when a file is read
        qdata, scale = parts["qdata"], parts["scale"]
        orig, swz = j.block_orig_dtype(d), j.swizzled(d)
        j.need(d.get("block_size") == BLOCK, f"NVFP4 block_size must be 16, found {str(d.get('block_size'))[:20]}")
        j.need(qdata.dtype == torch.uint8 and scale.dtype == torch.float8_e4m3fn,
               f"NVFP4 parts {qdata.dtype} / {scale.dtype}, expected uint8 / float8_e4m3fn")
        pts, apts = parts.get("per_tensor_scale"), parts.get("act_per_tensor_scale")
        for name, v in (("per_tensor_scale", pts), ("act_per_tensor_scale", apts)):
            j.need(v is None or (v.dtype == torch.float32 and v.numel() == 1), f"{name} must be one float32")
        return self.tensor_type()(qdata, scale, BLOCK, orig, per_tensor_scale=pts,
                                  act_per_tensor_scale=apts, is_swizzled_scales=swz,
                                  use_triton_kernel=j.bool_(d.get("use_triton_kernel"), "use_triton_kernel"),
                                  act_quant_kwargs=j.decode_act_kwargs(d.get("act_quant_kwargs"), ACT_KWARGS))


CODEC = NVFP4Codec()


# --- ComfyUI's ``nvfp4`` (docs/FORMAT.md section 6) -----------------------------------------------------------------
# ``weight`` uint8 [N, K/2], two e2m1 codes per byte with the **even element in the high nibble** (torchao packs the
# low nibble first: the bytes are swapped on the way in and out); ``weight_scale`` e4m3 block scales (one per 16
# inputs) in cuBLAS 128x4 tiles, the layout torchao's swizzled scales use; ``weight_scale_2`` the float32 per-tensor
# scale: W = e2m1 * (weight_scale_2 * block_scale).

def comfy_read(layout, stored, spec):
    weight, side = stored.weight, stored.side
    bs, s2 = side.get("weight_scale"), side.get("weight_scale_2")
    if weight.dtype != torch.uint8 or bs is None or s2 is None or s2.numel() != 1 or \
            s2.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise stored.bad("an nvfp4 layer needs uint8 codes, block scales and one float weight_scale_2",
                         found=f"{weight.dtype}, {None if bs is None else tuple(bs.shape)}, "
                               f"{None if s2 is None else f'{s2.dtype} {tuple(s2.shape)}'}")
    rows, blocks = weight.shape[0], weight.shape[1] * 2 // BLOCK
    want = nl.swizzled_shape(rows, blocks)
    if bs.numel() != want[0] * want[1] or weight.shape[1] * 2 % BLOCK:
        raise stored.bad("its block scales do not fit its codes (a padded layer?)",
                         expected=f"{want[0] * want[1]} block scales", found=f"{bs.numel()} for {tuple(weight.shape)}")
    kw = spec().as_kwargs()
    t = CODEC.tensor_type()(nl.swap_nibbles(weight), bs.contiguous().view(torch.float8_e4m3fn).reshape(want), BLOCK,
                            nl.LOGICAL_DTYPE, per_tensor_scale=s2.to(torch.float32).reshape(()),
                            is_swizzled_scales=True, act_quant_kwargs=kw.get("act_quant_kwargs"))
    return t, None, None


def comfy_from_weight(layout, t):
    """This pack's NVFP4 weight -> ComfyUI's parts, bit for bit; None unless it is torchao's tensor with swizzled
    scales (rows fused from weights of different scales, a ``QParts``, are not)."""
    if not getattr(t, "is_swizzled_scales", False):
        return None
    pts = t.per_tensor_scale if t.per_tensor_scale is not None else torch.ones(())
    return {"": nl.swap_nibbles(t.qdata.contiguous()), "_scale": t.scale.contiguous().view(torch.uint8).reshape(
        (t.qdata.shape[0] + 127) // 128 * 128, -1).view(torch.float8_e4m3fn),
        "_scale_2": pts.to(torch.float32).reshape(())}


def comfy_from_dense(layout, w):
    """torchao's quantizer (the same math as ComfyUI's), bytes in ComfyUI's order."""
    return comfy_from_weight(layout, quantize(w.to(torch.bfloat16), config()))


COMFY_LAYOUTS = (nl.ComfyLayout("nvfp4", torch.uint8, ("weight_scale", "weight_scale_2"), "0.8.0", comfy_read,
                                comfy_from_dense, comfy_from_weight, unread_side=("pre_quant_scale",)),)

# Unsloth's rule: nvfp4 takes fp16 / fp32 weights too (require_bf16 false); per-block scales are written as .pt,
# as Unsloth does (docs/FORMAT.md section 9); a v3 file declares which layer is which (its layer policy)
SCHEME = Scheme(name="nvfp4", kind="nvfp4", codec=CODEC, suffix="-NVFP4", config=config, quantize=quantize, require_divisible=16,
                block_size=16, containers=("pt",), comfy_layouts=COMFY_LAYOUTS, file_rules=(nvfp4_policy.RULE,),
                min_capability=(10, 0))
