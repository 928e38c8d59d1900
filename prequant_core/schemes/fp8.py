"""fp8: per-row float8_e4m3fn weights, activations quantized per row at each matmul with fast accumulation (torchao
``Float8DynamicActivationFloat8WeightConfig``); weight-only: ``Float8WeightOnlyConfig``."""
from __future__ import annotations

import torch

import dataclasses

from ..errors import CorruptCheckpointError
from . import codec as c_
from .codec import RowCodec
from . import field_checks as c, native_layout as nl
from .record import Scheme

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
ACTIVATION_LB = 1e-12  # the config's activation_value_lb (Unsloth's builder sets the same)


def config(weight_only: bool):
    from torchao.float8.inference import Float8MMConfig
    from torchao.quantization import (Float8DynamicActivationFloat8WeightConfig, Float8WeightOnlyConfig, PerRow)
    from torchao.quantization.quantize_.common import KernelPreference
    if weight_only:
        return Float8WeightOnlyConfig()
    return Float8DynamicActivationFloat8WeightConfig(
        granularity=PerRow(), activation_value_lb=ACTIVATION_LB, kernel_preference=KernelPreference.TORCH,
        mm_config=Float8MMConfig(use_fast_accum=True))


def keep_zero_rows(t):
    """torchao's per-row fp8 scale of an all-zero weight row is 0 (int8's has an eps floor, fp8's none), so the row's
    codes come out 0 / 0 = NaN and every output of the layer NaN. Those codes are set to 0 (the scale stays torchao's
    0): the row is zero again, every other byte is torchao's. Unsloth's builder makes the same call without this;
    the reader refuses such rows (``Float8Codec.check_values``)."""
    s, q = t.scale, t.qdata
    if s.ndim == 2 and s.shape[0] == q.shape[0] and q.ndim == 2:
        zero = s.reshape(-1) == 0
        if bool(zero.any()):
            q.view(torch.uint8)[zero] = 0
    return t


def quantize(weight, cfg):
    """torchao's fp8 module handler asserts a CUDA GPU of compute capability >= 8.9; the tensor it builds is
    ``Float8Tensor.from_hp`` with the config's fields, which runs anywhere, so that is what is called."""
    from torchao.quantization import Float8WeightOnlyConfig
    from torchao.quantization.quantize_.workflows import Float8Tensor
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import QuantizeTensorToFloat8Kwargs
    if isinstance(cfg, Float8WeightOnlyConfig):
        return keep_zero_rows(Float8Tensor.from_hp(weight, float8_dtype=cfg.weight_dtype,
                                                   granularity=cfg.granularity))
    act_g, w_g = cfg.granularity
    return keep_zero_rows(Float8Tensor.from_hp(
        weight, float8_dtype=cfg.weight_dtype, granularity=w_g, mm_config=cfg.mm_config,
        kernel_preference=cfg.kernel_preference,
        act_quant_kwargs=QuantizeTensorToFloat8Kwargs(
            cfg.activation_dtype, act_g, hp_value_lb=cfg.activation_value_lb,
            hp_value_ub=cfg.activation_value_ub, kernel_preference=cfg.kernel_preference)))


def decode_mm_config(v):
    """torchao's JSON of a ``Float8MMConfig`` (or null) -> the object."""
    from torchao.float8.inference import Float8MMConfig
    from . import json_values as j
    if v is None:
        return None
    d = j.obj(v, "Float8MMConfig")
    j.need(isinstance(d, dict), "Float8MMConfig data")
    return Float8MMConfig(emulate=j.bool_(d.get("emulate"), "emulate"),
                          use_fast_accum=j.bool_(d.get("use_fast_accum"), "use_fast_accum"),
                          pad_inner_dim=j.bool_(d.get("pad_inner_dim"), "pad_inner_dim"))


def decode_act(d: dict):
    """torchao's JSON ``_data`` of ``QuantizeTensorToFloat8Kwargs`` -> the object
    (``json_values.decode_act_kwargs``)."""
    from torchao.quantization.quantize_.common import KernelPreference
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import QuantizeTensorToFloat8Kwargs
    from . import json_values as j
    kp = d.get("kernel_preference")
    return QuantizeTensorToFloat8Kwargs(
        float8_dtype=j.decode_dtype(d.get("float8_dtype")),
        granularity=j.decode_granularity(d.get("granularity")),
        mm_config=decode_mm_config(d.get("mm_config")),
        hp_value_lb=j.opt_float(d.get("hp_value_lb"), "hp_value_lb"),
        hp_value_ub=j.opt_float(d.get("hp_value_ub"), "hp_value_ub"),
        kernel_preference=KernelPreference.AUTO if kp is None else
        j.decode_enum(kp, KernelPreference, "KernelPreference"))


ACT_KWARGS = {"QuantizeTensorToFloat8Kwargs": decode_act}  # the activation settings its weights may carry


def _mm_check(v, field):
    from torchao.float8.inference import Float8MMConfig
    if v is None:
        return
    c.need(type(v) is Float8MMConfig, field, "a Float8MMConfig or none", v)
    for f in ("emulate", "use_fast_accum", "pad_inner_dim"):
        c.bool_(getattr(v, f), f"{field}.{f}")


def _act_check(v, field):
    from torchao.quantization.quantize_.common import KernelPreference
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import QuantizeTensorToFloat8Kwargs
    if v is None:
        return
    c.dataclass_of(v, QuantizeTensorToFloat8Kwargs, field)
    c.need(v.float8_dtype in FP8, field + ".float8_dtype", "float8_e4m3fn or float8_e5m2", v.float8_dtype)
    c.granularity(v.granularity, field + ".granularity")
    _mm_check(v.mm_config, field + ".mm_config")
    c.opt_float(v.hp_value_lb, field + ".hp_value_lb", 0)
    c.opt_float(v.hp_value_ub, field + ".hp_value_ub", 0)
    c.enum(v.kernel_preference, KernelPreference, field + ".kernel_preference")


class Float8Codec(RowCodec):
    """torchao's ``Float8Tensor``: float8 codes (e4m3; e5m2 from ComfyUI-native files), one scale per row (or one
    for the whole weight in Unsloth's stale per-tensor builds, repeated per row here)."""
    kind, type_name = "float8", "Float8Tensor"
    code_dtypes = FP8
    fields = frozenset({"qdata", "scale", "block_size", "mm_config", "act_quant_kwargs", "kernel_preference"})
    fingerprint_fields = ("qdata", "scale")
    float8_codes = True
    pickled = ("torchao.quantization.quantize_.workflows:Float8Tensor", "torchao.quantization.granularity:PerRow",
               "torchao.float8.inference:Float8MMConfig",
               "torchao.quantization.quantize_.common.kernel_preference:KernelPreference",
               "torchao.quantization.quantize_.workflows.float8.float8_tensor:QuantizeTensorToFloat8Kwargs")

    def tensor_type(self):
        from torchao.quantization.quantize_.workflows import Float8Tensor
        return Float8Tensor

    def spec_attrs(self, t):
        out = {"mm_config": t.mm_config, "act_quant_kwargs": t.act_quant_kwargs,
               "kernel_preference": t.kernel_preference}
        if t.qdata.dtype == torch.float8_e5m2:  # ComfyUI-native e5m2: decoded, and requantized by a LoRA, as e5m2
            out["codes"] = "e5m2"
        return out

    def code_table(self, codes, spec):
        # ComfyUI-native e5m2 codes: their dtype says so, or, kept as bytes, the spec
        e5m2 = codes == torch.float8_e5m2 or (codes == torch.uint8 and spec.as_kwargs().get("codes") == "e5m2")
        return "e5m2" if e5m2 else "e4m3"

    def typed_codes(self, q, table):
        if q.dtype != torch.uint8:
            return q
        return q.view(torch.float8_e5m2 if table == "e5m2" else torch.float8_e4m3fn)

    def runs_quantized(self, tensors, spec):
        # torchao's fp8 matmul takes e4m3 weights
        return self.code_table(tensors[0].dtype, spec) != "e5m2" and super().runs_quantized(tensors, spec)

    def make(self, qdata, scale, block_size, spec):
        kw = spec.as_kwargs()
        return self.tensor_type()(qdata, scale, block_size, mm_config=kw.get("mm_config"),
                                  act_quant_kwargs=kw.get("act_quant_kwargs"),
                                  kernel_preference=kw.get("kernel_preference"), dtype=spec.dtype)

    def from_dense(self, dense, spec):
        from torchao.quantization import PerRow
        kw = spec.as_kwargs()
        dt = torch.float8_e5m2 if kw.get("codes") == "e5m2" else torch.float8_e4m3fn
        return keep_zero_rows(self.tensor_type().from_hp(dense, float8_dtype=dt, granularity=PerRow(),
                                                         mm_config=kw.get("mm_config"),
                                                         kernel_preference=kw.get("kernel_preference"),
                                                         act_quant_kwargs=kw.get("act_quant_kwargs")))

    def check_values(self, key, t, tensors, path):
        q, s = tensors[0], tensors[1]
        if q.ndim != 2 or s.numel() != q.shape[0]:
            return
        zero = s.reshape(-1) == 0
        if bool(zero.any()):
            # named apart: an all-zero weight row quantized without a floor (torchao's per-row fp8), a known cause
            b = q[zero].contiguous().view(torch.uint8)
            nan = (b & 0x7F) == 0x7F if q.dtype == torch.float8_e4m3fn else (b & 0x7C) == 0x7C
            if bool(nan.any()):
                row = int(zero.nonzero()[nan.any(dim=1).nonzero()[0, 0], 0])
                raise CorruptCheckpointError(
                    f"Row {row} of quantized tensor '{key[:80]}' has scale 0 and NaN float8 codes: an all-zero weight "
                    "row quantized without a floor (torchao's per-row fp8), which makes every output of that layer NaN.",
                    path=path, found=f"{int(nan.any(dim=1).sum())} such row(s)",
                    fix="Rebuild the file with Build Prequant Checkpoint or `python -m prequant_core build` (all-zero "
                        "rows stay zero), or use the repo's int8 file.")
        # any other NaN (or e5m2 infinite) code under a finite scale: one pass over the codes
        c_.refuse_special_codes(key, q, q.dtype, path)

    def check_fields(self, t):
        from torchao.quantization.quantize_.common import KernelPreference
        d = t.__dict__
        one_scale = isinstance(d.get("scale"), torch.Tensor) and d["scale"].numel() == 1 and t.qdata.ndim == 2
        c.block(d.get("block_size"), "block_size", tuple(t.qdata.shape), whole_ok=one_scale)
        _mm_check(d.get("mm_config"), "mm_config")
        _act_check(d.get("act_quant_kwargs"), "act_quant_kwargs")
        c.enum(d.get("kernel_preference"), KernelPreference, "kernel_preference")

    def from_json(self, d, parts):
        from . import json_values as j  # imports torchao: only when a file is read
        from torchao.quantization.quantize_.common import KernelPreference
        qdata, scale = parts["qdata"], parts["scale"]
        block = j.block_size(d.get("block_size"), qdata, per_tensor_ok=scale.numel() == 1)
        dtype = j.decode_dtype(d.get("dtype"))
        j.need(qdata.dtype in FP8, f"Float8Tensor data is {qdata.dtype}")
        kp = d.get("kernel_preference")
        return self.tensor_type()(qdata, scale, block, mm_config=decode_mm_config(d.get("mm_config")),
                                  act_quant_kwargs=j.decode_act_kwargs(d.get("act_quant_kwargs"), ACT_KWARGS),
                                  kernel_preference=KernelPreference.AUTO if kp is None else
                                  j.decode_enum(kp, KernelPreference, "KernelPreference"), dtype=dtype)


CODEC = Float8Codec()


# --- what a loaded file's fp8 weights record (Unsloth's loader) ---------------------------------------------------

def _loaded(tensors: dict):
    return [(k, v) for k, v in tensors.items() if CODEC.owns(v)]


def check_loaded(tensors: dict) -> tuple[list[str], list[str]]:
    """(reasons, notes) for the activation floor: a recorded floor must be 1e-12; a missing one is supplied."""
    reasons, missing = [], 0
    for k, t in _loaded(tensors):
        act = t.act_quant_kwargs
        if act is None:
            continue
        lb = getattr(act, "hp_value_lb", None)
        if lb is None:
            missing += 1
        elif float(lb) != ACTIVATION_LB:
            reasons.append(f"fp8 weight '{k}' records activation_value_lb {lb}, expected {ACTIVATION_LB} "
                           "(a different activation floor would not match load-time quantization)")
            break
    notes = [f"{missing} fp8 weights record no activation floor; {ACTIVATION_LB} is supplied at load"] \
        if missing else []
    return reasons, notes


def pin_loaded(tensors: dict) -> int:
    """Every fp8 weight gets torchao's TORCH kernels (and the 1e-12 activation floor where none is recorded), as
    Unsloth pins them at load: published fp8 files record AUTO, which picks other kernels on some GPUs and breaks
    identity with load-time quantization. Replaces the entries in ``tensors``; returns how many changed."""
    from torchao.quantization.quantize_.common import KernelPreference
    changed = 0
    for k, t in _loaded(tensors):
        act = t.act_quant_kwargs
        if act is not None and (act.kernel_preference != KernelPreference.TORCH or act.hp_value_lb is None):
            act = dataclasses.replace(act, kernel_preference=KernelPreference.TORCH,
                                      hp_value_lb=ACTIVATION_LB if act.hp_value_lb is None else act.hp_value_lb)
        elif t.kernel_preference == KernelPreference.TORCH:
            continue
        tensors[k] = CODEC.tensor_type()(t.qdata, t.scale, t.block_size, mm_config=t.mm_config, act_quant_kwargs=act,
                                         kernel_preference=KernelPreference.TORCH, dtype=t.dtype)
        changed += 1
    return changed


# --- ComfyUI's ``float8_e4m3fn`` / ``float8_e5m2`` (docs/FORMAT.md section 6) -------------------------------------
# ``weight`` fp8 [N, K], ``weight_scale`` float32 (one per tensor, or [N, 1]): W = fp8 * scale. A ``convrot`` setting
# is not ComfyUI's for these formats and is not read.

def comfy_read(layout, stored, spec):
    scale, gran = nl.row_scale(layout, stored)
    return CODEC.assemble((stored.weight, scale), spec()), gran, None


def comfy_from_dense(layout, w):
    """ComfyUI's fp8 quantizer: one scale per tensor (what ComfyUI's fp8 GPU matmul takes)."""
    dt = layout.storage
    amax = w.abs().max().to(torch.float32)
    scale = (amax / torch.finfo(dt).max).clamp(min=torch.finfo(torch.float32).tiny)
    q = (w.to(torch.float32) / scale).clamp(-torch.finfo(dt).max, torch.finfo(dt).max).to(dt)
    return {"": q, "_scale": scale.reshape(())}


COMFY_LAYOUTS = tuple(nl.ComfyLayout(name, dtype, ("weight_scale",), since, comfy_read, comfy_from_dense,
                                     marker_dtype=True)
                      for name, dtype, since in (("float8_e4m3fn", torch.float8_e4m3fn, "0.3.68"),
                                                 ("float8_e5m2", torch.float8_e5m2, "0.8.0")))

# an Unsloth -FP8 repo holds the int8 file too (tried after the fp8 one); its -ComfyUI twin has one scale per tensor,
# a coarser rounding of the per-row file, so it trails the artifact's names
SCHEME = Scheme(name="fp8", kind="float8", codec=CODEC, suffix="-FP8", config=config, quantize=quantize, require_bf16=True,
                require_divisible=16, granularity_field="fp8_granularity", granularity="per_row", fast_accum=True,
                weight_only=True, suffix_holds=("fp8", "int8"), legacy_pt=True, comfy_layouts=COMFY_LAYOUTS,
                check_loaded=check_loaded, pin_loaded=pin_loaded, min_capability=(8, 9))
