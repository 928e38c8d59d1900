"""nvfp4: 4-bit e2m1 weights in blocks of 16 with e4m3 block scales and one fp32 tensor scale, activations
quantized the same way at each matmul (torchao ``NVFP4DynamicActivationNVFP4WeightConfig``, prototype)."""
from __future__ import annotations

from .record import Scheme


def config(weight_only: bool = False):
    from torchao.prototype.mx_formats import NVFP4DynamicActivationNVFP4WeightConfig
    return NVFP4DynamicActivationNVFP4WeightConfig(use_triton_kernel=False, use_dynamic_per_tensor_scale=True)


def quantize(weight, cfg):
    """torchao's NVFP4 module handler (dynamic mode) without its Blackwell assert: a per-tensor scale from the
    weight's maximum, swizzled block scales, the activation settings the config implies."""
    import torch
    from torchao.prototype.mx_formats.nvfp4_tensor import (NVFP4Tensor, QuantizeTensorToNVFP4Kwargs,
                                                           per_tensor_amax_to_scale)
    from .qtensor import require_block_torchao
    require_block_torchao()
    pts = per_tensor_amax_to_scale(torch.max(torch.abs(weight))) if cfg.use_dynamic_per_tensor_scale else None
    act = QuantizeTensorToNVFP4Kwargs(use_dynamic_per_tensor_scale=cfg.use_dynamic_per_tensor_scale,
                                      use_triton_kernel=cfg.use_triton_kernel, is_swizzled_scales=True)
    t = NVFP4Tensor.to_nvfp4(weight, per_tensor_scale=pts, is_swizzled_scales=True, use_triton_kernel=False,
                             act_quant_kwargs=act)
    t.use_triton_kernel = cfg.use_triton_kernel
    return t


# Unsloth's rule: nvfp4 takes fp16 / fp32 weights too (require_bf16 false); per-block scales are written as .pt,
# as Unsloth does (docs/FORMAT.md section 9)
SCHEME = Scheme(name="nvfp4", kind="nvfp4", suffix="-NVFP4", config=config, quantize=quantize, require_divisible=16,
                block_size=16, containers=("pt",), comfy_format="nvfp4", min_capability=(10, 0))
