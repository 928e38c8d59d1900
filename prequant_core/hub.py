"""Download pre-quantized checkpoints from the Hugging Face Hub with the real ``huggingface_hub`` client.

Where files land: with ``dest_dir`` (what the loader node passes by default: the first folder ComfyUI lists for
``prequant``) the file is stored in that folder under ``sources.local_name``, through the client's local-folder mode
and a hidden staging folder, so it is resumable and never half-written there (``_transfer_to_folder``); later loads
find it there without any request. Without ``dest_dir``, in the standard Hugging Face cache (``HF_HUB_CACHE``,
default ``~/.cache/huggingface/hub``) exactly as ``hf_hub_download`` puts them there, shared with other tools.

Rules (see ``sources`` for where the names come from):

- Names are tried in order; the next name is tried ONLY when the Hub says this file is not in the repo
  (``EntryNotFoundError``: HTTP 404 with ``X-Error-Code: EntryNotFound``). Any other answer (5xx, connection refused,
  401/403, unknown revision or repo) stops at once with a typed ``HubError`` naming the repo, the revision, every name
  tried and the fix. The client itself retries 5xx and connection errors with back-off before that.
- Token: the ``token`` argument, else the client's default (``HF_TOKEN``, then the stored ``hf auth login``). A token
  is never logged or put into a message.
- ``revision`` pins a branch, tag or commit; a commit hash already in the cache is served without any request.
- Offline (``HF_HUB_OFFLINE=1``): served from the cache only; if none of the names is cached, ``HubOfflineError``
  lists them all.
- Status: ``status(text)`` (optional) gets a short line at each stage (connecting to the endpoint for a name,
  downloading it), so a wait is never silent; the client's retries against an unreachable Hub take ~20 s.
- Progress: ``progress(done_bytes, total_bytes)`` is called from the caller's thread while the client downloads in a
  worker thread (it reads the size of the client's ``.incomplete`` file); the terminal shows the client's own tqdm bar.
- Resume: the client resumes from its ``<blob>.incomplete`` file with an HTTP Range request. When the transfer breaks
  mid-body we call the client again (up to ``resume_attempts`` times, as long as bytes keep arriving), which resumes;
  a run killed mid-download (ComfyUI closed) resumes the same way next time.
- No partial file is left on errors: the ``.incomplete`` file of a failed download is deleted. The one exception is a
  transfer that kept breaking after the resume attempts: its bytes are kept, so queueing again resumes instead of
  starting over (the message says how many bytes were kept).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import threading
import time
from typing import Callable, Iterable, Mapping

from . import sources
from .errors import CheckpointNotFoundError, HubError

log = logging.getLogger("prequant")

ProgressFn = Callable[[int, int], None]
StatusFn = Callable[[str], None]  # a short line for the user while they wait (connecting, downloading, ...)
POLL_S = 0.2
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")  # what the client treats as a commit hash


class HubNotFoundError(HubError):
    """The repo, the revision, or every one of the expected file names is not on the Hub."""
    kind = "hub-not-found"


class HubAuthError(HubError):
    """401 / 403 / gated: a token is missing, wrong, or lacks access."""
    kind = "hub-auth"


class HubUnavailableError(HubError):
    """The Hub could not be reached or answered with a server error; nothing else was tried."""
    kind = "hub-unavailable"


class HubOfflineError(HubError):
    """Offline mode, and none of the names is in the local cache."""
    kind = "hub-offline"


class HubDownloadError(HubError):
    """The transfer itself failed (interrupted repeatedly, size mismatch, disk)."""
    kind = "hub-download"


@dataclasses.dataclass
class Fetched:
    path: str  # the cache's snapshot path (a symlink to the blob on most systems)
    repo: str
    revision: str  # as asked ("main" when none was given)
    filename: str
    commit: str | None
    size: int
    downloaded: bool  # False when it came from the cache without transferring bytes
    storage_folder: str  # <cache>/models--owner--name: the folder the file's real path lies in
    tried: list[tuple[str, str]]  # (name, outcome) for the names before it


@dataclasses.dataclass
class Located:
    path: str
    candidate: sources.Candidate
    model_dirs: list[str]  # folders open_checkpoint may read for this path
    fetched: Fetched | None = None


def _is_true(v: str | None) -> bool:
    return str(v or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _hf():
    try:
        import huggingface_hub  # noqa: F401
        from huggingface_hub import constants
    except ImportError as e:  # pragma: no cover - requirements.txt installs it
        raise HubError("Downloading from the Hugging Face Hub needs the huggingface_hub package.", found=str(e),
                       fix="pip install huggingface_hub (inside ComfyUI's Python environment).") from None
    return constants


def endpoint(env: Mapping[str, str] | None = None) -> str:
    """The Hub address: ``HF_ENDPOINT`` as set now, else the client's default."""
    env = os.environ if env is None else env
    ep = (env.get("HF_ENDPOINT") or "").strip().rstrip("/")
    return ep or _hf().ENDPOINT


def cache_dir(env: Mapping[str, str] | None = None) -> str:
    """The standard Hugging Face cache folder, with the client's own precedence, read from the environment now."""
    env = os.environ if env is None else env
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return os.path.expanduser(os.path.expandvars(env[var]))
    if env.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.path.expandvars(env["HF_HOME"])), "hub")
    return _hf().HF_HUB_CACHE


def is_offline(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return bool(_hf().HF_HUB_OFFLINE) or _is_true(env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE"))


def storage_folder(repo: str, cache: str | None = None) -> str:
    from huggingface_hub.file_download import repo_folder_name
    return os.path.join(cache or cache_dir(), repo_folder_name(repo_id=repo, repo_type="model"))


def cached_file(repo: str, filenames: Iterable[str], revision: str | None = None,
                cache: str | None = None) -> tuple[str, str] | None:
    """(name, path) of the first name present in the cache for this revision; no network."""
    _hf()
    from huggingface_hub import try_to_load_from_cache
    for fn in filenames:
        p = try_to_load_from_cache(repo, fn, cache_dir=cache or cache_dir(), revision=revision or None)
        if isinstance(p, str):
            return fn, p
    return None


def is_cached(candidate: sources.Candidate) -> bool:
    return candidate.kind == "hub" and cached_file(candidate.repo, candidate.filenames, candidate.revision) is not None


# --- errors -------------------------------------------------------------------------------------------------------

def _classify(exc: BaseException) -> tuple[str, str]:
    """(kind, short detail) of an exception from the client."""
    import requests
    from huggingface_hub.errors import (EntryNotFoundError, FileMetadataError, GatedRepoError, HfHubHTTPError,
                                        LocalEntryNotFoundError, OfflineModeIsEnabled, RepositoryNotFoundError,
                                        RevisionNotFoundError)
    if isinstance(exc, LocalEntryNotFoundError) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, LocalEntryNotFoundError):
        return "not-cached", "not in the local cache"
    if isinstance(exc, EntryNotFoundError):
        return "entry", "not in the repo (404 EntryNotFound)"
    if isinstance(exc, RevisionNotFoundError):
        return "revision", "revision not found"
    if isinstance(exc, GatedRepoError):
        return "auth", f"gated repo, HTTP {_status(exc)}"
    if isinstance(exc, RepositoryNotFoundError):
        return "repo", f"repo not found or private, HTTP {_status(exc)}"
    if isinstance(exc, OfflineModeIsEnabled):
        return "offline", "offline mode is enabled"
    if isinstance(exc, (HfHubHTTPError, requests.HTTPError)):  # the back-off gives up with a plain HTTPError
        status = _status(exc)
        if status in (401, 403):
            return "auth", f"HTTP {status} {_server_message(exc)}".strip()
        return "http", f"HTTP {status} {_server_message(exc)}".strip()
    if isinstance(exc, (requests.exceptions.ChunkedEncodingError, requests.exceptions.ConnectionError,
                        requests.exceptions.Timeout)):
        return "network", f"{type(exc).__name__}: {_short(exc)}"
    if isinstance(exc, FileMetadataError):
        return "metadata", _short(exc)
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
        return "corrupt", "size mismatch after the transfer"
    if isinstance(exc, OSError):
        return "disk", f"{type(exc).__name__}: {_short(exc)}"
    return "other", f"{type(exc).__name__}: {_short(exc)}"


def _status(exc) -> int | None:
    resp = getattr(exc, "response", None)
    return getattr(resp, "status_code", None)


def _server_message(exc) -> str:
    msg = getattr(exc, "server_message", None) or ""
    return f"({msg.strip()[:200]})" if msg.strip() else ""


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:240]


def _where(repo: str, revision: str) -> str:
    return f"Hub repo {repo} (revision {revision}, {endpoint()})"


def _reasons(tried: list[tuple[str, str]]) -> list[str]:
    return [f"{fn}: {outcome}" for fn, outcome in tried]


TOKEN_FIX = ("Set the HF_TOKEN environment variable (or run `hf auth login`) before starting ComfyUI; for a gated "
             "repo, also accept its terms on the repo's page at {url}. (The node never takes a token itself, so "
             "none is saved in workflows, history or images.)")


def _raise_for(kind: str, detail: str, exc: BaseException | None, *, repo: str, revision: str, fn: str,
               tried: list[tuple[str, str]], scheme_hint: str = "") -> None:
    where = _where(repo, revision)
    tried = tried + [(fn, detail)]
    url = f"{endpoint()}/{repo}"
    if kind == "auth":
        raise HubAuthError(f"{where} refused access ({detail}).", reasons=_reasons(tried),
                           fix=TOKEN_FIX.format(url=url)) from exc
    if kind == "repo":
        raise HubNotFoundError(f"{where} does not exist, or it is private and no valid token was sent.",
                               reasons=_reasons(tried),
                               fix="Check the repo id spelling. For a private repo: " + TOKEN_FIX.format(url=url)) from exc
    if kind == "revision":
        raise HubNotFoundError(f"{where}: revision '{revision}' does not exist.", reasons=_reasons(tried),
                               fix="Give an existing branch, tag or full commit hash in 'revision', or leave it "
                                   "empty for the default branch.") from exc
    if kind in ("network", "offline"):
        # One plain sentence for the user; the client's raw exception (retries, pools, quoted reprs) goes to the
        # server log only.
        log.warning("[prequant] could not reach %s for %s/%s: %s", endpoint(), repo, fn, detail)
        raise HubUnavailableError(f"Could not reach the Hugging Face Hub at {endpoint()} to download {fn} from "
                                  f"{repo} (revision {revision}).", reasons=_reasons(tried[:-1]),
                                  fix="Check the network connection, proxy (HTTPS_PROXY) and HF_ENDPOINT. Other file "
                                      "names were not tried because this was not a 'file not found' answer. To use "
                                      "files already downloaded, set HF_HUB_OFFLINE=1; or put the file into "
                                      "ComfyUI/models/prequant/.") from exc
    if kind in ("http", "metadata"):
        raise HubUnavailableError(f"{where} answered with an error ({detail}).", reasons=_reasons(tried),
                                  fix="This is a server-side problem, not a missing file, so no other file name was "
                                      "tried and nothing was kept. Try again later, or set HF_HUB_OFFLINE=1 to use "
                                      "files already in the cache.") from exc
    raise HubDownloadError(f"Downloading {fn} from {where} failed ({detail}).", reasons=_reasons(tried),
                           fix="Queue the prompt again; if it keeps failing, check free disk space in "
                               f"{cache_dir()} and the network.") from exc


# --- download -----------------------------------------------------------------------------------------------------

def _size(p) -> int | None:
    if callable(p):  # a download into a model folder: the client's partial file is found when asked
        p = p()
    if not p:
        return None
    try:
        return os.path.getsize(p)
    except OSError:
        return None


class _Aborted(BaseException):
    """The progress callback raised: hand its exception to the caller untouched, and clean nothing up."""

    def __init__(self, exc: BaseException):
        super().__init__(exc)
        self.exc = exc


def _run_with_progress(fn, incomplete: str, blob: str, total: int, progress: ProgressFn | None):
    """Run ``fn`` in a worker thread; report the growing ``.incomplete`` size from this thread."""
    box: dict = {}

    def work():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller's thread
            box["error"] = e

    t = threading.Thread(target=work, name="prequant-hub-download", daemon=True)
    t.start()
    last = -1
    while True:
        t.join(POLL_S)
        done = _size(incomplete)
        if done is None:
            done = total if os.path.exists(blob) else max(last, 0)
        if progress and done != last and t.is_alive():
            try:
                progress(min(done, total), total)
            except BaseException as e:  # noqa: BLE001 - e.g. ComfyUI's "interrupted" from its progress hook
                # The worker cannot be stopped; it finishes (or fails) on its own and the client's lock and
                # .incomplete file stay consistent, so the next run resumes or finds the file.
                raise _Aborted(e) from None
        last = done
        if not t.is_alive():
            break
    if "error" in box:
        raise box["error"]
    return box["result"]


def download(repo: str, filenames: Iterable[str], *, revision: str | None = None, token: str | None = None,
             progress: ProgressFn | None = None, resume_attempts: int = 3, dest_dir: str | None = None,
             search_dirs: Iterable[str] = (), status: StatusFn | None = None) -> Fetched:
    """Fetch the first of ``filenames`` that exists in ``repo``; return where it is.

    ``dest_dir`` None: into the HF cache. A folder (ComfyUI's models/prequant): the file is stored there under
    ``sources.local_name`` (see ``_transfer_to_folder``); a file of that name already in ``dest_dir`` or
    ``search_dirs`` is used as it is, without any request (a local file always takes precedence)."""
    constants = _hf()
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo = sources.normalize_repo(repo)
    filenames = list(filenames)
    rev = (revision or "").strip() or constants.DEFAULT_REVISION
    token = (token or "").strip() or None  # None: the client's default (HF_TOKEN, then the stored login)
    cache, ep = cache_dir(), endpoint()
    folder = storage_folder(repo, cache)
    tried: list[tuple[str, str]] = []

    if dest_dir:
        hit = local_file(repo, filenames, [dest_dir, *search_dirs])
        if hit:
            fn, p = hit
            log.info("[prequant] using %s (%s/%s, already downloaded)", p, repo, fn)
            if progress:
                progress(_size(p) or 0, _size(p) or 0)
            return Fetched(p, repo, rev, fn, None, _size(p) or 0, False, os.path.dirname(p), tried)

    if is_offline():
        for fn in filenames:
            try:
                p = hf_hub_download(repo, fn, revision=rev, cache_dir=cache, local_files_only=True)
            except LocalEntryNotFoundError:
                tried.append((fn, "not in the local cache"))
                continue
            log.info("[prequant] offline: using cached %s/%s (%s)", repo, fn, rev)
            if progress:
                progress(_size(p) or 0, _size(p) or 0)
            return Fetched(p, repo, rev, fn, None, _size(p) or 0, False, folder, tried)
        raise HubOfflineError(f"Offline mode (HF_HUB_OFFLINE) is on and {repo} (revision {rev}) has none of these "
                              f"files in the local Hugging Face cache ({cache}).", reasons=_reasons(tried),
                              fix="Run once with network access (unset HF_HUB_OFFLINE) so the file is downloaded, "
                                  "or put the file into ComfyUI/models/prequant/.")

    hit = None if dest_dir else _pinned_commit_hit(repo, filenames, rev, cache)
    if hit:
        fn, p, skipped = hit
        log.info("[prequant] using cached %s/%s at pinned commit %s", repo, fn, rev)
        if progress:
            progress(_size(p) or 0, _size(p) or 0)
        return Fetched(p, repo, rev, fn, rev, _size(p) or 0, False, folder, skipped)

    say = status or (lambda text: None)
    for fn in filenames:
        url = hf_hub_url(repo, fn, revision=rev, endpoint=ep)
        say(f"connecting to {ep} for {repo}/{fn}")
        try:
            meta = get_hf_file_metadata(url, token=token, timeout=constants.HF_HUB_ETAG_TIMEOUT, endpoint=ep)
        except Exception as e:  # noqa: BLE001 - classified below; anything unexpected is re-raised
            kind, detail = _classify(e)
            if kind == "entry":
                tried.append((fn, detail))
                continue
            if kind in ("network", "http", "metadata", "offline"):
                # The client's own rule: when the Hub cannot answer, a copy of this very file already in the cache
                # for this revision is served. Never another name.
                hit = cached_file(repo, [fn], rev, cache)
                if hit:
                    log.warning("[prequant] %s unreachable (%s); using the cached %s", ep, detail, fn)
                    if progress:
                        progress(_size(hit[1]) or 0, _size(hit[1]) or 0)
                    return Fetched(hit[1], repo, rev, fn, None, _size(hit[1]) or 0, False, folder, tried)
            if kind == "other":
                raise
            _raise_for(kind, detail, e, repo=repo, revision=rev, fn=fn, tried=tried)

        say(f"downloading {fn} from {repo}")
        if dest_dir:
            p = _transfer_to_folder(repo, fn, rev, meta, dest_dir, cache, ep, token, progress, resume_attempts, tried)
        else:
            p = _transfer(repo, fn, rev, meta, folder, cache, ep, token, progress, resume_attempts, tried,
                          lambda: hf_hub_download(repo, fn, revision=rev, cache_dir=cache, token=token, endpoint=ep))
        if p is None:  # removed between the two requests: same rule as a 404 on the first
            tried.append((fn, "not in the repo (404 EntryNotFound)"))
            continue
        return p

    raise HubNotFoundError(f"None of the expected file names is in {_where(repo, rev)}.", reasons=_reasons(tried),
                           fix=f"Check which files the repo holds ({endpoint()}/{repo}/tree/{rev}); pick the other "
                               "scheme, give the right repo or revision, or download the file by hand into "
                               "ComfyUI/models/prequant/.")


def _transfer(repo, fn, rev, meta, folder, cache, ep, token, progress, resume_attempts, tried, call, *,
              incomplete=None, blob=None):
    """Run the client's download of one file (HEAD already answered), resuming after broken transfers.
    ``incomplete`` / ``blob``: the partial and final paths when they are not the cache's (a download into a folder)."""
    total = int(meta.size or 0)
    blob = blob or os.path.join(folder, "blobs", meta.etag or "")
    incomplete = incomplete or blob + ".incomplete"
    cached_before = os.path.exists(blob)
    start_bytes = _size(incomplete) or 0
    if not cached_before:
        log.info("[prequant] downloading %s/%s (%s, %.1f MiB)%s into %s", repo, fn, rev, total / 2**20,
                 f", resuming at {start_bytes} bytes" if start_bytes else "", folder)
    attempt = 0
    while True:
        before = _size(incomplete) or 0
        try:
            p = _run_with_progress(call, incomplete, blob, total, progress)
            break
        except _Aborted as a:
            raise a.exc from None
        except Exception as e:  # noqa: BLE001 - classified below; anything unexpected is re-raised
            kind, detail = _classify(e)
            after = _size(incomplete) or 0
            if kind == "network" and after > before and attempt < resume_attempts:
                attempt += 1
                log.warning("[prequant] download of %s interrupted at %d/%d bytes (%s); resuming (%d/%d)",
                            fn, after, total, detail, attempt, resume_attempts)
                time.sleep(0.5)
                continue
            if kind == "network" and after > 0:
                raise HubDownloadError(
                    f"Downloading {fn} from {_where(repo, rev)} was interrupted ({detail}).",
                    reasons=_reasons(tried + [(fn, f"interrupted at {after} of {total} bytes")]),
                    fix=f"Queue the prompt again: the {after} bytes received are kept (in {folder}) and the "
                        "download resumes from there.") from e
            _discard(incomplete)
            if kind == "entry":
                return None
            if kind == "other":
                raise
            _raise_for(kind, detail, e, repo=repo, revision=rev, fn=fn, tried=tried)
    if progress:
        progress(total, total)
    downloaded = not cached_before
    if downloaded:
        log.info("[prequant] downloaded %s/%s (%d bytes%s, %d resume(s))", repo, fn, total,
                 f", resumed from {start_bytes}" if start_bytes else "", attempt)
    return Fetched(p, repo, rev, fn, meta.commit_hash, total, downloaded, folder, list(tried))


STAGING_DIR = ".prequant-download"  # hidden folder inside the destination: partial downloads, resumed from there


def local_file(repo: str, filenames: Iterable[str], folders: Iterable[str]) -> tuple[str, str] | None:
    """(repo file name, path) of the first name already stored in one of ``folders`` (as ``sources.local_name``)."""
    for fn in filenames:
        for d in folders:
            p = os.path.join(d, sources.local_name(repo, fn))
            if os.path.isfile(p):
                return fn, p
    return None


def _partial_in(staging: str):
    """The client's partial file for a download into ``staging`` (it names it after the etag), found when asked."""
    def find():
        best = None
        for root, _, names in os.walk(staging):
            for n in names:
                if n.endswith(".incomplete"):
                    p = os.path.join(root, n)
                    if best is None or (_size(p) or 0) > (_size(best) or 0):
                        best = p
        return best
    return find


def _transfer_to_folder(repo, fn, rev, meta, dest_dir, cache, ep, token, progress, resume_attempts, tried):
    """Download one file into ``dest_dir`` with the client's own local-folder mode, never half-written there.

    The client writes ``<dest>/.prequant-download/<repo>/.cache/huggingface/download/*.incomplete`` (resumed with a
    Range request on the next run), renames it to ``<dest>/.prequant-download/<repo>/<fn>`` when complete and checked
    (size), and we rename that to ``<dest>/<local name>``: same folder tree, so both renames are atomic; ComfyUI's
    list shows nothing until the last one. A file of the same name already in ``dest_dir`` was used before we got
    here, so nothing is overwritten."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.file_download import repo_folder_name
    final = os.path.join(dest_dir, sources.local_name(repo, fn))
    staging = os.path.join(dest_dir, STAGING_DIR, repo_folder_name(repo_id=repo, repo_type="model"))
    try:
        os.makedirs(staging, exist_ok=True)
    except OSError as e:
        raise HubDownloadError(f"Cannot write the download of {fn} into {dest_dir} ({type(e).__name__}: {_short(e)}).",
                               path=final, fix="Make the folder writable, free disk space, or set the node's "
                                               "download_to to the Hugging Face cache.") from e
    staged = os.path.join(staging, *fn.split("/"))
    f = _transfer(repo, fn, rev, meta, staging, cache, ep, token, progress, resume_attempts, tried,
                  lambda: hf_hub_download(repo, fn, revision=rev, cache_dir=cache, token=token, endpoint=ep,
                                          local_dir=staging),
                  incomplete=_partial_in(staging), blob=staged)
    if f is None:
        return None
    try:
        os.replace(f.path, final)
    except OSError as e:
        raise HubDownloadError(f"Could not move the downloaded {fn} to {final} ({type(e).__name__}: {_short(e)}).",
                               path=final, fix="Check permissions and free space in the folder.") from e
    shutil.rmtree(staging, ignore_errors=True)  # the client's metadata for the file we just moved out
    try:
        os.rmdir(os.path.dirname(staging))  # and the staging folder itself once no other download is in it
    except OSError:
        pass
    log.info("[prequant] stored %s/%s as %s", repo, fn, final)
    return dataclasses.replace(f, path=final, storage_folder=dest_dir)


def _pinned_commit_hit(repo, filenames, rev, cache):
    """A commit's files never change: when ``rev`` is a full commit hash, walk the names in the cache without any
    request, as far as the cache can answer (a name cached -> use it; recorded absent -> next; unknown -> go online)."""
    from huggingface_hub import _CACHED_NO_EXIST, try_to_load_from_cache
    if not _COMMIT_RE.match(rev):
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


def _discard(path) -> None:
    if callable(path):
        path = path()
    if not path:
        return
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as e:  # pragma: no cover
        log.warning("[prequant] could not remove the partial download %s: %s", path, e)


def locate(plan: sources.Plan | Iterable[sources.Candidate], *, model_dirs: Iterable[str] = (),
           token: str | None = None, progress: ProgressFn | None = None,
           env: Mapping[str, str] | None = None, dest_dir: str | None = None,
           search_dirs: Iterable[str] = (), status: StatusFn | None = None) -> Located:
    """The file to open for a plan.

    A local candidate (typed path or listed file) comes first in a plan and is always used as given: a refused or
    missing file is reported by ``open_checkpoint``, never replaced by a silent download. Among Hub candidates the
    first usable one is taken (``sources.usable``: cached, or we are online), else the first, so that its own error
    explains what is wrong. Only a Hub file gets its repo's cache folder as an extra allowed folder.
    ``dest_dir``: download into this folder instead of the HF cache (see ``download``); a file stored there or in
    ``search_dirs`` before counts as available offline.
    """
    cands = list(plan)
    model_dirs = list(model_dirs)
    if not cands:
        notes = list(getattr(plan, "notes", ()))
        raise CheckpointNotFoundError("No checkpoint chosen.", reasons=notes,
                                      fix="Pick a file in 'checkpoint', fill 'path', type a 'hub_repo' (e.g. "
                                          "unsloth/Z-Image-Turbo-FP8) with a scheme, or pick a preset.")
    if cands[0].kind == "local":
        return Located(cands[0].path, cands[0], model_dirs)
    hub_cands = [c for c in cands if c.kind == "hub"]
    search_dirs = list(search_dirs)

    def available(c):
        return is_cached(c) or bool(dest_dir and local_file(c.repo, c.filenames, [dest_dir, *search_dirs]))

    u = sources.usable(hub_cands, model_dirs=model_dirs, offline=is_offline(env), is_cached=available, env=env)
    chosen = u.usable[0] if u.usable else hub_cands[0]
    for c, why in u.rejected:
        if hub_cands.index(c) < hub_cands.index(chosen):
            log.warning("[prequant] skipping %s: %s; using %s", c.describe(), why, chosen.describe())
    f = download(chosen.repo, chosen.filenames, revision=chosen.revision, token=token, progress=progress,
                 dest_dir=dest_dir, search_dirs=search_dirs, status=status)
    return Located(f.path, chosen, model_dirs + [f.storage_folder], f)
