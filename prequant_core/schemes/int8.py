"""int8: per-row symmetric int8 weights, activations quantized per token at each matmul (torchao
``Int8DynamicActivationInt8WeightConfig``); weight-only: ``Int8WeightOnlyConfig``."""
from __future__ import annotations

from .record import Scheme

# docs/FORMAT.md section 4: int8 files keep these layers dense on every family
BASE_EXCLUDE = ("norm", "_mod", "modulation", "timestep_embed", "guidance_embed", "time_text_embed", "pooled",
                "time_embed")


def config(weight_only: bool):
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig
    return Int8WeightOnlyConfig() if weight_only else Int8DynamicActivationInt8WeightConfig()


def quantize(weight, cfg):
    from torchao.quantization import Int8WeightOnlyConfig
    from torchao.quantization.quantize_.workflows import Int8Tensor
    from torchao.quantization.quantize_.workflows.int8.int8_tensor import QuantizeTensorToInt8Kwargs
    if isinstance(cfg, Int8WeightOnlyConfig):
        return Int8Tensor.from_hp(weight, granularity=cfg.granularity)
    act_g, w_g = Int8Tensor._normalize_granularity(cfg.granularity)
    return Int8Tensor.from_hp(weight, granularity=w_g, act_quant_kwargs=QuantizeTensorToInt8Kwargs(
        granularity=act_g, mapping_type=cfg.act_mapping_type, reduce_range=cfg.reduce_range),
        reduce_range=cfg.reduce_range)


SCHEME = Scheme(name="int8", kind="int8", suffix="-INT8", config=config, quantize=quantize,
                granularity_field="int8_granularity", exclude_base_tokens=BASE_EXCLUDE, weight_only=True,
                legacy_pt=True, comfy_format="int8_tensorwise", min_capability=(7, 5))
