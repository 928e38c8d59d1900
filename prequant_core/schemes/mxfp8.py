"""mxfp8: float8_e4m3fn weights in blocks of 32 with power-of-two (e8m0) block scales, activations quantized the
same way at each matmul (torchao ``MXDynamicActivationMXWeightConfig``, prototype)."""
from __future__ import annotations

from .record import Scheme


def config(weight_only: bool = False):
    import torch
    from torchao.prototype.mx_formats import MXDynamicActivationMXWeightConfig
    return MXDynamicActivationMXWeightConfig(activation_dtype=torch.float8_e4m3fn, weight_dtype=torch.float8_e4m3fn)


def quantize(weight, cfg):
    """torchao's MX module handler: the weight as an ``MXTensor`` with the config's activation settings."""
    from torchao.prototype.mx_formats.mx_tensor import MXTensor, QuantizeTensorToMXKwargs
    from .qtensor import require_block_torchao
    require_block_torchao()
    act = QuantizeTensorToMXKwargs(elem_dtype=cfg.activation_dtype, block_size=cfg.block_size,
                                   kernel_preference=cfg.kernel_preference, is_swizzled_scales=True,
                                   scaling_mode=cfg.scaling_mode)
    return MXTensor.to_mx(weight, cfg.weight_dtype, block_size=cfg.block_size, kernel_preference=cfg.kernel_preference,
                          act_quant_kwargs=act, is_swizzled_scales=True, scaling_mode=cfg.scaling_mode)


# Unsloth's filter asks both dims to divide by the block (MX blocks run along the input dim only, but a file must
# hold the layers Unsloth's builder quantizes)
SCHEME = Scheme(name="mxfp8", kind="mxfp8", suffix="-MXFP8", config=config, quantize=quantize, require_bf16=True,
                require_divisible=32, block_size=32, containers=("pt",), comfy_format="mxfp8",
                min_capability=(10, 0))
