"""Giving back the resident pages of tensors that are a read-only view of a checkpoint file.

A loaded checkpoint's weights are memory-mapped from the file (``torch.load(mmap=True)``, safetensors): their pages
count in the process's resident memory once read, and the kernel re-reads them from the file when they are touched
again. When a weight has been replaced and only a backup keeps the original (a LoRA patch keeps it for an exact
unpatch), its pages can be dropped from memory without losing a byte: ``madvise(MADV_DONTNEED)`` on a private file
mapping discards only the process's copies, and the next read faults the file's bytes back in.

Only for pages that are certainly file-backed and unwritten: the range must lie inside one file mapping of this
process (``/proc/self/maps``), mapped without write permission or privately from a file the weights were read from.
Anonymous memory (a fused or converted tensor) is never touched: ``MADV_DONTNEED`` would zero it. Linux only; a
no-op elsewhere.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

MADV_DONTNEED = 4
_libc = None


def _madvise():
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        _libc = ctypes.CDLL(name, use_errno=True) if name else False
        if _libc:
            _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            _libc.madvise.restype = ctypes.c_int
    return _libc.madvise if _libc else None


def _file_mappings() -> list[tuple[int, int, str, str]]:
    """(start, end, perms, path) of this process's mappings of regular files."""
    out = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6 or not parts[5].startswith("/"):
                    continue
                lo, _, hi = parts[0].partition("-")
                out.append((int(lo, 16), int(hi, 16), parts[1], parts[5].strip()))
    except OSError:
        return []
    return out


def release(tensors) -> int:
    """Drop the resident pages of each CPU tensor of ``tensors`` that is wholly a read-only-or-private view of a
    mapped file; returns the bytes advised away (0 where nothing qualified, or off Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    madvise = _madvise()
    if madvise is None:
        return 0
    maps = None
    page = os.sysconf("SC_PAGE_SIZE")
    done = 0
    for t in tensors:
        if t is None or t.device.type != "cpu" or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        lo, n = storage.data_ptr(), storage.nbytes()
        # whole pages strictly inside the storage: a shared edge page may hold another tensor's bytes
        start, end = -(-lo // page) * page, ((lo + n) // page) * page
        if end <= start:
            continue
        if maps is None:
            maps = _file_mappings()
        hit = next((m for m in maps if m[0] <= start and end <= m[1]), None)
        if hit is None or "w" in hit[2] and hit[2][3] != "p":  # not a file mapping, or a shared writable one
            continue
        if madvise(start, end - start, MADV_DONTNEED) == 0:
            done += end - start
    return done
