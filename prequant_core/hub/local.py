"""Files of a Hub repo already on disk outside the cache: a model folder's origin folders
(``<dest>/<owner>/<repo>[@<revision>]``) and an operator mirror (``UNSLOTH_DIFFUSION_PREQUANT_MIRROR``)."""
from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Iterable, Mapping

from ..families.hub_names import local_name, normalize_repo


def local_file(repo: str, filenames: Iterable[str], folders: Iterable[str],
               revision: str | None = None) -> tuple[str, str] | None:
    """(repo file name, path) of the first name already stored in the origin folder of ``repo@revision`` in one of
    ``folders`` (never a file of the same name from elsewhere)."""
    for fn in filenames:
        for d in folders:
            p = os.path.join(origin_dir(d, repo, revision), local_name(repo, fn))
            if os.path.isfile(p):
                return fn, p
    return None


MIRROR_ENV = "UNSLOTH_DIFFUSION_PREQUANT_MIRROR"


def mirror_file(repo: str, filenames: Iterable[str], env: Mapping[str, str] | None = None,
                revision: str | None = None) -> tuple[str, str, str] | None:
    """(repo file name, path, root) of the first name an operator mirror holds, else None.

    Unsloth's layout: ``UNSLOTH_DIFFUSION_PREQUANT_MIRROR`` lists roots (``os.pathsep``-separated), a file lives at
    ``<root>/<owner>/<repo>/<file>``; roots outer, names inner; for a ``.pt`` name its converted ``.safetensors``
    sibling first. A name with an empty, ``.`` or ``..`` part or a backslash never matches, and the real path must
    stay under the root and be a regular file (a link pointing out of the mirror is not followed there).

    A mirror holds one copy per name, of no stated revision: for a pinned ``revision`` (anything but the default
    branch) a copy counts only if its ``unsloth_source`` record names that very revision, so a file is never served
    labelled with a commit it was not converted from."""
    pinned = (revision or "").strip() not in ("", "main")
    names = []
    for fn in filenames:
        stem, ext = os.path.splitext(fn)
        if ext.lower() in (".pt", ".pth"):
            names.append(stem + ".safetensors")
        names.append(fn)
    names = list(dict.fromkeys(names))
    owner, _, name = repo.partition("/")
    for root in filter(str.strip, ((os.environ if env is None else env).get(MIRROR_ENV) or "").split(os.pathsep)):
        real_root = os.path.realpath(os.path.expanduser(root))
        for fn in names:
            parts = [owner, name, *fn.split("/")]
            if any(p in ("", ".", "..") or "\\" in p for p in parts):
                continue
            p = os.path.join(real_root, *parts)
            real = os.path.realpath(p)
            if os.path.commonpath([real, real_root]) != real_root or not os.path.isfile(real):
                continue
            if pinned and mirror_revision(real) != revision.strip():
                continue
            return fn, real, real_root
    return None


MAX_COMPONENT = 120  # bytes of one folder name: well under the 255 every common file system allows
_PLAIN_REV = re.compile(r"[A-Za-z0-9._-]+")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogateescape")).hexdigest()


def revision_folder_part(revision: str) -> str:
    """A revision as one folder-name part, injective and short: a plain name (``v2``, a commit) as it is; one with
    a ``/`` (``feature/x``) or another character outside ``[A-Za-z0-9._-]`` percent-encoded (``feature%2Fx``), so
    ``feature/x`` and ``feature--x`` never share a folder; a long one cut and ended with its hash (a 200-character
    revision would otherwise make a name the disk refuses, after the whole download)."""
    if _PLAIN_REV.fullmatch(revision):
        enc = revision
    else:
        enc = "".join(c if _PLAIN_REV.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode("utf-8"))
                      for c in revision)
    if len(enc.encode("utf-8")) > MAX_COMPONENT - 40:
        enc = f"{enc[:40]}~{_digest(revision)[:16]}"
    return enc


def origin_dir(dest_dir: str, repo: str, revision: str | None = None) -> str:
    """Where a download from ``repo@revision`` is kept in a model folder: ``<dest>/<owner>/<name>`` (default branch)
    or ``<dest>/<owner>/<name>@<revision>`` (``revision_folder_part``). Keyed by origin, so a file from another repo
    or revision never stands in for the official one of the same name."""
    owner, name = normalize_repo(repo).split("/")
    rev = (revision or "").strip()
    if rev and rev != "main":
        name = f"{name}@{revision_folder_part(rev)}"
    return os.path.join(dest_dir, owner, name)


STAGING_DIR = ".prequant-download"  # hidden folder inside the destination: partial downloads, resumed from there


def staging_dir(dest_dir: str, repo: str, revision: str, filename: str) -> str:
    """The staging folder of one file of one repo and revision (``<dest>/.prequant-download/<owner>--<name>/<file
    key>``): each download has its own, so a second file of the same repo never finds, judges or removes the first's
    partial, and two processes downloading two files of one repo never delete each other's."""
    owner, name = normalize_repo(repo).split("/")
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", filename.rsplit("/", 1)[-1])[:48]
    return os.path.join(dest_dir, STAGING_DIR, f"{owner}--{name}", f"{stem}.{_digest(revision, filename)[:16]}")


SOURCE_KEY = "unsloth_source"  # Unsloth's converter: {"file", "sha256", "bytes", "repo", "revision"} of the origin


def mirror_revision(path: str) -> str | None:
    """The repo revision a mirror file says it was converted from (its ``unsloth_source`` header entry), or None
    (a ``.pt`` copy, a file without the record, an unreadable header)."""
    if not path.endswith(".safetensors"):
        return None
    try:
        from ..formats.containers.safetensors_container import read_header
        _, meta, _ = read_header(path)
        src = json.loads((meta or {}).get(SOURCE_KEY) or "null")
    except Exception:  # noqa: BLE001 - a mirror file that cannot say where it came from proves nothing
        return None
    rev = src.get("revision") if isinstance(src, dict) else None
    return rev if isinstance(rev, str) and rev else None
