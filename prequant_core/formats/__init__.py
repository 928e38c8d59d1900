"""Readers, one module per container. ``read`` picks by content (magic bytes), not by file name."""
from __future__ import annotations

from .. import safe_text
from ..checkpoint import Checkpoint
from ..errors import CorruptCheckpointError
from .file_handle import OpenedFile, open_file, opened  # noqa: F401 - the readers' shared entry points

ZIP_MAGIC = b"PK\x03\x04"


def sniff(src) -> str:
    """'pt' (torch.save zip), 'safetensors', or raise. ``src``: a path or an ``OpenedFile``."""
    with opened(src) as f:
        path, size = f.path, f.size
        try:
            head = f.read_at(0, 16)
        except OSError as e:
            raise CorruptCheckpointError("The checkpoint file cannot be read.", path=path,
                                         found=f"{type(e).__name__}: {e.strerror or e}",
                                         fix="Check the file's permissions and the disk.") from None
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
        path=path, expected="a .safetensors or .pt pre-quantized transformer",
        found=f"{size} bytes starting {safe_text.escape(repr(head[:8]))}",
        fix="Download the file again (it may be truncated or an HTML error page), or pick another file.")


def read(src, *, mmap: bool = True) -> Checkpoint:
    """The whole checkpoint. ``src``: a path (opened here, once) or an ``OpenedFile`` (read through it)."""
    with opened(src) as f:
        if sniff(f) == "pt":
            from .pt import read_pt
            return read_pt(f, mmap=mmap)
        from .safetensors_container import read_safetensors
        return read_safetensors(f)
