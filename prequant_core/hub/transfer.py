"""One transfer: the real ``huggingface_hub`` client in a child process (``child``), watched from here: every
wait bounded (``Limits``), cancellable, resumable from its partial file, never half-written into place."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import stat
import sys
import time
from typing import Mapping

from ..families.hub_names import local_name
from ..context import LoadContext
from .cache import storage_folder
from .errors import HubDownloadError, HubUnavailableError, reasons_of, where
from .local import local_file, origin_dir, staging_dir

log = logging.getLogger("prequant")

POLL_S = 0.2


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


def file_size(p) -> int | None:
    if callable(p):  # a download into a model folder: the client's partial file is found when asked
        p = p()
    if not p:
        return None
    try:
        return os.path.getsize(p)
    except OSError:
        return None


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
class Job:
    """One download: what is asked and where it goes, shared by the watch and the transfer; ``tried`` grows with
    the names the Hub says it does not hold; ``client``: the child's huggingface_hub version, once it said."""
    repo: str
    revision: str
    cache: str
    endpoint: str
    limits: Limits
    tried: list
    client: str = ""


@dataclasses.dataclass
class _Slot:
    """Where this process keeps the file while the child writes it (a models-folder download), and its lock."""
    staging: str | None = None
    lock: "_StagingLock | None" = None


@dataclasses.dataclass
class _Outcome:
    result: str  # done | exhausted | entry-late | a failure of errors.classify (network, auth, ...)
    name: str | None = None
    detail: str = ""
    fetched: Fetched | None = None
    started: bool = False  # the body transfer had begun
    have: int = 0  # bytes of the partial file at the end
    gained: int = 0  # bytes received by this attempt
    total: int = 0
    partial: object = None  # the partial file (path or finder), for clean-up


def _child_env() -> dict:
    import prequant_core  # the folder holding the package goes on the child's path, wherever this module sits in it
    root = os.path.dirname(os.path.dirname(os.path.abspath(prequant_core.__file__)))
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
        self.p = subprocess.Popen([sys.executable, "-m", "prequant_core.hub.child"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_child_env(), text=True,
                                  bufsize=1)
        self.p.stdin.write(json.dumps(request) + "\n")
        self.p.stdin.flush()
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, name="prequant-hub-child", daemon=True).start()

    def _read(self) -> None:
        for text in self.p.stdout:
            try:
                self.q.put(json.loads(text))
            except ValueError:
                self.q.put({"event": "error", "failure": "other", "detail": text.strip()[:200]})
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


def fetch_in_child(job: Job, names, ctx: LoadContext) -> _Outcome:
    """Ask the child for the first of ``names`` that exists and download it, watching every wait."""
    from huggingface_hub import constants
    repo, rev, dest_dir, limits, tried = job.repo, job.revision, ctx.download_dir, job.limits, job.tried
    staging = {fn: staging_dir(dest_dir, repo, rev, fn) for fn in names} if dest_dir else {}
    req = {"repo": repo, "names": list(names), "revision": rev, "cache_dir": job.cache, "endpoint": job.endpoint,
           "local_dirs": staging, "etag_timeout": float(constants.HF_HUB_ETAG_TIMEOUT), "token": ctx.token}
    child = _Child(req)
    slot = _Slot()
    try:
        ready = _wait_line(child, CHILD_START_S, ctx)
        if not ready or ready.get("event") != "ready":
            raise HubDownloadError("The download helper process did not start.", found=str(ready)[:200],
                                   fix="Check that ComfyUI's Python environment has huggingface_hub installed.")
        job.client = str(ready.get("client") or "")  # the child's huggingface_hub version: may not be this process's
        pending = list(names)
        ctx.say(f"connecting to {job.endpoint} for {repo}/{pending[0]}")
        while True:
            msg = _wait_line(child, limits.answer_s, ctx)
            if msg is None:
                raise HubUnavailableError(
                    f"{where(repo, rev)} gave no answer about {pending[0]} within {limits.answer_s:.0f} s.",
                    reasons=reasons_of(tried), fix="Check the network and HF_ENDPOINT, or try later "
                    "(PREQUANT_HUB_ANSWER_S sets this limit). To use files already downloaded, set HF_HUB_OFFLINE=1.")
            ev = msg.get("event")
            if ev == "entry":
                tried.append((msg["name"], msg.get("detail") or "not in the repo (404 EntryNotFound)"))
                pending = pending[pending.index(msg["name"]) + 1:] if msg["name"] in pending else pending[1:]
                if pending:
                    ctx.say(f"connecting to {job.endpoint} for {repo}/{pending[0]}")
                continue
            if ev == "exhausted":
                return _Outcome("exhausted")
            if ev in ("error", "gone"):
                return _Outcome(msg.get("failure", "other"), msg.get("name") or pending[0],
                                msg.get("detail") or f"the download process ended ({msg.get('code')})")
            if ev == "meta":
                fn = msg["name"]
                if fn in staging:
                    # before the lock (its file lies beside the staging folder) and before any partial is looked at
                    remove_staging_links(dest_dir, staging[fn])
                    # another process downloading this very file: wait for it, then take its result
                    slot.lock = _StagingLock(staging[fn])
                    slot.lock.acquire(ctx.poll, lambda: ctx.say(f"waiting for another download of {fn} to finish"))
                    hit = local_file(repo, [fn], [dest_dir], rev)
                    if hit:
                        child.send("stop")
                        slot.lock.release(remove=True)
                        _prune(staging[fn])
                        log.info("[prequant] %s/%s was downloaded by another process meanwhile: using %s",
                                 repo, fn, hit[1])
                        size = file_size(hit[1]) or 0
                        ctx.show(size, size)
                        return _Outcome("done", fn, fetched=Fetched(hit[1], repo, rev, fn, msg.get("commit"), size,
                                                                    False, os.path.dirname(hit[1]), list(tried)))
                slot.staging = staging.get(fn)
                return _transfer(child, msg, job, ctx, slot)
    finally:
        child.kill()
        if slot.lock is not None:
            slot.lock.release()


class _StagingLock:
    """One download of a file at a time across processes (an advisory lock next to its staging folder, polled so
    that Cancel is honoured while waiting). Where the platform has no ``fcntl`` it is a no-op: the client's own
    lock inside the staging folder still keeps two writers apart."""

    def __init__(self, staging: str):
        self.path = staging + ".lock"
        self.fd = None

    def acquire(self, check, waiting) -> None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            return
        told = False
        while True:
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                # O_NOFOLLOW: a link put there since remove_staging_links is refused, never opened (or created)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
            except FileNotFoundError:  # another process's finished download pruned the folder in between
                continue
            except OSError as e:
                if os.path.islink(self.path):
                    raise _link_error(self.path, "lock file") from e
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                if not told:
                    waiting()
                    told = True
                if check:
                    check()
                time.sleep(POLL_S)
                continue
            if os.path.exists(self.path) and os.path.samestat(os.fstat(fd), os.stat(self.path)):
                self.fd = fd  # locked the file that is still there (not one a finished download just removed)
                return
            os.close(fd)

    def release(self, remove: bool = False) -> None:
        if self.fd is None:
            return
        if remove:
            try:
                os.remove(self.path)
            except OSError:
                pass
        os.close(self.fd)
        self.fd = None


def _wait_line(child, timeout, ctx: LoadContext):
    """A message within ``timeout`` s; Cancel (``ctx.poll``) is honoured every poll."""
    end = time.monotonic() + timeout
    while True:
        ctx.poll()
        msg = child.line(min(POLL_S, max(end - time.monotonic(), 0)))
        if msg is not None or time.monotonic() >= end:
            return msg


def _transfer(child, meta, job: Job, ctx: LoadContext, slot: _Slot) -> _Outcome:
    fn, total, etag = meta["name"], int(meta.get("size") or 0), (meta.get("etag") or "")
    repo, rev, staging, dest_dir, limits, tried = job.repo, job.revision, slot.staging, ctx.download_dir, job.limits, \
        job.tried
    client, lock = job.client, slot.lock
    resumes = client_resumes(client)
    if staging:
        final_dir = origin_dir(dest_dir, repo, rev)
        outside = _outside(final_dir, dest_dir)
        if outside:
            child.send("stop")
            raise HubDownloadError(
                f"{fn} from {repo} would be stored in {final_dir}, which resolves outside the download folder "
                f"{dest_dir}: nothing was written.", path=final_dir, expected=f"a folder inside {outside[1]}",
                found=f"a path that resolves to {outside[0]}",
                fix=f"Remove the link on that path (the pack makes real folders there), or set the node's download_to "
                    "/ extra_model_paths.yaml to the folder it points to.")
        partial = _Partials(staging, etag, own=True)
        blob = os.path.join(staging, *fn.split("/"))
    else:
        folder = storage_folder(repo, job.cache)
        blob = os.path.join(folder, "blobs", etag)
        partial = _Partials(os.path.join(folder, "blobs"), etag, own=False)
        final_dir = folder
    have0 = file_size(partial) or 0
    cached_before = os.path.exists(blob)
    free = _free_bytes(staging or final_dir)
    if not cached_before and free is not None and total - have0 > free - DISK_MARGIN:
        child.send("stop")
        raise HubDownloadError(
            f"{fn} from {repo} is {human_size(total)} and the disk holding {staging or final_dir} has {human_size(free)} "
            "free: nothing was written.", path=os.path.join(final_dir, local_name(repo, fn)),
            expected=f"{human_size(total - have0 + DISK_MARGIN)} free", found=f"{human_size(free)} free",
            fix="Free disk space, or set the node's download_to / extra_model_paths.yaml to a larger disk.")
    child.send("go")
    ctx.say(f"downloading {fn} from {repo}")
    if not cached_before:
        log.info("[prequant] downloading %s/%s (%s, %.1f MiB)%s", repo, fn, rev, total / 2**20,
                 _earlier_note(have0, client, resumes) if have0 else "")
    # The child's client writes every 256 KiB it receives (child.CHUNK): the partial file's size is the liveness
    # signal for the stall / speed watch.
    history = [(time.monotonic(), have0)]  # (time, bytes) samples
    last_growth = time.monotonic()
    done = have0
    while True:
        msg = _wait_line(child, POLL_S, ctx)
        on_disk = file_size(partial)
        now = time.monotonic()
        if partial.started_over():  # the client wrote a new file from byte 0: the earlier bytes are not reused
            log.info("[prequant] %s/%s: %s starts every download from byte 0 (it does not resume partial files); the "
                     "%d bytes an earlier attempt left were removed", repo, fn, _client_name(client), have0)
            partial.drop_earlier()
            have0, done = 0, 0
            history, last_growth = [(now, 0)], now
        done = on_disk if on_disk is not None else (total if os.path.exists(blob) else done)
        got = done
        if got > history[-1][1]:
            last_growth = now
        history.append((now, got))
        while len(history) > 2 and now - history[1][0] > limits.stall_s:
            history.pop(0)
        ctx.show(min(done, total), total)  # every poll: ComfyUI's hook raises here when Cancel was pressed
        if msg is not None:
            ev = msg.get("event")
            if ev == "done":
                ctx.show(total, total)
                path = msg["path"]
                if staging:
                    check_stored(path, dest_dir)  # a link made while the client ran is never moved into place
                    path = _move_into(path, fn, repo, rev, final_dir, staging)
                    check_stored(path, dest_dir)
                    if lock is not None:
                        lock.release(remove=True)  # the file is in place: a waiter finds it there
                    _prune(staging)
                downloaded = not cached_before
                if downloaded:
                    # a resume only where it happened: the client resumes and wrote no new file
                    resumed = have0 and resumes is not False and not partial.restarts
                    log.info("[prequant] downloaded %s/%s (%d bytes%s)", repo, fn, total,
                             f", resumed from {have0}" if resumed else "")
                return _Outcome("done", fn, fetched=Fetched(path, repo, rev, fn, meta.get("commit"), total, downloaded,
                                                            final_dir, list(tried)))
            if ev == "entry":  # removed between the two requests: the same rule as a 404 on the first
                tried.append((fn, "not in the repo (404 EntryNotFound)"))
                return _Outcome("entry-late", fn, started=True)
            have = file_size(partial) or 0
            if partial.restarts:  # a client that never resumes: its partial is of no use to the next attempt
                partial.discard_own()
                have = 0
            return _Outcome(msg.get("failure", "other"), fn, msg.get("detail") or "the download process ended",
                            started=True, have=have, gained=have - have0, total=total, partial=partial)
        if total and done > total:
            child.kill()
            discard_partial(partial)
            return _Outcome("corrupt", fn, f"the server sent more than the {total} bytes it announced", started=True,
                            total=total)
        stalled = now - last_growth
        span = now - history[0][0]
        rate = (got - history[0][1]) / span if span > 0 else 0.0
        if stalled >= limits.stall_s or (span >= limits.stall_s and rate < limits.min_bps and done < total):
            child.kill()
            why = (f"no byte for {stalled:.0f} s" if stalled >= limits.stall_s else
                   f"{rate:.0f} bytes/s over the last {span:.0f} s, below the {limits.min_bps:.0f} bytes/s floor")
            if partial.restarts:
                partial.discard_own()
                again = ("Queue the prompt again (this huggingface_hub version starts a download from byte 0 each "
                         "time: the bytes received are not kept), or try later. ")
            else:
                again = f"Queue the prompt again to resume from byte {done} (the bytes received are kept), or try later. "
            raise HubDownloadError(
                f"The download of {fn} from {where(repo, rev)} stopped at byte {done} of {total}: {why}.",
                reasons=reasons_of(tried + [(fn, f"stopped at byte {done} of {total}")]),
                fix=again + "PREQUANT_HUB_STALL_S / PREQUANT_HUB_MIN_BPS set these limits.")


DISK_MARGIN = 64 * 2**20


def client_resumes(version: str) -> bool | None:
    """Whether this huggingface_hub resumes a partial file: < 1.0 appends to ``<etag>.incomplete`` with a Range
    request; 1.0 and later write a fresh ``<etag>.<id>.incomplete`` from byte 0 on every attempt. None: unknown."""
    try:
        return int(version.split(".")[0]) < 1
    except ValueError:
        return None


def _client_name(version: str) -> str:
    return f"huggingface_hub {version}" if version else "this huggingface_hub"


def _earlier_note(have0: int, version: str, resumes: bool | None) -> str:
    """What happens to an earlier attempt's bytes, said once and as the client really does it (issue 58: the log
    said "resumed" and then "starts every download from byte 0" for the same 2.x download)."""
    if resumes:
        return f"; an earlier attempt left {have0} bytes: {_client_name(version)} continues from there"
    if resumes is False:
        return (f"; an earlier attempt left {have0} bytes, not reused: {_client_name(version)} starts every download "
                "from byte 0")
    return f"; an earlier attempt left {have0} bytes, reused if {_client_name(version)} continues partial files"


CHILD_START_S = 120.0  # importing the client in a fresh process (a slow disk, a busy machine)


def human_size(n: int) -> str:
    from ..units import human_bytes
    return human_bytes(max(int(n), 0))


class _Partials:
    """The client's partial file for this one download, found when asked (``file_size`` / ``discard_partial`` call
    it). The client names it after the file's etag: huggingface_hub < 1.0 appends to one ``...<etag>.incomplete`` and
    resumes it with a Range request; newer clients write a fresh ``...<etag>.<id>.incomplete`` on every attempt and
    never resume, so an earlier attempt's file is of no use (and, followed, looks like a stalled transfer). A partial
    of another etag is an older version of the file and is never resumed either. ``own``: the folder is this file's
    own staging folder (the pack's, locked), so stale partials in it are removed; in the shared HF cache they are
    left to the client."""

    def __init__(self, folder: str, etag: str, *, own: bool):
        self.folder, self.etag, self.own = folder, etag, own
        self.fresh: str | None = None  # the file this attempt's client writes, once it is a new one
        self.restarts = False  # the client wrote a new file: it does not resume
        self._told = False
        mine = [p for p in self._all() if self._of_etag(p)]
        if own:
            for p in self._all():
                if not self._of_etag(p):
                    discard_partial(p)  # another version's bytes: never resumable
        self.earlier = {p: file_size(p) or 0 for p in mine}

    def _all(self) -> list[str]:
        out = []
        if os.path.islink(self.folder):  # never walked (nor anything in it deleted) through a link
            return out
        for root, _, names in os.walk(self.folder):  # followlinks=False: a linked subfolder is never entered
            out += [os.path.join(root, n) for n in names if n.endswith(".incomplete")]
            if not self.own:
                break  # the HF cache's blobs folder: its own files only
        return out

    def _of_etag(self, p: str) -> bool:
        return not self.etag or self.etag in os.path.basename(p).split(".")  # no etag announced: any is this one's

    def __call__(self) -> str | None:
        new = [p for p in self._all() if self._of_etag(p) and p not in self.earlier]
        if new:
            self.fresh = max(new, key=lambda p: os.stat(p).st_mtime if os.path.exists(p) else 0)
            # huggingface_hub >= 1: '<...>.<etag>.<attempt id>.incomplete'; older: '<...>.<etag>.incomplete'
            self.restarts = self.restarts or bool(self.etag) and os.path.basename(self.fresh).split(".")[-2] != self.etag
            return self.fresh
        alive = [p for p in self.earlier if os.path.exists(p)]
        return max(alive, key=lambda p: file_size(p) or 0) if alive else None

    def started_over(self) -> bool:
        """True once, when this attempt's client began a new file although an earlier attempt's is here."""
        if self._told or self.fresh is None or not any(os.path.exists(p) for p in self.earlier):
            return False
        self._told = True
        return True

    def drop_earlier(self) -> None:
        if self.own:
            for p in self.earlier:
                discard_partial(p)
        self.earlier = {}

    def discard_own(self) -> None:
        """This attempt's partial, where the client will never resume it (its killed process left it)."""
        if self.fresh:
            discard_partial(self.fresh)


def _move_into(staged: str, fn: str, repo: str, rev: str, final_dir: str, staging: str) -> str:
    """The client's completed, size-checked file -> ``<origin dir>/<local name>`` (same disk: an atomic rename; the
    list never shows a half-written file)."""
    final = os.path.join(final_dir, local_name(repo, fn))
    try:
        os.makedirs(final_dir, exist_ok=True)
        os.replace(staged, final)
    except OSError as e:
        raise HubDownloadError(f"Could not move the downloaded {fn} to {final} ({type(e).__name__}: {e}).",
                               path=final, fix="Check permissions and free space in the folder.") from e
    shutil.rmtree(staging, ignore_errors=True)  # this file's staging folder: the client's metadata for it
    log.info("[prequant] stored %s/%s as %s", repo, fn, final)
    return final


def _link_error(path: str, what: str) -> HubDownloadError:
    return HubDownloadError(
        f"The download's {what} {path} is a symbolic link the pack could not remove: a download never writes, reads "
        "or deletes through a link.", path=path, expected="no link in the pack's staging folders",
        found=f"a link to {_readlink(path)}",
        fix="Remove the link (the pack never makes one there) and queue the prompt again.")


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def remove_staging_links(dest_dir: str, staging: str) -> list[str]:
    """Every symbolic link on the way from ``dest_dir`` to this file's staging folder, beside it (its lock file)
    and inside it, removed itself, never followed (lstat): the staging folders are the pack's own, it never makes a
    link there, and one placed there by anyone with write access to the models folder would make the watcher delete
    partials of the folder it points to, or the client append to or hand back a file outside the models folder
    (issue 58). ``dest_dir`` itself is the user's (a models folder on another disk is often a link) and is kept.
    Returns the links removed (each logged)."""
    removed = []

    def drop(p: str, what: str) -> None:
        target = _readlink(p)
        try:
            os.unlink(p)
        except FileNotFoundError:
            return
        except OSError as e:
            raise _link_error(p, what) from e
        removed.append(p)
        log.warning("[prequant] removed the symbolic link %s (-> %s) in the download staging folder: the pack never "
                    "makes one there, and a download never goes through one", p, target)

    path = dest_dir
    for part in os.path.relpath(staging, dest_dir).split(os.sep):
        path = os.path.join(path, part)
        if os.path.islink(path):
            drop(path, "staging folder")
    if os.path.islink(staging + ".lock"):
        drop(staging + ".lock", "lock file")
    for root, dirs, files in os.walk(staging):  # followlinks=False: a linked folder is listed, never entered
        for n in dirs + files:
            p = os.path.join(root, n)
            if os.path.islink(p):
                drop(p, "staging entry")
    return removed


def _outside(path: str, folder: str) -> tuple[str, str] | None:
    """(real path, real folder) when ``path``, its links resolved, lies outside ``folder``; else None."""
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return None if os.path.commonpath([real, root]) == root else (real, root)


def check_stored(path: str, folder: str) -> None:
    """A downloaded model is a regular file (lstat: a link is not one) whose real path lies inside ``folder``; else
    ``HubDownloadError`` naming it, and a link is removed itself (its target untouched), so it is never loaded."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as e:
        raise HubDownloadError(f"The downloaded file {path} is gone ({type(e).__name__}).", path=path,
                               fix="Queue the prompt again.") from None
    if stat.S_ISLNK(mode):
        target = _readlink(path)
        try:
            os.unlink(path)
        except OSError:
            pass
        raise HubDownloadError(
            f"The downloaded file {path} is a symbolic link, not the file the client wrote: it is not stored or "
            "loaded (the link was removed, its target untouched).", path=path,
            expected=f"a regular file inside {folder}", found=f"a symbolic link to {target}",
            fix="Look for whatever makes links in the models folder, then queue the prompt again.")
    outside = _outside(path, folder)
    if not stat.S_ISREG(mode) or outside:
        raise HubDownloadError(
            f"The downloaded file {path} is not a regular file inside {folder}: it is not loaded.", path=path,
            expected=f"a regular file inside {os.path.realpath(folder)}",
            found=f"a file at {outside[0]}, outside that folder" if outside else "not a regular file",
            fix="Remove the links on that path (the pack makes real folders there) and queue the prompt again.")


def _prune(staging: str) -> None:
    """The repo's and the destination's staging folders go once no other download (or its lock) is in them."""
    for d in (os.path.dirname(staging), os.path.dirname(os.path.dirname(staging))):
        try:
            os.rmdir(d)
        except OSError:
            break


def discard_partial(path) -> None:
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
