"""The Hub's typed errors, the sorting of the client library's exceptions into them, and what the user is told for each.

Light on purpose (no torch, no other pack module but ``errors`` and ``hub.cache``): the download child process
(``hub.child``) imports it to sort what the client raised before it tells the parent. The client raises ``requests`` errors up to
huggingface_hub 0.x and ``httpx`` errors from 1.x; both are sorted here, by class where the library is installed and
by name otherwise.
"""
from __future__ import annotations

import logging

from ..errors import HubError
from ..safe_text import redact
from .cache import cache_dir, shown_endpoint

log = logging.getLogger("prequant")


class HubNotFoundError(HubError):
    """The repo, the revision, or every one of the expected file names is not on the Hub."""


class HubAuthError(HubError):
    """401 / 403 / gated: a token is missing, wrong, or lacks access."""


class HubUnavailableError(HubError):
    """The Hub could not be reached or answered with a server error; nothing else was tried."""


class HubOfflineError(HubError):
    """Offline mode, and none of the names is in the local cache."""


class HubDownloadError(HubError):
    """The transfer itself failed (interrupted repeatedly, stalled, too slow, size mismatch, disk)."""


_NETWORK_NAMES = {"ConnectionError", "ChunkedEncodingError", "Timeout", "ReadTimeout", "ConnectTimeout",
                  "ConnectError", "RemoteProtocolError", "ReadError", "WriteError", "NetworkError", "TimeoutException",
                  "PoolTimeout", "ProtocolError", "IncompleteRead", "ProxyError", "SSLError", "LocalProtocolError",
                  "ContentDecodingError", "TooManyRedirects"}


def _names(exc: BaseException) -> set:
    return {c.__name__ for c in type(exc).__mro__}


def classify(exc: BaseException) -> tuple[str, str]:
    """(failure, short detail) of an exception from the client: entry, not-cached, revision, auth, repo, offline, http,
    network, metadata, corrupt, xet, disk or other."""
    try:
        from huggingface_hub import errors as E
    except ImportError:  # pragma: no cover - requirements.txt installs it
        E = None
    if E is not None and isinstance(exc, E.LocalEntryNotFoundError) and exc.__cause__ is not None:
        exc = exc.__cause__
    names = _names(exc)
    text = " ".join(str(exc).split())
    if "LocalEntryNotFoundError" in names:
        return "not-cached", "not in the local cache"
    if "EntryNotFoundError" in names or "RemoteEntryNotFoundError" in names:
        return "entry", "not in the repo (404 EntryNotFound)"
    if "RevisionNotFoundError" in names:
        return "revision", "revision not found"
    if "GatedRepoError" in names:
        return "auth", f"gated repo{http(exc)}"
    if "RepositoryNotFoundError" in names:
        return "repo", f"repo not found or private{http(exc)}"
    if "OfflineModeIsEnabled" in names:
        return "offline", "offline mode is enabled"
    if "hf_xet" in text or "hf-xet" in text:
        return "xet", short(exc)
    if "Consistency check failed" in text or "IncompleteRead" in names:
        return "corrupt", "size mismatch: the received size does not match the announced one"
    if "HfHubHTTPError" in names or "HTTPError" in names or "HTTPStatusError" in names:
        code = status(exc)
        if code in (401, 403):
            return "auth", f"HTTP {code} {server_message(exc)}".strip()
        if code is None and names & _NETWORK_NAMES:
            return "network", f"{type(exc).__name__}: {short(exc)}"
        return "http", (f"HTTP {code} {server_message(exc)}" if code is not None else
                        f"HTTP error without a status: {server_message(exc) or short(exc)}").strip()
    if names & _NETWORK_NAMES or isinstance(exc, (ConnectionError, TimeoutError)):
        return "network", f"{type(exc).__name__}: {short(exc)}"
    if "FileMetadataError" in names:
        return "metadata", short(exc)
    if isinstance(exc, OSError):
        return "disk", f"{type(exc).__name__}: {short(exc)}"
    return "other", f"{type(exc).__name__}: {short(exc)}"


def status(exc) -> int | None:
    resp = getattr(exc, "response", None)
    return getattr(resp, "status_code", None)


def http(exc) -> str:
    """``, HTTP <status>`` where the error carries a response (an error raised without one names no status: a user
    read "HTTP None")."""
    code = status(exc)
    return f", HTTP {code}" if code is not None else ""


def server_message(exc) -> str:
    msg = getattr(exc, "server_message", None) or ""
    return f"({msg.strip()[:200]})" if msg.strip() else ""


def short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:240]


# --- the messages: what the user is told for each kind of failure -----------------------------------------------

def where(repo: str, revision: str) -> str:
    return f"Hub repo {repo} (revision {revision}, {shown_endpoint()})"


def reasons_of(tried: list[tuple[str, str]]) -> list[str]:
    return [f"{fn}: {outcome}" for fn, outcome in tried]


TOKEN_FIX = ("Set the HF_TOKEN environment variable (or run `hf auth login`) before starting ComfyUI; for a gated "
             "repo, also accept its terms on the repo's page at {url}. (The node never takes a token itself, so "
             "none is saved in workflows, history or images.)")


def raise_for(failure: tuple[str, str], exc: BaseException | None, *, repo: str, revision: str, fn: str,
              tried: list[tuple[str, str]]) -> None:
    """The typed error for a failed transfer of ``fn``: ``failure`` is (failure, detail) as ``classify`` gives them,
    ``exc`` the client's exception (None where the child reported it), ``tried`` the names tried before."""
    why, detail = failure
    at = where(repo, revision)
    detail = redact(detail)  # the client quotes URLs back, credentials included
    tried = tried + [(fn, detail)]
    url = f"{shown_endpoint()}/{repo}"
    if why == "auth":
        raise HubAuthError(f"{at} refused access ({detail}).", reasons=reasons_of(tried),
                           fix=TOKEN_FIX.format(url=url)) from exc
    if why == "repo":
        raise HubNotFoundError(f"{at} does not exist, or it is private and no valid token was sent.",
                               reasons=reasons_of(tried),
                               fix="Check the repo id spelling. For a private repo: " + TOKEN_FIX.format(url=url)) from exc
    if why == "revision":
        raise HubNotFoundError(f"{at}: revision '{revision}' does not exist.", reasons=reasons_of(tried),
                               fix="Give an existing branch, tag or full commit hash in 'revision', or leave it "
                                   "empty for the default branch.") from exc
    if why in ("network", "offline"):
        # One plain sentence for the user; the client's raw exception (retries, pools, quoted reprs) goes to the
        # server log only.
        log.warning("[prequant] could not reach %s for %s/%s: %s", shown_endpoint(), repo, fn, detail)
        raise HubUnavailableError(f"Could not reach the Hugging Face Hub at {shown_endpoint()} to download {fn} from "
                                  f"{repo} (revision {revision}).", reasons=reasons_of(tried[:-1]),
                                  fix="Check the network connection, proxy (HTTPS_PROXY) and HF_ENDPOINT. Other file "
                                      "names were not tried because this was not a 'file not found' answer. To use "
                                      "files already downloaded, set HF_HUB_OFFLINE=1; or put the file into "
                                      "ComfyUI/models/prequant/.") from exc
    if why in ("http", "metadata"):
        raise HubUnavailableError(f"{at} answered with an error ({detail}).", reasons=reasons_of(tried),
                                  fix="This is a server-side problem, not a missing file, so no other file name was "
                                      "tried and nothing was kept. Try again later, or set HF_HUB_OFFLINE=1 to use "
                                      "files already in the cache.") from exc
    if why == "xet":
        raise HubDownloadError(f"Downloading {fn} from {at} needs the hf_xet package ({detail}).",
                               reasons=reasons_of(tried), fix="pip install hf_xet (inside ComfyUI's Python environment), "
                                                            "then queue the prompt again.") from exc
    if why == "corrupt":
        raise HubDownloadError(f"Downloading {fn} from {at} gave a file of the wrong size ({detail}); it was not "
                               "kept.", reasons=reasons_of(tried), fix="Queue the prompt again; if it keeps failing, the "
                                                                     "server or a proxy is altering the file.") from exc
    raise HubDownloadError(f"Downloading {fn} from {at} failed ({detail}).", reasons=reasons_of(tried),
                           fix="Queue the prompt again; if it keeps failing, check free disk space in "
                               f"{cache_dir()} and the network.") from exc
