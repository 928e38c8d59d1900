"""The ``torch.save`` container: {"format", "metadata", "state_dict"}, read with ``weights_only=True`` only."""
from __future__ import annotations

import pickle

import torch

from ..checkpoint import Checkpoint
from ..errors import CorruptCheckpointError, UnsafeCheckpointError
from .validate_tensors import check_state_dict

LEGACY_V1_MARKERS = ("LinearActivationQuantizedTensor", "AffineQuantizedTensor", "PlainAQTTensorImpl")


def _safe_globals():
    import torchao  # noqa: F401  (registers Int8Tensor / Float8Tensor & their kwargs as safe globals)
    from torch.torch_version import TorchVersion
    return [TorchVersion]


def load_weights_only(path: str, *, mmap: bool = True):
    """``torch.load`` that never executes code, with errors mapped to our types."""
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        msg = str(e)
        if any(m in msg for m in LEGACY_V1_MARKERS):
            raise _LegacyV1(msg) from None
        if "Unsupported global" in msg or "Unsupported operand" in msg or "GLOBAL" in msg or "global" in msg:
            raise UnsafeCheckpointError(
                "Refused to load: the file asks Python to import or call something that is not a tensor type "
                "(a pickle that could run code). Nothing from it was executed.",
                path=path, expected="only tensors, torchao quantized tensors and plain containers",
                found=_first_line(msg), fix="Only load checkpoints from sources you trust; prefer .safetensors.") from None
        raise CorruptCheckpointError("The .pt file could not be unpickled safely.", path=path,
                                     found=_first_line(msg), fix="Download or build the file again.") from None
    except Exception as e:  # noqa: BLE001 - torch.load on a stranger's bytes fails in many ways (zipfile, struct,
        # RuntimeError from the zip reader, ...); every one of them means the same thing to the user
        raise CorruptCheckpointError("The .pt file is damaged or truncated.", path=path,
                                     found=f"{type(e).__name__}: {_first_line(str(e))}",
                                     fix="Download or build the file again.") from None


class _LegacyV1(Exception):
    pass


def _first_line(s: str) -> str:
    s = s.strip().splitlines()
    return s[0][:300] if s else ""


def read_pt(path: str, *, mmap: bool = True) -> Checkpoint:
    try:
        obj = load_weights_only(path, mmap=mmap)
    except _LegacyV1:
        from .legacy_v1 import read_legacy_v1
        return read_legacy_v1(path, mmap=mmap)
    return container(obj, path)


def container(obj, path: str, *, read_data: bool = True) -> Checkpoint:
    """The unpickled object -> Checkpoint, after checking it is the container (see check_state_dict for
    ``read_data``)."""
    if not isinstance(obj, dict) or "state_dict" not in obj:
        found = type(obj).__name__ if not isinstance(obj, dict) else f"dict with keys {sorted(map(str, obj))[:8]}"
        raise CorruptCheckpointError(
            "This .pt file is not a pre-quantized transformer container.", path=path,
            expected="a dict with 'format', 'metadata' and 'state_dict'", found=found,
            fix="Use a file written by Build Prequant Checkpoint or an Unsloth *-FP8 repo; a plain dense "
                "checkpoint belongs in 'Load Diffusion Model' (or use the dense fallback).")
    tag = obj.get("format")
    meta = obj.get("metadata") if obj.get("metadata") is not None else {}
    if tag is not None and not isinstance(tag, str):
        raise CorruptCheckpointError("The container's 'format' entry is not a string.", path=path,
                                     found=type(tag).__name__)
    if not isinstance(meta, dict):
        raise CorruptCheckpointError("The container's 'metadata' entry is not a dict.", path=path,
                                     found=type(meta).__name__)
    sd = check_state_dict(obj["state_dict"], path, read_data=read_data)
    return Checkpoint(path=path, container="pt", format_tag=tag, metadata=dict(meta), tensors=sd)
