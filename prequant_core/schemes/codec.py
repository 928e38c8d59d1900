"""What every weight kind's codec answers, and the pieces codecs share.

A *codec* is one weight kind's tensor layout in one object, held by its scheme module (``int8.py``, ``fp8.py``,
``nvfp4.py``, ``mxfp8.py``) and reached through its scheme record: which torchao class holds it, how it splits
into plain parts with the rows first (the form ComfyUI keeps) and is rebuilt from them, how it dequantizes and
requantizes, which attributes a file may give it, which of them are fingerprinted, how torchao's JSON describes it,
what a stranger's copy must satisfy, and which matmul a device can run for it. ``qtensor``, the readers, the
validation, the fingerprint, ``devices`` and ``nodes/ops`` ask the codec instead of testing kind names, so a new
weight kind is its scheme module plus one registry line (tests/toy/toy_kind.py).

This module imports nothing of torchao at import time and nothing of this pack but errors: scheme modules and
``qtensor`` import it, never the other way round.
"""
from __future__ import annotations

import dataclasses
import functools
import sys

import torch

from ..errors import CorruptCheckpointError


@dataclasses.dataclass(frozen=True)
class QSpec:
    """Everything but the tensors: enough to rebuild the torchao tensor or to requantize a dense weight alike."""
    kind: str  # the codec's kind: "int8" | "float8" | "nvfp4" | "mxfp8" | ...
    dtype: torch.dtype  # logical (high precision) dtype, e.g. bfloat16
    attrs: tuple  # sorted (name, value) pairs passed back to the torchao constructor

    def as_kwargs(self) -> dict:
        return dict(self.attrs)

    @property
    def rotation(self) -> int:
        """ConvRot group size (the layer's input is rotated by a block Hadamard of this size), 0 if none."""
        return int(dict(self.attrs).get("rotation", 0) or 0)

    @property
    def dynamic(self) -> bool:
        """The weight carries dynamic activation quantization (what torchao's quantized matmul needs)."""
        return dict(self.attrs).get("act_quant_kwargs") is not None


class QParts:
    """A weight that no single torchao tensor can hold (fused rows of NVFP4 weights whose per-tensor scales differ).
    Quacks like a weight where placement looks (``shape``, ``dtype``)."""

    def __init__(self, tensors: tuple, spec: QSpec, cols: int):
        self.tensors, self.spec = tuple(tensors), spec
        self.shape = torch.Size((self.tensors[0].shape[0], cols))
        self.dtype = spec.dtype
        self.ndim = 2

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]


ROTATION_ATTR = "prequant_rotation"  # set on a torchao tensor whose layer input is rotated (ConvRot, v2 files)


def rotation_attrs(t) -> dict:
    g = getattr(t, ROTATION_ATTR, 0)
    return {"rotation": int(g)} if g else {}


def set_rotation(t, spec: QSpec):
    if spec.rotation:
        setattr(t, ROTATION_ATTR, spec.rotation)
    return t


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def unswizzle(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """torchao's blocked (swizzled) scale layout, which its GPU kernels read, back to row-major [rows, cols]."""
    from torchao.prototype.mx_formats.utils import from_blocked
    return from_blocked(scale.reshape(-1), rows, cols).contiguous()


_TABLES: dict = {}


def decode_table(name: str, device) -> torch.Tensor:
    """Decode tables (float32), built on the CPU from torch's / torchao's own conversions, copied once per device:
    ``e4m3`` and ``e8m0`` map a byte to its value, ``e2m1x2`` a packed byte to its two values (low nibble first);
    ``e2m1x2h`` holds those two as one int32, their fp16 bit patterns side by side (each is exact in fp16), for a
    gather of half the bytes."""
    key = (name, str(device))
    if key not in _TABLES:
        b = torch.arange(256, dtype=torch.uint8)
        if name == "e2m1x2h":
            t = decode_table("e2m1x2", "cpu").to(torch.float16).view(torch.int32).reshape(256)
        elif name == "e4m3":
            t = b.view(torch.float8_e4m3fn).to(torch.float32)
        elif name == "e5m2":
            t = b.view(torch.float8_e5m2).to(torch.float32)
        elif name == "e8m0":
            from torchao.prototype.mx_formats.mx_tensor import get_fp_scale
            t = get_fp_scale(b.view(torch.float8_e8m0fnu))
        else:
            from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
            t = f4_unpacked_to_f32(unpack_uint4(b.reshape(256, 1))).reshape(256, 2)
        _TABLES[key] = t.to(device)
    return _TABLES[key]


def decode(table: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    idx = codes.reshape(-1).to(torch.int32)
    return torch.index_select(table, 0, idx).reshape(*codes.shape, *table.shape[1:])


BLOCK_TORCHAO = (0, 18)  # the torchao whose NVFP4Tensor / MXTensor fields this pack reads (earlier ones differ)


@functools.lru_cache(maxsize=None)
def require_block_torchao() -> None:
    """NVFP4 / MX weights need torchao's current tensor classes: say which torchao, rather than fail inside it."""
    import torchao
    from ..errors import DependencyError
    try:
        have = tuple(int(x) for x in torchao.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return
    if have < BLOCK_TORCHAO:
        raise DependencyError("NVFP4 and MXFP8 weights need a newer torchao.",
                              expected=f"torchao >= {BLOCK_TORCHAO[0]}.{BLOCK_TORCHAO[1]}",
                              found=f"torchao {torchao.__version__}",
                              fix=f"pip install -U 'torchao>={BLOCK_TORCHAO[0]}.{BLOCK_TORCHAO[1]}' in ComfyUI's "
                                  "Python environment.")


MAX_ROW_SCALE = 1e35  # per-row scales: 448 x this stays finite


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


def refuse_nan_scales(key: str, bad: bool, path: str) -> None:
    if bad:
        raise CorruptCheckpointError(f"A block scale of quantized tensor '{key[:80]}' is NaN: every output of "
                                     "that layer would be NaN.", path=path, fix="Download or build the file again.")


# Float8 codes that are not numbers: (byte & mask) == mask. e4m3fn: 0x7f / 0xff are NaN; e5m2 (also its infinities):
# exponent bits 0x7c all set. Tested eight bytes at a time: with the mask applied each byte is at most ``mask``, and
# adding ``carry`` sets its top bit exactly when it equals the mask, without carrying into the next byte.
_SPECIAL = {torch.float8_e4m3fn: (0x7F, 0x01), torch.float8_e5m2: (0x7C, 0x04)}
SCAN_ROWS_BYTES = 1 << 23  # a block of rows scanned at a time: 8 MiB of codes, its temporaries stay in cache


def dense_run(t: torch.Tensor) -> torch.Tensor | None:
    """``t``'s elements as the one contiguous 1-D run of its storage they occupy, without a copy, when ``t`` is a
    permutation of a contiguous tensor (row-major, or a ``.pt``'s transposed weight: the layout rule allows both);
    None when its elements leave gaps or repeat (the caller then takes the strided path). A scan that needs each
    element once and not their order reads this run front to back: reading a transposed view in its logical order
    instead gathers one byte per cache line (issue 58: 15x the row-major cost, bench/RESULTS-cpu.md)."""
    if t.is_contiguous():
        return t.reshape(-1)  # a view
    order = sorted(range(t.ndim), key=lambda d: t.stride(d), reverse=True)
    p = t.permute(order)
    # contiguous after the permutation: the elements fill storage[offset : offset + numel] exactly once each, so
    # the run holds the view's bytes and no byte outside it (a NaN beside the view is never read)
    return p.reshape(-1) if p.is_contiguous() else None


def _words(b: torch.Tensor):
    """``b`` (uint8, contiguous) as the widest integer view its size and address allow."""
    for dt, n in ((torch.int64, 8), (torch.int32, 4)):
        if b.numel() % n == 0 and b.data_ptr() % n == 0 and b.storage_offset() % n == 0:
            return b.view(dt), n
    return b, 1


def _repeat(byte: int, n: int) -> int:
    v = int.from_bytes(bytes([byte]) * n, "little")
    return v - (1 << (8 * n)) if v >= 1 << (8 * n - 1) else v  # as a signed word


def _any_special_words(b: torch.Tensor, mask: int, carry: int) -> bool:
    """Whether contiguous bytes ``b`` hold a special code, as the widest words ``_words`` allows."""
    w, n = _words(b)
    if n == 1:
        return bool(((w & mask) == mask).any())
    t = w & _repeat(mask, n)  # the block's one temporary; the rest in place
    return bool(t.add_(_repeat(carry, n)).bitwise_and_(_repeat(0x80, n)).any())


def any_special(run: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether a contiguous 1-D run of float8 bytes (``dense_run``) holds a NaN (or, for e5m2, an infinite) code,
    in blocks of ``SCAN_ROWS_BYTES``. A run that starts at an odd address (a ``.pt`` may store a tensor at any
    storage offset) is scanned as its unaligned head and tail bytes, at most seven each, plus the 8-byte words
    between them: byte at a time over the whole run cost 4.8x (issue 58, bench/RESULTS-cpu.md)."""
    mask, carry = _SPECIAL[dtype]
    b = run.view(torch.uint8) if run.dtype != torch.uint8 else run
    head = min(b.numel(), -b.data_ptr() % 8)
    body = (b.numel() - head) // 8 * 8
    for edge in (b[:head], b[head + body:]):
        if edge.numel() and bool(((edge & mask) == mask).any()):
            return True
    step = max(8, SCAN_ROWS_BYTES // 8 * 8)
    return any(_any_special_words(b[i:min(i + step, head + body)], mask, carry) for i in range(head, head + body, step))


def _first_row(b: torch.Tensor, step: int, mask: int, carry: int) -> tuple[int, int] | None:
    """``first_special_row`` on the logical rows of ``b``, a block of ``step`` rows at a time (each block copied
    when ``b`` is not contiguous): where ``b`` has no dense run, and to name the row of a row-major hit."""
    for r0 in range(0, b.shape[0], step):
        blk = b[r0:r0 + step]
        if not blk.is_contiguous():
            blk = blk.contiguous()
        if _any_special_words(blk.reshape(-1), mask, carry):
            bad = ((blk & mask) == mask).any(dim=1)
            return r0 + int(bad.nonzero()[0, 0]), int(bad.sum())
    return None


def first_special_row(codes: torch.Tensor, dtype: torch.dtype) -> tuple[int, int] | None:
    """(row, count of such rows in its block) of the first row of float8 ``codes`` (stored as ``dtype`` or as bytes)
    that holds a NaN (or, for e5m2, an infinity); None when every code is a number. One pass over the storage run the
    codes occupy (``dense_run``), eight bytes at a time, whatever the layout (row-major, transposed, any offset);
    only a file that holds such a code pays for finding its row (bench/bench_nan_scan.py measures it against reading
    the file). A block is ``SCAN_ROWS_BYTES // width`` logical rows, as the row-by-row pass counts them."""
    mask, carry = _SPECIAL[dtype]
    b = codes.view(torch.uint8) if codes.dtype != torch.uint8 else codes
    if b.ndim != 2 or 0 in b.shape:
        return None
    step = max(1, SCAN_ROWS_BYTES // max(1, b.shape[1]))
    run = dense_run(b)
    if run is None:
        return _first_row(b, step, mask, carry)
    if not any_special(run, dtype):
        return None
    if b.is_contiguous():
        return _first_row(b, step, mask, carry)
    # transposed: the storage holds columns; which rows hold a special code is folded column block by column block
    cols = b.t()  # contiguous (a 2-D permutation that is not row-major)
    bad = torch.zeros(b.shape[0], dtype=torch.bool)
    cstep = max(1, SCAN_ROWS_BYTES // b.shape[0])
    for c0 in range(0, cols.shape[0], cstep):
        bad |= ((cols[c0:c0 + cstep] & mask) == mask).any(dim=0).cpu()
    row = int(bad.nonzero()[0, 0])
    r0 = row - row % step
    return row, int(bad[r0:r0 + step].sum())


def refuse_special_codes(key: str, codes: torch.Tensor, dtype: torch.dtype, path: str, what: str = "float8") -> None:
    """``CorruptCheckpointError`` naming the tensor and the first row whose codes are NaN (or infinite): that row's
    output would be NaN in every image, with no error."""
    found = first_special_row(codes, dtype)
    if found is None:
        return
    row, n = found
    name = str(dtype).replace("torch.", "")
    kind = "NaN" if dtype == torch.float8_e4m3fn else "NaN or infinite"
    raise CorruptCheckpointError(
        f"Row {row} of quantized tensor '{key[:80]}' holds {kind} {what} codes ({name}): every output of that row "
        "would be NaN, and so would the image.", path=path, expected=f"finite {name} codes",
        found=f"{kind} codes in row {row}" + (f" and {n - 1} more row(s) near it" if n > 1 else ""),
        fix="Download or build the file again; if it was made by a converter, convert it again from the dense model.")


def block_scale_problem(t, cols: int, block: int) -> str | None:
    """Why a per-block weight's scales do not fit its data (``cols`` logical columns in blocks of ``block``)."""
    from torchao.prototype.mx_formats.utils import ceil_div
    q, s = t.qdata, t.scale
    rows = q.shape[0]
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


def dequantize_rows(qdata: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, table: str = "e4m3") -> torch.Tensor:
    """``codes * scale`` per row in float32, then ``dtype``: the same numbers as ``RowCodec.dequantize`` (tested), in
    fewer passes over the weight (int8 promotes inside the multiply; fp8 widens exactly to fp16 first, as fp8 takes
    part in no type promotion). ``uint8`` codes are fp8 codes kept as bytes (devices without a float8 dtype)."""
    s = scale.to(torch.float32)
    if qdata.dtype == torch.int8:
        w = qdata * s
    elif qdata.dtype == torch.uint8:
        w = decode(decode_table(table, qdata.device), qdata) * s
    else:
        w = qdata.to(torch.float16) * s  # every e4m3 value is exact in fp16; the product is computed in fp32
    return w if dtype == torch.float32 else w.to(dtype)


def weight_only_rows(input: torch.Tensor, qdata: torch.Tensor, scale: torch.Tensor, bias=None,
                     table: str = "e4m3") -> torch.Tensor:
    """The per-row weight-only path: the rows dequantized to the input's (compute) dtype, then a dense linear.

    float32 compute (ComfyUI on a CPU) scales the output columns instead of the weight rows,
    ``(x @ codes^T) * scale^T``: the same product, one pass less over the weight (which dominates at small sizes);
    the rounding differs at float32 level. Half-precision compute dequantizes the rows first (``codes`` times a
    large activation sum could overflow fp16 before the scale brings it down)."""
    if input.dtype == torch.float32:
        from . import cpu_weight_only
        out = cpu_weight_only.blocked(input, qdata, lambda: cpu_weight_only.codes_rows(qdata, table))
        if out is None:
            w = decode(decode_table(table, qdata.device), qdata) if qdata.dtype == torch.uint8 else \
                qdata.to(torch.float32)
            out = torch.nn.functional.linear(input, w)
        out.mul_(scale.reshape(-1).to(torch.float32))
        if bias is not None:
            out.add_(bias.to(device=input.device, dtype=torch.float32))
        return out
    w = dequantize_rows(qdata, scale, input.dtype, table)
    if bias is not None:
        bias = bias.to(device=input.device, dtype=input.dtype)
    return torch.nn.functional.linear(input, w, bias)


class Codec:
    """One weight kind's layout. Subclasses set the class attributes and implement the methods marked so; the
    defaults are what most kinds share."""
    kind: str = ""  # what ``qtensor.kind_of`` says and ``QSpec.kind`` holds
    type_name: str = ""  # the in-memory class's name, as pickles and torchao's JSON ``_type`` spell it
    block: int = 0  # scales per block of this many input columns; 0: one scale per row
    code_dtypes: tuple = ()  # per-row kinds: the dtypes a stranger's codes may have
    # the attributes an instance may carry (a file supplies nothing else; tensor_fields checks)
    fields: frozenset = frozenset()
    fingerprint_fields: tuple = ("qdata", "scale")  # hashed in this order (Unsloth's table)
    json_parts: frozenset | None = None  # the flattened parts torchao's JSON form may have (None: not checked)
    float8_codes: bool = False  # codes are float8: a device without a float8 dtype keeps them as bytes
    cpu_matmul: str | None = None  # why the quantized matmul runs on a CPU, or None where it does not
    # requantizing a row depends on that row alone: a LoRA may patch the layer a block of rows at a time
    rows_alone: bool = True
    # every class a ``torch.save`` of this kind's tensor names ("module:Class"), besides torch's own: torch's
    # weights-only reader is allowed exactly these (formats/containers/pt.py). Listed here, not taken from whatever
    # torchao happened to register as safe when some module was imported: a fresh process must read every file.
    pickled: tuple = ()

    def pickle_classes(self) -> list:
        """The classes ``pickled`` names, imported (what the weights-only reader may rebuild)."""
        import importlib
        out = []
        for ref in self.pickled:
            mod, _, name = ref.partition(":")
            out.append(getattr(importlib.import_module(mod), name))
        return out

    def tensor_type(self) -> type:  # implement: the torchao class (imported when first asked)
        raise NotImplementedError

    def owns(self, t) -> bool:
        # no torchao tensor exists before torchao is imported: a file of plain tensors (a pre-cast text encoder)
        # is described without paying torchao's import
        if "torchao" not in sys.modules:
            return False
        return isinstance(t, self.tensor_type())

    def dynamic(self, t) -> bool:
        return getattr(t, "act_quant_kwargs", None) is not None

    def parts(self, t) -> tuple[tuple, QSpec]:  # implement: torchao tensor -> (plain parts, spec)
        raise NotImplementedError

    def assemble(self, tensors: tuple, spec: QSpec):  # implement: the inverse of ``parts``
        raise NotImplementedError

    def dequantize(self, tensors: tuple, spec: QSpec, dtype: torch.dtype) -> torch.Tensor:  # implement
        """The dense weight, bit for bit what torchao's own ``dequantize(dtype)`` gives, on any device."""
        raise NotImplementedError

    def quantize(self, dense: torch.Tensor, spec: QSpec, like: tuple | None = None,
                 keep: torch.Tensor | None = None) -> tuple:  # implement
        """``dense`` quantized like ``spec``'s weights (LoRA-patched weights). ``like``: the parts being replaced;
        a kind with per-row side values (NVFP4's row scale) keeps theirs for every row, or with ``keep`` (bool
        [out]) for those rows only."""
        raise NotImplementedError

    def torchao_form(self, tensors: tuple) -> bool:
        """Whether the parts have a torchao tensor (else torchao's quantized matmul cannot run them)."""
        return True

    def check_fields(self, t) -> None:
        """The values of a stranger's attributes (``field_checks``: each check raises its ``Bad``)."""

    def structure_problem(self, t) -> str | None:
        """Block kinds: why the shapes / dtypes are not what ``parts`` reads (no tensor byte touched), or None."""
        return None

    def side_tensors(self, t) -> list:
        """Block kinds: tensors besides qdata and scale a stranger's copy carries, as (tensor, what)."""
        return []

    def check_values(self, key: str, t, tensors: tuple, path: str) -> None:
        """The values ``parts`` produced that would make the layer's output NaN, infinite or sign-flipped; raises
        ``CorruptCheckpointError``."""

    def from_json(self, d: dict, parts: dict):  # implement
        """The tensor from torchao's JSON ``_data`` and its flattened parts (``json_values``: each check raises its
        ``DecodeError``)."""
        raise NotImplementedError

    def to_json(self, t) -> tuple[str, list]:
        """(torchao's JSON for ``t``, [(part name, tensor)]) as torchao's own safetensors writer lays them out, so
        torchao reads the files this pack writes."""
        import json
        from torchao.prototype.safetensors.safetensors_utils import TensorSubclassAttributeJSONEncoder
        names = list(t.tensor_data_names) + list(getattr(t, "optional_tensor_data_names", None) or [])
        return json.dumps(t, cls=TensorSubclassAttributeJSONEncoder), \
            [(n, getattr(t, n)) for n in names if getattr(t, n) is not None]

    def weight_only_linear(self, input, tensors: tuple, spec: QSpec, bias, table: str):
        """The weight-only matmul: the weight dequantized to the compute dtype, then a dense linear (in float32 on a
        CPU a block of rows at a time, where the codec can decode one: ``cpu_weight_only``)."""
        from . import cpu_weight_only
        out = cpu_weight_only.blocked(input, tensors[0], lambda: self.float32_rows(tensors, spec),
                                      None if bias is None else bias.to(torch.float32))
        if out is not None:
            return out
        return torch.nn.functional.linear(input, self.dequantize(tensors, spec, input.dtype), bias)

    def float32_rows(self, tensors: tuple, spec: QSpec):
        """A ``cpu_weight_only.Fill`` writing rows ``i:j`` of ``dequantize(tensors, spec, float32)``, the same numbers
        bit for bit, or None (then the whole weight is dequantized per call)."""
        return None

    def quantized_linear(self, input, tensors: tuple, spec: QSpec, bias):
        """torchao's quantized matmul on the torchao tensor rebuilt around the parts (no copy)."""
        return torch.nn.functional.linear(input, self.assemble(tensors, spec), bias)

    def runs_quantized(self, tensors: tuple, spec: QSpec) -> bool:
        """Whether torchao's quantized matmul takes these parts (else the layer runs weight-only)."""
        return self.torchao_form(tensors)

    def code_table(self, codes: torch.dtype, spec: QSpec) -> str:
        """The decode table ``weight_only_linear`` gets for a layer whose codes are of dtype ``codes`` (``uint8``:
        kept as bytes); ``float8_codes`` kinds say which float8 they are."""
        return "e4m3"

    def typed_codes(self, q: torch.Tensor, table: str) -> torch.Tensor:
        """``float8_codes`` kinds: codes kept as bytes, viewed as their float8 dtype again (CPU / CUDA)."""
        return q


class RowCodec(Codec):
    """Per-row kinds: ``(codes [out, in], scale [out, 1])`` around a torchao tensor with ``qdata`` / ``scale`` and
    a ``[1, in]`` block. Subclasses give the torchao constructor and quantizer."""

    def spec_attrs(self, t) -> dict:  # implement: the non-tensor constructor arguments
        raise NotImplementedError

    def make(self, qdata, scale, block_size, spec: QSpec):  # implement: the torchao constructor
        raise NotImplementedError

    def from_dense(self, dense, spec: QSpec):  # implement: torchao's per-row quantizer with spec's settings
        raise NotImplementedError

    def parts(self, t):
        zp = getattr(t, "zero_point", None)
        if zp is not None and bool(torch.any(zp != 0)):
            raise ValueError("asymmetric int8 weights (non-zero zero point) are not supported")
        scale = t.scale
        rows = t.qdata.shape[0]
        if scale.numel() == 1:
            scale = scale.reshape(1, 1).expand(rows, 1).contiguous()
        scale = scale.reshape(rows, 1)
        spec = QSpec(self.kind, t.dtype, tuple(sorted({**self.spec_attrs(t), **rotation_attrs(t)}.items())))
        return (t.qdata, scale), spec

    def assemble(self, tensors, spec):
        qdata, scale = tensors[0], tensors[1]
        return set_rotation(self.make(qdata, scale, [1, qdata.shape[-1]], spec), spec)

    def dequantize(self, tensors, spec, dtype):
        q, s = tensors[0], tensors[1]
        if q.dtype == torch.uint8:  # float8 codes kept as bytes: the spec says which float8 (e4m3 unless noted)
            name = spec.as_kwargs().get("codes", "e4m3")
            q = q.view(torch.float8_e5m2 if name == "e5m2" else torch.float8_e4m3fn) \
                if q.device.type in ("cpu", "cuda") else decode(decode_table(name, q.device), q)
        return (q.to(torch.float32) * s.to(torch.float32)).to(dtype)

    # rows quantized at a time: each row's codes and scale depend on that row alone (``from_dense`` is per row), so a
    # patched weight is requantized with its temporaries a few MB, not several copies of the whole layer
    QUANTIZE_ROWS = 512

    def quantize(self, dense, spec, like=None, keep=None):
        rows = dense.shape[0] if dense.ndim == 2 else 0
        if rows <= self.QUANTIZE_ROWS:
            return self.parts(self.from_dense(dense.to(spec.dtype), spec))[0]
        chunks = [self.parts(self.from_dense(dense[i:i + self.QUANTIZE_ROWS].to(spec.dtype), spec))[0]
                  for i in range(0, rows, self.QUANTIZE_ROWS)]
        return tuple(torch.cat(p) for p in zip(*chunks))

    def weight_only_linear(self, input, tensors, spec, bias, table):
        return weight_only_rows(input, tensors[0], tensors[1], bias, table)


def row_block_accepted(v, shape, whole_ok: bool = False) -> bool:
    """The block shapes this pack reads for per-row weights, pickled or in torchao's JSON: ``[1, K]``, one block per
    row; with ``whole_ok`` (fp8 holding one scale) also the whole weight ``[N, K]``, the stale per-tensor fp8 of
    Unsloth's older builds, decoded so that Info can describe it and validation can name it stale."""
    if not (isinstance(v, (list, tuple)) and len(v) == 2
            and all(isinstance(i, int) and not isinstance(i, bool) for i in v)):
        return False
    return (v[0] == 1 and len(shape) > 0 and v[1] == shape[-1]) or (whole_ok and list(v) == list(shape))
