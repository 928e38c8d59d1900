"""The ComfyUI side: the only package that imports ComfyUI."""
from __future__ import annotations

from . import paths
from .build_node import PrequantBuildCheckpoint
from .info_node import PrequantInfo
from .load_node import PrequantLoadTransformer
from .te_node import PrequantLoadTextEncoder

paths.register()

NODE_CLASS_MAPPINGS = {
    "PrequantLoadTransformer": PrequantLoadTransformer,
    "PrequantBuildCheckpoint": PrequantBuildCheckpoint,
    "PrequantInfo": PrequantInfo,
    "PrequantLoadTextEncoder": PrequantLoadTextEncoder,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "PrequantLoadTransformer": "Load Prequant Transformer",
    "PrequantBuildCheckpoint": "Build Prequant Checkpoint",
    "PrequantInfo": "Prequant Info",
    "PrequantLoadTextEncoder": "Load Prequant Text Encoder",
}
