"""Structural checks shared by readers: a state dict is str -> tensor, quantized tensors are self-consistent."""
from __future__ import annotations

import torch

from ..schemes import codec as codec_checks, qtensor
from ..errors import CorruptCheckpointError
from .tensor_fields import check_fields

QUANT_CODE_DTYPES = (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2)
MAX_ROW_SCALE = codec_checks.MAX_ROW_SCALE
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
    check_fields(key, t, path)  # what the tensor carries besides its bytes, before any arithmetic
    codec = qtensor.codec_of(t)
    if codec.block:
        return _check_block(key, t, codec, path, read_data=read_data)
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
    if q.dtype not in codec.code_dtypes:
        raise CorruptCheckpointError(f"Quantized tensor '{key[:80]}' ({codec.kind}) stores {q.dtype} codes.",
                                     path=path, expected=" or ".join(str(d).replace("torch.", "")
                                                                     for d in codec.code_dtypes) + " codes")
    if read_data:
        try:
            ts, _ = codec.parts(t)
        except Exception as e:  # noqa: BLE001
            raise CorruptCheckpointError(f"Quantized tensor '{key[:80]}' is inconsistent.", path=path,
                                         found=f"{type(e).__name__}: {str(e)[:200]}") from None
        check_scale_finite(key, s, path)
        codec.check_values(key, t, ts, path)


def _check_block(key: str, t, codec, path: str, *, read_data: bool) -> None:
    try:
        parts = [(t.qdata, " (codes)"), (t.scale, " (block scales)"), *codec.side_tensors(t)]
        problem = None
        for part, what in parts:
            if not isinstance(part, torch.Tensor):
                problem = f"{what.strip(' ()')} is {type(part).__name__}"
                break
        if problem is None and (t.qdata.ndim != 2 or 0 in t.qdata.shape):
            problem = f"data {tuple(t.qdata.shape)}: expected a non-empty 2-D weight"
        problem = problem or codec.structure_problem(t)
    except Exception as e:  # noqa: BLE001 - any inconsistency inside a stranger's tensor is corruption
        problem = f"{type(e).__name__}: {str(e)[:200]}"
    if problem:
        raise CorruptCheckpointError(f"Quantized tensor '{key[:80]}' ({codec.kind}) is inconsistent.",
                                     path=path, found=problem, fix="Download or build the file again.")
    for part, what in parts:
        _check_layout(key, part, path, what)
    if read_data:
        try:
            ts, _ = codec.parts(t)
        except Exception as e:  # noqa: BLE001
            raise CorruptCheckpointError(f"Quantized tensor '{key[:80]}' is inconsistent.", path=path,
                                         found=f"{type(e).__name__}: {str(e)[:200]}") from None
        codec.check_values(key, t, ts, path)


check_scale_finite = codec_checks.check_scale_finite


FINITE_CHUNK = 1 << 22  # elements summed at a time: a float32 sum of bf16 makes a float32 copy, 16 MiB here


def all_finite(v: torch.Tensor) -> bool:
    """A float32 sum is NaN / inf exactly when an element is (finite weights cannot overflow it): one fast pass, in
    chunks, so that checking a weight while it is read costs no second copy of it."""
    acc = torch.float64 if v.dtype == torch.float64 else torch.float32
    flat = _flat(v)
    return all(bool(torch.isfinite(flat[i:i + FINITE_CHUNK].sum(dtype=acc))) for i in range(0, flat.numel(),
                                                                                          FINITE_CHUNK))


def _flat(v: torch.Tensor) -> torch.Tensor:
    """``v``'s elements in storage order without a copy where the layout rule's permuted dense tensors allow it
    (``reshape(-1)`` of a ``.pt``'s transposed weight would copy the whole of it first, gathering a byte per cache
    line); else ``reshape(-1)``. Finiteness needs each element once, not their order."""
    run = codec_checks.dense_run(v)
    return v.reshape(-1) if run is None else run


def fp8_all_finite(v: torch.Tensor) -> bool:
    """The same for float8 storage (a pre-cast text encoder's layerwise weights): the float8 codes scan
    (``codec.any_special``: the storage run eight bytes at a time, whatever the layout or offset). e4m3fn's NaN is
    S.1111.111 (it has no infinity), e5m2's NaN and inf S.11111.xx."""
    return not codec_checks.any_special(_flat(v).contiguous(), v.dtype)


PLAIN_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2)


def int8_encoder_parts(ck) -> frozenset:
    """The integer tensors an int8 ConvRot text encoder (its own tag) stores as plain tensors: each layer's uint8
    ``.comfy_quant`` blob and the int8 codes beside it. Exempt from the float rule below only there; the encoder's
    judge (``text_encoders.checks.int8_convrot_reasons``) checks each through the ComfyUI-native layer rules and the
    quantized-value boundary instead."""
    from .checkpoint import TEXT_ENCODER_FORMAT_INT8_CONVROT
    if ck.format_tag != TEXT_ENCODER_FORMAT_INT8_CONVROT:
        return frozenset()
    out = set()
    for k, v in ck.tensors.items():
        if k.endswith(".comfy_quant") and isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.ndim == 1:
            out.add(k)
            w = ck.tensors.get(k[: -len(".comfy_quant")] + ".weight")
            if isinstance(w, torch.Tensor) and w.dtype == torch.int8:
                out.add(k[: -len(".comfy_quant")] + ".weight")
    return frozenset(out)


def check_plain_tensors(tensors: dict, path: str, *, read_data: bool = True, exempt=frozenset()) -> None:
    """Unquantized tensors are floating-point weights (an integer, bool, complex or quantized-dtype tensor would be
    cast silently into a float parameter), and, when their bytes may be read, finite: one NaN or infinity in a norm
    or a bias makes every output of the model NaN. ``exempt``: ``int8_encoder_parts``."""
    for k, v in tensors.items():
        if qtensor.is_quantized(v) or not isinstance(v, torch.Tensor) or k in exempt:
            continue
        if v.dtype not in PLAIN_DTYPES:
            raise CorruptCheckpointError(f"Tensor '{k[:80]}' is {str(v.dtype).replace('torch.', '')}, not a "
                                         "floating-point weight: a transformer's unquantized tensors are floats.",
                                         path=path, expected="bfloat16 / float16 / float32",
                                         found=str(v.dtype).replace("torch.", ""),
                                         fix="Download or build the file again.")
        if read_data and v.numel() and not (all_finite(v) if v.dtype in PLAIN_DTYPES[:4] else fp8_all_finite(v)):
            raise CorruptCheckpointError(f"Tensor '{k[:80]}' holds NaN or infinite values: every output of the model "
                                         "would be NaN.", path=path, found=f"{v.dtype} {tuple(v.shape)}",
                                         fix="Download or build the file again.")
