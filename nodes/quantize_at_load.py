"""The dense fallback: quantize a dense transformer while reading it (one tensor at a time), with the same
scheme, min_features and exclude rules as the builder, into the same ComfyUI model as a pre-quantized file."""
from __future__ import annotations

import torch

from prequant_core.load.dense_sources import open_dense, stream_quantized
from prequant_core.load.route import LoadRoute

from .comfy_model import build_patcher


def load_quantized_at_load(plan: LoadRoute, progress=None):
    dense = open_dense(plan.dense_path)
    layout = plan.family.layout_of(list(dense.infos())) or "comfyui"
    with torch.inference_mode(False), torch.no_grad():
        q, _ = stream_quantized(dense, plan.scheme, min_features=plan.min_features, exclude=plan.exclude,
                                progress=progress)
        return build_patcher(plan.family, layout, q, {}, path=plan.dense_path)
