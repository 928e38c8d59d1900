"""The quantized Linear inside a ComfyUI model.

Weights are stored as plain tensors: ``weight`` (int8 / float8 codes, [out, in]) and ``weight_scale`` ([out, 1]),
which ComfyUI can move, size (real bytes), back up and offload like any other parameter. The torchao tensor is
rebuilt around them per call (metadata only, no copy), so the matmul is torchao's, identical to a model quantized
in place. ComfyUI's cast path (``cast_bias_weight``) would call ``weight.to(dtype)`` and dequantize nowhere, so a
quantized Linear takes its own forward; dense layers keep ComfyUI's.
"""
from __future__ import annotations

import torch

from prequant_core import qtensor


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

            def prequant_assign(self, qdata, scale, spec):
                # New Parameters, never in-place writes: ModelPatcher backups keep pointing at the originals.
                self._parameters["weight"] = torch.nn.Parameter(qdata, requires_grad=False)
                self._parameters["weight_scale"] = torch.nn.Parameter(scale, requires_grad=False)
                self.prequant_spec = spec

            def prequant_dense(self, dtype=torch.float32, device=None):
                q, s = self.weight, self.weight_scale
                if device is not None:
                    q, s = q.to(device), s.to(device)
                return qtensor.dequantize(q, s, dtype)

            def prequant_assign_dense(self, dense, before=None):
                """Requantize a patched dense weight per row. Rows equal to ``before`` (the dequantized weight
                the patch started from) keep their original codes and scale: a LoRA on to_k must not move the
                q and v rows of a fused qkv through a needless dequantize/requantize round trip."""
                q, s = qtensor.requantize(dense, self.prequant_spec)
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
                    w = qtensor.dequantize(q, s, spec.dtype)
                    for f in self.weight_function:
                        w = f(w)
                    q, s = qtensor.requantize(w, spec)
                weight = qtensor.join(q, s, spec)
                bias = self.bias
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
