"""A tiny assembler of protocol-2 pickle opcodes, for crafted pickles whose every byte the test shows: what torch.save
never writes, but a stranger's file may hold (tests/formats/test_legacy_formats.py, tests/formats/test_legacy_v1_records.py)."""
from __future__ import annotations

import struct

MARK, TUPLE, TUPLE1, EMPTY_TUPLE, REDUCE, POP, EMPTY_DICT, SETITEMS, STOP, NEWOBJ, BUILD, NEWFALSE = \
    b"(", b"t", b"\x85", b")", b"R", b"0", b"}", b"u", b".", b"\x81", b"b", b"\x89"


def global_(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def string(text: str) -> bytes:
    b = text.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def int32(i: int) -> bytes:
    return b"J" + struct.pack("<i", i)
