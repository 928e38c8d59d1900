"""The ComfyUI side: the only package that imports ComfyUI."""
from __future__ import annotations

from . import paths
from .info import PrequantInfo
from .load import PrequantLoadTransformer

paths.register()

NODE_CLASS_MAPPINGS = {
    "PrequantLoadTransformer": PrequantLoadTransformer,
    "PrequantInfo": PrequantInfo,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "PrequantLoadTransformer": "Load Prequant Transformer",
    "PrequantInfo": "Prequant Info",
}
