"""Scheme -> torchao config and the layer filter: one implementation shared by the builder and by load-time
quantization, so a pre-quantized file and quantizing on the fly give the same tensors bit for bit."""
from __future__ import annotations

import dataclasses

import torch

from .errors import ValidationError

# docs/FORMAT.md section 4: int8 files exclude these name tokens on every family; other schemes exclude none.
INT8_BASE_EXCLUDE = ("norm", "_mod", "modulation", "timestep_embed", "guidance_embed", "time_text_embed",
                     "pooled", "time_embed")

SCHEMES = ("int8", "fp8", "int8-weight-only", "fp8-weight-only", "nvfp4", "mxfp8")
BLOCK_SCHEMES = ("nvfp4", "mxfp8")  # per-block scales (docs/FORMAT.md section 9): written as .pt, as Unsloth does
DEFAULT_MIN_FEATURES = 512


@dataclasses.dataclass(frozen=True)
class SchemeRules:
    name: str
    require_bf16: bool
    require_divisible: int
    fast_accum: bool | None
    fp8_granularity: str | None


def rules(scheme: str) -> SchemeRules:
    scheme = normalize(scheme)
    fp8 = scheme.startswith("fp8")
    block = {"nvfp4": 16, "mxfp8": 32}.get(scheme)
    # Unsloth's rule: only fp8 and mxfp8 need bf16 weights (their torchao paths assert it); int8 and nvfp4 take
    # fp16 / fp32 too, and a recorded value other than the scheme's is refused.
    return SchemeRules(scheme, require_bf16=fp8 or scheme == "mxfp8",
                       require_divisible=16 if fp8 else (block or 0),
                       fast_accum=True if scheme == "fp8" else None,
                       fp8_granularity="per_row" if fp8 else None)


def normalize(scheme: str) -> str:
    s = str(scheme).strip().lower().replace("_", "-")
    if s in ("int8-wo", "int8wo"):
        s = "int8-weight-only"
    if s in ("fp8-wo", "fp8wo"):
        s = "fp8-weight-only"
    if s in SCHEMES:
        return s
    raise ValidationError(f"Unknown quantization scheme '{scheme}'.", expected=" / ".join(SCHEMES), found=str(scheme),
                          fix="Pick one of the listed schemes.")


def torchao_config(scheme: str):
    """The exact torchao config a scheme stands for (docs/FORMAT.md section 4)."""
    from torchao.quantization import (Float8DynamicActivationFloat8WeightConfig, Float8WeightOnlyConfig,
                                      Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, PerRow)
    from torchao.float8.inference import Float8MMConfig
    from torchao.quantization.quantize_.common import KernelPreference
    scheme = normalize(scheme)
    if scheme == "int8":
        return Int8DynamicActivationInt8WeightConfig()
    if scheme == "fp8":
        return Float8DynamicActivationFloat8WeightConfig(
            granularity=PerRow(), activation_value_lb=1e-12, kernel_preference=KernelPreference.TORCH,
            mm_config=Float8MMConfig(use_fast_accum=True))
    if scheme == "int8-weight-only":
        return Int8WeightOnlyConfig()
    if scheme == "nvfp4":
        from torchao.prototype.mx_formats import NVFP4DynamicActivationNVFP4WeightConfig
        return NVFP4DynamicActivationNVFP4WeightConfig(use_triton_kernel=False, use_dynamic_per_tensor_scale=True)
    if scheme == "mxfp8":
        from torchao.prototype.mx_formats import MXDynamicActivationMXWeightConfig
        return MXDynamicActivationMXWeightConfig(activation_dtype=torch.float8_e4m3fn,
                                                 weight_dtype=torch.float8_e4m3fn)
    return Float8WeightOnlyConfig()


def quantize_weight(weight: torch.Tensor, scheme: str):
    """Quantize one Linear weight exactly as ``quantize_(module, torchao_config(scheme))`` would.

    torchao's fp8 module handler asserts a CUDA GPU of compute capability >= 8.9; the tensor it builds is
    ``Float8Tensor.from_hp`` with the config's fields, which runs anywhere, so that is what we call.
    """
    from torchao.quantization.quantize_.workflows import Float8Tensor, Int8Tensor
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import QuantizeTensorToFloat8Kwargs
    from torchao.quantization.quantize_.workflows.int8.int8_tensor import QuantizeTensorToInt8Kwargs
    cfg = torchao_config(scheme)
    scheme = normalize(scheme)
    if scheme == "int8":
        act_g, w_g = Int8Tensor._normalize_granularity(cfg.granularity)
        return Int8Tensor.from_hp(weight, granularity=w_g, act_quant_kwargs=QuantizeTensorToInt8Kwargs(
            granularity=act_g, mapping_type=cfg.act_mapping_type, reduce_range=cfg.reduce_range),
            reduce_range=cfg.reduce_range)
    if scheme == "int8-weight-only":
        return Int8Tensor.from_hp(weight, granularity=cfg.granularity)
    if scheme in BLOCK_SCHEMES:
        from .qtensor import require_block_torchao
        require_block_torchao()
    if scheme == "nvfp4":
        return _nvfp4_weight(weight, cfg)
    if scheme == "mxfp8":
        return _mxfp8_weight(weight, cfg)
    if scheme == "fp8":
        act_g, w_g = cfg.granularity
        return Float8Tensor.from_hp(weight, float8_dtype=cfg.weight_dtype, granularity=w_g, mm_config=cfg.mm_config,
                                    kernel_preference=cfg.kernel_preference,
                                    act_quant_kwargs=QuantizeTensorToFloat8Kwargs(
                                        cfg.activation_dtype, act_g, hp_value_lb=cfg.activation_value_lb,
                                        hp_value_ub=cfg.activation_value_ub,
                                        kernel_preference=cfg.kernel_preference))
    return Float8Tensor.from_hp(weight, float8_dtype=cfg.weight_dtype, granularity=cfg.granularity)


def _nvfp4_weight(weight: torch.Tensor, cfg):
    """torchao's NVFP4 module handler (dynamic mode) without its Blackwell assert: a per-tensor scale from the
    weight's maximum, swizzled block scales, the activation settings the config implies."""
    from torchao.prototype.mx_formats.nvfp4_tensor import (NVFP4Tensor, QuantizeTensorToNVFP4Kwargs,
                                                           per_tensor_amax_to_scale)
    pts = per_tensor_amax_to_scale(torch.max(torch.abs(weight))) if cfg.use_dynamic_per_tensor_scale else None
    act = QuantizeTensorToNVFP4Kwargs(use_dynamic_per_tensor_scale=cfg.use_dynamic_per_tensor_scale,
                                      use_triton_kernel=cfg.use_triton_kernel, is_swizzled_scales=True)
    t = NVFP4Tensor.to_nvfp4(weight, per_tensor_scale=pts, is_swizzled_scales=True, use_triton_kernel=False,
                             act_quant_kwargs=act)
    t.use_triton_kernel = cfg.use_triton_kernel
    return t


def _mxfp8_weight(weight: torch.Tensor, cfg):
    """torchao's MX module handler: the weight as an ``MXTensor`` with the config's activation settings."""
    from torchao.prototype.mx_formats.mx_tensor import MXTensor, QuantizeTensorToMXKwargs
    act = QuantizeTensorToMXKwargs(elem_dtype=cfg.activation_dtype, block_size=cfg.block_size,
                                   kernel_preference=cfg.kernel_preference, is_swizzled_scales=True,
                                   scaling_mode=cfg.scaling_mode)
    return MXTensor.to_mx(weight, cfg.weight_dtype, block_size=cfg.block_size, kernel_preference=cfg.kernel_preference,
                          act_quant_kwargs=act, is_swizzled_scales=True, scaling_mode=cfg.scaling_mode)


def exclude_tokens(scheme: str, family_extra: tuple[str, ...] = ()) -> list[str]:
    """The tokens in Unsloth's order (base list, then the family's extras as docs/FORMAT.md section 4 lists them),
    never sorted: older Unsloth loaders compare the recorded list as an ordered tuple and refuse any other order."""
    if normalize(scheme).startswith("int8"):
        return list(dict.fromkeys((*INT8_BASE_EXCLUDE, *family_extra)))
    return []


@dataclasses.dataclass(frozen=True)
class LayerFilter:
    """Which ``nn.Linear`` weights a scheme quantizes (docs/FORMAT.md section 4, layer filter)."""
    scheme: str
    min_features: int = DEFAULT_MIN_FEATURES
    exclude: tuple[str, ...] = ()

    def reason_skipped(self, name: str, weight: torch.Tensor) -> str | None:
        """None if the Linear weight is quantized, else why not. ``name`` is the module name (no ``.weight``)."""
        r = rules(self.scheme)
        if weight.ndim != 2:
            return "not a Linear weight"
        out_f, in_f = weight.shape
        if in_f < self.min_features or out_f < self.min_features:
            return f"smaller than min_features={self.min_features}"
        low = name.lower()
        for tok in self.exclude:
            if tok in low:
                return f"name contains excluded token '{tok}'"
        if r.require_bf16 and weight.dtype != torch.bfloat16:
            return f"{weight.dtype} weight (scheme needs bfloat16)"
        # Unsloth's filter asks both dims to divide (MX blocks run along the input dim only, but a file must hold
        # the layers Unsloth's builder quantizes, and load-time quantization must quantize the same ones)
        if r.require_divisible and any(d % r.require_divisible for d in (in_f, out_f)):
            return f"dims not divisible by {r.require_divisible}"
        return None


_SPECS: dict = {}


def spec(scheme: str, dtype: torch.dtype = torch.bfloat16):
    """The ``qtensor.QSpec`` (activation quantization, fp8 mm config, kernels) this scheme gives a weight of
    ``dtype``: taken from the scheme's own config, for readers that rebuild weights from bare codes and scales."""
    key = (normalize(scheme), dtype)
    if key not in _SPECS:
        from . import qtensor
        _SPECS[key] = qtensor.parts(quantize_weight(torch.ones(16, 32, dtype=dtype), key[0]))[1]
    return _SPECS[key]
