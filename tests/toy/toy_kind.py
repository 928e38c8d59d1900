"""A scheme with a weight kind this pack does not ship, as one module: "q4toy", 4-bit codes (held in int8, -7..7)
with one float32 scale per row, in its own tensor class. tests/schemes/test_scheme_registry.py adds it with one registry
line and follows it through listing, building, writing, reading, validation, Info, the fingerprint and the matmul
choice. Nothing here is int8's: the class, its parts, its JSON, its checks and its arithmetic are the codec's own.

The same module gives it what the shipped scheme modules give theirs, found through the same registry line: its own
ComfyUI-native layout (``int4toy_rowwise``, both ways), its own activation-settings class (``ToyActKwargs``, decoded
from torchao-style JSON here alone) and its own file rule (a ``q4toy_levels`` metadata block, checked here).
"""
from __future__ import annotations

import dataclasses

import torch
from torchao.utils import TorchAOBaseTensor

from prequant_core.errors import CorruptCheckpointError
from prequant_core.schemes import field_checks as c, native_layout as nl
from prequant_core.schemes.codec import Codec, QSpec, rotation_attrs, set_rotation
from prequant_core.schemes.file_rules import FileRule, is_int
from prequant_core.schemes.record import Scheme

LEVELS = 7
KIND = "int4toy"


@dataclasses.dataclass(frozen=True)
class ToyActKwargs:
    """Its activation settings: a class no other scheme knows."""
    levels: int = LEVELS


class ToyInt4Tensor(TorchAOBaseTensor):
    tensor_data_names = ["qdata", "scale"]
    tensor_attribute_names = ["orig_dtype"]
    optional_tensor_attribute_names = ["act_quant_kwargs"]

    def __new__(cls, qdata, scale, orig_dtype, act_quant_kwargs=None):
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=orig_dtype, device=qdata.device)

    def __init__(self, qdata, scale, orig_dtype, act_quant_kwargs=None):
        self.qdata, self.scale, self.orig_dtype, self.act_quant_kwargs = qdata, scale, orig_dtype, act_quant_kwargs

    def dequantize(self, dtype=None):
        return (self.qdata.to(torch.float32) * self.scale).to(dtype or self.orig_dtype)


def config(weight_only: bool = False):
    return None  # no torchao config: the codec is the quantizer


def quantize(weight, cfg=None):
    w = weight.to(torch.float32)
    scale = (w.abs().amax(dim=1, keepdim=True) / LEVELS).clamp(min=1e-12)
    q = torch.round(w / scale).clamp(-LEVELS, LEVELS).to(torch.int8)
    return ToyInt4Tensor(q, scale, weight.dtype)


def decode_act(d: dict):
    from prequant_core.schemes import json_values as j
    levels = d.get("levels")
    j.need(is_int(levels), f"ToyActKwargs levels must be an integer, found {str(levels)[:20]}")
    return ToyActKwargs(levels=levels)


ACT_KWARGS = {"ToyActKwargs": decode_act}


class ToyInt4Codec(Codec):
    kind, type_name = KIND, "ToyInt4Tensor"
    code_dtypes = (torch.int8,)
    fields = frozenset({"qdata", "scale", "orig_dtype", "act_quant_kwargs"})
    json_parts = frozenset({"qdata", "scale"})

    def tensor_type(self):
        return ToyInt4Tensor

    def parts(self, t):
        attrs = {"act_quant_kwargs": t.act_quant_kwargs, **rotation_attrs(t)}
        return (t.qdata, t.scale), QSpec(self.kind, t.orig_dtype, tuple(sorted(attrs.items())))

    def assemble(self, tensors, spec):
        act = spec.as_kwargs().get("act_quant_kwargs")
        return set_rotation(ToyInt4Tensor(tensors[0], tensors[1], spec.dtype, act), spec)

    def dequantize(self, tensors, spec, dtype):
        return (tensors[0].to(torch.float32) * tensors[1].to(torch.float32)).to(dtype)

    def quantize(self, dense, spec, like=None, keep=None):
        return self.parts(quantize(dense.to(spec.dtype)))[0]

    def check_fields(self, t):
        d = t.__dict__
        c.need(d.get("orig_dtype") in (torch.bfloat16, torch.float16, torch.float32), "orig_dtype",
               "bfloat16, float16 or float32", d.get("orig_dtype"))
        act = d.get("act_quant_kwargs")
        c.need(act is None or (type(act) is ToyActKwargs and act.levels == LEVELS), "act_quant_kwargs",
               f"none or ToyActKwargs(levels={LEVELS})", act)

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
        return ToyInt4Tensor(qdata, scale, j.decode_dtype(d.get("orig_dtype")),
                             j.decode_act_kwargs(d.get("act_quant_kwargs"), ACT_KWARGS))

    def to_json(self, t):
        import json
        data = {"orig_dtype": {"_type": "torch.dtype", "_data": str(t.orig_dtype).split(".")[-1]}}
        if t.act_quant_kwargs is not None:
            data["act_quant_kwargs"] = {"_type": "ToyActKwargs", "_data": dataclasses.asdict(t.act_quant_kwargs)}
        return json.dumps({"_type": self.type_name, "_data": data}), [("qdata", t.qdata), ("scale", t.scale)]


CODEC = ToyInt4Codec()


# --- its ComfyUI-native layout: ``weight`` int8 codes in -7..7 [N, K], ``weight_scale`` float32 [N, 1] -------------

def comfy_read(layout, stored, spec):
    scale, gran = nl.row_scale(layout, stored)
    return CODEC.assemble((stored.weight, scale), spec()), gran, None


def comfy_from_weight(layout, t):
    return {"": t.qdata, "_scale": t.scale}


def comfy_from_dense(layout, w):
    return comfy_from_weight(layout, quantize(w))


COMFY_LAYOUTS = (nl.ComfyLayout("int4toy_rowwise", torch.int8, ("weight_scale",), "0.99.0", comfy_read,
                                comfy_from_dense, comfy_from_weight),)


# --- its file rule: ``q4toy_levels`` = {"levels": 7, "layers": how many 4-bit layers the file holds} --------------

def rule_reasons(block, facts, scheme):
    if not isinstance(block, dict):
        return [f"metadata 'q4toy_levels' must be an object, found {type(block).__name__}"]
    out = []
    if block.get("levels") != LEVELS:
        out.append(f"q4toy_levels 'levels' is {str(block.get('levels'))[:20]}, expected {LEVELS}")
    have = facts.kinds.get(KIND, 0)
    if block.get("layers") != have:
        out.append(f"q4toy_levels 'layers' is {str(block.get('layers'))[:20]}, the file holds {have} q4toy layers")
    return out


def rule_summary(block):
    if not isinstance(block, dict):
        return None
    return f"q4toy: {block.get('layers')} layers of 4-bit codes in -{LEVELS}..{LEVELS}"


RULE = FileRule(field="q4toy_levels", title="4-bit code range", reasons=rule_reasons, notes=lambda block, facts: [],
                summary=rule_summary)

SCHEME = Scheme(name="q4toy", kind=KIND, codec=CODEC, suffix="-Q4TOY", config=config, quantize=quantize,
                require_divisible=16, exclude_base_tokens=("norm",), containers=("safetensors",),
                comfy_layouts=COMFY_LAYOUTS, file_rules=(RULE,))
