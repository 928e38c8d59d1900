"""Which local files may be read.

* Inside the model folders ComfyUI manages: always, judged by where the name lies (its absolute path with no '..'
  part), so a file or folder there that is a symbolic link is read like a real file, as ComfyUI's own loaders and
  file lists do (shared model stores and launchers link files into ``models/``). Whoever can put a link there can
  put the file there, so following it protects nothing less. A name with a '..' part is judged by its real path
  only: '..' after a linked folder climbs from the link's target, which the name does not show.
* Anywhere else: only when the real path (symlinks resolved) lies inside a directory listed in
  ``PREQUANT_ALLOW_LOCAL_PATH`` (or Unsloth's ``UNSLOTH_ALLOW_LOCAL_PREQUANT_PATH``), ``os.pathsep``-separated.

The same rule guards the loader's typed ``path`` input: it can name a model folder entry, linked or not, or an
allowlisted file, nothing else. Reading stays free of code execution either way.
"""
from __future__ import annotations

import os
from typing import Iterable, Mapping

from ..errors import PathNotAllowedError

ENV_VARS = ("PREQUANT_ALLOW_LOCAL_PATH", "UNSLOTH_ALLOW_LOCAL_PREQUANT_PATH")
_FLAG_WORDS = {"", "0", "1", "true", "false", "yes", "no", "on", "off", "y", "n"}


def allowed_roots(env: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if env is None else env
    roots = []
    for var in ENV_VARS:
        for part in env.get(var, "").split(os.pathsep):
            part = part.strip()
            # A bare on/off value is not a directory; treating "1" as a relative path would allow the cwd's "1/".
            if part.lower() in _FLAG_WORDS or not os.path.isabs(os.path.expanduser(part)):
                continue
            roots.append(os.path.realpath(os.path.expanduser(part)))
    return roots


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:
        return False


def check(path: str, model_dirs: Iterable[str] = (), env: Mapping[str, str] | None = None) -> str:
    """Return the real path when reading ``path`` is allowed, else raise ``PathNotAllowedError``."""
    try:
        real = os.path.realpath(os.path.expanduser(str(path)))
    except ValueError:  # an embedded NUL character: no file has that name
        raise PathNotAllowedError("Refused a path that contains a NUL character.", path=repr(str(path))[:300],
                                  fix="Pick the file from the list, or type its path again.") from None
    except OSError as e:  # a symlink loop on some platforms, a name too long, an unreadable folder
        raise PathNotAllowedError("Refused a path that cannot be resolved.", path=str(path)[:300],
                                  found=f"{type(e).__name__}: {e.strerror or e}",
                                  fix="Pick the file from the list, or check the path.") from None
    if in_model_folder(path, model_dirs):
        return real
    return _judge(str(path), real, model_dirs, env)


def in_model_folder(path, model_dirs: Iterable[str]) -> bool:
    """Whether the name itself (absolute, links not followed, no '..' part) lies in one of the model folders."""
    try:
        p = os.path.expanduser(str(path))
        if ".." in p.replace("\\", "/").split("/"):
            return False
        lexical = os.path.abspath(p)
        dirs = [os.path.abspath(d) for d in model_dirs] + [os.path.realpath(d) for d in model_dirs]
    except (OSError, ValueError):
        return False
    return any(_inside(lexical, d) and lexical != d for d in dirs)


def check_opened(f, model_dirs: Iterable[str] = (), env: Mapping[str, str] | None = None) -> str:
    """``check`` for a file already opened (``formats.OpenedFile``): judges the name it was opened by and the real
    path of what was opened, so a name swapped after ``check`` cannot redirect the read outside the rule."""
    if in_model_folder(f.path, model_dirs):
        return f.real
    return _judge(f.path, f.real, model_dirs, env)


def _judge(path: str, real: str, model_dirs: Iterable[str], env: Mapping[str, str] | None) -> str:
    try:
        roots = [os.path.realpath(d) for d in model_dirs] + allowed_roots(env)
    except (OSError, ValueError):
        roots = []
    if any(_inside(real, r) for r in roots):
        return real
    shown = str(path) if real == os.path.abspath(str(path)) else f"{path} (resolves to {real})"
    raise PathNotAllowedError(
        "Refused to read a file outside ComfyUI's model folders and the allowlist.", path=shown,
        expected="a file under " + (", ".join(roots) if roots else "the ComfyUI models/prequant folder"),
        found=real,
        fix=f"Move the file into ComfyUI/models/prequant/, or add its folder to {ENV_VARS[0]} "
            f"(folders separated by '{os.pathsep}') and restart ComfyUI.")


def is_allowed(path: str, model_dirs: Iterable[str] = (), env: Mapping[str, str] | None = None) -> bool:
    try:
        check(path, model_dirs, env)
        return True
    except PathNotAllowedError:
        return False
