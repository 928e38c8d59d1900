"""A checkpoint file opened once, so that every check and every read applies to the same file.

Checking a name and then reopening it lets the name change in between (a swapped symlink, a file renamed over
another, a FIFO put in its place). Here the file is opened first (non-blocking, so a FIFO cannot stall the server),
``fstat`` of the handle decides whether it is a regular file, the allowlist judges the real path of what was
opened, and the readers reach the bytes through the handle: directly (``os.pread``), or, for libraries that only
take a file name (``torch.load(mmap=True)``, safetensors, torch's zip reader), through ``io_path``: on Linux
``/proc/self/fd/N``, which reopens this very file whatever happens to its name. Elsewhere ``io_path`` is the real
path resolved when the file was opened (the narrow race that remains there is documented in the README).
"""
from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
from typing import Iterator, Union

from ..errors import CheckpointNotFoundError, CorruptCheckpointError


class OpenedFile:
    """``path``: as the user named it (for messages); ``real``: the opened file's real path; ``size``: its size
    from ``fstat`` at open time; ``io_path``: a name that reaches this same open file."""

    def __init__(self, fd: int, path: str, real: str, size: int, io_path: str):
        self.fd, self.path, self.real, self.size, self.io_path = fd, path, real, size, io_path
        self.zip_infos = None  # a .pt archive's checked zip index, parsed once (pickle_guard.zip_index)

    def reader(self) -> io.BufferedReader:
        """A file object on this handle (its own position, reads by ``pread``): for libraries that take a file
        object (zipfile, torch's zip reader), so that they read this file without reopening it."""
        return io.BufferedReader(_HandleIO(self), buffer_size=1 << 16)

    def read_at(self, offset: int, n: int) -> bytes:
        """Exactly ``n`` bytes from ``offset`` (fewer only at the end of the file)."""
        out = bytearray()
        while len(out) < n:
            want = min(n - len(out), 1 << 24)
            if _PREAD is not None:
                chunk = _PREAD(self.fd, want, offset + len(out))
            else:  # Windows: no pread; the handle is this object's alone, so seeking it is safe
                os.lseek(self.fd, offset + len(out), os.SEEK_SET)
                chunk = os.read(self.fd, want)
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "OpenedFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __fspath__(self) -> str:
        return self.io_path

    def __repr__(self) -> str:
        return f"OpenedFile({self.path!r})"


Source = Union[str, os.PathLike, OpenedFile]


class _HandleIO(io.RawIOBase):
    """Read-only, seekable, on an ``OpenedFile``'s descriptor; the size is the one ``fstat`` gave at open time."""

    def __init__(self, fh: OpenedFile):
        super().__init__()
        self._fh, self._pos = fh, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._fh.size}.get(whence)
        if base is None:
            raise ValueError(f"invalid whence {whence}")
        if base + offset < 0:
            raise OSError(errno.EINVAL, "negative seek position")
        self._pos = base + offset
        return self._pos

    def readinto(self, b) -> int:
        data = self._fh.read_at(self._pos, len(b))
        b[:len(data)] = data
        self._pos += len(data)
        return len(data)


_PREAD = getattr(os, "pread", None)


def _fd_path(fd: int) -> str | None:
    # Linux only: opening /proc/self/fd/N opens the same file anew (its own offset). macOS's /dev/fd/N would dup
    # the descriptor and share one offset between readers, so there the real path is used instead.
    p = f"/proc/self/fd/{fd}"
    return p if os.path.exists(p) else None


def _real_of(fd: int, path: str) -> str:
    link = f"/proc/self/fd/{fd}"
    try:
        real = os.readlink(link)
        if os.path.isabs(real):
            return real[: -len(" (deleted)")] if real.endswith(" (deleted)") else real
    except OSError:
        pass
    return os.path.realpath(path)


def open_file(path) -> OpenedFile:
    """Open ``path`` for reading; refuse anything but a regular file with the pack's own errors."""
    path = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
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
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise CorruptCheckpointError("Expected a checkpoint file but this is a folder.", path=path,
                                         fix="Point at the .safetensors or .pt file inside it.")
        if not stat.S_ISREG(st.st_mode):  # a pipe would block a reader forever, a device never ends
            raise CorruptCheckpointError("Expected a checkpoint file but this is not a regular file (a pipe, socket "
                                         "or device).", path=path, fix="Point at the .safetensors or .pt file.")
        real = _real_of(fd, path)
        return OpenedFile(fd, path, real, st.st_size, _fd_path(fd) or real)
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def opened(src: Source) -> Iterator[OpenedFile]:
    """The handle itself when ``src`` is one (the caller keeps owning it), else a handle opened for this block."""
    if isinstance(src, OpenedFile):
        yield src
        return
    with open_file(src) as f:
        yield f
