"""A read-only container that exists only to prove the registry's claim: adding one is this module plus one line in
``prequant_core.formats.containers._MODULES``. Layout: ``TOYCKPT1``, an 8-byte little-endian JSON length, the JSON
({"format", "metadata", "tensors": {key: {"kind": "int8" | "bf16", "shape", "offset"}}}), then the raw bytes
(int8 codes followed by float32 per-row scales; bf16 tensors as they are)."""
from __future__ import annotations

import json

import torch

from prequant_core.schemes import qtensor
from prequant_core import schemes
from prequant_core.formats.checkpoint import Checkpoint
from prequant_core.formats.containers import Container

MAGIC = b"TOYCKPT1"


def _header(f):
    n = int.from_bytes(f.read_at(8, 8), "little")
    return json.loads(f.read_at(16, n)), 16 + n


def read(f, mmap=True) -> Checkpoint:
    head, base = _header(f)
    tensors = {}
    for k, e in head["tensors"].items():
        rows, cols = e["shape"]
        if e["kind"] == "int8":
            q = torch.frombuffer(bytearray(f.read_at(base + e["offset"], rows * cols)), dtype=torch.int8)
            s = torch.frombuffer(bytearray(f.read_at(base + e["offset"] + rows * cols, rows * 4)), dtype=torch.float32)
            tensors[k] = qtensor.join(q.reshape(rows, cols), s.reshape(rows, 1), schemes.spec("int8"))
        else:
            raw = bytearray(f.read_at(base + e["offset"], rows * cols * 2))
            tensors[k] = torch.frombuffer(raw, dtype=torch.bfloat16).reshape(rows, cols)
    return Checkpoint(path=f.path, container="toy", format_tag=head["format"], metadata=head["metadata"],
                      tensors=tensors)


def declared_bytes(f) -> int:
    head, base = _header(f)
    return f.size - base


def write_toy(path: str, tensors: dict, metadata: dict, tag: str) -> None:
    """For the test only: the container itself is read-only (its ``Container`` has no ``write``)."""
    entries, blobs, offset = {}, [], 0
    for k, v in tensors.items():
        if qtensor.is_quantized(v):
            q, s, _ = qtensor.split(v)
            data = q.contiguous().numpy().tobytes() + s.to(torch.float32).contiguous().numpy().tobytes()
            entries[k] = {"kind": "int8", "shape": list(q.shape), "offset": offset}
        else:
            data = v.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
            entries[k] = {"kind": "bf16", "shape": list(v.shape), "offset": offset}
        blobs.append(data)
        offset += len(data)
    head = json.dumps({"format": tag, "metadata": metadata, "tensors": entries}).encode()
    with open(path, "wb") as fh:
        fh.write(MAGIC + len(head).to_bytes(8, "little") + head + b"".join(blobs))


CONTAINER = Container(name="toy", description="a toy archive", extensions=(".toy",),
                      recognise=lambda head, size: head.startswith(MAGIC), read=read,
                      read_light=lambda f: None, declared_bytes=declared_bytes)
