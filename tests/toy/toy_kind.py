"""A scheme with a weight kind this pack does not ship, as one module: "q4toy", 4-bit codes (held in int8, -7..7)
with one float32 scale per row, in its own tensor class. tests/test_scheme_registry.py adds it with one registry
line and follows it through listing, building, writing, reading, validation, Info, the fingerprint and the matmul
choice. Nothing here is int8's: the class, its parts, its JSON, its checks and its arithmetic are the codec's own.
"""
from __future__ import annotations

import torch
from torchao.utils import TorchAOBaseTensor

from prequant_core.errors import CorruptCheckpointError
from prequant_core.schemes import field_checks as c
from prequant_core.schemes.codec import Codec, QSpec, rotation_attrs, set_rotation
from prequant_core.schemes.record import Scheme

LEVELS = 7


class ToyInt4Tensor(TorchAOBaseTensor):
    tensor_data_names = ["qdata", "scale"]
    tensor_attribute_names = ["orig_dtype"]

    def __new__(cls, qdata, scale, orig_dtype):
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=orig_dtype, device=qdata.device)

    def __init__(self, qdata, scale, orig_dtype):
        self.qdata, self.scale, self.orig_dtype = qdata, scale, orig_dtype

    def dequantize(self, dtype=None):
        return (self.qdata.to(torch.float32) * self.scale).to(dtype or self.orig_dtype)


def config(weight_only: bool = False):
    return None  # no torchao config: the codec is the quantizer


def quantize(weight, cfg=None):
    w = weight.to(torch.float32)
    scale = (w.abs().amax(dim=1, keepdim=True) / LEVELS).clamp(min=1e-12)
    q = torch.round(w / scale).clamp(-LEVELS, LEVELS).to(torch.int8)
    return ToyInt4Tensor(q, scale, weight.dtype)


class ToyInt4Codec(Codec):
    kind, type_name = "int4toy", "ToyInt4Tensor"
    code_dtypes = (torch.int8,)
    fields = frozenset({"qdata", "scale", "orig_dtype"})
    json_parts = frozenset({"qdata", "scale"})

    def tensor_type(self):
        return ToyInt4Tensor

    def parts(self, t):
        return (t.qdata, t.scale), QSpec(self.kind, t.orig_dtype, tuple(sorted(rotation_attrs(t).items())))

    def assemble(self, tensors, spec):
        return set_rotation(ToyInt4Tensor(tensors[0], tensors[1], spec.dtype), spec)

    def dequantize(self, tensors, spec, dtype):
        return (tensors[0].to(torch.float32) * tensors[1].to(torch.float32)).to(dtype)

    def quantize(self, dense, spec, like=None, keep=None):
        return self.parts(quantize(dense.to(spec.dtype)))[0]

    def check_fields(self, t):
        c.need(t.__dict__.get("orig_dtype") in (torch.bfloat16, torch.float16, torch.float32), "orig_dtype",
               "bfloat16, float16 or float32", t.__dict__.get("orig_dtype"))

    def check_values(self, key, t, tensors, path):
        if bool((tensors[0].abs() > LEVELS).any()):
            raise CorruptCheckpointError(f"Quantized tensor '{key}' holds 4-bit codes beyond +-{LEVELS}.", path=path,
                                         expected=f"codes in -{LEVELS}..{LEVELS}",
                                         fix="Download or build the file again.")

    def from_json(self, d, parts):
        from prequant_core.schemes import json_values as j
        qdata, scale = parts["qdata"], parts["scale"]
        j.need(qdata.dtype == torch.int8, f"ToyInt4Tensor data is {qdata.dtype}")
        j.need(tuple(scale.shape) == (qdata.shape[0], 1), f"scale {tuple(scale.shape)} is not one per row")
        return ToyInt4Tensor(qdata, scale, j.decode_dtype(d.get("orig_dtype")))

    def to_json(self, t):
        import json
        entry = {"_type": self.type_name, "_data": {"orig_dtype": {"_type": "torch.dtype",
                                                                   "_data": str(t.orig_dtype).split(".")[-1]}}}
        return json.dumps(entry), [("qdata", t.qdata), ("scale", t.scale)]


CODEC = ToyInt4Codec()

SCHEME = Scheme(name="q4toy", kind="int4toy", codec=CODEC, suffix="-Q4TOY", config=config, quantize=quantize,
                require_divisible=16, exclude_base_tokens=("norm",), containers=("safetensors",))
