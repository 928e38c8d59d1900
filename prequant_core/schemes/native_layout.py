"""ComfyUI's own quantized layouts as the scheme modules declare them (``comfy/quant_ops.py``: one layout class per
format, a format's facts as data): each scheme's record lists the ComfyUI formats that hold its weights
(``Scheme.comfy_layouts``), each one ``ComfyLayout``: the facts (format name, storage dtype, side tensors, the first
ComfyUI release that reads it) and the scheme module's own functions both ways (ComfyUI's parts -> this pack's
weight, and a weight -> ComfyUI's parts). The helpers those functions share are here; ``formats/comfy_layout.py``
finds the formats through the registry and reads and writes them (docs/FORMAT.md section 6).

``input_scale`` (a static activation scale ComfyUI uses only for its fp8 GPU matmul) is read and not used by any
layout: this pack quantizes activations dynamically, as in Unsloth's files. Layers must be unpadded (every real
model's Linears are multiples of 16 / 32 wide).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from ..errors import CorruptCheckpointError, UnsupportedFormatError

LOGICAL_DTYPE = torch.bfloat16  # the dtype a ComfyUI-native weight computes in


@dataclasses.dataclass(frozen=True)
class ComfyLayout:
    name: str  # ComfyUI's format name (the ``.comfy_quant`` JSON's "format")
    storage: Any  # the torch dtype of ``<layer>.weight``
    side: tuple[str, ...]  # the side tensors it needs, e.g. ("weight_scale", "weight_scale_2")
    since: str  # the first ComfyUI release that loads it with its own Load Diffusion Model
    # (layout, Stored, spec() -> the scheme's QSpec) -> (this pack's weight, 'per_tensor' | 'per_row' | None,
    # ConvRot group or None). The weight is 2-D (checked before), not yet checked otherwise (the reader passes it
    # through the tensor boundary) and carries no rotation yet (the reader sets the group after that boundary: a file
    # never supplies that attribute)
    read: Callable
    # (layout, dense weight) -> {suffix: tensor}, suffixes "" (the weight), "_scale", "_scale_2": quantized the way
    # ComfyUI's own quantizer does
    from_dense: Callable
    # (layout, this scheme's weight) -> the same parts bit for bit (no requantization), or None where this weight's
    # bytes do not fit the layout as they are (then it is quantized from its dense values); None: never kept
    from_weight: Callable | None = None
    # side tensors that change the layer's math and that this pack does not apply: refused by name (ComfyUI 0.33's
    # nvfp4 multiplies the input by ``pre_quant_scale``, an AWQ-style smoothing, before its matmul)
    unread_side: tuple[str, ...] = ()
    # ComfyUI's oldest marking, a ``scaled_fp8`` tensor whose dtype is the storage, names this format
    marker_dtype: bool = False
    scheme: str = ""  # the scheme holding it: filled in by formats/comfy_layout.formats() from the record


@dataclasses.dataclass(frozen=True)
class Stored:
    """One quantized layer as a ComfyUI-native file stores it: what a layout's ``read`` gets."""
    layer: str  # the layer's name in the file (errors name it)
    path: str  # the file (errors name it)
    cfg: dict  # the layer's ``.comfy_quant`` JSON
    weight: torch.Tensor
    side: dict  # {side tensor name: tensor or None}

    def bad(self, what: str, expected=None, found=None) -> CorruptCheckpointError:
        return bad(self.layer, self.path, what, expected=expected, found=found)


def bad(layer: str, path: str, what: str, expected=None, found=None) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"ComfyUI-native layer '{layer[:80]}': {what}", path=path, expected=expected,
                                  found=found, fix="Download the file again.")


def per_row(scale, rows: int, layer: str, path: str) -> tuple[torch.Tensor, str]:
    """A float scale, one per tensor or one per row, as ``[rows, 1]`` float32 and which of the two it was."""
    if scale is None or not scale.is_floating_point() or scale.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise bad(layer, path, "its weight_scale is missing or not a float", found=str(getattr(scale, "dtype", None)))
    s = scale.to(torch.float32)
    if s.numel() == 1:
        return s.reshape(1, 1).expand(rows, 1).contiguous(), "per_tensor"
    if s.numel() == rows and (s.ndim == 1 or (s.ndim == 2 and s.shape[1] == 1)):
        return s.reshape(rows, 1).contiguous(), "per_row"
    raise UnsupportedFormatError(f"Layer '{layer[:80]}' has a scale of shape {tuple(s.shape)} for {rows} rows: only "
                                 "per-tensor and per-row scales are read for this format.", path=path)


def row_scale(layout: ComfyLayout, stored: Stored):
    """Per-row formats (``W = codes * weight_scale``): the codes' dtype checked, the scale as ``[rows, 1]``."""
    if stored.weight.dtype != layout.storage:
        raise stored.bad(f"marked {layout.name} but its weight is {stored.weight.dtype}", expected=str(layout.storage))
    return per_row(stored.side.get("weight_scale"), stored.weight.shape[0], stored.layer, stored.path)


def swizzled_shape(rows: int, blocks: int) -> tuple[int, int]:
    """Block scales in cuBLAS 128x4 tiles (the layout torchao's swizzled scales use), as torchao shapes them."""
    return ((rows + 127) // 128 * 32, (blocks + 3) // 4 * 16)


def swap_nibbles(b: torch.Tensor) -> torch.Tensor:
    """ComfyUI's high-nibble-first 4-bit bytes <-> torchao's low-nibble-first ones (its own inverse)."""
    return ((b & 0x0F) << 4) | (b >> 4)
