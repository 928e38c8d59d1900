"""A tiny assembler of protocol-2 pickle opcodes, for crafted pickles whose every byte the test shows: what torch.save
never writes, but a stranger's file may hold (tests/formats/test_legacy_formats.py, tests/formats/test_legacy_v1_records.py)."""
from __future__ import annotations

import struct
import zipfile

MARK, TUPLE, TUPLE1, EMPTY_TUPLE, REDUCE, POP, EMPTY_DICT, SETITEMS, STOP, NEWOBJ, BUILD, NEWFALSE = \
    b"(", b"t", b"\x85", b")", b"R", b"0", b"}", b"u", b".", b"\x81", b"b", b"\x89"


def global_(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def string(text: str) -> bytes:
    b = text.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def int32(i: int) -> bytes:
    return b"J" + struct.pack("<i", i)


def write_pt(path, data_pkl: bytes, *, big_endian: bool = False) -> str:
    """A genuine torch.save archive (one storage of two float32 ones, data/0) with its pickle replaced; big-endian:
    the archive as a big-endian machine writes it (its byteorder record, its storage bytes swapped)."""
    import torch
    torch.save({"x": torch.ones(2)}, path)
    with zipfile.ZipFile(path) as z:
        blobs = {n: z.read(n) for n in z.namelist()}
    for n in blobs:
        if n.endswith("data.pkl"):
            blobs[n] = data_pkl
        elif big_endian and n.endswith("/byteorder"):
            blobs[n] = b"big"
        elif big_endian and n.endswith("/data/0"):
            blobs[n] = struct.pack(">2f", 1.0, 1.0)
    with zipfile.ZipFile(path, "w") as z:
        for n, b in blobs.items():
            z.writestr(n, b)
    return str(path)
