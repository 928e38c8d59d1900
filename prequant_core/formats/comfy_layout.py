"""ComfyUI's own quantization formats (``comfy/quant_ops.py`` ``QUANT_ALGOS`` and comfy-kitchen's layouts): what a layer
stores, how those bytes map onto this pack's torchao weights (both ways), and which ComfyUI release first reads the
format natively (docs/FORMAT.md section 6).

Each format is its scheme's: the scheme module declares it (``Scheme.comfy_layouts``, a
``schemes.native_layout.ComfyLayout`` each: the facts as data, and the module's functions reading ComfyUI's parts
into the pack's weight and writing them), with the byte layout restated from ComfyUI's and comfy-kitchen's sources and
checked against comfy-kitchen's eager (CPU) reference functions in tests/formats/test_comfy_native.py. Here: the formats looked
up through the registry at call time, the steps every format shares, and what ComfyUI has that no scheme here runs.
"""
from __future__ import annotations

import dataclasses

import torch

from .. import schemes
from ..schemes import registry
from ..schemes.native_layout import LOGICAL_DTYPE, ComfyLayout, Stored

# Side tensors ComfyUI 0.33 loads for some formats only (``QUANT_ALGOS[fmt]["parameters"]`` in comfy/quant_ops.py:
# ``pre_quant_scale`` is nvfp4's alone). On a layer of another format its loader (comfy/ops.py
# ``_load_quantized_module``) leaves the tensor in the state dict, ``load_state_dict(strict=False)`` drops it (logged
# as "unet unexpected") and the layer computes without it. Read the same way here: ignored, counted and noted; a
# format that does use it lists it in its ``unread_side`` (refused by name) or in its ``side``.
DROPPED_UNLESS_USED = ("pre_quant_scale",)
# Formats ComfyUI has whose math this pack does not run (named in the refusal)
OTHER = ("convrot_w4a4", "asym_w4a8_int8", "awq_w4a16", "svdquant_w4a4", "int4")


def _version(v: str) -> tuple:
    return tuple(int(x) for x in v.split("."))


def formats() -> dict[str, ComfyLayout]:
    """{ComfyUI's format name: its layout, ``scheme`` filled in}, every registered scheme's, in the order ComfyUI
    releases first read them (the registry's order among formats of one release)."""
    out = [dataclasses.replace(f, scheme=s.name) for s in registry.all_schemes() for f in s.comfy_layouts]
    return {f.name: f for f in sorted(out, key=lambda f: _version(f.since))}


def layout(name: str) -> ComfyLayout:
    """The layout of ComfyUI's format ``name``; ValueError for a format no registered scheme holds."""
    f = formats().get(name)
    if f is None:
        raise ValueError(name)
    return f


def dropped_side(fmt: ComfyLayout) -> tuple[str, ...]:
    """The side tensors ComfyUI drops on a layer of ``fmt`` (DROPPED_UNLESS_USED less the ones the format uses)."""
    return tuple(n for n in DROPPED_UNLESS_USED if n not in fmt.side and n not in fmt.unread_side)


def to_weight(fmt: ComfyLayout, stored: Stored):
    """(this pack's weight for the layer, 'per_tensor' | 'per_row' | None, rotation group or None). The weight is
    not yet checked (the reader passes it through the tensor boundary) and carries no rotation yet."""
    w = stored.weight
    if w.ndim != 2 or 0 in w.shape:
        raise stored.bad("its weight is not a 2-D Linear weight", found=f"{w.dtype} {tuple(w.shape)}")
    return fmt.read(fmt, stored, lambda: schemes.spec(fmt.scheme, LOGICAL_DTYPE))


# --- writing (Build Prequant Checkpoint's "comfyui-native" output) ---------------------------------------------

def from_dense(fmt_name: str, w: torch.Tensor) -> dict:
    """A dense weight quantized the way ComfyUI's own quantizer does for ``fmt_name``: {suffix: tensor} with suffixes
    ``""`` (the weight), ``"_scale"``, ``"_scale_2"`` (each layout's ``from_dense`` says how)."""
    f = layout(fmt_name)
    return f.from_dense(f, w.detach())


def from_weight(fmt_name: str, t) -> dict:
    """This pack's weight -> ComfyUI's parts, bit for bit (no requantization), where the layout keeps its bytes."""
    f = layout(fmt_name)
    parts = f.from_weight(f, t) if f.from_weight is not None else None
    if parts is None:
        raise ValueError(f"{fmt_name}: this weight's bytes do not fit the layout as they are")
    return parts
