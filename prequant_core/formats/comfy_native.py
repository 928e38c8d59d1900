"""ComfyUI's own quantized safetensors (the ``-ComfyUI`` twins)."""
from __future__ import annotations

from ..errors import UnsupportedFormatError


def read_comfy_native(path: str, index: dict, meta: dict):
    raise UnsupportedFormatError(
        "This is a ComfyUI-native quantized file (a '-ComfyUI' twin), which this version does not read yet.",
        path=path, fix="Load it with ComfyUI's own 'Load Diffusion Model', or use the non-ComfyUI file of the repo.")
