"""The ``.safetensors`` container (no pickle anywhere): torchao's flattened tensors plus Unsloth's header entries.

Layout (docs/FORMAT.md section 2):
  tensors   ``<fqn>._weight_qdata`` / ``_weight_scale`` (int8 also ``_weight_zero_point``), plain tensors as is,
            root-level keys (no dot) as ``unsloth_root::<key>``
  header    per tensor name the torchao JSON, ``tensor_names``, ``unsloth_format``, ``unsloth_metadata`` (JSON),
            ``unsloth_root_tensors`` (JSON list)
"""
from __future__ import annotations

import bisect
import json

import torch

from ...schemes import qtensor
from ..checkpoint import COMFY_PREFIX, Checkpoint
from ..layer_policy import expected_tag
from ...errors import BuildError, CorruptCheckpointError
from .. import plain_data
from ..file_handle import opened
from . import READ_HEADER, Container, Light
from ...units import human_bytes
from ..validate_tensors import check_quantized
from ..safetensors_layout import DTYPE_NAMES, ELEMENT_SIZES, NAME_DTYPES, write_flat  # noqa: F401 - named here

ROOT_PREFIX = "unsloth_root::"
# A real header is a few KB per hundred tensors (torchao's JSON per quantized weight included); parsing costs
# about 25x its size in memory, so the bound keeps a hostile header's cost small.
MAX_HEADER = 16 * 2**20
MAX_DIMS = 8
MAX_DIM = 2**40
MAX_EMPTY_DIM = 2**32
def read_header(src) -> tuple[dict, dict, int]:
    """(tensor index, __metadata__, header length) after checking every offset against the file size.

    Reads only the 8-byte length and the header itself: no tensor bytes. ``src``: a path or an ``OpenedFile``.
    """
    with opened(src) as f:
        path, size = f.path, f.size
        raw = f.read_at(0, 8)
        if len(raw) < 8:
            raise CorruptCheckpointError("The safetensors file is truncated before its header.", path=path)
        n = int.from_bytes(raw, "little")
        if n > MAX_HEADER:
            raise CorruptCheckpointError(
                f"The safetensors header is larger than the {human_bytes(MAX_HEADER)} this pack reads (a real "
                "checkpoint's header is well under 1 MB per thousand tensors).", path=path,
                found=f"{n} bytes declared", fix="Download the file again, or pick another file.")
        if n > size - 8:
            raise CorruptCheckpointError("The safetensors header runs past the end of the file (truncated).",
                                         path=path, found=f"header {n} bytes, file {size} bytes",
                                         fix="Download or build the file again.")
        blob = f.read_at(8, n)
    try:
        header = json.loads(blob.decode("utf-8"), parse_constant=plain_data.no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CorruptCheckpointError("The safetensors header is not valid UTF-8 JSON.", path=path,
                                     found=f"{type(e).__name__}") from None
    del blob
    if not isinstance(header, dict):
        raise CorruptCheckpointError("The safetensors header is not a JSON object.", path=path)
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise CorruptCheckpointError("The safetensors __metadata__ is not a string-to-string map.", path=path)
    data_len = size - 8 - n
    spans = []
    for name, info in header.items():
        ok = (isinstance(info, dict) and isinstance(info.get("dtype"), str) and info["dtype"] in ELEMENT_SIZES
              and isinstance(info.get("shape"), list) and len(info["shape"]) <= MAX_DIMS
              and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM for d in info["shape"])
              and isinstance(info.get("data_offsets"), list) and len(info["data_offsets"]) == 2
              and all(isinstance(o, int) and not isinstance(o, bool) for o in info["data_offsets"]))
        if not ok:
            raise CorruptCheckpointError(f"Tensor entry '{name[:80]}' in the safetensors header is malformed.",
                                         path=path, found=json.dumps(info, default=str)[:200])
        a, b = info["data_offsets"]
        numel = 1
        for d in info["shape"]:
            numel *= d
        if not (0 <= a <= b <= data_len) or b - a != numel * ELEMENT_SIZES[info["dtype"]]:
            raise CorruptCheckpointError(f"Tensor '{name[:80]}' points outside the file or has the wrong length "
                                         "for its shape (truncated or corrupt).", path=path,
                                         found=f"offsets {a}..{b}, data section {data_len} bytes, "
                                               f"{info['dtype']} {info['shape']}",
                                         fix="Download or build the file again.")
        if numel == 0 and any(d > MAX_EMPTY_DIM for d in info["shape"]):
            # holds nothing, but a reader that allocates by shape would overflow; no real tensor looks like this
            raise CorruptCheckpointError(f"Tensor '{name[:80]}' declares an empty shape with a huge dimension.",
                                         path=path, found=f"{info['dtype']} {info['shape']}",
                                         fix="Download or build the file again.")
        spans.append((a, b, name))
    end = 0  # the tensors tile the data section, as the full read (the safetensors library) requires of a file
    for a, b, name in sorted(spans):
        if a != end:
            raise CorruptCheckpointError("Two tensors in the safetensors file overlap." if a < end else
                                         "The safetensors file holds bytes no tensor accounts for.", path=path,
                                         found=f"tensor '{name[:60]}' at bytes {a}..{b}; the ones before end at {end}",
                                         fix="Download or build the file again.")
        end = b
    if end != data_len:
        raise CorruptCheckpointError("The safetensors file holds bytes no tensor accounts for.", path=path,
                                     found=f"data section {data_len} bytes, its tensors end at {end}",
                                     fix="Download or build the file again.")
    return header, meta, n


def json_entry(meta: dict, key: str, path: str, default):
    raw = meta.get(key)
    if raw is None:
        return default
    return plain_data.loads(raw, path, f"header entry '{key}'")


def is_comfy_native(index: dict, meta: dict) -> bool:
    """ComfyUI's own quantized layout (docs/FORMAT.md section 6), by any of its three markings."""
    return (meta.get("unsloth_format") is None and any(k.endswith(".comfy_quant") for k in index)) \
        or "_quantization_metadata" in meta or any(k == "scaled_fp8" or k.endswith(".scaled_fp8") for k in index)


def read_safetensors(src) -> Checkpoint:
    from safetensors import safe_open
    with opened(src) as fh:
        return _read(fh, safe_open)


def _read(fh, safe_open) -> Checkpoint:
    path = fh.path
    index, meta, _ = read_header(fh)
    tag = meta.get("unsloth_format")
    metadata = json_entry(meta, "unsloth_metadata", path, {})
    if not isinstance(metadata, dict):
        raise CorruptCheckpointError("Header entry 'unsloth_metadata' is not a JSON object.", path=path)
    if is_comfy_native(index, meta):
        from .comfy_native import read_comfy_native
        return read_comfy_native(fh, index, meta)
    try:
        with safe_open(fh.io_path, framework="pt", device="cpu") as f:
            raw = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - the safetensors library raises its own error types
        raise CorruptCheckpointError("The safetensors file could not be read.", path=path,
                                     found=f"{type(e).__name__}: {str(e)[:200]}") from None
    tensors, _ = assemble(path, index, meta, raw.__getitem__)
    return Checkpoint(path=path, container="safetensors", format_tag=tag, metadata=metadata, tensors=tensors)


def assemble(path: str, index: dict, meta: dict, get, *, read_data: bool = True) -> tuple[dict, dict]:
    """(state dict, {name: (torchao JSON, {part: stored key})}) from the header and ``get(stored key)``.

    ``get`` returns real tensors (the reader) or shape-only stand-ins (Prequant Info, ``read_data=False``), so both
    walk the same rules: listed names must have entries, flattened parts are decoded strictly, root tensors
    lose their prefix.
    """
    tensor_names = json_entry(meta, "tensor_names", path, None)
    roots = json_entry(meta, "unsloth_root_tensors", path, [])
    if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
        raise CorruptCheckpointError("Header entry 'unsloth_root_tensors' is not a list of names.", path=path)
    keys = sorted(index)
    tensors: dict = {}
    consumed: set = set()
    qparts: dict = {}
    if tensor_names is not None:
        if not isinstance(tensor_names, list) or not all(isinstance(t, str) for t in tensor_names):
            raise CorruptCheckpointError("Header entry 'tensor_names' is not a list of names.", path=path)
        for name in tensor_names:
            entry = meta.get(name)
            if entry is None:
                raise CorruptCheckpointError(f"Header lists tensor '{name[:80]}' but has no entry for it.", path=path)
            if "." not in name:
                raise CorruptCheckpointError(f"Tensor name '{name[:80]}' has no module path.", path=path)
            fqn, attr = name.rsplit(".", 1)
            prefix = f"{fqn}._{attr}_"
            i = bisect.bisect_left(keys, prefix)
            stored = {}
            while i < len(keys) and keys[i].startswith(prefix):
                stored[keys[i][len(prefix):]] = keys[i]
                i += 1
            if stored:
                from .. import torchao_json  # imports torchao: only a file holding torchao tensors pays for it
                try:
                    t = torchao_json.decode_weight(entry, {p: get(k) for p, k in stored.items()})
                except torchao_json.DecodeError as e:
                    raise CorruptCheckpointError(f"Quantized tensor '{name[:80]}' cannot be decoded: {e}.",
                                                 path=path, fix="Download or build the file again.") from None
                check_quantized(name, t, path, read_data=read_data)
                tensors[name] = t
                qparts[name] = (entry, stored)
                consumed.update(stored.values())
            elif name in index:
                tensors[name] = get(name)
                consumed.add(name)
            else:
                raise CorruptCheckpointError(f"Tensor '{name[:80]}' is listed in the header but missing.", path=path)
    for k in keys:
        if k not in consumed:
            tensors[k[len(ROOT_PREFIX):] if k.startswith(ROOT_PREFIX) else k] = get(k)
    if not tensors:
        raise CorruptCheckpointError("The checkpoint holds no tensors.", path=path)
    return tensors, qparts


def metadata_json(metadata: dict) -> str:
    """The ``unsloth_metadata`` entry: the fields in the order given (the builder's, which is Unsloth's), never
    sorted."""
    return json.dumps(metadata, default=str)


def flatten(tensors: dict, *, format_tag: str, metadata: dict) -> tuple[dict, dict]:
    """State dict with torchao tensors -> (plain tensors, header) in the container's layout."""
    from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict
    dotted = {k: v for k, v in tensors.items() if "." in k}
    roots = {k: v for k, v in tensors.items() if "." not in k}
    # torchao's flatten clones every tensor; fine for the per-layer pieces we pass it, and it keeps its JSON exact
    flat, header = flatten_tensor_state_dict(dotted)
    for k, v in roots.items():
        if qtensor.is_quantized(v):
            raise ValueError(f"root-level tensor '{k}' cannot be quantized")
        flat[ROOT_PREFIX + k] = v.contiguous()
    header["unsloth_format"] = format_tag
    header["unsloth_metadata"] = metadata_json(metadata)
    header["unsloth_root_tensors"] = json.dumps(sorted(roots))
    flat = {k: (v.contiguous() if isinstance(v, torch.Tensor) else v) for k, v in flat.items()}
    return flat, header


# ----------------------------------------------------------------------------------------------------------------
# Writing: streamed, header first, each tensor's bytes straight from its storage

def _flat_parts(key: str, t) -> tuple[str | None, list[tuple[str, torch.Tensor]]]:
    """(torchao header JSON or None, [(flat name, tensor)]) exactly as the container's ``flatten`` lays them out,
    without cloning the tensor data."""
    if "." not in key:
        if qtensor.is_quantized(t):
            raise BuildError(f"Root-level tensor '{key}' cannot be quantized.")
        return None, [(ROOT_PREFIX + key, t)]
    if not qtensor.is_quantized(t):
        return json.dumps({"_type": torch.Tensor.__name__}), [(key, t)]
    mod, attr = key.rsplit(".", 1)
    entry, parts = qtensor.codec_of(t).to_json(t)
    return entry, [(f"{mod}._{attr}_{n}", p) for n, p in parts]


def layout(tensors: Mapping, metadata: dict) -> tuple[dict, list[tuple[str, str, torch.Tensor]]]:
    """(``__metadata__`` header dict, [(key, flat name, tensor)]) for the safetensors container."""
    header: dict = {}
    dotted, roots, flat = [], [], []
    for k, v in tensors.items():
        entry, parts = _flat_parts(k, v)
        if entry is None:
            roots.append(k)
        else:
            dotted.append(k)
            header[k] = entry
        flat.extend((k, n, p) for n, p in parts)
    header["tensor_names"] = json.dumps(dotted)
    header["unsloth_format"] = expected_tag(metadata)
    header["unsloth_metadata"] = metadata_json(metadata)
    header["unsloth_root_tensors"] = json.dumps(sorted(roots))
    return header, flat


def write(path: str, tensors: Mapping, metadata: dict, *, progress: BuildProgress | None = None) -> None:
    """Stream the container to ``path``: header first, then each tensor's bytes straight from its storage.

    ``safetensors.save_file`` would need every flattened tensor at once (torchao's flatten clones them; older
    safetensors versions also copy every tensor to ``bytes``); this writer never holds more than the input.
    Tensors are ordered by element size (largest first), so every tensor starts aligned to its element size.
    """
    meta_header, flat = layout(tensors, metadata)
    write_flat(path, meta_header, flat, progress=progress)


# ----------------------------------------------------------------------------------------------------------------
# The registry's record

def read_light(fh) -> Light | None:
    """Header-only read, mirroring ``read_safetensors`` key for key. None: a layout only the full read understands
    (ComfyUI-native twins)."""
    path = fh.path
    index, meta, _ = read_header(fh)
    if is_comfy_native(index, meta):
        return None
    tag = meta.get("unsloth_format")
    md = json_entry(meta, "unsloth_metadata", path, {})
    if not isinstance(md, dict):
        raise CorruptCheckpointError("Header entry 'unsloth_metadata' is not a JSON object.", path=path)
    tensors, qparts = assemble(path, index, meta, read_data=False, get=lambda k: torch.empty(
        index[k]["shape"], dtype=NAME_DTYPES[index[k]["dtype"]], device="meta"))
    ck = Checkpoint(path=path, container="safetensors", format_tag=tag, metadata=md, tensors=tensors)
    return Light(ck, READ_HEADER, qparts)


def declared_bytes(fh) -> int:
    """The tensor bytes the header's offsets declare (a full ComfyUI checkpoint: its diffusion model's only)."""
    index, _, _ = read_header(fh)
    names = list(index)
    if any(n.startswith(COMFY_PREFIX) for n in names):
        names = [n for n in names if n.startswith(COMFY_PREFIX) or n == "scaled_fp8"]
    return sum(index[n]["data_offsets"][1] - index[n]["data_offsets"][0] for n in names)


def _recognise(head: bytes, size: int) -> bool:
    if len(head) < 9:
        return False
    n = int.from_bytes(head[:8], "little")
    return 2 <= n <= size - 8 and head[8:9] == b"{"


CONTAINER = Container(
    name="safetensors", description="a safetensors file", extensions=(".safetensors",), recognise=_recognise,
    read=lambda f, mmap=True: read_safetensors(f), read_light=read_light, declared_bytes=declared_bytes, write=write)
