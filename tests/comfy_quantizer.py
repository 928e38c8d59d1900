"""ComfyUI's own quantized-file writer, restated for tests (from ComfyUI's ``comfy/quant_ops.py``, its
``QUANTIZATION.md`` and the layer loader in ``comfy/ops.py``), with the numbers made by comfy-kitchen itself (ComfyUI's
kernel library; its eager CPU reference functions, installed for the tests in ``.cache/comfy-kitchen`` by
scripts/setup_test_extras.sh). Nothing here imports this pack: the pack's reader is tested on files it did not write.

``quantize_layer`` makes one layer's tensors and ``.comfy_quant`` JSON the way ComfyUI's quantizer does;
``dequantize_layer`` is ComfyUI's own dequantization of them (comfy-kitchen's eager functions, float32 unless asked);
``write`` assembles a file: per-layer ``.comfy_quant`` uint8 JSON tensors, and / or the older
``_quantization_metadata`` header, optional ``input_scale`` and ``comfy_attention.config`` entries.
"""
from __future__ import annotations

import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CK_DIR = os.path.join(ROOT, ".cache", "comfy-kitchen")


def kitchen():
    """comfy-kitchen, from the test extras (pure-Python wheel; on a CPU it runs its eager backend)."""
    if CK_DIR not in sys.path:
        sys.path.insert(0, CK_DIR)
    import comfy_kitchen
    return comfy_kitchen


def _eager():
    kitchen()
    import comfy_kitchen.backends.eager.quantization as eq
    return eq


def quantize_layer(fmt: str, w: torch.Tensor, *, per_row: bool = False, convrot: int | None = None) -> tuple[dict, dict]:
    """({suffix: tensor}, the layer's JSON): suffixes "" (the weight), "_scale", "_scale_2"."""
    ck = kitchen()
    w = w.detach()
    cfg: dict = {"format": fmt}
    if fmt in ("float8_e4m3fn", "float8_e5m2"):
        dt = torch.float8_e4m3fn if fmt == "float8_e4m3fn" else torch.float8_e5m2
        scale = (w.abs().max().to(torch.float32) / torch.finfo(dt).max).reshape(())
        return {"": ck.quantize_per_tensor_fp8(w, scale, dt), "_scale": scale}, cfg
    if fmt == "nvfp4":
        s2 = (w.abs().max() / (448 * 6)).to(torch.float32).reshape(())  # ComfyUI: computed in W's dtype
        q, bs = ck.quantize_nvfp4(w, s2)
        return {"": q, "_scale": bs, "_scale_2": s2}, cfg
    if fmt == "mxfp8":
        q, bs = ck.quantize_mxfp8(w)
        return {"": q, "_scale": bs.view(torch.uint8)}, cfg
    if fmt == "int8_tensorwise":
        if convrot:
            q, s = _eager().quantize_int8_convrot_weight(w, convrot)
            cfg.update(convrot=True, convrot_groupsize=convrot)
            return {"": q, "_scale": s.reshape(-1, 1).to(torch.float32)}, cfg
        if per_row:
            q, s = ck.quantize_int8_rowwise(w)
            return {"": q, "_scale": s.reshape(-1, 1).to(torch.float32)}, cfg
        q, s = ck.quantize_int8_tensorwise(w)
        return {"": q, "_scale": s.reshape(()).to(torch.float32)}, cfg
    raise ValueError(fmt)


def dequantize_layer(parts: dict, cfg: dict, dtype=torch.float32) -> torch.Tensor:
    """ComfyUI's dequantization of one layer (comfy-kitchen's eager reference functions)."""
    ck = kitchen()
    fmt, q = cfg["format"], parts[""]
    if fmt in ("float8_e4m3fn", "float8_e5m2"):
        return ck.dequantize_per_tensor_fp8(q, parts["_scale"], output_type=dtype)
    if fmt == "nvfp4":
        n, k = q.shape[0], q.shape[1] * 2
        return ck.dequantize_nvfp4(q, parts["_scale_2"], parts["_scale"], output_type=dtype)[:n, :k]
    if fmt == "mxfp8":
        return ck.dequantize_mxfp8(q, parts["_scale"].view(torch.float8_e8m0fnu), output_type=dtype)[:q.shape[0], :q.shape[1]]
    if fmt == "int8_tensorwise":
        if cfg.get("convrot"):
            return _eager().dequantize_int8_convrot_weight(q, parts["_scale"], cfg["convrot_groupsize"]).to(dtype)
        return (q.to(torch.float32) * parts["_scale"]).to(dtype)
    raise ValueError(fmt)


def _json_tensor(obj) -> torch.Tensor:
    return torch.tensor(list(json.dumps(obj).encode("utf-8")), dtype=torch.uint8)


def write(path: str, dense: dict, layers: dict, *, style: str = "comfy_quant", input_scale: bool = False,
          attention: bool = False, prefix: str = "") -> dict:
    """A ComfyUI-native file: ``dense`` (ComfyUI key names) with each ``layers`` entry {layer: (format, options)}
    quantized. ``style``: "comfy_quant" (per-layer JSON tensors), "header" (``_quantization_metadata`` only), or
    "both". Returns {layer: (parts, cfg)} for the comparison."""
    from safetensors.torch import save_file
    out: dict = {}
    header_layers: dict = {}
    made: dict = {}
    for k, v in dense.items():
        layer = k[: -len(".weight")] if k.endswith(".weight") else None
        if layer in layers:
            continue
        out[prefix + k] = v.contiguous()
    for layer, (fmt, opts) in layers.items():
        parts, cfg = quantize_layer(fmt, dense[layer + ".weight"], **opts)
        made[layer] = (parts, cfg)
        for suffix, t in parts.items():
            out[f"{prefix}{layer}.weight{suffix}"] = t.contiguous()
        if style in ("comfy_quant", "both"):
            out[f"{prefix}{layer}.comfy_quant"] = _json_tensor(cfg)
        header_layers[layer] = cfg
        if input_scale:
            out[f"{prefix}{layer}.input_scale"] = torch.tensor(0.05, dtype=torch.float32)
    if attention:
        block = next(iter(layers)).rsplit(".", 2)[0]
        out[f"{prefix}{block}.comfy_attention.config"] = _json_tensor({"attention": "comfy_kitchen_sol"})
    meta = {}
    if style in ("header", "both"):
        meta["_quantization_metadata"] = json.dumps({"format_version": "1.0", "layers": header_layers})
    save_file(out, path, metadata=meta or None)
    return made
