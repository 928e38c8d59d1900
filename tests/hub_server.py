"""A loopback HTTP server that speaks enough of the Hugging Face Hub's file protocol for the real
``huggingface_hub`` client (0.36) to download from it unchanged, pointed at it with ``HF_ENDPOINT``.

What the client does (``huggingface_hub/file_download.py``) and what we answer:

- ``HEAD /<repo>/resolve/<revision>/<filename>`` (no redirects followed except relative ones): we answer with
  ``X-Repo-Commit`` (40 hex), ``ETag`` (git blob sha1) and ``Content-Length``; for an LFS-like file a ``302`` whose
  absolute ``Location`` points at ``http://localhost:<port>/cdn/<sha256>/<filename>`` (another host name, as the CDN is) plus ``X-Linked-Etag`` (the sha256, which names the
  cache blob) and ``X-Linked-Size``, like the real Hub's CDN redirect.
- ``GET`` of the resolve URL or of the CDN URL: the bytes, with ``Range: bytes=N-`` answered ``206`` +
  ``Content-Range`` (the client resumes ``.incomplete`` files that way).
- Errors the client maps to typed exceptions via ``X-Error-Code``: ``404 EntryNotFound`` (with ``X-Repo-Commit``, so
  the client records the absence in ``.no_exist``), ``404 RevisionNotFound``, ``401 RepoNotFound``, ``401 GatedRepo``
  and ``401`` ``X-Error-Message: Invalid credentials in Authorization header`` for a wrong token.
- ``GET /api/models/<repo>[/revision/<rev>]``: a minimal model-info JSON (``hf_hub_download`` itself never calls it;
  it is here for clients that list files first).

Faults for tests: a fixed status for one file, a connection dropped after N body bytes (once), a body shorter than
announced, and slow bodies. Every request is logged (method, route, file, Range start, auth, status, bytes sent).
"""
from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import os
import socket
import threading
import time
import urllib.parse

_hash_cache: dict = {}


def _hashes(path: str) -> tuple[str, str, int]:
    """(sha256, git blob sha1, size) of a file, cached by (path, mtime, size)."""
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _hash_cache:
        s256, s1 = hashlib.sha256(), hashlib.sha1(f"blob {st.st_size}\0".encode())
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                s256.update(chunk)
                s1.update(chunk)
        _hash_cache[key] = (s256.hexdigest(), s1.hexdigest(), st.st_size)
    return _hash_cache[key]


@dataclasses.dataclass
class Entry:
    path: str
    lfs: bool
    sha256: str
    gitsha: str
    size: int


@dataclasses.dataclass
class Fault:
    repo: str
    filename: str
    status: int | None = None  # answer this status instead
    method: str | None = None  # only for this method (HEAD / GET); None: both
    drop_after: int | None = None  # GET body: close the connection after this many bytes
    short_by: int = 0  # GET body: announce and send this many bytes fewer than the file has
    times: int | None = None  # how many requests the fault applies to; None: all
    where: str = "any"  # "resolve" | "cdn" | "any"
    stall_after: int | None = None  # GET body: send this many bytes, then hold the connection open, silent
    drip: float | None = None  # GET body: one byte every this many seconds
    declare_size: int | None = None  # HEAD / redirect: announce this size instead of the file's
    extra: int = 0  # GET body: send (and announce) this many bytes more than the file has
    hang: bool = False  # never answer at all (hold the connection open)
    redirect_to: str | None = None  # answer 302 to this address instead
    after: int = 0  # let this many matching requests through first (a file removed between two requests)
    code: str | None = None  # with ``status``: the Hub's X-Error-Code (EntryNotFound ...)

    def applies(self, method: str, repo: str, filename: str, where: str) -> bool:
        return (self.repo == repo and self.filename == filename and (self.method in (None, method))
                and self.where in ("any", where) and (self.times is None or self.times > 0))


class HubServer:
    def __init__(self, *, chunk: int = 256 * 1024):
        self.repos: dict[str, dict] = {}  # repo -> {"refs": {name: commit}, "commits": {commit: {filename: Entry}}}
        self.tokens: dict[str, str] = {}
        self.faults: list[Fault] = []
        self.slow: dict[tuple[str, str], float] = {}  # (repo, filename) -> seconds per chunk
        self.log: list[dict] = []
        self.chunk = chunk
        self.lock = threading.Lock()
        self._httpd = None
        self._thread = None
        self.port = None

    # --- content ------------------------------------------------------------------------------------------------
    def commit(self, repo: str, files: dict[str, str], *, ref: str | None = "main", lfs: bool = True) -> str:
        """Add a commit holding ``files`` ({name: local path}); point ``ref`` at it. Returns the commit hash."""
        entries = {}
        for name, path in files.items():
            s256, s1, size = _hashes(path)
            entries[name] = Entry(path, lfs, s256, s1, size)
        h = hashlib.sha1(json.dumps([repo, sorted((n, e.sha256) for n, e in entries.items()),
                                     len(self.repos.get(repo, {}).get("commits", {}))]).encode()).hexdigest()
        r = self.repos.setdefault(repo, {"refs": {}, "commits": {}})
        r["commits"][h] = entries
        if ref:
            r["refs"][ref] = h
        return h

    def fault(self, repo: str, filename: str, **kw) -> Fault:
        f = Fault(repo, filename, **kw)
        self.faults.append(f)
        return f

    def require_token(self, repo: str, token: str) -> None:
        self.tokens[repo] = token

    def requests(self, method: str | None = None, filename: str | None = None, route: str | None = None) -> list[dict]:
        with self.lock:
            return [r for r in self.log if (method is None or r["method"] == method)
                    and (filename is None or r["filename"] == filename) and (route is None or r["route"] == route)]

    def body_gets(self, filename: str | None = None) -> list[dict]:
        """GETs that carried file bytes (status 200/206)."""
        return [r for r in self.requests("GET", filename) if r["status"] in (200, 206)]

    # --- lifecycle ----------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def cdn_url(self) -> str:
        return f"http://localhost:{self.port}"

    def start(self) -> "HubServer":
        server = self

        class Handler(_Handler):
            hub = server

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(5)
            self._httpd = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # --- lookup -------------------------------------------------------------------------------------------------
    def _resolve(self, repo: str, revision: str):
        """(commit, files) or an error tuple (status, code, message)."""
        r = self.repos.get(repo)
        if r is None:
            return None, (401, "RepoNotFound", "Repository not found")
        commit = r["refs"].get(revision) or (revision if revision in r["commits"] else None)
        if commit is None:
            return None, (404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return (commit, r["commits"][commit]), None

    def _take_fault(self, method, repo, filename, where) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.applies(method, repo, filename, where):
                    if f.after > 0:
                        f.after -= 1
                        continue
                    if f.times is not None:
                        f.times -= 1
                    return f
        return None


def free_port() -> int:
    """A port nothing listens on (for 'connection refused')."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Handler(http.server.BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):  # quiet
        pass

    def do_HEAD(self):
        self._handle("HEAD")

    def do_GET(self):
        self._handle("GET")

    # --- helpers ------------------------------------------------------------------------------------------------
    def _record(self, **kw):
        rng = self.headers.get("Range")
        start = None
        if rng and rng.startswith("bytes="):
            try:
                start = int(rng[6:].split("-", 1)[0])
            except ValueError:
                start = None
        rec = {"method": self.command, "path": self.path, "range_start": start,
               "auth": self.headers.get("Authorization") is not None, "route": None, "repo": None,
               "filename": None, "revision": None, "status": None, "sent": 0, "time": time.time(),
               "agent": self.headers.get("User-Agent") or ""}
        rec.update(kw)
        with self.hub.lock:
            self.hub.log.append(rec)
        return rec

    def _plain(self, rec, status, *, code=None, message=None, headers=None, body=b""):
        rec["status"] = status
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        if message:
            self.send_header("X-Error-Message", message)
        if not body and status >= 400:
            body = json.dumps({"error": message or http.HTTPStatus(status).phrase}).encode()
            self.send_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _auth_error(self, repo):
        want = self.hub.tokens.get(repo)
        if not want:
            return None
        got = self.headers.get("Authorization", "")
        if not got:
            return (401, "GatedRepo", f"Access to model {repo} is restricted. You must have access to it and be "
                                      "authenticated to access it. Please log in.")
        if got != f"Bearer {want}":
            return (401, None, "Invalid credentials in Authorization header")
        return None

    # --- routes -------------------------------------------------------------------------------------------------
    def _handle(self, method):
        parsed = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(p) for p in parsed.path.split("/")[1:]]
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve_route(method, f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
        if len(parts) >= 3 and parts[0] == "cdn":
            return self._cdn_route(method, parts[1], "/".join(parts[2:]))
        if len(parts) >= 4 and parts[0] == "api" and parts[1] == "models":
            rev = parts[5] if len(parts) >= 6 and parts[4] == "revision" else "main"
            return self._api_route(f"{parts[2]}/{parts[3]}", rev)
        rec = self._record(route="unknown")
        self._plain(rec, 404, message="Not Found")

    def _api_route(self, repo, rev):
        rec = self._record(route="api", repo=repo, revision=rev)
        err = self._auth_error(repo)
        found, rerr = self.hub._resolve(repo, rev)
        if err or rerr:
            status, code, msg = err or rerr
            return self._plain(rec, status, code=code, message=msg)
        commit, files = found
        body = json.dumps({"id": repo, "modelId": repo, "sha": commit, "private": False,
                           "gated": bool(self.hub.tokens.get(repo)),
                           "siblings": [{"rfilename": n} for n in sorted(files)]}).encode()
        self._plain(rec, 200, headers={"Content-Type": "application/json"}, body=body)

    def _hold(self, seconds: float = 600.0) -> None:
        """Keep the connection open and say nothing (a stalled server), until the client leaves or the hub stops."""
        end = time.time() + seconds
        while time.time() < end and self.hub._httpd is not None:
            time.sleep(0.1)

    def _resolve_route(self, method, repo, revision, filename):
        rec = self._record(route="resolve", repo=repo, revision=revision, filename=filename)
        f = self.hub._take_fault(method, repo, filename, "resolve")
        if f and f.hang:
            return self._hold()
        if f and f.redirect_to:
            return self._plain(rec, 302, headers={"Location": f.redirect_to})
        if f and f.status:
            return self._plain(rec, f.status, code=f.code, message=f"injected {f.status}")
        err = self._auth_error(repo)
        if err:
            status, code, msg = err
            return self._plain(rec, status, code=code, message=msg)
        found, rerr = self.hub._resolve(repo, revision)
        if rerr:
            status, code, msg = rerr
            return self._plain(rec, status, code=code, message=msg)
        commit, files = found
        entry = files.get(filename)
        if entry is None:
            return self._plain(rec, 404, code="EntryNotFound", message="Entry not found",
                               headers={"X-Repo-Commit": commit})
        base = {"X-Repo-Commit": commit, "ETag": f'"{entry.gitsha}"'}
        if entry.lfs:
            # another host name for the same server, as the real Hub's CDN is another host: newer clients (2.x)
            # read the metadata from the redirect itself and follow only redirects that stay on the Hub
            loc = f"{self.hub.cdn_url}/cdn/{entry.sha256}/{urllib.parse.quote(filename)}"
            size = f.declare_size if f and f.declare_size is not None else entry.size
            return self._plain(rec, 302, headers={**base, "Location": loc, "X-Linked-Etag": f'"{entry.sha256}"',
                                                  "X-Linked-Size": str(size)})
        return self._send_file(rec, method, entry, f, base)

    def _cdn_route(self, method, sha, filename):
        rec = self._record(route="cdn", filename=filename)
        entry = repo = None
        for name, r in self.hub.repos.items():
            for files in r["commits"].values():
                for n, e in files.items():
                    if e.sha256 == sha and (n == filename or entry is None):
                        entry, repo = e, name
        rec["repo"] = repo
        if entry is None:
            return self._plain(rec, 404, message="NoSuchKey")
        f = self.hub._take_fault(method, repo, filename, "cdn")
        if f and f.status:
            return self._plain(rec, f.status, message=f"injected {f.status}")
        self._send_file(rec, method, entry, f, {"ETag": f'"{entry.sha256}"'})

    def _send_file(self, rec, method, entry: Entry, fault: Fault | None, headers: dict):
        extra = fault.extra if fault else 0
        size = entry.size - (fault.short_by if fault else 0) + extra
        start, status = 0, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start = int(a or 0)
            end = int(b) if b else size - 1
            if start >= size:
                return self._plain(rec, 416, message="Requested Range Not Satisfiable",
                                   headers={"Content-Range": f"bytes */{size}"})
            size_to_send = end - start + 1
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end}/{size}"}
        else:
            size_to_send = size
        rec["status"] = status
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(size_to_send))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if method == "HEAD":
            return
        drop = fault.drop_after if fault and fault.drop_after is not None else None
        delay = self.hub.slow.get((rec.get("repo"), rec.get("filename")), 0.0)
        stall = fault.stall_after if fault else None
        drip = fault.drip if fault else None
        sent = 0
        try:
            with open(entry.path, "rb") as fh:
                fh.seek(start)
                while sent < size_to_send:
                    if stall is not None and sent >= stall:
                        self.wfile.flush()
                        rec["sent"] = sent
                        return self._hold()
                    n = min(self.hub.chunk, size_to_send - sent)
                    if drip:
                        n = 1
                    if stall is not None:
                        n = min(n, stall - sent)
                    if drop is not None:
                        n = min(n, drop - sent)
                        if n <= 0:
                            break
                    data = fh.read(n) or (b"\0" * min(n, extra))  # past the file: the oversized tail
                    if not data:
                        break
                    self.wfile.write(data)
                    sent += len(data)
                    rec["sent"] = sent  # as it goes: a client done reading need not wait for the pacing sleep
                    if drip:
                        self.wfile.flush()
                        time.sleep(drip)
                    if delay:
                        self.wfile.flush()
                        time.sleep(delay)
        except (BrokenPipeError, ConnectionResetError):
            pass
        rec["sent"] = sent
        if drop is not None and sent < size_to_send:
            rec["dropped"] = True
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
