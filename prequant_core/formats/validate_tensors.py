"""Structural checks shared by readers: a state dict is str -> tensor, quantized tensors are self-consistent."""
from __future__ import annotations

import torch

from .. import qtensor
from ..errors import CorruptCheckpointError


def check_state_dict(sd, path: str) -> dict:
    if not isinstance(sd, dict):
        raise CorruptCheckpointError("The checkpoint's state_dict is not a dict.", path=path, found=type(sd).__name__)
    if not sd:
        raise CorruptCheckpointError("The checkpoint holds no tensors.", path=path, fix="Build or download it again.")
    out = {}
    for k, v in sd.items():
        if not isinstance(k, str):
            raise CorruptCheckpointError("A state_dict key is not a string.", path=path, found=repr(k)[:100])
        if not isinstance(v, torch.Tensor):
            raise CorruptCheckpointError(f"Entry '{k}' is not a tensor.", path=path, found=type(v).__name__)
        if qtensor.is_quantized(v):
            check_quantized(k, v, path)
        out[k] = v
    return out


def check_quantized(key: str, t, path: str) -> None:
    try:
        q, s, _ = qtensor.split(t)
    except Exception as e:  # noqa: BLE001 - any inconsistency inside a stranger's tensor is corruption
        raise CorruptCheckpointError(f"Quantized tensor '{key}' is inconsistent.", path=path,
                                     found=f"{type(e).__name__}: {e}") from None
    if q.ndim != 2 or s.shape[0] != q.shape[0] or tuple(t.shape) != tuple(q.shape):
        raise CorruptCheckpointError(f"Quantized tensor '{key}' has mismatched data and scale shapes.", path=path,
                                     found=f"data {tuple(q.shape)}, scale {tuple(s.shape)}")
    if q.dtype not in (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2):
        raise CorruptCheckpointError(f"Quantized tensor '{key}' stores {q.dtype} codes.", path=path,
                                     expected="int8 or float8 codes")
