"""Structural checks shared by readers: a state dict is str -> tensor, quantized tensors are self-consistent."""
from __future__ import annotations

import torch

from .. import qtensor
from ..errors import CorruptCheckpointError

QUANT_CODE_DTYPES = (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2)
MAX_DIM = 2**40


def dense_layout_problem(t: torch.Tensor) -> str | None:
    """Why ``t`` is not laid out like a saved weight (each element stored once, in one block), or None.

    A stride-0 or overlapping view stores a few bytes yet declares any size: expanding, copying, hashing or moving
    it to a GPU materialises the declared size. torch.save and safetensors write weights densely, so no real
    checkpoint has such a view. A permuted (transposed) dense tensor is fine.
    """
    if t.layout != torch.strided:
        return f"layout {t.layout}"
    shape, stride = tuple(t.shape), tuple(t.stride())
    if any(d > MAX_DIM for d in shape):
        return f"a dimension beyond {MAX_DIM} in shape {shape}"
    if t.numel() == 0:
        return None
    expected = 1
    for size, st in sorted(((sz, st) for sz, st in zip(shape, stride) if sz != 1), key=lambda p: p[1]):
        if st != expected:
            return f"a strided view (shape {shape}, strides {stride}): elements repeat or are spread out"
        expected *= size
    return None


def _check_layout(key: str, t: torch.Tensor, path: str, what: str = "") -> None:
    problem = dense_layout_problem(t)
    if problem:
        raise CorruptCheckpointError(f"Tensor '{key[:80]}'{what} is not stored densely: {problem}. A saved "
                                     "weight never looks like this; the file was crafted or damaged.", path=path,
                                     fix="Download or build the file again.")


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
        else:
            _check_layout(k, v, path)
        out[k] = v
    return out


def check_quantized(key: str, t, path: str, *, read_data: bool = True) -> None:
    """Shapes and dtypes always; with ``read_data`` also the values ``qtensor.split`` needs (zero points are zero).
    Without it no tensor byte is touched (Prequant Info on a memory-mapped file)."""
    try:
        q, s = t.qdata, t.scale
        zp = getattr(t, "zero_point", None)
        s.numel(), tuple(t.shape), q.dtype  # noqa: B018 - a pickled tensor may lack or mistype any of these
        parts = [(q, " (codes)"), (s, " (scale)")] + ([(zp, " (zero point)")] if isinstance(zp, torch.Tensor) else [])
    except Exception as e:  # noqa: BLE001 - any inconsistency inside a stranger's tensor is corruption
        raise CorruptCheckpointError(f"Quantized tensor '{key[:80]}' is inconsistent.", path=path,
                                     found=f"{type(e).__name__}: {str(e)[:200]}") from None
    for part, what in parts:
        if not isinstance(part, torch.Tensor):
            raise CorruptCheckpointError(f"Quantized tensor '{key[:80]}'{what} is not a tensor.", path=path,
                                         found=type(part).__name__)
        _check_layout(key, part, path, what)
    rows = q.shape[0] if q.ndim else 0
    if q.ndim != 2 or s.numel() not in (1, rows) or tuple(t.shape) != tuple(q.shape):
        raise CorruptCheckpointError(f"Quantized tensor '{key[:80]}' has mismatched data and scale shapes.",
                                     path=path, found=f"data {tuple(q.shape)}, scale {tuple(s.shape)}")
    if 0 in q.shape:
        # a per-tensor scale is repeated per row: an empty weight declaring a billion rows would cost gigabytes
        raise CorruptCheckpointError(f"Quantized tensor '{key[:80]}' has no elements.", path=path,
                                     found=f"data {tuple(q.shape)}", fix="Download or build the file again.")
    if q.dtype not in QUANT_CODE_DTYPES:
        raise CorruptCheckpointError(f"Quantized tensor '{key[:80]}' stores {q.dtype} codes.", path=path,
                                     expected="int8 or float8 codes")
    if read_data:
        try:
            qtensor.split(t)
        except Exception as e:  # noqa: BLE001
            raise CorruptCheckpointError(f"Quantized tensor '{key[:80]}' is inconsistent.", path=path,
                                         found=f"{type(e).__name__}: {str(e)[:200]}") from None
        check_scale_finite(key, s, path)


def check_scale_finite(key: str, s, path: str) -> None:
    try:
        finite = bool(torch.isfinite(s).all()) if s.is_floating_point() else False
    except Exception as e:  # noqa: BLE001 - a stranger's tensor
        raise CorruptCheckpointError(f"The scale of quantized tensor '{key[:80]}' cannot be read.", path=path,
                                     found=f"{type(e).__name__}: {str(e)[:200]}") from None
    if not finite:
        raise CorruptCheckpointError(f"The scale of quantized tensor '{key[:80]}' is not finite (NaN or infinity) "
                                     "or not a float: every output of that layer would be NaN.", path=path,
                                     found=f"scale {s.dtype} {tuple(s.shape)}",
                                     fix="Download or build the file again.")
