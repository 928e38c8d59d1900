"""int8: per-row symmetric int8 weights, activations quantized per token at each matmul (torchao
``Int8DynamicActivationInt8WeightConfig``); weight-only: ``Int8WeightOnlyConfig``."""
from __future__ import annotations

import torch

from .codec import RowCodec
from . import field_checks as c, native_layout as nl, rotation
from .record import Scheme

# docs/FORMAT.md section 4: int8 files keep these layers dense on every family
BASE_EXCLUDE = ("norm", "_mod", "modulation", "timestep_embed", "guidance_embed", "time_text_embed", "pooled",
                "time_embed")


def config(weight_only: bool):
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig
    return Int8WeightOnlyConfig() if weight_only else Int8DynamicActivationInt8WeightConfig()


def quantize(weight, cfg):
    from torchao.quantization import Int8WeightOnlyConfig
    from torchao.quantization.quantize_.workflows import Int8Tensor
    from torchao.quantization.quantize_.workflows.int8.int8_tensor import QuantizeTensorToInt8Kwargs
    if isinstance(cfg, Int8WeightOnlyConfig):
        return Int8Tensor.from_hp(weight, granularity=cfg.granularity)
    act_g, w_g = Int8Tensor._normalize_granularity(cfg.granularity)
    return Int8Tensor.from_hp(weight, granularity=w_g, act_quant_kwargs=QuantizeTensorToInt8Kwargs(
        granularity=act_g, mapping_type=cfg.act_mapping_type, reduce_range=cfg.reduce_range),
        reduce_range=cfg.reduce_range)


def decode_act(d: dict):
    """torchao's JSON ``_data`` of ``QuantizeTensorToInt8Kwargs`` -> the object (``json_values.decode_act_kwargs``)."""
    from torchao.quantization.quant_primitives import MappingType
    from torchao.quantization.quantize_.workflows.int8.int8_tensor import QuantizeTensorToInt8Kwargs
    from . import json_values as j
    return QuantizeTensorToInt8Kwargs(granularity=j.decode_granularity(d.get("granularity")),
                                      mapping_type=j.decode_enum(d.get("mapping_type"), MappingType, "MappingType"),
                                      reduce_range=j.bool_(d.get("reduce_range"), "reduce_range"))


ACT_KWARGS = {"QuantizeTensorToInt8Kwargs": decode_act}  # the activation settings its weights may carry


def _act_check(v, field):
    from torchao.quantization.quant_primitives import MappingType
    from torchao.quantization.quantize_.workflows.int8.int8_tensor import QuantizeTensorToInt8Kwargs
    if v is None:
        return
    c.dataclass_of(v, QuantizeTensorToInt8Kwargs, field)
    c.granularity(v.granularity, field + ".granularity")
    c.enum(v.mapping_type, MappingType, field + ".mapping_type")
    c.need(v.mapping_type == MappingType.SYMMETRIC, field + ".mapping_type", "SYMMETRIC", v.mapping_type)
    c.bool_(v.reduce_range, field + ".reduce_range")


class Int8Codec(RowCodec):
    """torchao's ``Int8Tensor``: int8 codes, one scale per row (symmetric: zero points, where present, are zero)."""
    kind, type_name = "int8", "Int8Tensor"
    code_dtypes = (torch.int8,)
    fields = frozenset({"qdata", "scale", "zero_point", "block_size", "act_quant_kwargs", "reduce_range",
                        "act_pre_scale", "act_quant_scale", "act_quant_zero_point"})
    fingerprint_fields = ("qdata", "scale", "zero_point", "act_quant_scale", "act_quant_zero_point", "act_pre_scale")
    json_parts = frozenset({"qdata", "scale", "zero_point"})
    pickled = ("torchao.quantization.quantize_.workflows:Int8Tensor", "torchao.quantization.granularity:PerRow",
               "torchao.quantization.quant_primitives:MappingType",
               "torchao.quantization.quantize_.workflows.int8.int8_tensor:QuantizeTensorToInt8Kwargs")

    @property
    def cpu_matmul(self) -> str:
        from . import int8_cpu
        if int8_cpu.native_chosen():
            how = "torch._int_mm, exact on this CPU"
        elif int8_cpu.native_exact():
            how = "integer sums in exact float32 pieces: faster than torch._int_mm on this CPU"
        else:
            how = "integer sums in exact float32 pieces: torch._int_mm is not exact on this CPU"
        return f"int8 matmul supported (torchao's result; {how})"

    def tensor_type(self):
        from torchao.quantization.quantize_.workflows import Int8Tensor
        return Int8Tensor

    def spec_attrs(self, t):
        return {"act_quant_kwargs": t.act_quant_kwargs, "reduce_range": getattr(t, "reduce_range", False)}

    def make(self, qdata, scale, block_size, spec):
        kw = spec.as_kwargs()
        return self.tensor_type()(qdata, scale, block_size, spec.dtype, act_quant_kwargs=kw.get("act_quant_kwargs"),
                                  reduce_range=kw.get("reduce_range", False))

    def from_dense(self, dense, spec):
        from torchao.quantization import PerRow
        return self.tensor_type().from_hp(dense, granularity=PerRow(),
                                          act_quant_kwargs=spec.as_kwargs().get("act_quant_kwargs"))

    def check_fields(self, t):
        d = t.__dict__
        c.block(d.get("block_size"), "block_size", tuple(t.qdata.shape))
        _act_check(d.get("act_quant_kwargs"), "act_quant_kwargs")
        c.bool_(d.get("reduce_range", False), "reduce_range")
        for f in ("act_pre_scale", "act_quant_scale", "act_quant_zero_point"):  # static activation settings
            c.need(d.get(f) is None, f, "none (this pack's int8 quantizes activations dynamically)", d.get(f))

    def from_json(self, d, parts):
        from . import json_values as j  # imports torchao: only when a file is read
        qdata, scale = parts["qdata"], parts["scale"]
        block = j.block_size(d.get("block_size"), qdata)
        dtype = j.decode_dtype(d.get("dtype"))
        j.need(qdata.dtype == torch.int8, f"Int8Tensor data is {qdata.dtype}")
        zp = parts.get("zero_point")
        j.need(zp is None or (zp.numel() == scale.numel() and zp.dtype == torch.int8), "zero_point shape/dtype")
        return self.tensor_type()(qdata, scale, block, dtype, zero_point=zp,
                                  act_quant_kwargs=j.decode_act_kwargs(d.get("act_quant_kwargs"), ACT_KWARGS),
                                  reduce_range=j.bool_(d.get("reduce_range"), "reduce_range"))

    def quantized_linear(self, input, tensors, spec, bias):
        if tensors[0].device.type == "cpu":  # torchao's result, without its BLAS-less CPU int32 matmul
            from . import int8_cpu
            return int8_cpu.linear(input, tensors[0], tensors[1], spec, bias)
        return super().quantized_linear(input, tensors, spec, bias)


CODEC = Int8Codec()


# --- ComfyUI's ``int8_tensorwise`` (docs/FORMAT.md section 6) -------------------------------------------------------
# ``weight`` int8 [N, K], ``weight_scale`` float32 scalar or [N, 1]: W = q * scale. With ``convrot`` the stored weight
# is W H (the regular-H4 block Hadamard of ``convrot_groupsize``, the same matrix Unsloth's v2 files use) and the
# input is rotated at run time.

def comfy_read(layout, stored, spec):
    scale, gran = nl.row_scale(layout, stored)
    group, weight = None, stored.weight
    if stored.cfg.get("convrot"):
        group = stored.cfg.get("convrot_groupsize", 256)
        if not rotation.is_power_of_4(group) or group > rotation.MAX_GROUP or weight.shape[1] % group:
            raise stored.bad("its convrot_groupsize is not a power of 4 dividing the input width",
                             expected=f"4 .. {rotation.MAX_GROUP}, dividing {weight.shape[1]}", found=repr(group)[:40])
        if gran != "per_row":
            raise stored.bad("a ConvRot layer needs per-row scales", found=gran)
    return CODEC.assemble((weight, scale), spec()), gran, group


def comfy_from_dense(layout, w):
    """ComfyUI's int8 quantizer: one scale per row."""
    scale = (w.abs().amax(dim=1, keepdim=True).to(torch.float32) / 127).clamp(min=1e-30)
    q = torch.round(w.to(torch.float32) / scale).clamp(-128, 127).to(torch.int8)
    return {"": q, "_scale": scale}


COMFY_LAYOUTS = (nl.ComfyLayout("int8_tensorwise", torch.int8, ("weight_scale",), "0.27.0", comfy_read,
                                comfy_from_dense),)

# An int8 -ComfyUI twin holds the artifact's weights bit for bit (per-row scales): it leads the artifact's names
SCHEME = Scheme(name="int8", kind="int8", codec=CODEC, suffix="-INT8", config=config, quantize=quantize,
                granularity_field="int8_granularity", exclude_base_tokens=BASE_EXCLUDE, weight_only=True,
                legacy_pt=True, comfy_layouts=COMFY_LAYOUTS, twin_leads=True, convrot_file=True,
                min_capability=(7, 5))
