"""The in-memory form every reader produces: tensors plus the metadata record, nothing format-specific."""
from __future__ import annotations

import dataclasses
from typing import Any

from ..schemes import qtensor

COMFY_PREFIX = "model.diffusion_model."  # a full ComfyUI checkpoint's diffusion model keys
FORMAT_V1 = "unsloth_prequant_transformer_state_dict_v1"
FORMAT_V2 = "unsloth_prequant_transformer_state_dict_v2"
FORMAT_V3 = "unsloth_prequant_transformer_state_dict_v3"
KNOWN_FORMATS = (FORMAT_V1, FORMAT_V2, FORMAT_V3)  # v2: ConvRot rotation, v3: NVFP4 layer policy (layer_policy)
# Unsloth's pre-cast text encoders: every Linear stored float8_e4m3fn, no scale (diffusers' layerwise casting)
TEXT_ENCODER_FORMAT_V1 = "unsloth_prequant_text_encoder_state_dict_v1"
# ... and its int8 ConvRot form (Qwen-Image 2.1's Qwen3-VL-8B): every decoder projection ComfyUI's ``int8_tensorwise``
# with ConvRot (int8 codes in the group's Hadamard basis, a float32 per-row scale, a ``.comfy_quant`` blob per layer)
TEXT_ENCODER_FORMAT_INT8_CONVROT = "unsloth_prequant_text_encoder_int8_convrot_v1"
LAYERWISE_CAST = "diffusers_layerwise"  # the metadata's cast_backend

# The order Unsloth's current builder writes them in (docs/FORMAT.md section 3); fp8_granularity only for fp8
WRITE_ORDER = ("base_model_id", "family", "scheme", "component", "min_features", "exclude_name_tokens", "require_bf16",
               "require_divisible", "fingerprint", "fast_accum", "torch_dtype", "quant_backend", "transformer_class",
               "torch_version", "torchao_version", "diffusers_version", "fp8_granularity")


@dataclasses.dataclass
class Checkpoint:
    path: str
    container: str  # "pt" | "safetensors" | "legacy-pt" | "comfyui-native"
    format_tag: str | None
    metadata: dict[str, Any]
    tensors: dict[str, Any]  # plain tensors and torchao quantized tensors, keyed as stored

    @property
    def quantized_keys(self) -> list[str]:
        return [k for k, v in self.tensors.items() if qtensor.is_quantized(v)]

    def schemes_found(self) -> set[str]:
        return {qtensor.scheme_of(v) for v in self.tensors.values() if qtensor.is_quantized(v)}

    def nbytes(self) -> int:
        return sum(qtensor.nbytes(v) for v in self.tensors.values())

    def dense_nbytes(self) -> int:
        return sum(qtensor.dense_nbytes(v) if qtensor.is_quantized(v) else qtensor.nbytes(v)
                   for v in self.tensors.values())
