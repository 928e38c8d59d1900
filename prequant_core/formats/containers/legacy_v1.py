"""Older hosted INT8 ``.pt`` files pickled torchao "v1" classes that current torchao no longer has.

Such a file holds, per quantized Linear, a ``LinearActivationQuantizedTensor`` (the dynamic per-token activation
quantizer) wrapping an ``AffineQuantizedTensor`` whose ``PlainAQTTensorImpl`` carries the int8 codes, a per-row
scale and an (all-zero or absent) zero point. ``torch.load(weights_only=True)`` refuses those class names, and
importing an old torchao is not an option, so this module reads the archive with its own unpickler:

* the pickle is interpreted by a subclass of the pure-Python ``pickle._Unpickler`` whose ``find_class`` knows an
  exact list of names (the v1 classes and the helper objects torchao 0.10-0.14 pickled beside them, the torch
  rebuild helpers ``torch.load(weights_only=True)`` itself allows, dtypes, storages) and maps each to an inert
  stand-in defined here. Any other name raises ``UnsafeCheckpointError`` before anything is called.
* the opcodes that call or instantiate (REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ, BUILD) only accept those stand-ins,
  so nothing from the file reaches a Python callable outside this module.
* storages are read like ``torch.load(mmap=True)``: the archive is memory-mapped once and each record is a slice
  of it (nothing copied until a tensor is used).

The decoded weights become current torchao ``Int8Tensor``s with the codes and scales of the file, bit for bit
(a bf16 scale widens to float32 exactly), and the activation quantization of this pack's ``int8`` scheme, so a
legacy file runs like a current one holding the same codes.
"""
from __future__ import annotations

import collections
import dataclasses
import io
import pickle
import sys

import torch

from .. import fingerprint
from ...schemes import qtensor
from ... import schemes
from ..checkpoint import Checkpoint
from ...errors import CorruptCheckpointError, PrequantError, UnsafeCheckpointError, UnsupportedFormatError
from .. import pickle_guard, plain_data
from ..file_handle import OpenedFile, opened
from ..validate_tensors import MAX_DIM, check_state_dict, dense_layout_problem

V1_TENSORS = {
    ("torchao.quantization.linear_activation_quantized_tensor", "LinearActivationQuantizedTensor"): "LAQT",
    ("torchao.dtypes.affine_quantized_tensor", "AffineQuantizedTensor"): "AQT",
    ("torchao.dtypes.uintx.plain_layout", "PlainAQTTensorImpl"): "PlainAQTTensorImpl",
}
# input_quant_func of LinearActivationQuantizedTensor: a module-level function pickled by reference.
ACT_FUNCS = {
    "_int8_symm_per_token_reduced_range_quant": "symmetric",
    "_int8_symm_per_token_reduced_range_quant_noop_decode": "symmetric",
    "_int8_asymm_per_token_quant": "asymmetric",
}
STORAGE_TYPES = {"ByteStorage", "CharStorage", "ShortStorage", "IntStorage", "LongStorage", "HalfStorage",
                 "FloatStorage", "DoubleStorage", "BFloat16Storage", "BoolStorage"}
DTYPE_NAMES = {"bfloat16", "float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool"}
LOGICAL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
HIGH_LEVEL = "LinearActivationQuantizedTensor / AffineQuantizedTensor / PlainAQTTensorImpl"


class _Refused(Exception):
    """Raised inside the unpickler; turned into UnsafeCheckpointError with the path by ``read_legacy_v1``."""


class _Bad(Exception):
    """Structurally wrong (but not dangerous): becomes CorruptCheckpointError."""


# ---- inert stand-ins for everything a legacy file may name -------------------------------------------------------

class _V1Class:
    """Stands for one torchao v1 tensor class. Only ever passed to the rebuild helpers, never called."""
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"<torchao v1 {self.name}>"


class _FuncRef:
    """Stands for a torchao module-level function pickled by reference (the activation quantizer)."""
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


class _StorageType:
    __slots__ = ("name", "dtype")

    def __init__(self, name, dtype):
        self.name, self.dtype = name, dtype


class _TypeMarker:
    """``torch.Tensor`` / ``torch.nn.Parameter`` named as the target type of ``_rebuild_from_type_v2``."""
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


class _PlainLayout:
    """torchao.dtypes.utils.PlainLayout (an empty dataclass)."""

    def __setstate__(self, state):
        if state not in (None, {}) and not isinstance(state, dict):
            raise _Bad("PlainLayout state is not a dict")


@dataclasses.dataclass
class _Storage:
    untyped: torch.UntypedStorage
    dtype: torch.dtype


@dataclasses.dataclass
class _Subclass:
    """A wrapper-subclass instance as pickled: its class, logical dtype and shape, then its ``__dict__``."""
    cls: _V1Class
    dtype: torch.dtype
    shape: tuple
    state: dict | None = None


_TENSOR = _TypeMarker("torch.Tensor")
_PARAMETER = _TypeMarker("torch.nn.Parameter")


def _ints(v, what, n=None):
    if not isinstance(v, (tuple, list)) or (n is not None and len(v) != n) or \
            not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= MAX_DIM for i in v):
        raise _Bad(f"{what} is not a tuple of non-negative integers: {str(v)[:60]}")
    return tuple(v)


# The two rebuild functions take the arguments torch.save pickled for torch._utils' functions of these names: their
# signatures are torch's, not this pack's.
def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata=None):
    if not isinstance(storage, _Storage):
        raise _Bad("a tensor refers to something that is not a storage of the archive")
    size, stride = _ints(size, "tensor size"), _ints(stride, "tensor stride")
    if len(size) != len(stride) or not isinstance(storage_offset, int) or storage_offset < 0:
        raise _Bad("tensor size / stride / offset are inconsistent")
    if backward_hooks is not None and (not isinstance(backward_hooks, dict) or backward_hooks):
        raise _Bad("a tensor carries backward hooks")
    if metadata:
        raise _Bad("a tensor carries extra tensor metadata")
    if storage_offset > MAX_DIM:
        raise _Bad("tensor offset is beyond any storage")
    itemsize = torch.empty((), dtype=storage.dtype).element_size()
    capacity = storage.untyped.nbytes() // itemsize
    if all(s > 0 for s in size):
        last = storage_offset + sum((s - 1) * st for s, st in zip(size, stride))
        if last >= capacity:
            raise _Bad(f"a tensor of size {size} reaches past the end of its storage")
    t = torch.empty((0,), dtype=storage.dtype)
    t.set_(storage.untyped, storage_offset, size, stride)
    problem = dense_layout_problem(t)
    if problem:
        raise _Bad(f"a tensor is not stored densely: {problem}")
    return t


def _rebuild_wrapper_subclass(cls, dtype, size, stride, storage_offset, layout, device, requires_grad):
    if not isinstance(cls, _V1Class):
        raise _Bad(f"a tensor subclass of unexpected type {type(cls).__name__}")
    if not isinstance(dtype, torch.dtype):
        raise _Bad("a tensor subclass has no dtype")
    return _Subclass(cls, dtype, _ints(size, "subclass size"))


def _rebuild_from_type_v2(func, new_type, args, state):
    if func not in (_rebuild_wrapper_subclass, _rebuild_tensor_v2) or not isinstance(args, tuple):
        raise _Bad("unexpected tensor rebuild")
    ret = func(*args)
    if isinstance(ret, _Subclass):
        if new_type is not ret.cls or not isinstance(state, dict):
            raise _Bad(f"{ret.cls.name} rebuilt with a mismatched type or state")
        ret.state = state
        return ret
    if new_type not in (_TENSOR, _PARAMETER):
        raise _Bad("a plain tensor rebuilt as an unexpected type")
    return ret  # python attributes on a plain tensor are ignored


def _rebuild_parameter(data, requires_grad, backward_hooks):
    return data


def _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state):
    return data


def _get_layout(name):
    if name != "torch.strided":
        raise _Bad(f"tensor layout {str(name)[:40]}")
    return torch.strided


def _device(spec, index=None):
    if not isinstance(spec, str):
        raise _Bad("device is not a string")
    return torch.device("cpu")  # everything is read onto the CPU, like torch.load(map_location="cpu")


def _enum(type_name, members):
    def decode(value):
        if value not in members:
            raise _Bad(f"unknown {type_name} value {str(value)[:20]}")
        return f"{type_name}.{members[value]}"
    decode.__name__ = f"_decode_{type_name}"
    return decode


_ZERO_POINT_DOMAIN = _enum("ZeroPointDomain", {1: "INT", 2: "FLOAT", 3: "NONE"})
_MAPPING_TYPE = _enum("MappingType", {1: "SYMMETRIC", 2: "SYMMETRIC_NO_CLIPPING_ERR", 3: "ASYMMETRIC"})


def _allowed() -> dict:
    table = {
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
        ("torch._utils", "_rebuild_wrapper_subclass"): _rebuild_wrapper_subclass,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
        ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter_with_state,
        ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
        ("torch.serialization", "_get_layout"): _get_layout,
        ("torch", "device"): _device,
        ("torch", "Size"): torch.Size,
        ("torch", "Tensor"): _TENSOR,
        ("torch.nn.parameter", "Parameter"): _PARAMETER,
        ("torch.torch_version", "TorchVersion"): str,  # a str subclass; read as a plain str
        ("torchao.dtypes.utils", "PlainLayout"): _PlainLayout,
        ("torchao.quantization.quant_primitives", "ZeroPointDomain"): _ZERO_POINT_DOMAIN,
        ("torchao.quantization.quant_primitives", "MappingType"): _MAPPING_TYPE,
    }
    for key, short in V1_TENSORS.items():
        table[key] = _V1Class(key[1])
    for name in ACT_FUNCS:
        table[("torchao.quantization.quant_api", name)] = _FuncRef(name)
    for name in DTYPE_NAMES:
        table[("torch", name)] = getattr(torch, name)
    for name in STORAGE_TYPES:
        table[("torch", name)] = _StorageType(name, torch.storage._get_dtype_from_pickle_storage_type(name))
    return table


_ALLOWED = _allowed()
# What REDUCE may call and NEWOBJ may instantiate: our own stand-ins and two harmless builtins.
_CALLABLE = {id(f): f for f in (collections.OrderedDict, torch.Size, _rebuild_tensor_v2, _rebuild_wrapper_subclass,
                                _rebuild_parameter, _rebuild_parameter_with_state, _rebuild_from_type_v2,
                                _get_layout, _device, _ZERO_POINT_DOMAIN, _MAPPING_TYPE)}
_INSTANTIABLE = (str, _PlainLayout, collections.OrderedDict)


class _Unpickler(pickle._Unpickler):
    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, data: bytes, load_record):
        super().__init__(io.BytesIO(data))
        self._load_record = load_record
        self._storages: dict = {}

    def find_class(self, module, name):
        hit = _ALLOWED.get((module, name))
        if hit is None:
            raise _Refused(f"{module}.{name}")
        return hit

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _Bad(f"unexpected persistent id {str(pid)[:60]}")
        _, stype, key, location, numel = pid
        if not isinstance(stype, _StorageType) or not isinstance(key, str) or not isinstance(numel, int) \
                or numel < 0:
            raise _Bad(f"malformed storage reference {str(pid)[:60]}")
        st = self._storages.get(key)
        if st is None:
            nbytes = numel * torch.empty((), dtype=stype.dtype).element_size()
            st = self._storages[key] = _Storage(self._load_record(key, nbytes, stype.dtype), stype.dtype)
        elif st.dtype != stype.dtype:
            raise _Bad(f"storage {key} is referenced with two dtypes")
        return st

    # -- opcodes that call or instantiate: only our stand-ins ------------------------------------------------------
    def _check_callable(self, func):
        if id(func) in _CALLABLE and _CALLABLE[id(func)] is func:
            return
        if isinstance(func, _V1Class):
            raise _Refused(f"a direct call of torchao's {func.name}(...) (a v1 file only rebuilds it)")
        if isinstance(func, _FuncRef):
            raise _Refused(f"a call of torchao's {func.name}(...) while loading")
        raise _Bad(f"the pickle calls a {type(func).__name__}")

    def load_reduce(self):
        stack = self.stack
        args = stack.pop()
        func = stack[-1]
        self._check_callable(func)
        if not isinstance(args, tuple):
            raise _Bad("REDUCE arguments are not a tuple")
        stack[-1] = func(*args)
    dispatch[pickle.REDUCE[0]] = load_reduce

    def load_newobj(self):
        args = self.stack.pop()
        cls = self.stack.pop()
        if cls not in _INSTANTIABLE:
            if isinstance(cls, (_V1Class, _FuncRef)):
                raise _Refused(f"instantiating torchao's {cls.name} directly")
            raise _Bad(f"the pickle instantiates a {type(cls).__name__}")
        if not isinstance(args, tuple) or (cls is str and not (len(args) == 1 and isinstance(args[0], str))) \
                or (cls is not str and args):
            raise _Bad(f"unexpected arguments for {cls.__name__}")
        self.append(cls.__new__(cls, *args))
    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def _refuse_op(self):
        raise _Bad("the pickle uses an opcode torch.save never writes (instance creation or a copyreg extension)")
    # EXT1/2/4 would read pickle's process-wide extension cache, which find_class never sees
    for _op in (pickle.NEWOBJ_EX, pickle.INST, pickle.OBJ, pickle.EXT1, pickle.EXT2, pickle.EXT4):
        dispatch[_op[0]] = _refuse_op
    del _op

    # container opcodes call .append / .extend / __setitem__ / .add on whatever is on the stack: plain containers only
    def _target(self, kinds):
        obj = self.stack[-1]
        if type(obj) not in kinds:
            raise _Bad(f"the pickle fills a {type(obj).__name__} as if it were a container")
        return obj

    def load_append(self):
        value = self.stack.pop()
        self._target((list,)).append(value)
    dispatch[pickle.APPEND[0]] = load_append

    def load_appends(self):
        items = self.pop_mark()
        self._target((list,)).extend(items)
    dispatch[pickle.APPENDS[0]] = load_appends

    def load_setitem(self):
        value = self.stack.pop()
        key = self.stack.pop()
        self._target((dict, collections.OrderedDict))[key] = value
    dispatch[pickle.SETITEM[0]] = load_setitem

    def load_setitems(self):
        items = self.pop_mark()
        d = self._target((dict, collections.OrderedDict))
        for i in range(0, len(items), 2):
            d[items[i]] = items[i + 1]
    dispatch[pickle.SETITEMS[0]] = load_setitems

    def load_additems(self):
        items = self.pop_mark()
        self._target((set,)).update(items)
    dispatch[pickle.ADDITEMS[0]] = load_additems

    def load_build(self):
        state = self.stack.pop()
        inst = self.stack[-1]
        if isinstance(inst, _PlainLayout):
            inst.__setstate__(state)
            return
        if isinstance(inst, collections.OrderedDict) and not state:
            return
        raise _Bad(f"the pickle sets the state of a {type(inst).__name__}")
    dispatch[pickle.BUILD[0]] = load_build


# ---- the archive ---------------------------------------------------------------------------------------------------

def _open_archive(fh: OpenedFile, mmap: bool):
    path = fh.path
    reader, data = pickle_guard.open_checked(fh)
    order = "little"
    if reader.has_record("byteorder"):
        if reader.get_record_size("byteorder") > 16:
            raise CorruptCheckpointError("The .pt archive declares an unknown byte order.", path=path)
        order = bytes(reader.get_record("byteorder")).decode("utf-8", "replace")
    if order not in ("little", "big"):
        raise CorruptCheckpointError("The .pt archive declares an unknown byte order.", path=path, found=order[:20])
    size = fh.size
    whole = torch.UntypedStorage.from_file(fh.io_path, False, size) if mmap else None

    def load_record(key: str, nbytes: int, dtype) -> torch.UntypedStorage:
        name = f"data/{key}"
        if not reader.has_record(name):
            raise _Bad(f"storage record {key[:20]} is missing")
        if reader.get_record_size(name) != nbytes:
            raise _Bad(f"storage record {key[:20]} holds {reader.get_record_size(name)} bytes, expected {nbytes}")
        if whole is not None:
            off = reader.get_record_offset(name)
            if off < 0 or off + nbytes > size:
                raise _Bad(f"storage record {key[:20]} points outside the file")
            st = whole[off: off + nbytes]
        else:
            st = torch.frombuffer(bytearray(reader.get_record(name)), dtype=torch.uint8).untyped_storage() \
                if nbytes else torch.UntypedStorage(0)
        if order != sys.byteorder:
            st.byteswap(dtype)
        return st

    return data, load_record


def _unpickle(fh: OpenedFile, mmap: bool):
    """The container object, with v1 tensors as inert records. Refuses any name outside the allowlist."""
    path = fh.path
    data, load_record = _open_archive(fh, mmap)
    try:
        return _Unpickler(data, load_record).load()
    except _Refused as e:
        raise UnsafeCheckpointError(
            "Refused to load: this legacy .pt file asks Python for something that is not part of a torchao v1 "
            "INT8 checkpoint (a pickle that could run code). Nothing from it was executed.",
            path=path, expected=f"torchao v1 int8 tensors ({HIGH_LEVEL}), plain tensors and containers",
            found=str(e)[:200], fix="Only load checkpoints from sources you trust; prefer .safetensors.") from None
    except PrequantError:
        raise
    except (_Bad, pickle.UnpicklingError, EOFError, ValueError, TypeError, RuntimeError, KeyError, IndexError,
            AttributeError, OverflowError, RecursionError, MemoryError, UnicodeDecodeError) as e:
        raise CorruptCheckpointError("The legacy .pt file is damaged or not a torch.save archive of tensors.",
                                     path=path, found=f"{type(e).__name__}: {str(e)[:200]}",
                                     fix="Download the file again.") from None


# ---- v1 records -> current torchao tensors -------------------------------------------------------------------------



def _state(rec: _Subclass, key: str, need: tuple) -> dict:
    st = rec.state
    if not isinstance(st, dict) or any(n not in st for n in need):
        missing = [n for n in need if not isinstance(st, dict) or n not in st]
        raise _Bad(f"'{key}': {rec.cls.name} lacks {', '.join(missing)}")
    return st


def decode_aqt(rec: _Subclass, key: str) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """AffineQuantizedTensor record -> (int8 codes [out, in], per-row scale [out, 1] widened to float32, the
    record's nesting as ``fingerprint.origin`` describes it: Unsloth's fingerprint hashes the parts as stored)."""
    if rec.cls.name != "AffineQuantizedTensor":
        raise _Bad(f"'{key}': expected an AffineQuantizedTensor inside, found {rec.cls.name}")
    st = _state(rec, key, ("tensor_impl", "block_size"))
    impl = st["tensor_impl"]
    if not isinstance(impl, _Subclass) or impl.cls.name != "PlainAQTTensorImpl":
        name = impl.cls.name if isinstance(impl, _Subclass) else type(impl).__name__
        raise UnsupportedFormatError(f"Legacy weight '{key}' uses the torchao layout '{name}', not the plain int8 "
                                     "layout this pack reads.", found=name)
    ist = _state(impl, key, ("int_data", "scale"))
    q, scale, zp = ist["int_data"], ist["scale"], ist.get("zero_point")
    layout = ist.get("_layout")
    if layout is not None and not isinstance(layout, _PlainLayout):
        raise _Bad(f"'{key}': unexpected tensor layout")
    if not isinstance(q, torch.Tensor) or q.dtype != torch.int8 or q.ndim != 2 or tuple(q.shape) != rec.shape:
        raise _Bad(f"'{key}': int data is not int8 {rec.shape}")
    rows, cols = q.shape
    if not isinstance(scale, torch.Tensor) or not scale.is_floating_point() or scale.numel() != rows:
        shape = tuple(getattr(scale, "shape", ()))
        raise UnsupportedFormatError(f"Legacy weight '{key}' is not quantized per row (scale {shape} for {rows} "
                                     "rows); only per-row int8 is supported.")
    if _ints(st["block_size"], "block size") != (1, cols):
        raise UnsupportedFormatError(f"Legacy weight '{key}' uses block size {tuple(st['block_size'])}, not one "
                                     f"block per row (1, {cols}).")
    domain = st.get("zero_point_domain")
    if domain not in (None, "ZeroPointDomain.NONE", "ZeroPointDomain.INT"):
        raise UnsupportedFormatError(f"Legacy weight '{key}' uses {domain}, which this pack does not read.")
    if zp is not None:
        if not isinstance(zp, torch.Tensor) or (zp.numel() not in (0, rows)):
            raise _Bad(f"'{key}': zero point shape")
        if zp.numel() and bool(torch.any(zp != 0)):
            raise UnsupportedFormatError(f"Legacy weight '{key}' is asymmetric (non-zero zero point); only symmetric "
                                         "int8 is supported.")
    qmin, qmax = st.get("quant_min"), st.get("quant_max")
    if (qmin, qmax) not in ((None, None), (-128, 127), (-127, 127)):
        raise UnsupportedFormatError(f"Legacy weight '{key}' uses the quantization range {qmin}..{qmax}.")
    if rec.dtype not in LOGICAL_DTYPES:
        raise _Bad(f"'{key}': logical dtype {rec.dtype}")
    # float32 holds every bf16 / fp16 value exactly: the scales stay bit-identical in value
    impl_origin = ("PlainAQTTensorImpl", (("int_data", q), ("scale", scale),
                                          ("zero_point", zp if isinstance(zp, torch.Tensor) else None)))
    return q, scale.reshape(rows, 1).to(torch.float32), ("AffineQuantizedTensor", (("tensor_impl", impl_origin),))


def decode_weight(rec: _Subclass, key: str):
    """(current ``Int8Tensor``, the record's nesting for Unsloth's fingerprint)."""
    if rec.cls.name == "LinearActivationQuantizedTensor":
        st = _state(rec, key, ("original_weight_tensor", "input_quant_func"))
        func = st["input_quant_func"]
        if not isinstance(func, _FuncRef):
            raise _Bad(f"'{key}': activation quantizer is not a known torchao function")
        if ACT_FUNCS[func.name] != "symmetric":
            raise UnsupportedFormatError(
                f"Legacy weight '{key}' quantizes activations asymmetrically ({func.name}); this pack's int8 "
                "scheme is symmetric per-token.", found=func.name,
                fix="Use the .safetensors variant of the repo, or rebuild the file.")
        if st.get("quant_kwargs") not in (None, {}):
            raise _Bad(f"'{key}': unexpected activation quantizer arguments")
        inner = st["original_weight_tensor"]
        if not isinstance(inner, _Subclass):
            raise _Bad(f"'{key}': no weight inside the activation wrapper")
        q, s, aqt = decode_aqt(inner, key)
        scheme = schemes.registry.by_codes(q.dtype)  # the scheme whose per-row weights are these codes (int8)
        return qtensor.join(q, s, schemes.spec(scheme.name, inner.dtype)), \
            ("LinearActivationQuantizedTensor", (("original_weight_tensor", aqt),))
    q, s, aqt = decode_aqt(rec, key)  # a bare AffineQuantizedTensor: weight-only
    scheme = schemes.registry.by_codes(q.dtype)
    return qtensor.join(q, s, schemes.spec(scheme.label(weight_only=True), rec.dtype)), aqt


def read_legacy_v1(src, *, mmap: bool = True) -> Checkpoint:
    with opened(src) as fh:
        return _read(fh, mmap)


def _read(fh: OpenedFile, mmap: bool) -> Checkpoint:
    path = fh.path
    obj = _unpickle(fh, mmap)
    if not isinstance(obj, dict) or "state_dict" not in obj:
        raise CorruptCheckpointError("This legacy .pt file is not a pre-quantized transformer container.", path=path,
                                     expected="a dict with 'format', 'metadata' and 'state_dict'",
                                     found=type(obj).__name__)
    tag, meta, sd = obj.get("format"), obj.get("metadata") or {}, obj["state_dict"]
    if tag is not None and not isinstance(tag, str):
        raise CorruptCheckpointError("The container's 'format' entry is not a string.", path=path)
    if not isinstance(meta, dict) or not isinstance(sd, dict):
        raise CorruptCheckpointError("The container's 'metadata' / 'state_dict' entries are not dicts.", path=path)
    tensors, origins = {}, {}
    try:
        for k, v in sd.items():
            if isinstance(v, _Subclass):
                tensors[k], origins[k] = decode_weight(v, str(k))
            else:
                tensors[k] = v
    except (_Bad, TypeError, ValueError, AttributeError, RuntimeError) as e:
        raise CorruptCheckpointError("A legacy quantized weight is malformed.", path=path,
                                     found=f"{type(e).__name__}: {str(e)[:300]}",
                                     fix="Download the file again.") from None
    except UnsupportedFormatError as e:
        e.path = path
        raise UnsupportedFormatError(e.message, path=path, found=e.found, fix=e.fix or
                                     "Use the .safetensors variant of the repo, or rebuild the file.") from None
    tensors = check_state_dict(tensors, path)
    for k, o in origins.items():  # set after the checks: a file never supplies it
        setattr(tensors[k], fingerprint.ORIGIN_ATTR, o)
    return Checkpoint(path=path, container="legacy-pt", format_tag=tag, metadata=plain_data.plain(meta, path),
                      tensors=tensors)
