"""Older hosted INT8 ``.pt`` files pickled torchao "v1" classes that current torchao no longer has."""
from __future__ import annotations

from ..errors import UnsupportedFormatError


def read_legacy_v1(path: str):
    raise UnsupportedFormatError(
        "This is a legacy INT8 file written with torchao's old v1 tensor classes "
        "(LinearActivationQuantizedTensor / AffineQuantizedTensor), which this version cannot read yet.",
        path=path, fix="Download the .safetensors variant of the same repo, or rebuild with Build Prequant Checkpoint.")
