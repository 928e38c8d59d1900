"""Giving back the resident pages of memory-mapped checkpoint tensors that the model no longer uses.

A checkpoint is memory-mapped (``torch.load(mmap=True)``, safetensors): its tensors cost resident memory only
where their pages have been read. Fusing rows (``to_q/to_k/to_v`` -> ComfyUI's ``qkv``) reads the parts and
copies them into a new tensor; the parts' pages would stay mapped and counted in the process's RSS next to the copy
for as long as the file's mapping lives (the whole load, or the model's life). ``release`` asks the kernel to
reclaim those pages (``MADV_PAGEOUT``): only pages of file-backed mappings are touched, the call never changes what
the memory holds (a page read again is faulted back in from the file), and it is a no-op where unsupported.
"""
from __future__ import annotations

import bisect
import ctypes
import mmap
import sys

MADV_PAGEOUT = 21  # Linux >= 5.4
_PAGE = mmap.PAGESIZE  # 4 KiB on x86; 16 / 64 KiB kernels on some ARM machines (madvise needs its alignment)
_libc = None


def _madvise():
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        except (OSError, AttributeError):
            _libc = False
    return _libc.madvise if _libc else None


def _file_mappings() -> list[tuple[int, int]]:
    """(start, end) of this process's mappings of regular files, sorted."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/") and fields[4] != "0":  # a path and an inode
                a, b = fields[0].split("-")
                out.append((int(a, 16), int(b, 16)))
    out.sort()
    return out


class Mappings(tuple):
    """This process's file mappings, sorted (start, end) pairs, with their starts for bisecting."""
    __slots__ = ()

    @property
    def starts(self) -> list[int]:
        return self[0]

    @property
    def spans(self) -> list[tuple[int, int]]:
        return self[1]

    def hold(self, start: int, end: int) -> bool:
        """Whether [start, end) lies wholly inside one file mapping."""
        i = bisect.bisect_right(self.starts, start) - 1
        return i >= 0 and self.spans[i][0] <= start and end <= self.spans[i][1]


def file_mappings() -> Mappings | None:
    """A snapshot of this process's file mappings for several ``release`` calls in a row (reading /proc/self/maps
    takes milliseconds): valid for tensors kept alive meanwhile, whose mappings cannot go away under them."""
    try:
        spans = _file_mappings()
    except OSError:
        return None
    return Mappings(([m[0] for m in spans], spans))


def release(tensors, maps: Mappings | None = None) -> int:
    """Reclaim the whole pages of these CPU tensors that lie in file mappings; returns the bytes advised. ``maps``:
    a ``file_mappings`` snapshot taken while these tensors were alive (else /proc/self/maps is read now)."""
    if not sys.platform.startswith("linux"):
        return 0
    madvise = _madvise()
    if madvise is None:
        return 0
    spans = []
    for t in tensors:
        if t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
            continue
        ptr = t.data_ptr()
        start = -(-ptr // _PAGE) * _PAGE  # only pages wholly inside the tensor (neighbours keep theirs)
        end = (ptr + t.numel() * t.element_size()) // _PAGE * _PAGE
        if end > start:
            spans.append((start, end))
    if not spans:
        return 0
    if maps is None:
        maps = file_mappings()
    if maps is None:
        return 0
    done = 0
    for start, end in spans:
        if not maps.hold(start, end):
            continue  # not (wholly) in one file mapping: anonymous memory is never advised
        if madvise(start, end - start, MADV_PAGEOUT) == 0:
            done += end - start
    return done


def file_backed(tensors, maps: Mappings | None = None) -> bool:
    """Whether every one of these CPU tensors lies wholly inside a mapping of a regular file (a memory-mapped
    checkpoint), so that its bytes can always be read back from that file instead of being kept in memory. ``maps``:
    as for ``release``."""
    tensors = list(tensors)
    if not sys.platform.startswith("linux") or not tensors:
        return False
    if maps is None:
        maps = file_mappings()
    if maps is None:
        return False
    for t in tensors:
        if t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
            return False
        start = t.data_ptr()
        if not maps.hold(start, start + t.numel() * t.element_size()):
            return False
    return True
