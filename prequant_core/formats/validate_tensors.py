"""Structural checks shared by readers: a state dict is str -> tensor, quantized tensors are self-consistent."""
from __future__ import annotations

import torch

from ..schemes import qtensor
from ..errors import CorruptCheckpointError
from .tensor_fields import check_fields

QUANT_CODE_DTYPES = (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2)
MAX_NVFP4_TENSOR_SCALE = 1e35  # 6 x 448 x this stays below bf16's / float32's largest value (3.4e38)
MAX_MX_EXPONENT = 246  # 448 x 2^(246 - 127) is finite in bf16 / float32
MAX_ROW_SCALE = 1e35  # int8 / fp8 per-row scales: 448 x this stays finite
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


def _block_problem(t) -> str | None:
    """Why a per-block weight (NVFP4 / MX) is not what ``qtensor.parts`` reads, from shapes and dtypes only."""
    from torchao.prototype.mx_formats.utils import ceil_div
    q, s = t.qdata, t.scale
    if q.ndim != 2 or 0 in q.shape:
        return f"data {tuple(q.shape)}: expected a non-empty 2-D weight"
    rows = q.shape[0]
    if qtensor.kind_of(t) == "nvfp4":
        cols, block = q.shape[1] * 2, int(t.block_size)
        if q.dtype != torch.uint8 or s.dtype != torch.float8_e4m3fn or block != qtensor.NVFP4_BLOCK:
            return f"data {q.dtype}, scales {s.dtype}, block {block}: expected uint8, float8_e4m3fn, 16"
        pts = t.per_tensor_scale
        if pts is not None and (not isinstance(pts, torch.Tensor) or pts.numel() != 1):
            return "a per-tensor scale that is not one number"
    else:
        cols, block = q.shape[1], int(t.block_size)
        if t.elem_dtype not in (torch.float8_e4m3fn, torch.float8_e5m2) or q.dtype != t.elem_dtype:
            return f"MX elements {t.elem_dtype} / data {q.dtype}: only mxfp8 (float8 elements) is supported"
        if s.dtype != torch.float8_e8m0fnu:
            return f"MX scales {s.dtype}, expected float8_e8m0fnu"
    if block <= 0 or cols % block:
        return f"width {cols} is not a multiple of the block size {block}"
    n = cols // block
    # the shape, not only the count, says which layout the scales are in: a flipped is_swizzled_scales flag with a
    # count that happens to fit would silently scramble every block's scale
    want = (ceil_div(rows, 128) * 32, ceil_div(n, 4) * 16) if t.is_swizzled_scales else (rows, n)
    if tuple(s.shape) != want:
        layout = "swizzled (128 x 4 tiles)" if t.is_swizzled_scales else "row-major"
        return f"block scales {tuple(s.shape)} for data {tuple(q.shape)}, expected {want} ({layout}, as the " \
               "tensor's is_swizzled_scales flag says)"
    return None


def check_quantized(key: str, t, path: str, *, read_data: bool = True) -> None:
    """Shapes and dtypes always; with ``read_data`` also the values ``qtensor.split`` needs (zero points are zero).
    Without it no tensor byte is touched (Prequant Info on a memory-mapped file)."""
    check_fields(key, t, path)  # what the tensor carries besides its bytes, before any arithmetic
    if qtensor.kind_of(t) in qtensor.BLOCK_KINDS:
        return _check_block(key, t, path, read_data=read_data)
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


def _check_block(key: str, t, path: str, *, read_data: bool) -> None:
    try:
        parts = [(t.qdata, " (codes)"), (t.scale, " (block scales)")]
        pts = getattr(t, "per_tensor_scale", None)
        if pts is not None:
            parts.append((pts, " (per-tensor scale)"))
        problem = None
        for part, what in parts:
            if not isinstance(part, torch.Tensor):
                problem = f"{what.strip(' ()')} is {type(part).__name__}"
                break
        problem = problem or _block_problem(t)
    except Exception as e:  # noqa: BLE001 - any inconsistency inside a stranger's tensor is corruption
        problem = f"{type(e).__name__}: {str(e)[:200]}"
    if problem:
        raise CorruptCheckpointError(f"Quantized tensor '{key[:80]}' ({qtensor.kind_of(t)}) is inconsistent.",
                                     path=path, found=problem, fix="Download or build the file again.")
    for part, what in parts:
        _check_layout(key, part, path, what)
    if read_data:
        try:
            ts, _ = qtensor.parts(t)
        except Exception as e:  # noqa: BLE001
            raise CorruptCheckpointError(f"Quantized tensor '{key[:80]}' is inconsistent.", path=path,
                                         found=f"{type(e).__name__}: {str(e)[:200]}") from None
        if pts is not None:
            check_scale_finite(key, pts.reshape(1), path)
            p = float(pts.reshape(()))
            # codes x block scale reach 6 x 448; above this bound a weight is infinite in bf16 / float32
            if not 0 <= p <= MAX_NVFP4_TENSOR_SCALE or (p == 0 and bool(ts[0].any())):
                raise CorruptCheckpointError(
                    f"The per-tensor scale of NVFP4 weight '{key[:80]}' is {p:g}: "
                    + ("negative" if p < 0 else "zero, though the codes are not" if p == 0 else "so large that its "
                       "weights would be infinite") + ".", path=path,
                    expected=f"0 < per-tensor scale <= {MAX_NVFP4_TENSOR_SCALE:g}", found=f"{p:g}",
                    fix="Download or build the file again.")
        if qtensor.kind_of(t) == "nvfp4":  # e4m3 bytes 0x7f / 0xff are NaN: every weight of that block would be
            bad = ((ts[1] & 0x7F) == 0x7F).any()
            if (ts[1] & 0x80).any():  # a negative block scale flips the sign of its 16 weights
                raise CorruptCheckpointError(f"A block scale of NVFP4 weight '{key[:80]}' is negative.", path=path,
                                             expected="block scales >= 0", found="a negative e4m3 scale",
                                             fix="Download or build the file again.")
        else:  # e8m0 byte 0xff is NaN; 247..254 make e4m3 codes overflow bf16 / float32 (448 x 2^120 > 3.4e38)
            bad = (ts[1] == 0xFF).any()
            top = int(ts[1].max()) if ts[1].numel() else 0
            if top > MAX_MX_EXPONENT and top != 0xFF:
                raise CorruptCheckpointError(
                    f"A block exponent of MX weight '{key[:80]}' is {top} (2^{top - 127}): every weight of that block "
                    "would be infinite.", path=path, expected=f"block exponents <= {MAX_MX_EXPONENT}",
                    found=str(top), fix="Download or build the file again.")
        if bool(bad):
            raise CorruptCheckpointError(f"A block scale of quantized tensor '{key[:80]}' is NaN: every output of "
                                         "that layer would be NaN.", path=path, fix="Download or build the file again.")


def check_scale_finite(key: str, s, path: str) -> None:
    """Finite, not negative (a negative scale flips a row's sign) and small enough that the largest code times it
    stays finite."""
    try:
        finite = bool((torch.isfinite(s) & (s >= 0) & (s <= MAX_ROW_SCALE)).all()) if s.is_floating_point() else False
    except Exception as e:  # noqa: BLE001 - a stranger's tensor
        raise CorruptCheckpointError(f"The scale of quantized tensor '{key[:80]}' cannot be read.", path=path,
                                     found=f"{type(e).__name__}: {str(e)[:200]}") from None
    if not finite:
        raise CorruptCheckpointError(f"The scale of quantized tensor '{key[:80]}' is not finite (NaN or infinity), "
                                     f"negative, above {MAX_ROW_SCALE:g} or not a float: that layer's output would be "
                                     "NaN, infinite or sign-flipped.", path=path,
                                     found=f"scale {s.dtype} {tuple(s.shape)}",
                                     fix="Download or build the file again.")


PLAIN_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2)


def check_plain_tensors(tensors: dict, path: str, *, read_data: bool = True) -> None:
    """Unquantized tensors are floating-point weights (an integer, bool, complex or quantized-dtype tensor would be
    cast silently into a float parameter), and, when their bytes may be read, finite: one NaN or infinity in a norm
    or a bias makes every output of the model NaN."""
    for k, v in tensors.items():
        if qtensor.is_quantized(v) or not isinstance(v, torch.Tensor):
            continue
        if v.dtype not in PLAIN_DTYPES:
            raise CorruptCheckpointError(f"Tensor '{k[:80]}' is {str(v.dtype).replace('torch.', '')}, not a "
                                         "floating-point weight: a transformer's unquantized tensors are floats.",
                                         path=path, expected="bfloat16 / float16 / float32",
                                         found=str(v.dtype).replace("torch.", ""),
                                         fix="Download or build the file again.")
        # one float32 sum is NaN / inf exactly when an element is (finite weights cannot overflow it): one fast pass
        if read_data and v.numel() and v.dtype in PLAIN_DTYPES[:4] and \
                not bool(torch.isfinite(v.sum(dtype=torch.float64 if v.dtype == torch.float64 else torch.float32))):
            raise CorruptCheckpointError(f"Tensor '{k[:80]}' holds NaN or infinite values: every output of the model "
                                         "would be NaN.", path=path, found=f"{v.dtype} {tuple(v.shape)}",
                                         fix="Download or build the file again.")
