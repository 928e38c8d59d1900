"""The quantized Linear inside a ComfyUI model.

Weights are stored as plain tensors: ``weight`` (int8 / float8 codes, [out, in]) and ``weight_scale`` ([out, 1]),
which ComfyUI can move, size (real bytes), back up and offload like any other parameter. The torchao tensor is
rebuilt around them per call (metadata only, no copy), so the matmul is torchao's, identical to a model quantized
in place. ComfyUI's cast path (``cast_bias_weight``) would call ``weight.to(dtype)`` and dequantize nowhere, so a
quantized Linear takes its own forward; dense layers keep ComfyUI's.

Which matmul runs (torchao's quantized one, or weight-only: rows dequantized to the compute dtype, then a dense
``F.linear``) is decided at load for the device the model computes on (``prequant_core.devices``,
docs/FORMAT.md section 8) and stored on each Linear, so sampling never meets an unsupported kernel.
"""
from __future__ import annotations

import torch

from prequant_core import devices, qtensor


def dequantize_rows(qdata: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``codes * scale`` per row in float32, then ``dtype``: the same numbers as ``qtensor.dequantize`` (tested), in
    fewer passes over the weight (int8 promotes inside the multiply; fp8 widens exactly to fp16 first, as fp8 takes
    part in no type promotion). ``uint8`` codes are fp8 codes kept as bytes (devices without a float8 dtype)."""
    s = scale.to(torch.float32)
    if qdata.dtype == torch.int8:
        w = qdata * s
    elif qdata.dtype == torch.uint8:
        table = _fp8_table(qdata.device)
        w = torch.index_select(table, 0, qdata.reshape(-1).to(torch.int32)).reshape(qdata.shape) * s
    else:
        w = qdata.to(torch.float16) * s  # every e4m3 value is exact in fp16; the product is computed in fp32
    return w if dtype == torch.float32 else w.to(dtype)


_FP8_TABLES: dict = {}


def _fp8_table(device) -> torch.Tensor:
    """The float32 value of each of the 256 e4m3 bit patterns, on ``device`` (built on the CPU, copied once)."""
    key = str(device)
    if key not in _FP8_TABLES:
        _FP8_TABLES[key] = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32) \
            .to(device)
    return _FP8_TABLES[key]


def weight_only_linear(input: torch.Tensor, qdata: torch.Tensor, scale: torch.Tensor, bias=None) -> torch.Tensor:
    """The weight-only path: the rows dequantized to the input's (compute) dtype, then a dense linear.

    float32 compute (ComfyUI on a CPU) scales the output columns instead of the weight rows,
    ``(x @ codes^T) * scale^T``: the same product, one pass less over the weight (which dominates at small sizes);
    the rounding differs at float32 level. Half-precision compute dequantizes the rows first (``codes`` times a
    large activation sum could overflow fp16 before the scale brings it down)."""
    if input.dtype == torch.float32:
        if qdata.dtype == torch.uint8:
            w = torch.index_select(_fp8_table(qdata.device), 0, qdata.reshape(-1).to(torch.int32)).reshape(qdata.shape)
        else:
            w = qdata.to(torch.float32)
        out = torch.nn.functional.linear(input, w)
        out.mul_(scale.reshape(-1).to(torch.float32))
        if bias is not None:
            out.add_(bias.to(device=input.device, dtype=torch.float32))
        return out
    w = dequantize_rows(qdata, scale, input.dtype)
    if bias is not None:
        bias = bias.to(device=input.device, dtype=input.dtype)
    return torch.nn.functional.linear(input, w, bias)


def spec_is_dynamic(spec) -> bool:
    return dict(spec.attrs).get("act_quant_kwargs") is not None


def choose_matmul(module: torch.nn.Module, device) -> list:
    """Decide the matmul path of every quantized Linear in ``module`` for ``device`` (the load device) and store it
    on each Linear. Returns the distinct choices (``devices.MatmulChoice``), for the node's text."""
    dev = devices.describe(device)
    override = devices.override_from_env()
    choices: dict = {}
    for m in module.modules():
        spec = getattr(m, "prequant_spec", None)
        if spec is None:
            continue
        key = (spec.kind, spec_is_dynamic(spec))
        if key not in choices:
            choices[key] = devices.choose(spec.kind, key[1], dev, override)
        m.prequant_matmul = choices[key].path
        if choices[key].codes_as_bytes:
            m.prequant_keep_bytes()
    return list(choices.values())


def matmul_summary(choices) -> str | None:
    """One line for the node: which matmul runs and why."""
    if not choices:
        return None
    return "; ".join(c.text() for c in choices)


def set_quantized(module: torch.nn.Module, attr: str, t) -> None:
    if attr != "weight" or not hasattr(module, "prequant_assign"):
        raise TypeError(f"a quantized tensor arrived for {type(module).__name__}.{attr}; only Linear weights are")
    q, s, spec = qtensor.split(t)
    module.prequant_assign(q, s, spec)


def make_ops(base):
    """ComfyUI operations class = ``base`` (what ComfyUI would pick) with a Linear that also runs quantized."""
    import comfy.ops

    class PrequantOps(base):
        class Linear(base.Linear):
            prequant_spec = None
            prequant_matmul = None  # devices.QUANTIZED / devices.WEIGHT_ONLY, set at load by choose_matmul
            prequant_bytes = False  # fp8 codes held as uint8 (a device without a float8 dtype)

            def prequant_keep_bytes(self):
                """Hold fp8 codes as their raw bytes from now on (same storage, a uint8 view)."""
                self.prequant_bytes = True
                self.prequant_assign(self.weight, self.weight_scale, self.prequant_spec)

            def prequant_typed(self, q):
                """The codes with their real dtype (CPU / CUDA only when kept as bytes)."""
                return q.view(torch.float8_e4m3fn) if q.dtype == torch.uint8 else q

            def prequant_requantize(self, dense):
                """``qtensor.requantize`` (on the CPU for bytes-kept codes: torchao's fp8 needs a float8 dtype)."""
                if not self.prequant_bytes:
                    return qtensor.requantize(dense, self.prequant_spec)
                q, s = qtensor.requantize(dense.cpu(), self.prequant_spec)
                return q.view(torch.uint8).to(dense.device), s.to(dense.device)

            def prequant_assign(self, qdata, scale, spec):
                if self.prequant_bytes and qdata.dtype != torch.uint8:
                    qdata = qdata.view(torch.uint8)
                # New Parameters, never in-place writes: ModelPatcher backups keep pointing at the originals.
                self._parameters["weight"] = torch.nn.Parameter(qdata, requires_grad=False)
                self._parameters["weight_scale"] = torch.nn.Parameter(scale, requires_grad=False)
                self.prequant_spec = spec

            def prequant_dense(self, dtype=torch.float32, device=None):
                q, s = self.weight, self.weight_scale
                if device is not None:
                    q, s = q.to(device), s.to(device)
                return dequantize_rows(q, s, dtype)

            def prequant_assign_dense(self, dense, before=None):
                """Requantize a patched dense weight per row. Rows equal to ``before`` (the dequantized weight
                the patch started from) keep their original codes and scale: a LoRA on to_k must not move the
                q and v rows of a fused qkv through a needless dequantize/requantize round trip."""
                q, s = self.prequant_requantize(dense)
                if before is not None:
                    same = (dense == before).all(dim=1)
                    if bool(same.any()):
                        keep = same[:, None].to(q.device)
                        # byte views: where() has no float8 kernels on every device
                        q = torch.where(keep, self.weight.to(q.device).view(torch.uint8), q.view(torch.uint8)) \
                            .view(q.dtype)
                        s = torch.where(keep, self.weight_scale.to(s.device), s)
                self.prequant_assign(q, s, self.prequant_spec)

            def forward(self, input, *args, **kwargs):
                spec = self.prequant_spec
                if spec is None:
                    return super().forward(input, *args, **kwargs)
                comfy.ops.run_every_op()
                dev = input.device
                q, s = self.weight, self.weight_scale
                if q.device != dev:  # low-VRAM streaming: only the codes travel
                    q = q.to(dev, non_blocking=True)
                    s = s.to(dev, non_blocking=True)
                if self.weight_function:  # LoRA in low-VRAM mode patches per call on the dense weight
                    w = dequantize_rows(q, s, spec.dtype)
                    for f in self.weight_function:
                        w = f(w)
                    q, s = self.prequant_requantize(w)
                path = self.prequant_matmul
                if path is None:  # built outside the loader: decide once, for the device it first runs on
                    self.prequant_matmul = path = devices.choose(spec.kind, spec_is_dynamic(spec),
                                                                 devices.describe(dev),
                                                                 devices.override_from_env()).path
                bias = self.bias
                if path == devices.WEIGHT_ONLY:
                    if bias is not None:
                        bias = bias.to(device=dev, dtype=input.dtype)
                        for f in self.bias_function:
                            bias = f(bias)
                    return weight_only_linear(input, q, s, bias)
                weight = qtensor.join(self.prequant_typed(q), s, spec)
                if bias is not None:
                    bias = bias.to(device=dev, dtype=spec.dtype)
                    for f in self.bias_function:
                        bias = f(bias)
                out = torch.nn.functional.linear(input.to(spec.dtype), weight, bias)
                return out.to(input.dtype)

    PrequantOps.__name__ = f"PrequantOps_{base.__name__}"
    return PrequantOps


def is_prequant_linear(m) -> bool:
    return getattr(m, "prequant_spec", None) is not None
