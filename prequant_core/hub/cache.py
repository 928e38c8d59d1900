"""Where the Hugging Face client keeps files and what it has already: the Hub address, the cache folder, offline
mode, cached files (the client's own precedence, read from the environment at each call; no network)."""
from __future__ import annotations

import os
import re
from typing import Iterable, Mapping

from ..errors import HubError


def client_constants():
    try:
        import huggingface_hub  # noqa: F401
        from huggingface_hub import constants
    except ImportError as e:  # pragma: no cover - requirements.txt installs it
        raise HubError("Downloading from the Hugging Face Hub needs the huggingface_hub package.", found=str(e),
                       fix="pip install huggingface_hub (inside ComfyUI's Python environment).") from None
    return constants


COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")  # what the client treats as a commit hash


def endpoint(env: Mapping[str, str] | None = None) -> str:
    """The Hub address: ``HF_ENDPOINT`` as set now, else the client's default."""
    env = os.environ if env is None else env
    ep = (env.get("HF_ENDPOINT") or "").strip().rstrip("/")
    return ep or client_constants().ENDPOINT


def shown_endpoint(env: Mapping[str, str] | None = None) -> str:
    """The Hub address as messages and logs show it: any user:password@ in it redacted."""
    from ..safe_text import redact
    return redact(endpoint(env))


def cache_dir(env: Mapping[str, str] | None = None) -> str:
    """The standard Hugging Face cache folder, with the client's own precedence, read from the environment now."""
    env = os.environ if env is None else env
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return os.path.expanduser(os.path.expandvars(env[var]))
    if env.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.path.expandvars(env["HF_HOME"])), "hub")
    return client_constants().HF_HUB_CACHE


def is_offline(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    said = str(env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or "").strip().upper()
    return bool(client_constants().HF_HUB_OFFLINE) or said in {"1", "ON", "YES", "TRUE"}


def storage_folder(repo: str, cache: str | None = None) -> str:
    from huggingface_hub.file_download import repo_folder_name
    return os.path.join(cache or cache_dir(), repo_folder_name(repo_id=repo, repo_type="model"))


def cached_file(repo: str, filenames: Iterable[str], revision: str | None = None,
                cache: str | None = None) -> tuple[str, str] | None:
    """(name, path) of the first name present in the cache for this revision; no network."""
    client_constants()
    from huggingface_hub import try_to_load_from_cache
    for fn in filenames:
        p = try_to_load_from_cache(repo, fn, cache_dir=cache or cache_dir(), revision=revision or None)
        if isinstance(p, str):
            return fn, p
    return None


def is_cached(candidate) -> bool:
    """Whether a Hub candidate of the load's plan (``load.sources.Candidate``) has a file in the cache."""
    return candidate.place == "hub" and cached_file(candidate.repo, candidate.filenames, candidate.revision) is not None


def pinned_commit_hit(repo, filenames, rev, cache):
    """A commit's files never change: when ``rev`` is a full commit hash, walk the names in the cache without any
    request, as far as the cache can answer (a name cached -> use it; recorded absent -> next; unknown -> go online)."""
    from huggingface_hub import _CACHED_NO_EXIST, try_to_load_from_cache
    if not COMMIT_RE.match(rev):
        return None
    skipped = []
    for fn in filenames:
        p = try_to_load_from_cache(repo, fn, cache_dir=cache, revision=rev)
        if isinstance(p, str):
            return fn, p, skipped
        if p is not _CACHED_NO_EXIST:
            return None
        skipped.append((fn, "not in the repo (recorded in the cache)"))
    return None
