"""Download pre-quantized checkpoints from the Hugging Face Hub with the real ``huggingface_hub`` client.

Where files land: with ``dest_dir`` (what the loader node passes by default: the first folder ComfyUI lists for
``prequant``) the file is stored in its origin folder there, ``<dest>/<owner>/<repo>/`` (``<repo>@<revision>`` for a
pinned revision: ``origin_dir``), through the client's local-folder mode and a hidden staging folder, so it is
resumable and never half-written there; later loads find it there without any request, and a file of the same name
from another repo never stands in for it. Without ``dest_dir``, in the standard Hugging Face cache (``HF_HUB_CACHE``,
default ``~/.cache/huggingface/hub``) exactly as ``hf_hub_download`` puts them there, shared with other tools.

Rules (see ``sources`` for where the names come from):

- An operator mirror (``UNSLOTH_DIFFUSION_PREQUANT_MIRROR``) is searched before any request.
- Names are tried in order; the next name is tried ONLY when the Hub says this file is not in the repo
  (``EntryNotFoundError``: HTTP 404 with ``X-Error-Code: EntryNotFound``). Any other answer (5xx, connection refused,
  401/403, unknown revision or repo) stops at once with a typed ``HubError`` naming the repo, the revision, every name
  tried and the fix. The client itself retries 5xx and connection errors with back-off before that.
- Every wait is bounded and can be cancelled: the client runs in a child process (``hub_child``) that this process
  watches (``Limits``: an answer within ``answer_s``, no stall longer than ``stall_s``, no transfer slower than
  ``min_bps``); ``check()`` (ComfyUI's interrupt) is called every poll. A stopped child is killed at once, its partial
  file kept, and the next run resumes from it with an HTTP Range request.
- A file announced larger than the free space of its disk is refused before a byte is written; a body longer than
  announced is discarded; a body of the wrong size is never renamed into place (the client checks the size).
- Token: the ``token`` argument, else the client's default (``HF_TOKEN``, then the stored ``hf auth login``). A token
  is never logged, put into a message or on a command line (it reaches the child through its stdin).
- ``revision`` pins a branch, tag or commit (``sources.normalize_revision``: what the Hub accepts, no path tricks);
  a commit hash already in the cache is served without any request.
- Offline (``HF_HUB_OFFLINE=1``): served from the cache only (names the cache records as absent are skipped); if none
  of the names is cached, ``HubOfflineError`` lists them all.
- Status and progress: ``status(text)`` gets a short line at each stage, ``progress(done_bytes, total_bytes)`` is
  called every poll from the size of the client's partial file.
- Resume: when the transfer breaks mid-body the client is started again (up to ``resume_attempts`` times, as long as
  bytes keep arriving), which resumes; a run killed or cancelled mid-download resumes the same way next time.
- No partial file is left on refusals (wrong size, oversized); the bytes of a transfer that broke, stalled or was
  cancelled are kept for the resume (the message says so).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import sys
import time
from typing import Callable, Iterable, Mapping

from . import sources
from .errors import CheckpointNotFoundError, HubError  # noqa: F401
from .hub_errors import (HubAuthError, HubDownloadError, HubNotFoundError, HubOfflineError,  # noqa: F401
                         HubUnavailableError, classify as _classify)

log = logging.getLogger("prequant")

ProgressFn = Callable[[int, int], None]
StatusFn = Callable[[str], None]  # a short line for the user while they wait (connecting, downloading, ...)
POLL_S = 0.2
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")  # what the client treats as a commit hash


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
    if kind == "xet":
        raise HubDownloadError(f"Downloading {fn} from {where} needs the hf_xet package ({detail}).",
                               reasons=_reasons(tried), fix="pip install hf_xet (inside ComfyUI's Python environment), "
                                                            "then queue the prompt again.") from exc
    if kind == "corrupt":
        raise HubDownloadError(f"Downloading {fn} from {where} gave a file of the wrong size ({detail}); it was not "
                               "kept.", reasons=_reasons(tried), fix="Queue the prompt again; if it keeps failing, the "
                                                                     "server or a proxy is altering the file.") from exc
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


def download(repo: str, filenames: Iterable[str], *, revision: str | None = None, token: str | None = None,
             progress: ProgressFn | None = None, resume_attempts: int = 3, dest_dir: str | None = None,
             search_dirs: Iterable[str] = (), status: StatusFn | None = None,
             check: Callable[[], None] | None = None) -> Fetched:
    """Fetch the first of ``filenames`` that exists in ``repo``; return where it is.

    ``dest_dir`` None: into the HF cache. A folder (ComfyUI's models/prequant): the file is stored in its origin
    folder there (``origin_dir``: ``<dest>/<owner>/<repo>[@<revision>]/``); a file already in the origin folder of
    ``dest_dir`` or ``search_dirs`` is used as it is, without any request. ``check()`` is called every poll while
    waiting and may raise to cancel (ComfyUI's interrupt); the transfer then stops at once and its bytes are kept."""
    constants = _hf()
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo = sources.normalize_repo(repo)
    filenames = list(filenames)
    rev = sources.normalize_revision(revision) or constants.DEFAULT_REVISION
    token = (token or "").strip() or None  # None: the client's default (HF_TOKEN, then the stored login)
    cache, ep = cache_dir(), endpoint()
    folder = storage_folder(repo, cache)
    tried: list[tuple[str, str]] = []

    if dest_dir:
        hit = local_file(repo, filenames, [dest_dir, *search_dirs], rev)
        if hit:
            fn, p = hit
            log.info("[prequant] using %s (%s/%s, already downloaded)", p, repo, fn)
            if progress:
                progress(_size(p) or 0, _size(p) or 0)
            return Fetched(p, repo, rev, fn, None, _size(p) or 0, False, os.path.dirname(p), tried)

    hit = mirror_file(repo, filenames)
    if hit:
        fn, p, root = hit
        log.info("[prequant] using %s (%s/%s from the operator mirror %s)", p, repo, fn, root)
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
    limits = Limits.from_env()
    names = list(filenames)
    attempt = 0
    while names:
        out = _child_fetch(repo, names, rev, cache, ep, token, dest_dir, progress, check, say, limits, tried)
        if out.kind == "done":
            return out.fetched
        if out.kind == "exhausted":
            break
        if out.kind == "entry-late":
            names = names[names.index(out.name) + 1:]
            continue
        fn = out.name
        if out.kind in ("network", "http", "metadata", "offline") and not out.started:
            # The client's own rule: when the Hub cannot answer, a copy of this very file already in the cache for
            # this revision is served. Never another name.
            hit = cached_file(repo, [fn], rev, cache)
            if hit:
                log.warning("[prequant] %s unreachable (%s); using the cached %s", ep, out.detail, fn)
                if progress:
                    progress(_size(hit[1]) or 0, _size(hit[1]) or 0)
                return Fetched(hit[1], repo, rev, fn, None, _size(hit[1]) or 0, False, folder, tried)
        if out.kind == "network" and out.gained > 0 and attempt < resume_attempts:
            attempt += 1
            log.warning("[prequant] download of %s interrupted at %d bytes (%s); resuming (%d/%d)", fn, out.have,
                        out.detail, attempt, resume_attempts)
            names = names[names.index(fn):]
            continue
        if out.kind == "network" and out.have > 0:
            raise HubDownloadError(
                f"Downloading {fn} from {_where(repo, rev)} was interrupted ({out.detail}).",
                reasons=_reasons(tried + [(fn, f"interrupted at {out.have} of {out.total} bytes")]),
                fix=f"Queue the prompt again: the {out.have} bytes received are kept and the download resumes from "
                    "there.")
        _discard(out.partial)
        _raise_for(out.kind, out.detail, None, repo=repo, revision=rev, fn=fn, tried=tried)

    raise HubNotFoundError(f"None of the expected file names is in {_where(repo, rev)}.", reasons=_reasons(tried),
                           fix=f"Check which files the repo holds ({endpoint()}/{repo}/tree/{rev}); pick the other "
                               "scheme, give the right repo or revision, or download the file by hand into "
                               "ComfyUI/models/prequant/.")


# --- the transfer: the client in a child process, watched from here -----------------------------------------------

@dataclasses.dataclass(frozen=True)
class Limits:
    """How long each Hub wait may last (environment: ``PREQUANT_HUB_ANSWER_S``, ``PREQUANT_HUB_STALL_S``,
    ``PREQUANT_HUB_MIN_BPS``). ``answer_s``: for the Hub to say whether a file exists (the client's own retries of a
    refused connection or a 5xx take about 20 s); ``stall_s``: no byte for this long ends the transfer; ``min_bps``:
    a transfer averaging less than this over the last ``stall_s`` seconds (a server dripping bytes) ends too."""
    answer_s: float = 90.0
    stall_s: float = 60.0
    min_bps: float = 8192.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Limits":
        env = os.environ if env is None else env
        out = {}
        for field, var in (("answer_s", "PREQUANT_HUB_ANSWER_S"), ("stall_s", "PREQUANT_HUB_STALL_S"),
                           ("min_bps", "PREQUANT_HUB_MIN_BPS")):
            try:
                v = float(env.get(var, ""))
                if v > 0:
                    out[field] = v
            except ValueError:
                pass
        return cls(**out)


@dataclasses.dataclass
class _Outcome:
    kind: str  # done | exhausted | an error kind of hub_errors.classify
    name: str | None = None
    detail: str = ""
    fetched: Fetched | None = None
    started: bool = False  # the body transfer had begun
    have: int = 0  # bytes of the partial file at the end
    gained: int = 0  # bytes received by this attempt
    total: int = 0
    partial: object = None  # the partial file (path or finder), for clean-up


def _child_cmd() -> list[str]:
    return [sys.executable, "-m", "prequant_core.hub_child"]


def _child_env() -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


class _Child:
    """The child process and its line protocol, every read bounded (a reader thread and a queue: ``select`` does not
    take pipes on Windows)."""

    def __init__(self, request: dict):
        import queue
        import subprocess
        import threading
        self.p = subprocess.Popen(_child_cmd(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, env=_child_env(), text=True, bufsize=1)
        self.p.stdin.write(json.dumps(request) + "\n")
        self.p.stdin.flush()
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, name="prequant-hub-child", daemon=True).start()

    def _read(self) -> None:
        for text in self.p.stdout:
            try:
                self.q.put(json.loads(text))
            except ValueError:
                self.q.put({"event": "error", "kind": "other", "detail": text.strip()[:200]})
        self.q.put({"event": "gone", "code": self.p.wait()})

    def line(self, timeout: float) -> dict | None:
        """The next message, or None after ``timeout`` s."""
        import queue
        try:
            return self.q.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None

    def send(self, text: str) -> None:
        try:
            self.p.stdin.write(text + "\n")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()
        for f in (self.p.stdin, self.p.stdout):
            try:
                f.close()
            except (OSError, ValueError):
                pass


def _free_bytes(folder: str) -> int | None:
    try:
        os.makedirs(folder, exist_ok=True)
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _child_fetch(repo, names, rev, cache, ep, token, dest_dir, progress, check, say, limits, tried) -> _Outcome:
    """Ask the child for the first of ``names`` that exists and download it, watching every wait."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name
    staging = os.path.join(dest_dir, STAGING_DIR, repo_folder_name(repo_id=repo, repo_type="model")) if dest_dir \
        else None
    req = {"repo": repo, "names": list(names), "revision": rev, "cache_dir": cache, "endpoint": ep,
           "local_dir": staging, "etag_timeout": float(constants.HF_HUB_ETAG_TIMEOUT), "token": token}
    child = _Child(req)
    try:
        ready = _wait_line(child, CHILD_START_S, check, progress)
        if not ready or ready.get("event") != "ready":
            raise HubDownloadError("The download helper process did not start.", found=str(ready)[:200],
                                   fix="Check that ComfyUI's Python environment has huggingface_hub installed.")
        pending = list(names)
        say(f"connecting to {ep} for {repo}/{pending[0]}")
        while True:
            msg = _wait_line(child, limits.answer_s, check, progress)
            if msg is None:
                raise HubUnavailableError(
                    f"{_where(repo, rev)} gave no answer about {pending[0]} within {limits.answer_s:.0f} s.",
                    reasons=_reasons(tried), fix="Check the network and HF_ENDPOINT, or try later "
                    "(PREQUANT_HUB_ANSWER_S sets this limit). To use files already downloaded, set HF_HUB_OFFLINE=1.")
            ev = msg.get("event")
            if ev == "entry":
                tried.append((msg["name"], msg.get("detail") or "not in the repo (404 EntryNotFound)"))
                pending = pending[pending.index(msg["name"]) + 1:] if msg["name"] in pending else pending[1:]
                if pending:
                    say(f"connecting to {ep} for {repo}/{pending[0]}")
                continue
            if ev == "exhausted":
                return _Outcome("exhausted")
            if ev in ("error", "gone"):
                return _Outcome(msg.get("kind", "other"), msg.get("name") or pending[0],
                                msg.get("detail") or f"the download process ended ({msg.get('code')})")
            if ev == "meta":
                return _transfer(child, msg, repo, rev, cache, staging, dest_dir, progress, check, say, limits, tried)
    finally:
        child.kill()


def _wait_line(child, timeout, check, progress, keep=None):
    """A message within ``timeout`` s; Cancel (``check``) is honoured every poll."""
    end = time.monotonic() + timeout
    while True:
        if check:
            check()
        msg = child.line(min(POLL_S, max(end - time.monotonic(), 0)))
        if msg is not None or time.monotonic() >= end:
            return msg


def _transfer(child, meta, repo, rev, cache, staging, dest_dir, progress, check, say, limits, tried) -> _Outcome:
    fn, total, etag = meta["name"], int(meta.get("size") or 0), (meta.get("etag") or "")
    if staging:
        partial = _partial_in(staging)
        final_dir = origin_dir(dest_dir, repo, rev)
        blob = os.path.join(staging, *fn.split("/"))
    else:
        folder = storage_folder(repo, cache)
        blob = os.path.join(folder, "blobs", etag)
        partial = blob + ".incomplete"
        final_dir = folder
    have0 = _size(partial) or 0
    cached_before = os.path.exists(blob)
    free = _free_bytes(staging or final_dir)
    if not cached_before and free is not None and total - have0 > free - DISK_MARGIN:
        child.send("stop")
        raise HubDownloadError(
            f"{fn} from {repo} is {_human(total)} and the disk holding {staging or final_dir} has {_human(free)} "
            "free: nothing was written.", path=os.path.join(final_dir, sources.local_name(repo, fn)),
            expected=f"{_human(total - have0 + DISK_MARGIN)} free", found=f"{_human(free)} free",
            fix="Free disk space, or set the node's download_to / extra_model_paths.yaml to a larger disk.")
    child.send("go")
    say(f"downloading {fn} from {repo}")
    if not cached_before:
        log.info("[prequant] downloading %s/%s (%s, %.1f MiB)%s", repo, fn, rev, total / 2**20,
                 f", resuming at {have0} bytes" if have0 else "")
    # The child's client writes every 256 KiB it receives (hub_child.CHUNK): the partial file's size is the liveness
    # signal for the stall / speed watch.
    history = [(time.monotonic(), have0)]  # (time, bytes) samples
    last_growth = time.monotonic()
    done = have0
    while True:
        msg = _wait_line(child, POLL_S, check, None)
        on_disk = _size(partial)
        done = on_disk if on_disk is not None else (total if os.path.exists(blob) else done)
        now = time.monotonic()
        got = done
        if got > history[-1][1]:
            last_growth = now
        history.append((now, got))
        while len(history) > 2 and now - history[1][0] > limits.stall_s:
            history.pop(0)
        if progress:
            progress(min(done, total), total)  # every poll: ComfyUI's hook raises here when Cancel was pressed
        if msg is not None:
            ev = msg.get("event")
            if ev == "done":
                if progress:
                    progress(total, total)
                path = msg["path"]
                if staging:
                    path = _move_into(path, fn, repo, rev, final_dir, staging)
                downloaded = not cached_before
                if downloaded:
                    log.info("[prequant] downloaded %s/%s (%d bytes%s)", repo, fn, total,
                             f", resumed from {have0}" if have0 else "")
                return _Outcome("done", fn, fetched=Fetched(path, repo, rev, fn, meta.get("commit"), total, downloaded,
                                                            final_dir, list(tried)))
            if ev == "entry":  # removed between the two requests: the same rule as a 404 on the first
                tried.append((fn, "not in the repo (404 EntryNotFound)"))
                return _Outcome("entry-late", fn, started=True)
            have = _size(partial) or 0
            return _Outcome(msg.get("kind", "other"), fn, msg.get("detail") or "the download process ended",
                            started=True, have=have, gained=have - have0, total=total, partial=partial)
        if total and done > total:
            child.kill()
            _discard(partial)
            return _Outcome("corrupt", fn, f"the server sent more than the {total} bytes it announced", started=True,
                            total=total)
        stalled = now - last_growth
        span = now - history[0][0]
        rate = (got - history[0][1]) / span if span > 0 else 0.0
        if stalled >= limits.stall_s or (span >= limits.stall_s and rate < limits.min_bps and done < total):
            child.kill()
            why = (f"no byte for {stalled:.0f} s" if stalled >= limits.stall_s else
                   f"{rate:.0f} bytes/s over the last {span:.0f} s, below the {limits.min_bps:.0f} bytes/s floor")
            raise HubDownloadError(
                f"The download of {fn} from {_where(repo, rev)} stopped at byte {done} of {total}: {why}.",
                reasons=_reasons(tried + [(fn, f"stopped at byte {done} of {total}")]),
                fix=f"Queue the prompt again to resume from byte {done} (the bytes received are kept), or try later. "
                    "PREQUANT_HUB_STALL_S / PREQUANT_HUB_MIN_BPS set these limits.")


DISK_MARGIN = 64 * 2**20
CHILD_START_S = 120.0  # importing the client in a fresh process (a slow disk, a busy machine)


def _human(n: int) -> str:
    from .units import human_bytes
    return human_bytes(max(int(n), 0))


STAGING_DIR = ".prequant-download"  # hidden folder inside the destination: partial downloads, resumed from there


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


def origin_dir(dest_dir: str, repo: str, revision: str | None = None) -> str:
    """Where a download from ``repo@revision`` is kept in a model folder: ``<dest>/<owner>/<name>`` (default branch)
    or ``<dest>/<owner>/<name>@<revision>``. Keyed by origin, so a file from another repo never stands in for the
    official one of the same name."""
    owner, name = sources.normalize_repo(repo).split("/")
    rev = (revision or "").strip()
    if rev and rev != "main":
        name = f"{name}@{rev.replace('/', '--')}"
    return os.path.join(dest_dir, owner, name)


def _move_into(staged: str, fn: str, repo: str, rev: str, final_dir: str, staging: str) -> str:
    """The client's completed, size-checked file -> ``<origin dir>/<local name>`` (same disk: an atomic rename; the
    list never shows a half-written file)."""
    final = os.path.join(final_dir, sources.local_name(repo, fn))
    try:
        os.makedirs(final_dir, exist_ok=True)
        os.replace(staged, final)
    except OSError as e:
        raise HubDownloadError(f"Could not move the downloaded {fn} to {final} ({type(e).__name__}: {e}).",
                               path=final, fix="Check permissions and free space in the folder.") from e
    shutil.rmtree(staging, ignore_errors=True)  # the client's metadata for the file just moved out
    try:
        os.rmdir(os.path.dirname(staging))  # and the staging folder itself once no other download is in it
    except OSError:
        pass
    log.info("[prequant] stored %s/%s as %s", repo, fn, final)
    return final


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


def locate(plan: sources.Candidates | Iterable[sources.Candidate], *, model_dirs: Iterable[str] = (),
           token: str | None = None, progress: ProgressFn | None = None,
           env: Mapping[str, str] | None = None, dest_dir: str | None = None,
           search_dirs: Iterable[str] = (), status: StatusFn | None = None,
           check: Callable[[], None] | None = None) -> Located:
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
        return is_cached(c) or bool(dest_dir and local_file(c.repo, c.filenames, [dest_dir, *search_dirs],
                                                            c.revision)) \
            or mirror_file(c.repo, c.filenames) is not None

    u = sources.usable(hub_cands, model_dirs=model_dirs, offline=is_offline(env), is_cached=available, env=env)
    chosen = u.usable[0] if u.usable else hub_cands[0]
    for c, why in u.rejected:
        if hub_cands.index(c) < hub_cands.index(chosen):
            log.warning("[prequant] skipping %s: %s; using %s", c.describe(), why, chosen.describe())
    f = download(chosen.repo, chosen.filenames, revision=chosen.revision, token=token, progress=progress, check=check,
                 dest_dir=dest_dir, search_dirs=search_dirs, status=status)
    return Located(f.path, chosen, model_dirs + [f.storage_folder], f)
