"""Structural checks shared by readers: a state dict is str -> tensor, quantized tensors are self-consistent."""
from __future__ import annotations

import torch

from .. import qtensor
from ..errors import CorruptCheckpointError

QUANT_CODE_DTYPES = (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2)


def check_state_dict(sd, path: str, *, read_data: bool = True) -> dict:
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
            check_quantized(k, v, path, read_data=read_data)
        out[k] = v
    return out


def check_quantized(key: str, t, path: str, *, read_data: bool = True) -> None:
    """Shapes and dtypes always; with ``read_data`` also the values ``qtensor.split`` needs (zero points are zero).
    Without it no tensor byte is touched (Prequant Info on a memory-mapped file)."""
    try:
        if read_data:
            q, s, _ = qtensor.split(t)
        else:
            q, s = t.qdata, t.scale
            s.numel(), tuple(t.shape), q.dtype  # noqa: B018 - a pickled tensor may lack or mistype any of these
    except Exception as e:  # noqa: BLE001 - any inconsistency inside a stranger's tensor is corruption
        raise CorruptCheckpointError(f"Quantized tensor '{key}' is inconsistent.", path=path,
                                     found=f"{type(e).__name__}: {str(e)[:200]}") from None
    rows = q.shape[0] if q.ndim else 0
    if q.ndim != 2 or s.numel() not in (1, rows) or tuple(t.shape) != tuple(q.shape):
        raise CorruptCheckpointError(f"Quantized tensor '{key}' has mismatched data and scale shapes.", path=path,
                                     found=f"data {tuple(q.shape)}, scale {tuple(s.shape)}")
    if q.dtype not in QUANT_CODE_DTYPES:
        raise CorruptCheckpointError(f"Quantized tensor '{key}' stores {q.dtype} codes.", path=path,
                                     expected="int8 or float8 codes")
