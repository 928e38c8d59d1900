"""The container registry: every file container this pack reads (and the ones it writes), one module each, each
described by one ``Container`` record. Every consumer goes through here: the readers' dispatch
(``formats.read``), Prequant Info's light read, the memory guard's size estimate, the model lists and the
builder's writers. Adding a read-only container is one module defining ``CONTAINER`` plus one line in
``_MODULES``, and its tests.

Containers are picked by content (the first bytes), never by the file name; ``extensions`` only decide which files
the model lists show.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from ...errors import CorruptCheckpointError
from ...schemes import registry as scheme_registry
from ..file_handle import opened

READ_HEADER = "header"  # length + JSON header only
READ_MMAP = "mmap"  # torch.load(mmap=True): pickle only, tensor bytes mapped, untouched
READ_FULL = "full"  # the full reader: every tensor loaded (kinds the light paths do not understand)
HEAD_BYTES = 32  # enough for the longest mark read here ("version https://git-lfs", 23 bytes)


@dataclasses.dataclass
class Light:
    """A checkpoint whose tensors carry shapes and dtypes but whose bytes were never read."""
    checkpoint: object  # checkpoint.Checkpoint
    read_mode: str
    # logical name -> (torchao JSON entry, {part: stored key}), for verifying fingerprints one weight at a time
    quantized_parts: dict | None = None


@dataclasses.dataclass(frozen=True)
class Container:
    name: str  # "pt" | "safetensors": the builder's container names and ``Checkpoint.container``
    description: str  # what the file is, in words ("a torch.save archive")
    extensions: tuple[str, ...]  # first one: what the builder names its files
    recognise: Callable[[bytes, int], bool]  # (the first HEAD_BYTES bytes, file size) -> is this container
    read: Callable  # (OpenedFile, *, mmap) -> Checkpoint, every tensor
    read_light: Callable  # OpenedFile -> Light | None (None: only the full read understands this file)
    declared_bytes: Callable  # OpenedFile -> bytes of tensor data the index declares, or None
    write: Callable | None = None  # (path, tensors, metadata, *, progress) -> None; None: read-only

    @property
    def extension(self) -> str:
        return self.extensions[0]


_MODULES = ("pt", "safetensors_container")  # recognition order; a name with a dot is a full module path


def containers() -> tuple[Container, ...]:
    return tuple(importlib.import_module(m if "." in m else f"{__package__}.{m}").CONTAINER for m in _MODULES)


def by_name(name: str) -> Container:
    for c in containers():
        if c.name == name:
            return c
    raise KeyError(name)


def writable() -> tuple[Container, ...]:
    return tuple(c for c in containers() if c.write is not None)


def writes_schemes(c: Container) -> tuple[str, ...]:
    """The scheme names the builder writes to ``c`` (each scheme's record lists its containers)."""
    return scheme_registry.in_container(c.name) if c.write is not None else ()


def extensions() -> set[str]:
    return {e for c in containers() for e in c.extensions}


def _looks_like(head: bytes) -> str:
    """What the first bytes look like, in words (never the bytes themselves)."""
    h = head.lstrip()[:16].lower()
    if h.startswith((b"<!doctype html", b"<html")):
        return "an HTML page (an error page saved instead of the file?)"
    if h.startswith(b"{"):
        return "JSON text"
    if head.startswith(b"version https://git-lfs"):
        return "a Git LFS pointer (the file itself was not downloaded)"
    if head[:4] == b"GGUF":
        return "a GGUF file (ComfyUI-GGUF's format)"
    if all(32 <= c < 127 or c in (9, 10, 13) for c in head[:64]):
        return "plain text"
    return "neither a zip archive nor a safetensors header"


def recognise(src) -> Container:
    """The container of ``src`` (a path or an ``OpenedFile``), by its first bytes, or a typed error that says what
    the file is not."""
    with opened(src) as f:
        path, size = f.path, f.size
        try:
            head = f.read_at(0, HEAD_BYTES)
        except OSError as e:
            raise CorruptCheckpointError("The checkpoint file cannot be read.", path=path,
                                         found=f"{type(e).__name__}: {e.strerror or e}",
                                         fix="Check the file's permissions and the disk.") from None
    for c in containers():
        if c.recognise(head, size):
            return c
    if size == 0:
        raise CorruptCheckpointError("The checkpoint file is empty (0 bytes).", path=path,
                                     fix="Download or build it again.")
    names = " nor ".join(c.description for c in containers())
    raise CorruptCheckpointError(
        f"Not a pre-quantized checkpoint: the file is neither {names}.",
        path=path, expected="a " + " or ".join(c.extension for c in reversed(containers())) + " pre-quantized "
                                                                                             "transformer",
        # never the file's own bytes: behind a symlinked folder a "checkpoint" may be /etc/passwd
        found=f"{size} bytes, {_looks_like(head)}",
        fix="Download the file again (it may be truncated or an HTML error page), or pick another file.")
