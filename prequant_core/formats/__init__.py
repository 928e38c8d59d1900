"""Readers, one module per container. ``read`` picks by content (magic bytes), not by file name."""
from __future__ import annotations

import os
import stat

from ..checkpoint import Checkpoint
from ..errors import CheckpointNotFoundError, CorruptCheckpointError

ZIP_MAGIC = b"PK\x03\x04"


def sniff(path: str) -> str:
    """'pt' (torch.save zip), 'safetensors', or raise."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(st.st_mode):  # a pipe would block the reader forever, a device never ends
            raise CorruptCheckpointError("Expected a checkpoint file but this is not a regular file (a pipe, socket "
                                         "or device).", path=path, fix="Point at the .safetensors or .pt file.")
        size = st.st_size
        with open(path, "rb") as f:
            head = f.read(16)
    except FileNotFoundError:
        raise CheckpointNotFoundError("Checkpoint file not found.", path=path,
                                      fix="Check the file name, or put the file into ComfyUI/models/prequant/.") from None
    except IsADirectoryError:
        raise CorruptCheckpointError("Expected a checkpoint file but this is a folder.", path=path,
                                     fix="Point at the .safetensors or .pt file inside it.") from None
    except (OSError, ValueError) as e:  # permission denied, a symlink loop, a name too long, an embedded NUL ...
        raise CorruptCheckpointError("The checkpoint file cannot be opened.", path=path,
                                     found=f"{type(e).__name__}: {getattr(e, 'strerror', None) or e}",
                                     fix="Check the file's name and permissions.") from None
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
