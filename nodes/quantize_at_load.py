"""The dense fallback: quantize a dense transformer while reading it (one tensor at a time), with the same
scheme, min_features and exclude rules as the builder, into the same ComfyUI model as a pre-quantized file."""
from __future__ import annotations

import torch

from prequant_core.load import companion_source
from prequant_core.context import LoadContext
from prequant_core.formats.dense_sources import open_dense, stream_quantized
from prequant_core.load.route import LoadRoute

from .comfy_model import build_patcher, check_loadable


def load_quantized_at_load(plan: LoadRoute, progress=None, ctx: LoadContext | None = None):
    """The dense file quantized while it is read. Weights the family's class holds beside the transformer's (LTX-2.3's
    text connectors) that the file lacks come from their own file (``companion_source``, through ``ctx``), found
    before anything is quantized, and are kept as that file holds them."""
    check_loadable(plan.family)  # before a companion is fetched for a family this ComfyUI cannot build
    dense = open_dense(plan.dense_path)
    names = list(dense.infos())
    layout = plan.family.layout_of(names) or "comfyui"
    companion = companion_source.find(plan.family, ctx or LoadContext()) \
        if companion_source.needed(plan.family, names) else None
    with torch.inference_mode(False), torch.no_grad():
        q, _ = stream_quantized(dense, plan.scheme, min_features=plan.min_features, exclude=plan.exclude,
                                progress=progress)
        if companion is not None:
            q.update(companion.tensors)
        return build_patcher(plan.family, layout, q, path=plan.dense_path)
