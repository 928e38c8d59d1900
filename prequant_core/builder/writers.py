"""Writing a checkpoint: the container's own writer (``formats.containers``) behind an atomic output file."""
from __future__ import annotations

import errno
import os
import shutil
from typing import Callable, Mapping


from ..schemes import qtensor
from ..errors import BuildError
from ..formats import containers
from .output_file import atomic_output


BuildProgress = Callable[[str, int, int, str], None]  # (stage "quantize" | "write", done, total, key)





def write_checkpoint(dest: str, tensors: Mapping, metadata: dict, *, container: str = "safetensors",
                     overwrite: bool = False, progress: BuildProgress | None = None) -> str:
    """Write ``tensors`` + ``metadata`` with the registry's writer for ``container``, atomically (a temp file in the
    same folder, fsync, rename), turning the file system's refusals into clear errors."""
    names = [c.name for c in containers.writable()]
    if container not in names:
        raise BuildError(f"Unknown output container '{container}'.", expected=" or ".join(names), found=container)
    c = containers.by_name(container)
    scheme = metadata.get("scheme") if isinstance(metadata, dict) else None
    held = containers.writes_schemes(c)
    if scheme is not None and scheme not in held:
        raise BuildError(f"The {container} container does not hold {scheme} weights; nothing was written.",
                         path=dest, expected=" / ".join(held), found=str(scheme),
                         fix="Write this scheme as " + " or ".join(
                             x.extension for x in containers.writable() if scheme in containers.writes_schemes(x)) + ".")
    writer = c.write
    try:
        with atomic_output(dest, overwrite=overwrite) as tmp:
            writer(tmp, tensors, metadata, progress=progress)
    except OSError as e:
        err = write_error(e, dest)
        if err is None:
            raise
        raise err from None
    except RuntimeError as e:
        if container != "pt":
            raise
        # torch.save reports a failed write as RuntimeError ("PytorchStreamWriter failed writing file ...") and
        # drops the errno: a full disk or a file size limit are the usual causes; a disk with less room than the
        # tensors (the temp is gone by now) was the full one
        try:
            full = shutil.disk_usage(os.path.dirname(os.path.abspath(dest))).free < \
                sum(qtensor.nbytes(v) for v in tensors.values())
        except OSError:
            full = False
        if full:
            raise write_error(OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({str(e).strip()[:200]})"),
                               dest) from None
        raise BuildError("Writing the .pt file failed; the partial file was removed and nothing was written.",
                         path=dest, found=str(e).strip().splitlines()[0][:300] if str(e).strip() else "RuntimeError",
                         fix="Check the free space and the file size limit of that drive, or write the checkpoint "
                             "to another folder.") from None
    return os.path.abspath(dest)


def write_error(e: OSError, dest: str) -> BuildError | None:
    """A clear BuildError for the file system refusing the output (nothing was written); None: not one of those."""
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return BuildError("The disk filled up while writing; the partial file was removed and nothing was "
                          "written.", path=dest, found=str(e),
                          fix="Free some space on that drive, or write the checkpoint to another folder.")
    if e.errno == errno.EFBIG:
        return BuildError("The output is larger than this system lets one file be (file size limit); the partial "
                          "file was removed and nothing was written.", path=dest, found=str(e),
                          fix="Raise the file size limit (ulimit -f), or write to another file system.")
    if e.errno == errno.EROFS:
        return BuildError("The output folder is on a read-only file system; nothing was written.", path=dest,
                          found=str(e), fix="Write the checkpoint to a writable folder.")
    if e.errno in (errno.EACCES, errno.EPERM):
        return BuildError("No permission to write the output (permission denied); nothing was written.", path=dest,
                          found=str(e), fix="Write to a folder you may write to, fix its permissions, or clear an "
                                            "immutable flag on the existing file (chattr -i).")
    return None


