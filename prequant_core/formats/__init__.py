"""Readers, one module per container. ``read`` picks by content (magic bytes), not by file name."""
from __future__ import annotations

import os

from ..checkpoint import Checkpoint
from ..errors import CheckpointNotFoundError, CorruptCheckpointError

ZIP_MAGIC = b"PK\x03\x04"


def sniff(path: str) -> str:
    """'pt' (torch.save zip), 'safetensors', or raise."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(16)
    except FileNotFoundError:
        raise CheckpointNotFoundError("Checkpoint file not found.", path=path,
                                      fix="Check the file name, or put the file into ComfyUI/models/prequant/.") from None
    except IsADirectoryError:
        raise CorruptCheckpointError("Expected a checkpoint file but this is a folder.", path=path,
                                     fix="Point at the .safetensors or .pt file inside it.") from None
    if head.startswith(ZIP_MAGIC):
        return "pt"
    if len(head) >= 9:
        n = int.from_bytes(head[:8], "little")
        if 2 <= n <= size - 8 and head[8:9] == b"{":
            return "safetensors"
    if size == 0:
        raise CorruptCheckpointError("The checkpoint file is empty (0 bytes).", path=path,
                                     fix="Download or build it again.")
    raise CorruptCheckpointError(
        "Not a pre-quantized checkpoint: the file is neither a torch.save archive nor a safetensors file.",
        path=path, expected="a .safetensors or .pt pre-quantized transformer", found=f"{size} bytes starting {head[:8]!r}",
        fix="Download the file again (it may be truncated or an HTML error page), or pick another file.")


def read(path: str, *, mmap: bool = True) -> Checkpoint:
    kind = sniff(path)
    if kind == "pt":
        from .pt import read_pt
        return read_pt(path, mmap=mmap)
    from .safetensors_container import read_safetensors
    return read_safetensors(path)
