"""ComfyUI's own quantization formats (``comfy/quant_ops.py`` ``QUANT_ALGOS`` and comfy-kitchen's layouts), one record
each: what a layer stores, how those bytes map onto this pack's torchao weights (both ways), and which ComfyUI
release first reads the format natively (docs/FORMAT.md section 6).

The byte layouts, restated from ComfyUI's and comfy-kitchen's sources and checked against comfy-kitchen's eager
(CPU) reference functions in tests/test_comfy_native.py:

* ``float8_e4m3fn`` / ``float8_e5m2``: ``weight`` fp8 ``[N, K]``, ``weight_scale`` float32 (one per tensor, or
  ``[N, 1]``): ``W = fp8 * scale``.
* ``int8_tensorwise``: ``weight`` int8 ``[N, K]``, ``weight_scale`` float32 scalar or ``[N, 1]``: ``W = q * scale``;
  with ``convrot`` the stored weight is ``W H`` (the regular-H4 block Hadamard of ``convrot_groupsize``, the same
  matrix Unsloth's v2 files use) and the input is rotated at run time.
* ``nvfp4``: ``weight`` uint8 ``[N, K/2]``, two e2m1 codes per byte with the **even element in the high nibble**
  (torchao packs the low nibble first: the bytes are swapped on the way in and out); ``weight_scale`` e4m3 block
  scales (one per 16 inputs) in cuBLAS 128x4 tiles, the layout torchao's swizzled scales use; ``weight_scale_2`` the
  float32 per-tensor scale: ``W = e2m1 * (weight_scale_2 * block_scale)``.
* ``mxfp8``: ``weight`` e4m3 ``[N, K]``, ``weight_scale`` e8m0 exponents (one per 32 inputs, as uint8 or
  float8_e8m0fnu) in the same tiles: ``W = e4m3 * 2^(e - 127)``.

``input_scale`` (a static activation scale ComfyUI uses only for its fp8 GPU matmul) is read and not used: this pack
quantizes activations dynamically, as in Unsloth's files. Layers must be unpadded (every real model's Linears are
multiples of 16 / 32 wide).
"""
from __future__ import annotations

import dataclasses

import torch

from ..schemes import qtensor, rotation
from .. import schemes
from ..errors import CorruptCheckpointError, UnsupportedFormatError


@dataclasses.dataclass(frozen=True)
class ComfyFormat:
    name: str  # ComfyUI's format name (the ``.comfy_quant`` JSON's "format")
    scheme: str  # this pack's scheme for the same math
    storage: torch.dtype  # the dtype of ``<layer>.weight``
    side: tuple[str, ...]  # the side tensors it needs, e.g. ("weight_scale", "weight_scale_2")
    since: str  # the first ComfyUI release that loads it with its own Load Diffusion Model


FORMATS = {f.name: f for f in (
    ComfyFormat("float8_e4m3fn", "fp8", torch.float8_e4m3fn, ("weight_scale",), "0.3.68"),
    ComfyFormat("float8_e5m2", "fp8", torch.float8_e5m2, ("weight_scale",), "0.8.0"),
    ComfyFormat("nvfp4", "nvfp4", torch.uint8, ("weight_scale", "weight_scale_2"), "0.8.0"),
    ComfyFormat("mxfp8", "mxfp8", torch.float8_e4m3fn, ("weight_scale",), "0.18.0"),
    ComfyFormat("int8_tensorwise", "int8", torch.int8, ("weight_scale",), "0.27.0"),
)}
CONVROT_SINCE = "0.27.0"
# Side tensors a format may carry that change the layer's math and that this pack does not apply: refused by name
# (ComfyUI 0.33's nvfp4 multiplies the input by ``pre_quant_scale``, an AWQ-style smoothing, before its matmul)
UNREAD_SIDE = {"nvfp4": ("pre_quant_scale",)}
# Side tensors ComfyUI 0.33 loads for some formats only (``QUANT_ALGOS[fmt]["parameters"]`` in comfy/quant_ops.py:
# ``pre_quant_scale`` is nvfp4's alone). On a layer of another format its loader (comfy/ops.py
# ``_load_quantized_module``) leaves the tensor in the state dict, ``load_state_dict(strict=False)`` drops it (logged
# as "unet unexpected") and the layer computes without it. Read the same way here: ignored, counted and noted; a
# format that does use it lists it in UNREAD_SIDE (refused by name) or in its ``side``.
DROPPED_UNLESS_USED = ("pre_quant_scale",)


def dropped_side(fmt: ComfyFormat) -> tuple[str, ...]:
    """The side tensors ComfyUI drops on a layer of ``fmt`` (DROPPED_UNLESS_USED less the ones the format uses)."""
    return tuple(n for n in DROPPED_UNLESS_USED if n not in fmt.side and n not in UNREAD_SIDE.get(fmt.name, ()))


# Formats ComfyUI has whose math this pack does not run (named in the refusal)
OTHER = ("convrot_w4a4", "asym_w4a8_int8", "awq_w4a16", "svdquant_w4a4", "int4")
LOGICAL_DTYPE = torch.bfloat16


def swap_nibbles(b: torch.Tensor) -> torch.Tensor:
    """ComfyUI's high-nibble-first NVFP4 bytes <-> torchao's low-nibble-first ones (its own inverse)."""
    return ((b & 0x0F) << 4) | (b >> 4)


def _swizzled_shape(rows: int, blocks: int) -> tuple[int, int]:
    return ((rows + 127) // 128 * 32, (blocks + 3) // 4 * 16)


def _bad(layer, path, what, expected=None, found=None):
    return CorruptCheckpointError(f"ComfyUI-native layer '{layer[:80]}': {what}", path=path, expected=expected,
                                  found=found, fix="Download the file again.")


def _per_row(scale, rows: int, layer: str, path: str) -> tuple[torch.Tensor, str]:
    if scale is None or not scale.is_floating_point() or scale.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise _bad(layer, path, "its weight_scale is missing or not a float", found=str(getattr(scale, "dtype", None)))
    s = scale.to(torch.float32)
    if s.numel() == 1:
        return s.reshape(1, 1).expand(rows, 1).contiguous(), "per_tensor"
    if s.numel() == rows and (s.ndim == 1 or (s.ndim == 2 and s.shape[1] == 1)):
        return s.reshape(rows, 1).contiguous(), "per_row"
    raise UnsupportedFormatError(f"Layer '{layer[:80]}' has a scale of shape {tuple(s.shape)} for {rows} rows: only "
                                 "per-tensor and per-row scales are read for this format.", path=path)


def to_weight(fmt: ComfyFormat, cfg: dict, weight: torch.Tensor, side: dict, layer: str, path: str):
    """(this pack's weight for the layer, 'per_tensor' | 'per_row' | None, rotation group or None). The weight is
    not yet checked (the reader passes it through the tensor boundary) and carries no rotation yet."""
    if weight.ndim != 2 or 0 in weight.shape:
        raise _bad(layer, path, "its weight is not a 2-D Linear weight", found=f"{weight.dtype} {tuple(weight.shape)}")
    if fmt.scheme in ("fp8", "int8"):
        if weight.dtype != fmt.storage:
            raise _bad(layer, path, f"marked {fmt.name} but its weight is {weight.dtype}", expected=str(fmt.storage))
        scale, gran = _per_row(side.get("weight_scale"), weight.shape[0], layer, path)
        group = None
        if fmt.name == "int8_tensorwise" and cfg.get("convrot"):
            group = cfg.get("convrot_groupsize", 256)
            if not rotation.is_power_of_4(group) or group > rotation.MAX_GROUP or weight.shape[1] % group:
                raise _bad(layer, path, "its convrot_groupsize is not a power of 4 dividing the input width",
                           expected=f"4 .. {rotation.MAX_GROUP}, dividing {weight.shape[1]}", found=repr(group)[:40])
            if gran != "per_row":
                raise _bad(layer, path, "a ConvRot layer needs per-row scales", found=gran)
        # a ConvRot group is set by the reader after the tensor boundary (a file never supplies that attribute)
        return qtensor.join(weight, scale, schemes.spec(fmt.scheme, LOGICAL_DTYPE)), gran, group
    if fmt.name == "nvfp4":
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
        bs, s2 = side.get("weight_scale"), side.get("weight_scale_2")
        if weight.dtype != torch.uint8 or bs is None or s2 is None or s2.numel() != 1 or \
                s2.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise _bad(layer, path, "an nvfp4 layer needs uint8 codes, block scales and one float weight_scale_2",
                       found=f"{weight.dtype}, {None if bs is None else tuple(bs.shape)}, "
                             f"{None if s2 is None else f'{s2.dtype} {tuple(s2.shape)}'}")
        rows, blocks = weight.shape[0], weight.shape[1] * 2 // 16
        want = _swizzled_shape(rows, blocks)
        if bs.numel() != want[0] * want[1] or weight.shape[1] * 2 % 16:
            raise _bad(layer, path, "its block scales do not fit its codes (a padded layer?)",
                       expected=f"{want[0] * want[1]} block scales", found=f"{bs.numel()} for {tuple(weight.shape)}")
        spec = schemes.spec("nvfp4", LOGICAL_DTYPE).as_kwargs()
        t = NVFP4Tensor(swap_nibbles(weight), bs.contiguous().view(torch.float8_e4m3fn).reshape(want), 16,
                        LOGICAL_DTYPE, per_tensor_scale=s2.to(torch.float32).reshape(()), is_swizzled_scales=True,
                        act_quant_kwargs=spec.get("act_quant_kwargs"))
        return t, None, None
    if fmt.name == "mxfp8":
        from torchao.prototype.mx_formats.mx_tensor import MXTensor
        from torchao.quantization.quantize_.common import KernelPreference
        bs = side.get("weight_scale")
        if weight.dtype != torch.float8_e4m3fn or bs is None or bs.dtype not in (torch.uint8, torch.float8_e8m0fnu):
            raise _bad(layer, path, "an mxfp8 layer needs e4m3 codes and uint8 / e8m0 block exponents",
                       found=f"{weight.dtype}, {None if bs is None else bs.dtype}")
        rows, blocks = weight.shape[0], weight.shape[1] // 32
        want = _swizzled_shape(rows, blocks)
        if bs.numel() != want[0] * want[1] or weight.shape[1] % 32:
            raise _bad(layer, path, "its block exponents do not fit its codes (a padded layer?)",
                       expected=f"{want[0] * want[1]} block exponents", found=f"{bs.numel()} for {tuple(weight.shape)}")
        spec = schemes.spec("mxfp8", LOGICAL_DTYPE).as_kwargs()
        t = MXTensor(weight, bs.contiguous().view(torch.float8_e8m0fnu).reshape(want), torch.float8_e4m3fn, 32,
                     LOGICAL_DTYPE, spec.get("kernel_preference", KernelPreference.AUTO), spec.get("act_quant_kwargs"),
                     True)
        return t, None, None
    raise UnsupportedFormatError(f"ComfyUI format '{fmt.name}' is not read.", path=path)


# --- writing (Build Prequant Checkpoint's "comfyui-native" output) ---------------------------------------------

def from_dense(fmt_name: str, w: torch.Tensor) -> dict:
    """A dense weight quantized the way ComfyUI's own quantizer does for ``fmt_name``: {suffix: tensor} with suffixes
    ``""`` (the weight), ``"_scale"``, ``"_scale_2"``. fp8 / int8: one scale per tensor (what ComfyUI's fp8 GPU matmul
    takes); nvfp4 / mxfp8: torchao's quantizer (the same math), bytes in ComfyUI's order."""
    w = w.detach()
    if fmt_name in ("float8_e4m3fn", "float8_e5m2"):
        dt = FORMATS[fmt_name].storage
        amax = w.abs().max().to(torch.float32)
        scale = (amax / torch.finfo(dt).max).clamp(min=torch.finfo(torch.float32).tiny)
        q = (w.to(torch.float32) / scale).clamp(-torch.finfo(dt).max, torch.finfo(dt).max).to(dt)
        return {"": q, "_scale": scale.reshape(())}
    if fmt_name == "int8_tensorwise":
        scale = (w.abs().amax(dim=1, keepdim=True).to(torch.float32) / 127).clamp(min=1e-30)
        q = torch.round(w.to(torch.float32) / scale).clamp(-128, 127).to(torch.int8)
        return {"": q, "_scale": scale}
    if fmt_name == "nvfp4":
        return from_weight("nvfp4", schemes.quantize_weight(w.to(torch.bfloat16), "nvfp4"))
    if fmt_name == "mxfp8":
        return from_weight("mxfp8", schemes.quantize_weight(w.to(torch.bfloat16), "mxfp8"))
    raise ValueError(fmt_name)


def from_weight(fmt_name: str, t) -> dict:
    """This pack's NVFP4 / MX weight -> ComfyUI's parts, bit for bit (no requantization)."""
    if fmt_name == "nvfp4":
        if not t.is_swizzled_scales:
            raise ValueError("NVFP4 scales must be swizzled")
        pts = t.per_tensor_scale if t.per_tensor_scale is not None else torch.ones(())
        return {"": swap_nibbles(t.qdata.contiguous()), "_scale": t.scale.contiguous().view(torch.uint8).reshape(
            (t.qdata.shape[0] + 127) // 128 * 128, -1).view(torch.float8_e4m3fn),
            "_scale_2": pts.to(torch.float32).reshape(())}
    if fmt_name == "mxfp8":
        if not t.is_swizzled_scales:
            raise ValueError("MX scales must be swizzled")
        return {"": t.qdata.contiguous(), "_scale": t.scale.contiguous().view(torch.uint8).reshape(
            (t.qdata.shape[0] + 127) // 128 * 128, -1)}
    raise ValueError(fmt_name)
