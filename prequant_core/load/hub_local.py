"""Files of a Hub repo already on disk outside the cache: a model folder's origin folders
(``<dest>/<owner>/<repo>[@<revision>]``) and an operator mirror (``UNSLOTH_DIFFUSION_PREQUANT_MIRROR``)."""
from __future__ import annotations

import os
from typing import Iterable, Mapping

from . import sources


def local_file(repo: str, filenames: Iterable[str], folders: Iterable[str],
               revision: str | None = None) -> tuple[str, str] | None:
    """(repo file name, path) of the first name already stored in the origin folder of ``repo@revision`` in one of
    ``folders`` (never a file of the same name from elsewhere)."""
    for fn in filenames:
        for d in folders:
            p = os.path.join(origin_dir(d, repo, revision), sources.local_name(repo, fn))
            if os.path.isfile(p):
                return fn, p
    return None


MIRROR_ENV = "UNSLOTH_DIFFUSION_PREQUANT_MIRROR"


def _mirror_roots(env: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if env is None else env
    return [r for r in (env.get(MIRROR_ENV) or "").split(os.pathsep) if r.strip()]


def mirror_file(repo: str, filenames: Iterable[str], env: Mapping[str, str] | None = None
                ) -> tuple[str, str, str] | None:
    """(repo file name, path, root) of the first name an operator mirror holds, else None.

    Unsloth's layout: ``UNSLOTH_DIFFUSION_PREQUANT_MIRROR`` lists roots (``os.pathsep``-separated), a file lives at
    ``<root>/<owner>/<repo>/<file>``; roots outer, names inner; for a ``.pt`` name its converted ``.safetensors``
    sibling first. A name with an empty, ``.`` or ``..`` part or a backslash never matches, and the real path must
    stay under the root and be a regular file (a link pointing out of the mirror is not followed there)."""
    names = []
    for fn in filenames:
        stem, ext = os.path.splitext(fn)
        if ext.lower() in (".pt", ".pth"):
            names.append(stem + ".safetensors")
        names.append(fn)
    names = list(dict.fromkeys(names))
    owner, _, name = repo.partition("/")
    for root in _mirror_roots(env):
        real_root = os.path.realpath(os.path.expanduser(root))
        for fn in names:
            parts = [owner, name, *fn.split("/")]
            if any(p in ("", ".", "..") or "\\" in p for p in parts):
                continue
            p = os.path.join(real_root, *parts)
            real = os.path.realpath(p)
            if os.path.commonpath([real, real_root]) != real_root or not os.path.isfile(real):
                continue
            return fn, real, real_root
    return None


def origin_dir(dest_dir: str, repo: str, revision: str | None = None) -> str:
    """Where a download from ``repo@revision`` is kept in a model folder: ``<dest>/<owner>/<name>`` (default branch)
    or ``<dest>/<owner>/<name>@<revision>``. Keyed by origin, so a file from another repo never stands in for the
    official one of the same name."""
    owner, name = sources.normalize_repo(repo).split("/")
    rev = (revision or "").strip()
    if rev and rev != "main":
        name = f"{name}@{rev.replace('/', '--')}"
    return os.path.join(dest_dir, owner, name)
