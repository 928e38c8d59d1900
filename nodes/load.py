"""Load Prequant Transformer."""
from __future__ import annotations

import logging
import os

import torch

from prequant_core import families, schemes
from prequant_core.errors import PrequantError
from prequant_core.loader import open_checkpoint
from prequant_core.metadata import Request

from . import paths
from .comfy_model import load_checkpoint_as_model

log = logging.getLogger("prequant")
AUTO = "auto"


def _summary(opened, model_bytes: int) -> dict:
    ck = opened.checkpoint
    return {"file": os.path.basename(ck.path), "family": opened.family.name, "layout": opened.layout,
            "scheme": ck.metadata.get("scheme") or ",".join(sorted(ck.schemes_found())),
            "base_model_id": ck.metadata.get("base_model_id"), "container": ck.container,
            "quantized_layers": len(ck.quantized_keys), "size_bytes": model_bytes,
            "dense_bytes": ck.dense_nbytes(), "path": "pre-quantized"}


def summary_text(s: dict) -> str:
    gib = lambda b: f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"  # noqa: E731
    return (f"{s['family']} {s['scheme']} from {s['file']} ({s['container']}, {s['layout']} keys): "
            f"{s['quantized_layers']} quantized layers, {gib(s['size_bytes'])} in memory "
            f"(dense {gib(s['dense_bytes'])})")


class PrequantLoadTransformer:
    CATEGORY = "loaders/prequant"
    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    FUNCTION = "load"
    DESCRIPTION = ("Loads a pre-quantized (torchao int8 / fp8) diffusion transformer into ComfyUI's own model class "
                   "without ever materialising the dense model.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "checkpoint": (paths.choices(), {"tooltip": "A file from models/prequant (or a pre-quantized file "
                                                            "in models/diffusion_models)."}),
            },
            "optional": {
                "path": ("STRING", {"default": "", "tooltip": "Explicit file path instead of the list. Outside the "
                                    "model folders it must lie under PREQUANT_ALLOW_LOCAL_PATH."}),
                "base_model_id": ("STRING", {"default": "", "tooltip": "Refuse the file unless it was built from this "
                                             "base (e.g. Tongyi-MAI/Z-Image-Turbo; the last path part is enough)."}),
                "scheme": ([AUTO] + list(schemes.SCHEMES), {"default": AUTO}),
                "family": ([AUTO] + sorted(families.FAMILIES), {"default": AUTO}),
            },
        }

    @classmethod
    def IS_CHANGED(cls, checkpoint, path="", **kw):
        target = path.strip() or paths.resolve(checkpoint)
        try:
            st = os.stat(target)
            return f"{target}:{st.st_mtime_ns}:{st.st_size}"
        except (OSError, TypeError):
            return f"{target}"

    def load(self, checkpoint, path="", base_model_id="", scheme=AUTO, family=AUTO):
        target = path.strip() or paths.resolve(checkpoint)
        if not target:
            raise PrequantError("No checkpoint chosen.", fix="Pick a file in 'checkpoint', or fill 'path'.")
        req = Request(scheme=None if scheme == AUTO else scheme, base_model_id=base_model_id.strip() or None,
                      family=None if family == AUTO else family)
        # Tensors made under ComfyUI's inference mode could not later be moved or swapped outside it.
        with torch.inference_mode(False), torch.no_grad():
            opened = open_checkpoint(target, req, model_dirs=paths.model_dirs())
            patcher = load_checkpoint_as_model(opened.checkpoint, opened.family, opened.layout)
        s = _summary(opened, patcher.model_size())
        log.info("[prequant] %s", summary_text(s))
        return {"ui": {"prequant": [s], "text": [summary_text(s)]}, "result": (patcher,)}
