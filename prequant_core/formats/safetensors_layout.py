"""The safetensors file layout both writers share (the Unsloth container's and the ComfyUI-native one): the dtype
table (torch dtype <-> the header's name) and a streaming writer, header first, each tensor's bytes straight from
its storage. ``safetensors.save_file`` copies every tensor and raises errors that are not OSErrors."""
from __future__ import annotations

import json

import torch

from ..errors import BuildError

# The one safetensors dtype table: torch dtype <-> the header's name (and so the element size)
DTYPE_NAMES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
               torch.int8: "I8", torch.uint8: "U8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
               torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
               torch.float8_e8m0fnu: "F8_E8M0"}  # MX block exponents
for _name, _st in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64")):
    if hasattr(torch, _name):
        DTYPE_NAMES[getattr(torch, _name)] = _st
NAME_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}
ELEMENT_SIZES = {n: torch.empty((), dtype=d).element_size() for n, d in NAME_DTYPES.items()}


def write_flat(path: str, meta_header: dict, flat: list, *, progress=None) -> None:
    """Stream plain tensors [(key, stored name, tensor)] and a string-to-string ``__metadata__`` to ``path``.
    Tensors are ordered by element size (largest first), so every tensor starts aligned to its element size."""
    seen = set()
    for _, name, _ in flat:
        if name in seen:
            raise BuildError(f"Two tensors flatten to the same name '{name}'.")
        seen.add(name)
    order = sorted(range(len(flat)), key=lambda i: (-flat[i][2].element_size(), i))
    header: dict = {"__metadata__": meta_header}
    offset = 0
    for i in order:
        _, name, t = flat[i]
        if t.dtype not in DTYPE_NAMES:
            raise BuildError(f"Tensor '{name}' has dtype {t.dtype}, which safetensors cannot store.")
        n = t.numel() * t.element_size()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    blob += b" " * (-(8 + len(blob)) % 8)
    total = len(order)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for done, i in enumerate(order, 1):
            key, name, t = flat[i]
            t = t.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            t = t.contiguous()
            if t.numel():
                f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            if progress:
                progress("write", done, total, name)
