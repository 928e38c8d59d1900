"""``md5-packed-v1``, Unsloth's per-weight fingerprint, restated from its definition (docs/FORMAT.md section 10).

For every state-dict key ``weight`` or ``*.weight`` whose value is a quantized tensor, one md5 over the tensor's
parts in its class's attribute order: for each part present, the part's *name* (UTF-8), then either the nested
tensor's own parts (the torchao v1 wrappers) or the part's raw bytes as stored (contiguous, a 0-d part as one
element). Plain weights are listed in ``skipped``, in state-dict order; biases and root tensors appear nowhere.

Verification has Unsloth's three modes (``full``, ``sample``: the keys whose md5's first byte is a multiple of 8,
count not compared, ``off``) and remembers a full pass per file (real path, device, inode, size, mtime, ctime and the
recorded digests), so a verified 10 GB file is hashed once, not on every load. The record is a hint, never trusted
beyond "skip the hash": whatever else sits at its path costs a re-hash, nothing more.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from typing import Mapping

import torch

from ..safe_text import escape
from ..schemes import registry

ALGO = "md5-packed-v1"
MODES = ("full", "sample", "off")
ENV_MODE = ("PREQUANT_FINGERPRINT", "UNSLOTH_PREQUANT_FINGERPRINT")  # ours first, Unsloth's operators' setting next
ENV_VERIFIED_DIR = "PREQUANT_VERIFIED_DIR"

# class name -> the attributes hashed, in order (Unsloth's table; a class not listed is never fingerprinted). The
# weight kinds' own classes come from their codecs (``fingerprint_fields``); these are the legacy v1 wrappers.
LEGACY_ATTRS = {
    "LinearActivationQuantizedTensor": ("original_weight_tensor",),
    "AffineQuantizedTensor": ("tensor_impl",),
    "PlainAQTTensorImpl": ("int_data", "scale", "zero_point"),
}
# A reader that rebuilt a weight from another class (the legacy v1 reader) leaves the original nesting here:
# a tuple of (class name, ((attribute, tensor | nested tuple | None), ...)).
ORIGIN_ATTR = "prequant_fingerprint_origin"


def is_weight_key(key: str) -> bool:
    return key == "weight" or key.endswith(".weight")


def _raw(t: torch.Tensor):
    """The part's bytes as a buffer (no copy for a contiguous CPU tensor: a memory-mapped file is hashed in place)."""
    t = t.detach()
    if t.ndim == 0:
        t = t.reshape(1)
    return t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy()


def _feed(h, cls: str, items) -> bool:
    """Hash one (class, parts) level into ``h``; True if any part was hashed."""
    covered = False
    for name, v in items:
        if v is None:
            continue
        h.update(name.encode("utf-8"))
        if isinstance(v, tuple):  # a nested wrapper level: (class name, items)
            if not _feed(h, *v):
                raise ValueError(f"nested {v[0]} has no parts")
        else:
            h.update(_raw(v))
        covered = True
    return covered


def origin(t) -> tuple | None:
    """(class name, ((attribute, value), ...)) for a torchao tensor as Unsloth's table sees it, else None."""
    o = getattr(t, ORIGIN_ATTR, None)
    if o is not None:
        return o
    cls = type(t).__name__
    codec = registry.codec_named(cls)
    names = codec.fingerprint_fields if codec is not None else LEGACY_ATTRS.get(cls)
    if names is None:
        return None
    return cls, tuple((a, getattr(t, a, None)) for a in names)


def _digest(o) -> str | None:
    h = hashlib.md5()
    try:
        return h.hexdigest() if _feed(h, *o) else None
    except (ValueError, RuntimeError, TypeError):
        return None


def of_tensor(t) -> str | None:
    """The digest of one weight, or None when it is not covered (a plain tensor, an unknown class)."""
    o = origin(t)
    return None if o is None else _digest(o)


def compute(tensors: Mapping) -> dict:
    """The fingerprint block for a state dict, in state-dict order (Unsloth lists the uncovered ``.weight`` keys
    itself)."""
    mods, skip = {}, []
    for k, v in tensors.items():
        if not is_weight_key(k):
            continue
        d = of_tensor(v) if isinstance(v, torch.Tensor) else None
        if d is None:
            skip.append(k)
        else:
            mods[k] = d
    return {"algo": ALGO, "count": len(mods), "modules": mods, "skipped": skip}


def mode_from_env(env: Mapping[str, str] | None = None) -> str:
    """``full`` (default, and for any unknown value, as Unsloth does), ``sample`` or ``off``."""
    env = os.environ if env is None else env
    for var in ENV_MODE:
        v = (env.get(var) or "").strip().lower()
        if v:
            return v if v in MODES else "full"
    return "full"


def sampled(key: str) -> bool:
    return hashlib.md5(key.encode("utf-8")).digest()[0] % 8 == 0


def verify(tensors: Mapping, fp, mode: str = "full", digests: Mapping[str, str] | None = None) -> list[str]:
    """Reasons the fingerprint does not match (empty when it does, or when there is nothing to check).

    ``tensors``: the file's state dict (values may be computed lazily by a Mapping); ``digests``: already computed
    digests by key (a streamed safetensors read), used instead of ``tensors`` where given."""
    if mode == "off" or fp in (None, {}):
        return []
    if not isinstance(fp, dict) or fp.get("algo") != ALGO:
        found = escape(str(fp.get("algo"))[:40]) if isinstance(fp, dict) else type(fp).__name__
        return [f"fingerprint: expected algorithm {ALGO}, found {found}"]
    mods = fp.get("modules") or {}
    if not isinstance(mods, dict):
        return [f"fingerprint 'modules': expected an object, found {type(mods).__name__}"]
    keys = [k for k in (digests if digests is not None else tensors) if is_weight_key(k)]
    if mode == "sample":
        keys = [k for k in keys if sampled(k)]
    got: dict = {}
    out: list[str] = []
    for k in keys:
        d = digests[k] if digests is not None else of_tensor(tensors[k])
        if d is not None:
            got[k] = d
    if not got and mode == "full" and mods:
        return []  # Unsloth: nothing it can fingerprint here (an unknown class) passes with a warning
    want = {k: v for k, v in mods.items() if mode == "full" or sampled(str(k))}
    bad = [k for k, h in want.items() if k in got and got[k] != h]
    gone = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    if bad:
        out.append(f"fingerprint: {len(bad)} weights differ from the recorded md5 (e.g. '{escape(bad[0][:80])}'): "
                   "the file was changed or damaged after it was built")
    if mode == "full" and (gone or extra or len(got) != len(mods)):
        eg = (gone or extra or [""])[0]
        out.append(f"fingerprint: expected {len(mods)} weights, found {len(got)}"
                   + (f" (e.g. '{escape(str(eg)[:80])}' {'missing' if gone else 'not recorded'})" if eg else ""))
    return out


# --- remembered passes --------------------------------------------------------------------------------------------

def verified_dir(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    d = (env.get(ENV_VERIFIED_DIR) or "").strip()
    if d:
        return os.path.expanduser(d)
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "comfyui-prequant", "verified")


MARKER_MAX_BYTES = 4096  # a stamp is ~250 bytes; anything bigger at the marker's path is not one of ours


def _stamp(real: str, st: os.stat_result, fp: dict) -> dict:
    # device + inode + ctime as well as size + mtime: a file swapped for another of the same size with its mtime put
    # back (os.utime) still has a new inode or ctime, which no unprivileged writer can set back
    mods = fp.get("modules") if isinstance(fp, dict) else None
    return {"path": real, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "dev": st.st_dev, "ino": st.st_ino,
            "fingerprint": hashlib.md5(json.dumps(mods, sort_keys=True, default=str).encode()).hexdigest()}


def _marker(folder: str, real: str) -> str:
    return os.path.join(folder, hashlib.md5(real.encode("utf-8", "surrogateescape")).hexdigest() + ".json")


def _read_marker(path: str) -> bytes | None:
    """The marker's bytes, or None for anything but a small regular file of this user's: the cache folder may be
    shared, so a FIFO (open would block the prompt worker), a link to /dev/zero or a huge sparse file (read until
    MemoryError) at the marker's path only costs a re-hash."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MARKER_MAX_BYTES:
            return None
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            return None
        return os.read(fd, MARKER_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def remembered(real: str, st: os.stat_result, fp: dict, folder: str | None = None) -> bool:
    """True if a full pass of this very file (same path, device, inode, size, mtime, ctime and recorded digests)
    was recorded. Whatever else sits at the marker's path means "not remembered": the file is hashed again."""
    raw = _read_marker(_marker(folder or verified_dir(), real))
    if raw is None or len(raw) > MARKER_MAX_BYTES:
        return False
    try:
        return json.loads(raw.decode("utf-8")) == _stamp(real, st, fp)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False


def remember(real: str, st: os.stat_result, fp: dict, folder: str | None = None) -> None:
    """Record a full pass (best effort: a read-only cache folder only costs the next load a re-hash). The stamp is
    written to a fresh temp file (O_EXCL, random name: a link planted at a guessable name is never followed) and
    renamed over the marker, which replaces whatever was there, a link included, without writing through it."""
    folder = folder or verified_dir()
    tmp = None
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".stamp-", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(_stamp(real, st, fp), f)
        os.replace(tmp, _marker(folder, real))
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
