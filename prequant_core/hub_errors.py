"""The Hub's typed errors and the sorting of the client library's exceptions into them.

Light on purpose (no torch, no other pack module but ``errors``): the download child process (``hub_child``) imports
it to sort what the client raised before it tells the parent. The client raises ``requests`` errors up to
huggingface_hub 0.x and ``httpx`` errors from 1.x; both are sorted here, by class where the library is installed and
by name otherwise.
"""
from __future__ import annotations

from .errors import HubError


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
    """(kind, short detail) of an exception from the client: entry, not-cached, revision, auth, repo, offline, http,
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
        return "auth", f"gated repo, HTTP {status(exc)}"
    if "RepositoryNotFoundError" in names:
        return "repo", f"repo not found or private, HTTP {status(exc)}"
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
        return "http", f"HTTP {code} {server_message(exc)}".strip()
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


def server_message(exc) -> str:
    msg = getattr(exc, "server_message", None) or ""
    return f"({msg.strip()[:200]})" if msg.strip() else ""


def short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:240]
