"""Readers, one module per container (``registry`` lists them). ``read`` picks by content, not by file name."""
from __future__ import annotations

from ..checkpoint import Checkpoint
from .file_handle import OpenedFile, open_file, opened  # noqa: F401 - the readers' shared entry points



def sniff(src) -> str:
    """The container's name ('pt', 'safetensors', ...: ``registry``), by content, or a typed error."""
    from .registry import recognise
    return recognise(src).name


def read(src, *, mmap: bool = True) -> Checkpoint:
    """The whole checkpoint. ``src``: a path (opened here, once) or an ``OpenedFile`` (read through it)."""
    from .registry import recognise
    with opened(src) as f:
        return recognise(f).read(f, mmap=mmap)
