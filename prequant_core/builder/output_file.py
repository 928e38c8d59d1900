"""Where a built file goes: output size estimate, free-space check, atomic write (temp file beside the destination,
fsync, no-clobber link or rename) and removal of temp files left by killed builds."""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import socket
import stat
import time
from typing import Mapping

import torch

from .. import schemes
from ..errors import BuildError
from ..formats.dense_sources import TensorInfo
from ..schemes.quantize import is_linear_weight
from ..safe_text import is_clean
from ..units import human_bytes


TEMP_PREFIX = ".prequant-"
TEMP_SUFFIX = ".partial"
_TEMP_RE = re.compile(r"^\.prequant-([0-9a-f]{8})-(\d+)-[A-Za-z0-9_]+\.partial$")
_LEGACY_TEMP_RE = re.compile(r"^\.prequant-[A-Za-z0-9_]+\.partial$")  # first version: tempfile.mkstemp names
STALE_AFTER_S = 24 * 3600  # a temp file untouched this long is stale even if its pid is alive again (pid reuse)
HEADER_SLACK = 64 * 1024  # added to the output estimate: JSON header, metadata, zip overhead





def estimate_output_bytes(infos: Mapping[str, TensorInfo], flt: schemes.LayerFilter,
                          dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """(upper bound of the output file size, number of weights that will be quantized), from shapes alone."""
    total, n_q = HEADER_SLACK, 0
    for k, info in infos.items():
        dt = dtype if info.dtype.is_floating_point else info.dtype
        if is_linear_weight(k, info) and flt.reason_skipped(k[: -len(".weight")],
                                                            torch.empty(info.shape, dtype=dt, device="meta")) is None:
            rows, cols = info.shape
            total += rows * cols + rows * 4 + rows  # codes, float32 per-row scale, int8 zero point (int8 only)
            n_q += 1
        else:
            total += TensorInfo(info.shape, dt).nbytes
        total += 1024  # header entry per tensor (torchao JSON, offsets, fingerprint line)
    return total, n_q


def default_free_space(folder: str) -> int:
    return shutil.disk_usage(folder).free


def check_writable(folder: str) -> None:
    """A folder files can be written in: not read-only, not a virtual file system (/proc, /sys: no blocks at all)."""
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):  # no statvfs (Windows), or the folder is gone: the write itself will say
        return
    if st.f_flag & getattr(os, "ST_RDONLY", 1) or st.f_blocks == 0:
        raise BuildError("Nothing can be written in the output folder.", path=folder,
                         found="a read-only file system" if st.f_flag & getattr(os, "ST_RDONLY", 1) else
                         "a virtual file system (no disk behind it)",
                         fix="Pick a folder you can write files in (e.g. ComfyUI/models/prequant).")


def check_free_space(folder: str, needed: int) -> int:
    check_writable(folder)
    free = default_free_space(folder)
    if free < needed:
        raise BuildError("Not enough free disk space for the output; nothing was written.", path=folder,
                         expected=f"at least {human_bytes(needed)} free (estimated output size)",
                         found=f"{human_bytes(free)} free",
                         fix="Free some space on that drive, or write the checkpoint to another folder.")
    return free


# ----------------------------------------------------------------------------------------------------------------
# Atomic output and stale temp files
# ----------------------------------------------------------------------------------------------------------------

def _host_tag() -> str:
    return hashlib.md5(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


def _pid_alive(pid: int) -> bool:
    try:
        import psutil  # ComfyUI depends on it; the plain os.kill probe below would *terminate* the process on Windows
        return psutil.pid_exists(pid)
    except ImportError:
        pass
    if os.name == "nt":
        return True  # cannot tell safely: leave the temp to the age rule
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def clean_stale_temps(folder: str, *, now: float | None = None) -> list[str]:
    """Remove temp files left by builds that died (killed, crashed, power loss) in ``folder``.

    A temp is stale when the process that made it (same host, pid in the name) is gone, or when it has not been
    written for ``STALE_AFTER_S`` (pid reused, or another host). Temps of live builds are left alone.
    """
    now = time.time() if now is None else now
    host, me = _host_tag(), os.getpid()
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        m = _TEMP_RE.match(name)
        if not m and not _LEGACY_TEMP_RE.match(name):
            continue
        full = os.path.join(folder, name)
        try:
            age = now - os.stat(full).st_mtime
        except OSError:
            continue
        if m:
            same_host, pid = m.group(1) == host, int(m.group(2))
            if same_host and pid == me:
                continue
            stale = (same_host and not _pid_alive(pid)) or age > STALE_AFTER_S
        else:
            stale = age > 3600
        if stale:
            with contextlib.suppress(OSError):
                os.unlink(full)
                removed.append(full)
    return removed


# Names Windows reserves in every folder (with any extension), whatever the disk.
_WINDOWS_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


def check_output_name(name: str, *, origin: str = "filename") -> str:
    """A bare file name safe to create in the output folder on any OS, else ``BuildError``. One check for every
    name, typed or derived (``origin`` says which, for the message)."""
    problem = None
    if not name or not name.strip():
        problem = "it is empty"
    elif any(sep in name for sep in ("/", "\\", os.sep, os.altsep or "/")) or os.path.isabs(name) or ":" in name:
        problem = "it contains a folder or drive part"
    elif name in (".", "..") or ".." in name:
        problem = "it contains '..'"
    elif name.startswith("."):
        problem = "it is a hidden name (starts with '.')"
    elif not is_clean(name) or any(c in name for c in '<>"|?*'):
        problem = "it contains control or reserved characters"
    elif name != name.rstrip(" ."):
        problem = "it ends with a space or a dot (Windows drops them)"
    elif name.split(".")[0].strip().upper() in _WINDOWS_RESERVED:
        problem = "it is a name Windows reserves for a device"
    elif len(name.encode("utf-8")) > 240:
        problem = "it is longer than file systems allow"
    if problem:
        raise BuildError(f"The output file name is not a plain file name: {problem}.", found=repr(name)[:200],
                         expected="e.g. Z-Image-Turbo-INT8.safetensors (no folders, no '..', not hidden, no control "
                                  "characters)",
                         fix="Type a plain name in 'filename'." if origin == "filename" else
                             "Give the output a plain file name (the command line's -o, the node's filename)."
                             if origin == "output" else
                             f"The name was derived from {origin}; type a plain name in 'filename' instead.")
    return name


# the same refusal reaches the Build node and the command line: name the switch of each
OVERWRITE_FIX = ("Choose another filename, or allow overwriting: the Build node's overwrite input, or --overwrite on "
                 "the command line.")


def _refuse_existing(dest: str, overwrite: bool) -> None:
    if os.path.isdir(dest):
        raise BuildError("The output path is a folder.", path=dest, fix="Give a file name.")
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        return
    except OSError as e:
        raise BuildError("The output path cannot be checked.", path=dest, found=f"{type(e).__name__}: {e.strerror}",
                         fix="Check the folder's permissions, or choose another filename.") from None
    if not overwrite:
        raise BuildError("The output file already exists; it was left untouched.", path=dest,
                         fix=OVERWRITE_FIX)
    if not stat.S_ISREG(st.st_mode):
        # overwriting means replacing a checkpoint, never a pipe, a device node or a link to somewhere else
        raise BuildError("The output path exists and is not a regular file; it was left untouched, even with "
                         "overwriting allowed.", path=dest, found="a symbolic link" if stat.S_ISLNK(st.st_mode) else
                         "a pipe, socket or device", fix="Choose another filename.")


@contextlib.contextmanager
def atomic_output(dest: str, *, overwrite: bool = False):
    """Yield a temp path beside ``dest``; on success fsync + move onto ``dest``, on any failure remove it.

    Without ``overwrite`` the final move is a hard link, which fails if ``dest`` appeared meanwhile (no clobbering a
    file another process wrote); filesystems without hard links fall back to a checked rename.
    """
    dest = os.path.abspath(dest)
    folder = os.path.dirname(dest)
    # every output, typed on the command line or in the node, is a plain file name: no terminal escapes reach the
    # messages that print it
    check_output_name(os.path.basename(dest), origin="output")
    _refuse_existing(dest, overwrite)
    if not os.path.isdir(folder):
        raise BuildError("The output folder does not exist.", path=folder, fix="Create it or pick another folder.")
    clean_stale_temps(folder)
    tmp = os.path.join(folder, f"{TEMP_PREFIX}{_host_tag()}-{os.getpid()}-{secrets.token_hex(6)}{TEMP_SUFFIX}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as e:  # /proc, a read-only mount, no permission: the folder, not a bug
        raise BuildError("Nothing can be written in the output folder.", path=folder,
                         found=f"{type(e).__name__}: {e.strerror}",
                         fix="Pick a folder you can write files in (e.g. ComfyUI/models/prequant).") from None
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, dest)
        else:
            try:
                os.link(tmp, dest)
            except FileExistsError:
                raise BuildError("The output file appeared while building; it was left untouched.", path=dest,
                                 fix=OVERWRITE_FIX) from None
            except OSError:
                _refuse_existing(dest, overwrite)
                os.replace(tmp, dest)
            else:
                os.unlink(tmp)
        with contextlib.suppress(OSError):
            dfd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


