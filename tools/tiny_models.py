"""Tiny models of the real architectures, built on the spot with seeded random weights (no downloads).

Dims are the smallest at which ComfyUI's and diffusers' versions of the architecture agree (COMFYUI.md):
Z-Image needs dim >= 1024 with int(8/3*dim) a multiple of 256 and 128-wide heads, e.g. 1536 / 12 heads.
"""
from __future__ import annotations

import math

import torch

ZIMAGE_TINY = dict(dim=1536, n_layers=1, n_refiner_layers=1, n_heads=12, n_kv_heads=12, axes_dims=[32, 48, 48],
                   cap_feat_dim=768)


def randomize_(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Deterministic, non-degenerate weights (diffusers zero-inits some output layers, which would hide bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            elif "norm" in name or name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
    return module


def zimage_dense(seed: int = 0, dtype=torch.bfloat16, **overrides) -> dict:
    """Dense Z-Image transformer state dict in diffusers layout (the layout of Unsloth's files)."""
    from diffusers import ZImageTransformer2DModel
    cfg = {**ZIMAGE_TINY, **overrides}
    m = randomize_(ZImageTransformer2DModel(**cfg), seed)
    return {k: v.to(dtype).contiguous() for k, v in m.state_dict().items()}


def save_dense_safetensors(sd: dict, path: str) -> str:
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in sd.items()}, path)
    return path


def zimage_comfy_layout(dense_diffusers: dict) -> dict:
    """The same weights in ComfyUI's key layout (fused qkv), converted with ComfyUI's own key map."""
    import comfy.utils
    from prequant_core import families
    from prequant_core.families import keymap
    fam = families.get("z-image")
    shapes = {k: tuple(v.shape) for k, v in dense_diffusers.items()}
    cfg = fam.config_from_shapes(shapes)
    return keymap.to_comfy(dense_diffusers, getattr(comfy.utils, fam.arch.comfy_key_map)(cfg))


def linear_weight_keys(tensors) -> list[str]:
    """The Linear weights of a state dict, as the builder tells them (``schemes.quantize.is_linear_weight``)."""
    from prequant_core.schemes.quantize import is_linear_weight
    return [k for k, v in tensors.items() if is_linear_weight(k, v)]


def comfy_to_diffusers(tensors: dict, key_map: dict) -> dict:
    """A ComfyUI-layout dense state dict -> diffusers' layout (fused weights split by rows), all at once in memory:
    the reference the builder's streamed remap (``formats.dense_sources.RemappedSource``) is held to."""
    from prequant_core.families.keymap import parse_target
    out = {}
    for dk, target in key_map.items():
        t = parse_target(dk, target)
        if t.name in tensors:
            out[dk] = tensors[t.name] if t.rows is None else tensors[t.name].narrow(0, *t.rows)  # (offset, length)
    return out
