"""ComfyUI's own quantized safetensors (its ``-ComfyUI`` twins, Comfy-Org's and other vendors' quantized releases), read
as this pack's weights without dequantizing.

Layout (docs/FORMAT.md section 6), ComfyUI key names (fused ``attention.qkv`` etc.), optionally under
``model.diffusion_model.``:

* per quantized layer ``<layer>.comfy_quant``: a uint8 tensor holding JSON such as ``{"format": "nvfp4"}`` or
  ``{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 256}``; ``<layer>.weight`` in its storage
  dtype and the format's side tensors (``comfy_layout.formats()``: every format ComfyUI has whose math a registered
  scheme runs, each declared by its scheme module: ``float8_e4m3fn``, ``float8_e5m2``, ``nvfp4``, ``mxfp8``,
  ``int8_tensorwise`` with or without ConvRot);
  ``<layer>.input_scale`` may exist (a static activation scale for ComfyUI's fp8 GPU matmul: read, not used, as this
  pack quantizes activations dynamically); ``<block>.comfy_attention.config`` (an attention-kernel preference of
  newer ComfyUI releases) is read and ignored, with a note; ``<layer>.pre_quant_scale`` on a layer of a format ComfyUI
  does not apply it to (all but nvfp4) is ignored as ComfyUI ignores it, with a note (on nvfp4 it is refused by name);
* older files: the header entry ``_quantization_metadata`` = ``{"format_version": "1.0", "layers": {name: cfg}}``
  (``cfg`` a format name or the same JSON object), same tensor names;
* oldest: the ``scaled_fp8`` marker tensor (its dtype is the format: the layouts marked ``marker_dtype``), every
  ``<layer>.weight`` of those layouts' storage with a scalar ``<layer>.scale_weight``.

A scalar scale is repeated per row (exact: every row carries the same value); the rounding stays the file's own, per
tensor, which is coarser than a per-row file. The synthesized metadata records the formats per layer and the
granularity, and Prequant Info says which ComfyUI release reads the file natively.
"""
from __future__ import annotations

import json

import torch

from ..checkpoint import COMFY_PREFIX, Checkpoint
from ... import schemes as _schemes
from ...errors import CorruptCheckpointError, UnsupportedFormatError, ValidationError
from ...safe_text import escape
from .. import comfy_layout as cf, plain_data
from ..file_handle import OpenedFile
from ..safetensors_layout import DTYPE_NAMES
from ..validate_tensors import check_quantized
from ...schemes import qtensor
from ...schemes.native_layout import Stored

PREFIX = COMFY_PREFIX
QUANT_SUFFIX = ".comfy_quant"
ATTENTION_SUFFIX = ".comfy_attention.config"
SIDE_TENSORS = (".weight_scale", ".input_scale", ".scale_weight", ".scale_input", ".weight_scale_2")
MAX_QUANT_JSON = 64 * 1024


def _config_of(cfg, layer: str, path: str) -> dict:
    """The layer's JSON object (a bare format name from an older header becomes {"format": name})."""
    if isinstance(cfg, str):
        cfg = {"format": cfg}
    if not isinstance(cfg, dict) or not isinstance(cfg.get("format"), str):
        raise CorruptCheckpointError(f"The quantization entry of layer '{layer[:80]}' has no format name.",
                                     path=path, found=str(cfg)[:120])
    params = cfg.get("params")
    if isinstance(params, dict):  # ComfyUI reads convrot settings nested under "params" as a fallback
        cfg = {**{k: v for k, v in params.items() if k in ("convrot", "convrot_groupsize")}, **cfg}
    if "convrot" in cfg and not isinstance(cfg["convrot"], bool):
        raise CorruptCheckpointError(f"Layer '{layer[:80]}': 'convrot' must be true or false.", path=path,
                                     found=repr(cfg["convrot"])[:40])
    return cfg


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
            layers[strip(name)] = _config_of(cfg, name, path)
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


def layer_config(t: torch.Tensor, layer: str, path: str) -> dict:
    """A layer's ``.comfy_quant`` tensor as its config object (format name, convrot settings), checked."""
    return _config_of(_read_quant_json(t, layer, path), layer, path)


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
                layers.setdefault(layer, _config_of(_read_quant_json(get(n), layer, path), layer, path))
                style = style or "comfy_quant"
        legacy_scale_key = ".weight_scale"
        fmts = cf.formats()
        if marker is not None:
            mdtype = get(marker).dtype
            marked = [f for f in fmts.values() if f.marker_dtype]  # the marker's dtype names one of them
            fmt = next((f.name for f in marked if f.storage == mdtype), marked[0].name if marked else None)
            stored = {DTYPE_NAMES[f.storage] for f in marked}
            for n in names:
                if n.endswith(".weight") and index[n]["dtype"] in stored:
                    layers.setdefault(strip(n[: -len(".weight")]), {"format": fmt})
            style = style or "scaled_fp8"
            legacy_scale_key = ".scale_weight"
        if not layers:
            raise CorruptCheckpointError("This ComfyUI-native file marks no quantized layers.", path=path,
                                         fix="A dense file belongs in 'Load Diffusion Model'.")
        unsupported = sorted({c["format"] for c in layers.values() if c["format"] not in fmts})
        if unsupported:
            known = [u for u in unsupported if u in cf.OTHER]
            raise UnsupportedFormatError(
                f"This ComfyUI-native file uses the quantization format{'s' if len(unsupported) > 1 else ''} "
                f"{', '.join(repr(escape(u[:40])) for u in unsupported)}, which this pack does not load"
                + ("" if known == unsupported else " (unknown to it)") + ".", path=path,
                expected=" / ".join(fmts), found=", ".join(escape(u[:40]) for u in unsupported),
                fix="Load it with ComfyUI's own 'Load Diffusion Model' (a newer ComfyUI may know it), or use the "
                    "repo's non-ComfyUI file.")

        by_stripped = {strip(n): n for n in names}
        tensors: dict = {}
        consumed: set = set()
        granularity: dict = {}
        counts: dict = {}
        rotated: dict = {}
        input_scales = attention = 0
        dropped: dict = {}  # {side tensor name: layers}: what ComfyUI's own loader drops too (cf.dropped_side)
        for layer, cfg in sorted(layers.items()):
            fmt = fmts[cfg["format"]]
            wkey = by_stripped.get(layer + ".weight")
            if wkey is None:
                raise CorruptCheckpointError(f"Quantized layer '{layer[:80]}' has no weight tensor.", path=path)
            for name in fmt.unread_side:
                if layer + "." + name in by_stripped:
                    raise UnsupportedFormatError(
                        f"Layer '{escape(layer[:80])}' is {fmt.name} with a '{name}' (an input smoothing factor ComfyUI "
                        "multiplies each input by before the matmul), which this pack does not apply: read without "
                        "it, the layer would compute another function.", path=path, expected=f"{fmt.name} without "
                        f"{name}", found=f"{layer[:80]}.{name}",
                        fix="Load it with ComfyUI's own 'Load Diffusion Model' (0.33+ reads it), or use the repo's "
                            "non-ComfyUI file.")
            for name in cf.dropped_side(fmt):
                key = by_stripped.get(layer + "." + name)
                if key is not None:  # ComfyUI computes this layer without it: so does this pack
                    consumed.add(key)
                    dropped[name] = dropped.get(name, 0) + 1
            side = {}
            for name in fmt.side:
                key = by_stripped.get(layer + (legacy_scale_key if name == "weight_scale" else "." + name))
                if key is None and name == "weight_scale":
                    key = by_stripped.get(layer + ".weight_scale")
                side[name] = get(key) if key else (torch.ones(()) if style == "scaled_fp8" else None)
            t, gran, group = cf.to_weight(fmt, Stored(layer, path, cfg, get(wkey), side))
            # the boundary every reader's quantized tensors pass: finite, non-negative, bounded scales included
            check_quantized(layer + ".weight", t, path)
            if group:
                setattr(t, qtensor.ROTATION_ATTR, int(group))
            tensors[layer + ".weight"] = t
            if gran:
                granularity.setdefault(fmt.scheme, set()).add(gran)
            if group:
                rotated[layer] = group
            counts[fmt.name] = counts.get(fmt.name, 0) + 1
            consumed.add(wkey)
            for suffix in SIDE_TENSORS + (QUANT_SUFFIX,):
                if layer + suffix in by_stripped:
                    consumed.add(by_stripped[layer + suffix])
                    input_scales += suffix in (".input_scale", ".scale_input")
        for n in names:
            if n in consumed or n == marker or n.endswith(QUANT_SUFFIX):
                continue
            if n.endswith(ATTENTION_SUFFIX):
                attention += 1
                continue
            tensors[strip(n)] = get(n)

    schemes_in = sorted({fmts[c["format"]].scheme for c in layers.values()})
    metadata = {"component": "transformer", "source_format": "comfyui-native", "comfy_quant_style": style,
                "comfy_quant_formats": counts}
    if len(schemes_in) == 1:
        metadata["scheme"] = schemes_in[0]
    if rotated:
        metadata["comfy_convrot_layers"] = len(rotated)
        metadata["comfy_convrot_groups"] = sorted(set(rotated.values()))
    if input_scales:
        metadata["comfy_input_scales"] = input_scales
    if attention:
        metadata["comfy_attention_configs"] = attention
    if dropped:
        metadata["comfy_dropped_side"] = dict(sorted(dropped.items()))
    for scheme, grans in granularity.items():
        field = _schemes.get(scheme)[0].granularity_field
        if field:  # a scheme naming no granularity field records none
            metadata[field] = "per_tensor" if grans == {"per_tensor"} else \
                "per_row" if grans == {"per_row"} else "mixed"
    metadata.update(_conversion_record(meta, metadata.get("scheme"), path))
    return Checkpoint(path=path, container="comfyui-native", format_tag=None, metadata=metadata, tensors=tensors)


CONVERSION_RECORD = "unsloth_comfy_conversion"  # Unsloth's converter records the source here; ComfyUI ignores it


def _conversion_record(meta: dict, scheme: str | None, path: str) -> dict:
    """The fields of Unsloth's conversion record (a ``-ComfyUI`` twin) the loader judges like any file's own: its
    base model (checked against the requested base, with the usual rule) and family; a record naming another
    scheme than the layers hold, or one that is not a JSON object of strings, is refused."""
    raw = (meta or {}).get(CONVERSION_RECORD)
    if raw is None:
        return {}
    try:
        rec = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        rec = None
    if not isinstance(rec, dict):
        raise CorruptCheckpointError(f"The header's '{CONVERSION_RECORD}' record is not a JSON object.", path=path,
                                     fix="Download the file again from its repo.")
    out = {}
    for key in ("base_model_id", "family"):
        v = rec.get(key)
        if v is not None and not isinstance(v, str):
            raise CorruptCheckpointError(f"The '{CONVERSION_RECORD}' record's '{key}' is not a string.", path=path,
                                         found=type(v).__name__, fix="Download the file again from its repo.")
        if v:
            out[key] = v[:300]
    recorded = rec.get("scheme")
    try:
        recorded = _schemes.normalize(recorded) if isinstance(recorded, str) else None
    except ValidationError:
        recorded = None
    if recorded and scheme and not _schemes.same_kind(recorded, scheme):
        raise CorruptCheckpointError(f"The '{CONVERSION_RECORD}' record says {recorded!r}, but its layers "
                                     f"hold {scheme}.", path=path, fix="Download the file again from its repo.")
    if out:
        out["comfy_conversion_record"] = True
    return out


def native_since(counts: dict) -> str | None:
    """The first ComfyUI release whose own Load Diffusion Model reads every format in ``counts``."""
    fmts = cf.formats()
    vs = [fmts[f].since for f in counts if f in fmts]
    return max(vs, key=lambda v: tuple(int(x) for x in v.split("."))) if vs else None


# --- writing: a file stock ComfyUI loads with its own Load Diffusion Model ----------------------------------------

def native_format(scheme: str) -> str:
    """The ComfyUI format that holds this pack's ``scheme`` (its record's first ComfyUI layout)."""
    s, _ = _schemes.get(scheme)
    if s.comfy_format is None:
        raise ValidationError(f"Scheme '{s.name}' has no ComfyUI-native format.", expected=", ".join(
            x.name for x in _schemes.registry.all_schemes() if x.comfy_format), found=s.name,
            fix="Write it in the Unsloth format instead.")
    return s.comfy_format
# Only the transformer's repeated blocks are quantized: ComfyUI reads the model's configuration from the shapes of the
# layers around them (FLUX's img_in, Z-Image's cap_embedder ...), and NVFP4's packed codes halve a weight's width.
BLOCK_TOKENS = ("blocks.", "layers.", "refiner.")


def native_tensors(tensors, scheme: str, *, min_features: int, progress=None) -> tuple[dict, dict, list]:
    """ComfyUI-layout tensors (dense, or this pack's quantized weights) -> (the file's tensors, {layer: JSON},
    skipped Linear names). A pre-quantized weight whose layout keeps its bytes (``from_weight``: NVFP4 / MX, only the
    nibble order changes) keeps them; anything else is quantized from its dense values the way ComfyUI's quantizer
    does (the layout's ``from_dense``: one scale per tensor for fp8, per row for int8)."""
    import json as _json

    from ...schemes import qtensor
    fmt = cf.layout(native_format(scheme))
    rec, _ = _schemes.get(scheme)
    flt = _schemes.LayerFilter(_schemes.normalize(scheme), min_features, ())
    out, layers, skipped = {}, {}, []
    items = list(tensors.items())
    for i, (k, v) in enumerate(items):
        quantized = qtensor.is_quantized(v)
        dense = qtensor.dense_from_parts(*qtensor.parts(v), torch.bfloat16) if quantized else v
        layer = k[: -len(".weight")] if k.endswith(".weight") else None
        eligible = layer is not None and dense.ndim == 2 and any(t in k for t in BLOCK_TOKENS)
        if eligible and flt.reason_skipped(layer, dense.to(torch.bfloat16)) is None:
            lossless = quantized and fmt.from_weight is not None and qtensor.kind_of(v) == rec.kind \
                and not qtensor.parts(v)[1].rotation
            parts = (fmt.from_weight(fmt, v) if lossless else None) or fmt.from_dense(fmt, dense.to(torch.bfloat16))
            cfg = {"format": fmt.name}
            for suffix, t in parts.items():
                out[f"{layer}.weight{suffix}"] = t.contiguous()
            out[f"{layer}{QUANT_SUFFIX}"] = torch.tensor(list(_json.dumps(cfg).encode()), dtype=torch.uint8)
            layers[layer] = cfg
        else:
            if eligible:
                skipped.append(layer)
            out[k] = (dense.to(torch.bfloat16) if dense.is_floating_point() else dense).contiguous()
        if progress:
            progress("quantize", i + 1, len(items), k)
    return out, layers, skipped


def write_native(path: str, tensors: dict, layers: dict, metadata: dict | None = None) -> None:
    """Both markings: per-layer ``.comfy_quant`` (ComfyUI 0.4+) and the ``_quantization_metadata`` header (0.3.68+,
    which reads only that; newer releases take either). Keys unprefixed, as Load Diffusion Model expects."""
    import json as _json

    from ..safetensors_layout import write_flat
    header = {"_quantization_metadata": _json.dumps({"format_version": "1.0", "layers": layers})}
    for k, v in (metadata or {}).items():
        header[f"prequant_{k}"] = _json.dumps(v)
    write_flat(path, header, [(k, k, t) for k, t in tensors.items()])
