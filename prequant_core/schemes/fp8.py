"""fp8: per-row float8_e4m3fn weights, activations quantized per row at each matmul with fast accumulation (torchao
``Float8DynamicActivationFloat8WeightConfig``); weight-only: ``Float8WeightOnlyConfig``."""
from __future__ import annotations

from .record import Scheme


def config(weight_only: bool):
    from torchao.float8.inference import Float8MMConfig
    from torchao.quantization import (Float8DynamicActivationFloat8WeightConfig, Float8WeightOnlyConfig, PerRow)
    from torchao.quantization.quantize_.common import KernelPreference
    if weight_only:
        return Float8WeightOnlyConfig()
    return Float8DynamicActivationFloat8WeightConfig(
        granularity=PerRow(), activation_value_lb=1e-12, kernel_preference=KernelPreference.TORCH,
        mm_config=Float8MMConfig(use_fast_accum=True))


def quantize(weight, cfg):
    """torchao's fp8 module handler asserts a CUDA GPU of compute capability >= 8.9; the tensor it builds is
    ``Float8Tensor.from_hp`` with the config's fields, which runs anywhere, so that is what is called."""
    from torchao.quantization import Float8WeightOnlyConfig
    from torchao.quantization.quantize_.workflows import Float8Tensor
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import QuantizeTensorToFloat8Kwargs
    if isinstance(cfg, Float8WeightOnlyConfig):
        return Float8Tensor.from_hp(weight, float8_dtype=cfg.weight_dtype, granularity=cfg.granularity)
    act_g, w_g = cfg.granularity
    return Float8Tensor.from_hp(weight, float8_dtype=cfg.weight_dtype, granularity=w_g, mm_config=cfg.mm_config,
                                kernel_preference=cfg.kernel_preference,
                                act_quant_kwargs=QuantizeTensorToFloat8Kwargs(
                                    cfg.activation_dtype, act_g, hp_value_lb=cfg.activation_value_lb,
                                    hp_value_ub=cfg.activation_value_ub, kernel_preference=cfg.kernel_preference))


# an Unsloth -FP8 repo holds the int8 file too (tried after the fp8 one)
SCHEME = Scheme(name="fp8", kind="float8", suffix="-FP8", config=config, quantize=quantize, require_bf16=True,
                require_divisible=16, granularity_field="fp8_granularity", granularity="per_row", fast_accum=True,
                weight_only=True, suffix_holds=("fp8", "int8"), legacy_pt=True, comfy_format="float8_e4m3fn", min_capability=(8, 9))
