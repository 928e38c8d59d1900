"""One Hub download, run by the real ``huggingface_hub`` client in a child process (``python -m prequant_core.hub.child``).

Why a process: the client's waits cannot be interrupted from outside in-process (a server that drips one byte every
few seconds never trips its read timeout, and a thread cannot be stopped), while a child can always be killed. The
parent (``hub.py``) watches the partial file, stops the child on Cancel, on a stall or on a transfer too slow to
finish, and never waits on it unboundedly. A killed child leaves the client's partial file, so the next run resumes.

Protocol, one JSON object per line (the first from the child: ``{"event": "ready", "client": <huggingface_hub
version>}``). Parent -> child (stdin): the request ``{"repo", "names", "revision", "cache_dir",
"endpoint", "local_dirs", "etag_timeout", "token"}`` (``local_dirs``: each name's own staging folder, empty for the
HF cache; the token travels here, never in argv or the environment of the process table), then ``go`` or ``stop`` after each ``meta``. Child -> parent (stdout):
``{"event": "entry", "name", "detail"}`` (not in the repo: the next name follows), ``{"event": "meta", "name",
"size", "etag", "commit"}``, ``{"event": "done", "name", "path"}``, ``{"event": "error", "name", "failure", "detail"}``.
The child exits when its stdin closes (the parent is gone).
"""
from __future__ import annotations

import json
import os
import sys
import threading


def _say(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _watch_parent() -> None:
    """Exit as soon as the parent is gone (stdin closes): a killed ComfyUI leaves no download behind."""
    for line in sys.stdin:
        _inbox.append(line.strip())
        _ready.set()
    os._exit(3)


CHUNK = 256 * 1024
_inbox: list = []
_ready = threading.Event()


def _next_command() -> str:
    while not _inbox:
        _ready.wait(1.0)
        _ready.clear()
    return _inbox.pop(0)


def _report(fn: str, exc: BaseException) -> str:
    """Tell the parent why ``fn`` failed: a 404 EntryNotFound as an ``entry`` (the next name follows), anything else
    as an ``error``; the failure, as ``errors.classify`` names it."""
    from prequant_core.hub.errors import classify  # imported by main() already (before "ready")
    failure, detail = classify(exc)
    _say({"event": "entry" if failure == "entry" else "error", "name": fn, "failure": failure, "detail": detail})
    return failure


def main() -> int:
    req = json.loads(sys.stdin.readline())
    threading.Thread(target=_watch_parent, daemon=True).start()
    import huggingface_hub
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
    from prequant_core.hub import errors  # noqa: F401 - loaded before "ready": a failure's report imports nothing new
    # The client writes what it receives in chunks of this size (10 MB by default); smaller chunks let the parent see
    # progress (and a stall) from the partial file's size. This process only: other tools keep their setting.
    constants.DOWNLOAD_CHUNK_SIZE = CHUNK
    # imports done: from here on every wait is the server's. The version: whether this client resumes a partial file
    # (the parent's own huggingface_hub may be another one)
    _say({"event": "ready", "client": str(getattr(huggingface_hub, "__version__", ""))})
    token = req.get("token") or None
    for fn in req["names"]:
        try:
            url = hf_hub_url(req["repo"], fn, revision=req["revision"], endpoint=req["endpoint"])
            meta = get_hf_file_metadata(url, token=token, timeout=req["etag_timeout"], endpoint=req["endpoint"])
        except Exception as e:  # noqa: BLE001 - sorted and reported
            if _report(fn, e) == "entry":
                continue
            return 1
        _say({"event": "meta", "name": fn, "size": int(meta.size or 0), "etag": meta.etag,
              "commit": meta.commit_hash})
        if _next_command() != "go":
            return 0
        try:
            path = hf_hub_download(req["repo"], fn, revision=req["revision"], cache_dir=req["cache_dir"], token=token,
                                   endpoint=req["endpoint"],
                                   local_dir=(req.get("local_dirs") or {}).get(fn))
        except Exception as e:  # noqa: BLE001
            _report(fn, e)  # a 404 now (the file removed since the metadata): the parent tries the next name
            return 1
        _say({"event": "done", "name": fn, "path": path})
        return 0
    _say({"event": "exhausted"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
