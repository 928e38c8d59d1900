"""Which local files may be read. Inside the model folders ComfyUI manages: always. Anywhere else: only when the
real path (symlinks resolved) lies inside a directory listed in ``PREQUANT_ALLOW_LOCAL_PATH``
(or Unsloth's ``UNSLOTH_ALLOW_LOCAL_PREQUANT_PATH``), ``os.pathsep``-separated."""
from __future__ import annotations

import os
from typing import Iterable, Mapping

from .errors import PathNotAllowedError

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
    return _judge(str(path), real, model_dirs, env)


def check_opened(f, model_dirs: Iterable[str] = (), env: Mapping[str, str] | None = None) -> str:
    """``check`` for a file already opened (``formats.OpenedFile``): judges the real path of what was opened, so
    a name swapped after ``check`` cannot redirect the read."""
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
