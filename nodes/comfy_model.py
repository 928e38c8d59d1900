"""Family -> ComfyUI's own model class, built on ``meta`` and filled by assignment (never a dense allocation)."""
from __future__ import annotations

import logging

import torch

import comfy.model_management as mm
import comfy.ops
import comfy.supported_models
import comfy.utils

from prequant_core import keymap, placement
from prequant_core.checkpoint import Checkpoint
from prequant_core.errors import ComfyVersionError
from prequant_core.families import Family

from .ops import make_ops, set_quantized
from .patcher import PrequantModelPatcher

log = logging.getLogger("prequant")


def model_config_for(family: Family, tensors: dict, metadata: dict, dtype=torch.bfloat16):
    cls = getattr(comfy.supported_models, family.comfy_model, None)
    if cls is None:
        raise ComfyVersionError(f"This ComfyUI has no model class for {family.title} "
                                f"('{family.comfy_model}').", expected=f"ComfyUI {family.min_comfy} or newer",
                                fix="Update ComfyUI.")
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    unet_config = family.comfy_unet_config(shapes, metadata)
    return cls(dict(unet_config)), unet_config


def to_comfy_layout(family: Family, layout: str, tensors: dict, unet_config: dict, path: str | None = None) -> dict:
    if layout == "comfyui":
        return dict(tensors)
    fn = getattr(comfy.utils, family.comfy_key_map or "", None)
    if fn is None:
        raise ComfyVersionError(f"This ComfyUI cannot convert diffusers-layout {family.title} files "
                                f"(no comfy.utils.{family.comfy_key_map}).", path=path, fix="Update ComfyUI.")
    return keymap.to_comfy(tensors, fn(unet_config), path=path)


def build_patcher(family: Family, layout: str, tensors: dict, metadata: dict, *, path: str | None = None,
                  dtype=torch.bfloat16):
    """Checkpoint tensors (either layout, quantized or a mix) -> a ModelPatcher around ComfyUI's model class."""
    model_config, unet_config = model_config_for(family, tensors, metadata, dtype)
    tensors = to_comfy_layout(family, layout, tensors, unet_config, path)
    load_device = mm.get_torch_device()
    offload_device = mm.unet_offload_device()
    manual_cast = mm.unet_manual_cast(dtype, load_device, model_config.supported_inference_dtypes)
    model_config.set_inference_dtype(dtype, manual_cast)
    base_ops = comfy.ops.manual_cast if manual_cast is not None else comfy.ops.disable_weight_init
    model_config.custom_operations = make_ops(base_ops)
    # Only the diffusion model's layers take device=meta; model_sampling and buffers stay real.
    model = model_config.get_model({}, "", device=torch.device("meta"))
    placement.assign(model.diffusion_model, tensors, path=path, fill_missing=family.fill_missing,
                     set_quantized=set_quantized, cast_plain=dtype)
    model.diffusion_model.to(offload_device)
    model.device = offload_device
    size = mm.module_size(model)  # plain int8/fp8 storage: real bytes, not dense-equivalent
    return PrequantModelPatcher(model, load_device=load_device, offload_device=offload_device, size=size)


def load_checkpoint_as_model(ckpt: Checkpoint, family: Family, layout: str):
    return build_patcher(family, layout, ckpt.tensors, ckpt.metadata, path=ckpt.path)
