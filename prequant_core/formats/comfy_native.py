"""ComfyUI's own quantized safetensors (the ``-ComfyUI`` twins), read as torchao tensors without dequantizing.

Layout (docs/FORMAT.md section 6), ComfyUI key names (fused ``attention.qkv`` etc.), optionally under
``model.diffusion_model.``:

* per quantized layer ``<layer>.comfy_quant``: a uint8 tensor holding JSON such as ``{"format": "int8_tensorwise"}``
  or ``{"format": "float8_e4m3fn"}``; ``<layer>.weight`` in its storage dtype; ``<layer>.weight_scale`` (int8: per
  row ``[out, 1]`` / ``[out]`` or one scalar; fp8: one scalar per tensor); ``<layer>.input_scale`` may exist (a
  static activation scale: not used, activations are quantized dynamically like this pack's own files);
* older files: the header entry ``_quantization_metadata`` = ``{"format_version": "1.0", "layers": {name: format}}``
  (``format`` a string or ``{"format": ...}``), same tensor names;
* oldest: the ``scaled_fp8`` marker tensor (its dtype is the fp8 format), every fp8 ``<layer>.weight`` with a scalar
  ``<layer>.scale_weight``.

Weights become ``Int8Tensor`` / ``Float8Tensor`` with the activation quantization of this pack's ``int8`` / ``fp8``
schemes, so a twin runs like the pack's own files. A scalar scale is repeated per row (exact: every row carries the
same value); the rounding stays the twin's own, per tensor, which is coarser than a per-row file. The synthesized
metadata records that (``fp8_granularity`` / ``int8_granularity``), and validation reports it as a note.
"""
from __future__ import annotations

import json

import torch

from .. import qtensor, schemes
from ..checkpoint import COMFY_PREFIX, Checkpoint
from ..errors import CorruptCheckpointError, UnsupportedFormatError
from . import plain_data
from .file_handle import OpenedFile

PREFIX = COMFY_PREFIX
QUANT_SUFFIX = ".comfy_quant"
# format -> (our scheme, storage dtype)
FORMATS = {
    "int8_tensorwise": ("int8", torch.int8),
    "float8_e4m3fn": ("fp8", torch.float8_e4m3fn),
}
# known ComfyUI formats we deliberately do not read (named in the refusal)
KNOWN_OTHER = ("float8_e5m2", "nvfp4", "mxfp8", "convrot_w4a4", "int4", "svdquant")
SIDE_TENSORS = (".weight_scale", ".input_scale", ".scale_weight", ".scale_input", ".weight_scale_2")
MAX_QUANT_JSON = 64 * 1024
LOGICAL_DTYPE = torch.bfloat16  # ComfyUI computes these families in bf16; our fp8 scheme requires bf16


def _format_of(cfg, layer: str, path: str) -> str:
    if isinstance(cfg, str):
        return cfg
    if not isinstance(cfg, dict) or not isinstance(cfg.get("format"), str):
        raise CorruptCheckpointError(f"The quantization entry of layer '{layer[:80]}' has no format name.",
                                     path=path, found=str(cfg)[:120])
    if cfg.get("convrot"):
        raise UnsupportedFormatError(
            f"Layer '{layer[:80]}' uses ConvRot activation rotation ({cfg['format']} with convrot), which this pack "
            "does not support: its weights are rotated and need rotated activations.", path=path,
            found=json.dumps(cfg)[:160], fix="Load it with the node pack it was made for, or use a plain file.")
    return cfg["format"]


def _layer_configs(path: str, index: dict, meta: dict, strip) -> tuple[dict, str]:
    """{layer: format}, and which marking style the file uses."""
    layers: dict = {}
    style = None
    raw = meta.get("_quantization_metadata")
    if raw is not None:
        style = "_quantization_metadata"
        qm = plain_data.loads(raw, path, "header entry '_quantization_metadata'")
        if not isinstance(qm, dict) or not isinstance(qm.get("layers"), dict):
            raise CorruptCheckpointError("Header entry '_quantization_metadata' has no 'layers' object.", path=path,
                                         found=str(raw)[:160])
        for name, cfg in qm["layers"].items():
            layers[strip(name)] = _format_of(cfg, name, path)
    return layers, style


def _read_quant_json(t: torch.Tensor, layer: str, path: str):
    if t.dtype != torch.uint8 or t.ndim != 1 or t.numel() > MAX_QUANT_JSON:
        raise CorruptCheckpointError(f"'{layer[:80]}.comfy_quant' is not a short uint8 JSON tensor.", path=path,
                                     found=f"{t.dtype} {tuple(t.shape)}")
    try:
        text = t.numpy().tobytes().decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptCheckpointError(f"'{layer[:80]}.comfy_quant' does not hold valid JSON.", path=path) from None
    return plain_data.loads(text, path, f"'{layer[:80]}.comfy_quant' entry")


def _scale_rows(scale: torch.Tensor | None, rows: int, layer: str, path: str, default_one: bool) -> tuple:
    """(float32 per-row scale [rows, 1], 'per_tensor' | 'per_row')."""
    if scale is None:
        if not default_one:
            raise CorruptCheckpointError(f"Quantized layer '{layer[:80]}' has no weight_scale.", path=path,
                                         fix="Download the file again.")
        scale = torch.ones(())
    if not scale.is_floating_point() or scale.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise CorruptCheckpointError(f"The scale of '{layer[:80]}' is {scale.dtype}.", path=path)
    s = scale.to(torch.float32)
    if not bool(torch.isfinite(s).all()):
        raise CorruptCheckpointError(f"The scale of '{layer[:80]}' is not finite.", path=path)
    if s.numel() == 1:
        return s.reshape(1, 1).expand(rows, 1).contiguous(), "per_tensor"
    if s.numel() == rows and (s.ndim == 1 or (s.ndim == 2 and s.shape[1] == 1)):
        return s.reshape(rows, 1).contiguous(), "per_row"
    raise UnsupportedFormatError(f"Layer '{layer[:80]}' has a scale of shape {tuple(s.shape)} for {rows} rows "
                                 "(block-wise scales): only per-tensor and per-row scales are supported.", path=path,
                                 found=str(tuple(s.shape)))


def read_comfy_native(fh: OpenedFile, index: dict, meta: dict) -> Checkpoint:
    from safetensors import safe_open
    path = fh.path
    names = list(index)
    prefixed = any(n.startswith(PREFIX) for n in names)

    def strip(n: str) -> str:
        return n[len(PREFIX):] if n.startswith(PREFIX) else n

    if prefixed:  # a full ComfyUI checkpoint: only the diffusion model is ours
        names = [n for n in names if n.startswith(PREFIX) or n == "scaled_fp8"]
    layers, style = _layer_configs(path, index, meta, strip)
    marker = next((n for n in names if strip(n) == "scaled_fp8"), None)
    try:
        f = safe_open(fh.io_path, framework="pt", device="cpu")
    except Exception as e:  # noqa: BLE001 - the safetensors library raises its own error types
        raise CorruptCheckpointError("The safetensors file could not be read.", path=path,
                                     found=f"{type(e).__name__}: {str(e)[:200]}") from None
    with f:
        def get(n):
            try:
                return f.get_tensor(n)
            except Exception as e:  # noqa: BLE001
                raise CorruptCheckpointError(f"Tensor '{n[:80]}' could not be read.", path=path,
                                             found=f"{type(e).__name__}: {str(e)[:200]}") from None

        for n in names:
            if n.endswith(QUANT_SUFFIX):
                layer = strip(n[: -len(QUANT_SUFFIX)])
                layers[layer] = _format_of(_read_quant_json(get(n), layer, path), layer, path)
                style = style or "comfy_quant"
        legacy_scale_key = ".weight_scale"
        if marker is not None:
            mdtype = get(marker).dtype
            fmt = "float8_e5m2" if mdtype == torch.float8_e5m2 else "float8_e4m3fn"
            for n in names:
                if n.endswith(".weight") and index[n]["dtype"] in ("F8_E4M3", "F8_E5M2"):
                    layers.setdefault(strip(n[: -len(".weight")]), fmt)
            style = style or "scaled_fp8"
            legacy_scale_key = ".scale_weight"
        if not layers:
            raise CorruptCheckpointError("This ComfyUI-native file marks no quantized layers.", path=path,
                                         fix="A dense file belongs in 'Load Diffusion Model'.")
        unsupported = sorted({fmt for fmt in layers.values() if fmt not in FORMATS})
        if unsupported:
            known = [u for u in unsupported if u in KNOWN_OTHER]
            raise UnsupportedFormatError(
                f"This ComfyUI-native file uses the quantization format{'s' if len(unsupported) > 1 else ''} "
                f"{', '.join(repr(u[:40]) for u in unsupported)}, which this pack does not load"
                + ("" if known == unsupported else " (unknown to it)") + ".", path=path,
                expected=" or ".join(FORMATS), found=", ".join(u[:40] for u in unsupported),
                fix="Load it with ComfyUI's own 'Load Diffusion Model', or use the repo's non-ComfyUI file.")

        by_stripped = {strip(n): n for n in names}
        tensors: dict = {}
        consumed: set = set()
        granularity: dict = {}
        counts: dict = {}
        for layer, fmt in sorted(layers.items()):
            scheme, storage = FORMATS[fmt]
            wkey = by_stripped.get(layer + ".weight")
            if wkey is None:
                raise CorruptCheckpointError(f"Quantized layer '{layer[:80]}' has no weight tensor.", path=path)
            w = get(wkey)
            if w.dtype != storage or w.ndim != 2 or 0 in w.shape:
                raise CorruptCheckpointError(f"Layer '{layer[:80]}' is marked {fmt} but its weight is "
                                             f"{w.dtype} {tuple(w.shape)}.", path=path,
                                             expected=f"2-D {storage} with rows and columns")
            skey = by_stripped.get(layer + legacy_scale_key) or by_stripped.get(layer + ".weight_scale")
            scale, gran = _scale_rows(get(skey) if skey else None, w.shape[0], layer, path,
                                      default_one=(style == "scaled_fp8"))
            tensors[layer + ".weight"] = qtensor.join(w, scale, schemes.spec(scheme, LOGICAL_DTYPE))
            granularity.setdefault(scheme, set()).add(gran)
            counts[fmt] = counts.get(fmt, 0) + 1
            consumed.add(wkey)
            consumed.update(by_stripped[layer + s] for s in SIDE_TENSORS + (QUANT_SUFFIX,) if layer + s in by_stripped)
        for n in names:
            if n in consumed or n == marker or n.endswith(QUANT_SUFFIX):
                continue
            tensors[strip(n)] = get(n)

    schemes_in = sorted(granularity)
    metadata = {"component": "transformer", "source_format": "comfyui-native", "comfy_quant_style": style,
                "comfy_quant_formats": counts}
    if len(schemes_in) == 1:
        metadata["scheme"] = schemes_in[0]
    for scheme, grans in granularity.items():
        field = "fp8_granularity" if scheme == "fp8" else "int8_granularity"
        metadata[field] = "per_tensor" if grans == {"per_tensor"} else "per_row" if grans == {"per_row"} else "mixed"
    return Checkpoint(path=path, container="comfyui-native", format_tag=None, metadata=metadata, tensors=tensors)
