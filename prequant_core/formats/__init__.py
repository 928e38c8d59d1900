"""Readers, one module per container (``containers`` lists them). ``read`` picks by content, not by file name."""
from __future__ import annotations

from .checkpoint import Checkpoint
from .file_handle import OpenedFile, open_file, opened  # noqa: F401 - the readers' shared entry points



def sniff(src) -> str:
    """The container's name ('pt', 'safetensors', ...: ``containers``), by content, or a typed error."""
    from .containers import recognise
    return recognise(src).name


def read(src, *, mmap: bool = True) -> Checkpoint:
    """The whole checkpoint. ``src``: a path (opened here, once) or an ``OpenedFile`` (read through it).

    Whatever a reader raises that is not already one of the pack's typed errors (a stranger's bytes can make any
    library raise anything) becomes a ``CorruptCheckpointError`` naming the file, with the original attached."""
    from ..errors import reading
    from .containers import recognise
    from .validate_tensors import check_plain_tensors, int8_encoder_parts
    with opened(src) as f, reading(f.path):
        ck = recognise(f).read(f, mmap=mmap)
        check_plain_tensors(ck.tensors, f.path, exempt=int8_encoder_parts(ck))
        return ck
