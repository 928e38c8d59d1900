"""Dense transformer files for load-time quantization (the fallback), read one tensor at a time.

The builder's reader and quantizer are used as they are (one implementation): tensors are read with plain file
reads into private memory and freed as soon as they are quantized, so the dense model is never whole in memory
and a memory-mapped dense file does not stay resident either.
"""
from __future__ import annotations

import os

from . import schemes
from .dense_sources import SafetensorsSource, file_source
from .quantize import quantize_items
from .errors import CheckpointNotFoundError, UnsupportedFormatError


def open_dense(path: str) -> SafetensorsSource:
    if not os.path.isfile(path):
        raise CheckpointNotFoundError("Dense model file not found.", path=path,
                                      fix="Put the dense transformer into ComfyUI/models/diffusion_models/.")
    if not path.endswith(".safetensors"):
        raise UnsupportedFormatError("Dense fallback files must be .safetensors (pickled .ckpt/.pt/.bin files are "
                                     "not opened: they could run code).", path=path,
                                     fix="Use the .safetensors release of the model.")
    return file_source(path)


def dense_nbytes(source: SafetensorsSource) -> int:
    return sum(i.nbytes for i in source.infos().values())


def stream_quantized(source: SafetensorsSource, scheme: str, *, min_features: int, exclude, progress=None):
    """(tensors, skipped): the builder's quantize_items over the file, in file order."""
    flt = schemes.LayerFilter(schemes.normalize(scheme), min_features, tuple(exclude))
    return quantize_items(source.items(), flt, total=len(source.infos()), progress=progress)
