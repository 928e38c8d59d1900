#!/usr/bin/env python3
"""The sources of a test ComfyUI, from the nearest place that has them, checked before use.

    comfyui_sources.py VERSION DEST      (VERSION: 0.33.0 or 0.12.1)

leaves the source tree in DEST/<folder> (``comfyui-0.33.0`` / ``src``) and prints where it came from. Tried in order:

1. ``PREQUANT_COMFYUI_MIRROR``: a folder or an http(s) URL holding the source archive (``comfyui-0.33.0-src.tar.gz``,
   directly or in ``comfyui-0.33/``) or a git repository with the upstream tag;
2. an offline mirror folder ``comfyui-0.33/`` in ``PREQUANT_SHARED``, beside the checkout (``../shared``) or beside
   the repository it was cloned from;
3. the upstream repository at the pinned commit, over the network.

An archive is checked by its SHA-256, a git checkout by its commit; anything else is refused. Nothing is unpacked in
DEST until the check passed (a temporary folder beside it, then one rename). What was checked is kept in
``KEEP`` (the archive, or a bare git repository with the tag): the next build reads it there, offline, and the
suite's fresh-clone test serves it as a mirror. Standard library only: this runs before any virtual environment
exists.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request

MIRROR_VAR = "PREQUANT_COMFYUI_MIRROR"
KEEP = os.path.join(".cache", "comfyui-sources")  # under the checkout


@dataclasses.dataclass(frozen=True)
class Pin:
    version: str
    folder: str  # the tree's folder name under DEST (what the archive holds at its top)
    shared: str  # the offline mirror's folder name
    archive: str
    sha256: str  # of the archive
    upstream: str  # git URL
    ref: str  # tag or commit fetched from a git source
    commit: str  # the commit the fetched ref must be (a prefix where only that much is recorded upstream)


PINS = {p.version: p for p in (
    # ComfyUI 0.33.0 (2026-08-22); the archive: its sources without tests and two large tokenizer files
    Pin("0.33.0", "comfyui-0.33.0", "comfyui-0.33", "comfyui-0.33.0-src.tar.gz",
        "9f81937cb0f1512cb52131e1926d9f91b9da3031f441e6c83e3d40987a2ad539",
        "https://github.com/comfyanonymous/ComfyUI.git", "v0.33.0", "783545f6"),
    # ComfyUI 0.12.1 as its pip-installable distribution carries it (February 2026)
    Pin("0.12.1", "src", "comfyui-0.12", "comfyui-0.12.1-src.tar.gz",
        "a6cba80803a372b5223cca1d4b9f00bb5e6689c5c4dbf44cc6c0ed4c3834ceca",
        "https://github.com/hiddenswitch/pip-and-uv-installable-ComfyUI.git",
        "04bdced30ef2b1de064ee20029e7c5e90e7dac93", "04bdced30ef2b1de064ee20029e7c5e90e7dac93"),
)}


class SourceError(Exception):
    """One line for the user: where it looked, what it found, what to do."""


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _is_url(s: str) -> bool:
    return s.startswith(("http://", "https://"))


def _shared_folders(root: str) -> list[str]:
    out = [os.environ.get("PREQUANT_SHARED", ""), os.path.join(root, "..", "shared")]
    try:
        origin = subprocess.run(["git", "-C", root, "config", "--get", "remote.origin.url"], capture_output=True,
                                text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        origin = ""
    if origin and not _is_url(origin) and "://" not in origin:  # a local clone: its repository's own ../shared
        out.append(os.path.join(origin, "..", "shared"))
    return [d for d in out if d]


def _archive_in(folder: str, pin: Pin) -> str | None:
    for p in (os.path.join(folder, pin.shared, pin.archive), os.path.join(folder, pin.archive)):
        if os.path.isfile(p):
            return p
    return None


def _download(url: str, dest: str) -> bool:
    """``url`` into ``dest``; False where the server has no such file (404), SourceError where it cannot be reached."""
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(dest, "wb") as f:  # noqa: S310 - http(s) only
            shutil.copyfileobj(r, f, 1 << 20)
        return True
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return False
        raise SourceError(f"{url}: HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        raise SourceError(f"{url}: {getattr(e, 'reason', e)}") from None


def _unpack(archive: str, pin: Pin, dest: str, tmp: str, keep: str) -> None:
    digest = _sha256(archive)
    if digest != pin.sha256:
        raise SourceError(f"{archive}: SHA-256 {digest[:16]}... is not ComfyUI {pin.version}'s archive "
                          f"({pin.sha256[:16]}...): a damaged or other file; remove it or point {MIRROR_VAR} elsewhere")
    kept = os.path.join(keep, pin.archive)
    if os.path.abspath(archive) != os.path.abspath(kept):
        os.makedirs(keep, exist_ok=True)
        shutil.copyfile(archive, kept + ".part")
        os.replace(kept + ".part", kept)
    out = os.path.join(tmp, "x")
    with tarfile.open(archive) as t:
        t.extractall(out, filter="data")  # the "data" filter refuses links out of the tree and absolute names
    if not os.path.isdir(os.path.join(out, pin.folder)):
        raise SourceError(f"{archive}: holds no '{pin.folder}/' folder")
    os.replace(os.path.join(out, pin.folder), os.path.join(dest, pin.folder))


def _git(*args, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=1800)


def _from_git(url: str, pin: Pin, dest: str, tmp: str, keep: str) -> None:
    repo = os.path.join(tmp, "git")
    _git("init", "-q", "--bare", repo)
    r = _git("fetch", "-q", "--depth", "1", url, pin.ref, cwd=repo)
    if r.returncode:
        raise SourceError(f"{url} ({pin.ref}): {(r.stderr.strip().splitlines() or ['git fetch failed'])[-1]}")
    commit = _git("rev-parse", "FETCH_HEAD^{commit}", cwd=repo).stdout.strip()
    if not commit.startswith(pin.commit):
        raise SourceError(f"{url}: {pin.ref} is commit {commit[:12]}, not ComfyUI {pin.version}'s {pin.commit}")
    # kept as upstream names it (the tag, or the commit itself), served as a plain-HTTP git mirror as it is
    ref = f"refs/tags/{pin.ref}" if pin.ref != commit else "refs/heads/pinned"
    _git("update-ref", ref, commit, cwd=repo)
    _git("update-server-info", cwd=repo)
    out = os.path.join(tmp, "tree")
    os.makedirs(out)
    archive = os.path.join(tmp, "tree.tar")
    r = _git("archive", "--format=tar", f"--prefix={pin.folder}/", "-o", archive, commit, cwd=repo)
    if r.returncode:
        raise SourceError(f"{url}: git archive failed: {r.stderr.strip()[:200]}")
    with tarfile.open(archive) as t:
        t.extractall(out, filter="data")
    os.replace(os.path.join(out, pin.folder), os.path.join(dest, pin.folder))
    kept = os.path.join(keep, f"{pin.shared}.git")
    if os.path.abspath(url) != os.path.abspath(kept):
        shutil.rmtree(kept, ignore_errors=True)
        os.makedirs(keep, exist_ok=True)
        os.replace(repo, kept)


def _from_mirror(mirror: str, pin: Pin, dest: str, tmp: str, keep: str) -> bool:
    """An archive or a git repository at ``mirror`` (a folder or URL); False where it holds neither."""
    if _is_url(mirror):
        base = mirror.rstrip("/")
        for name in (f"{pin.shared}/{pin.archive}", pin.archive):
            local = os.path.join(tmp, pin.archive)
            if _download(f"{base}/{name}", local):
                _unpack(local, pin, dest, tmp, keep)
                return True
        _from_git(mirror, pin, dest, tmp, keep)  # not an archive folder: a git remote, or an error that says why
        return True
    if os.path.isdir(mirror):
        archive = _archive_in(mirror, pin)
        if archive:
            _unpack(archive, pin, dest, tmp, keep)
            return True
        if os.path.isdir(os.path.join(mirror, ".git")) or os.path.isfile(os.path.join(mirror, "HEAD")):
            _from_git(os.path.abspath(mirror), pin, dest, tmp, keep)
            return True
    return False


def fetch(version: str, dest: str, root: str) -> str:
    """The sources of ComfyUI ``version`` in ``dest``; returns where they came from."""
    pin = PINS[version]
    os.makedirs(dest, exist_ok=True)
    target = os.path.join(dest, pin.folder)
    if os.path.isdir(target):
        shutil.rmtree(target)  # a half-unpacked tree of an earlier, killed run
    tried, keep = [], os.path.join(root, KEEP)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".sources-") as tmp:
        mirror = os.environ.get(MIRROR_VAR, "").strip()
        if mirror:
            if _from_mirror(mirror, pin, dest, tmp, keep):
                return mirror
            tried.append(f"{MIRROR_VAR}={mirror} (no {pin.archive} and no git repository there)")
        for folder in [*_shared_folders(root), keep]:
            archive = _archive_in(folder, pin)
            if archive:
                _unpack(archive, pin, dest, tmp, keep)
                return os.path.dirname(os.path.abspath(archive))
        if os.path.isfile(os.path.join(keep, f"{pin.shared}.git", "HEAD")):  # fetched from upstream before
            _from_git(os.path.join(keep, f"{pin.shared}.git"), pin, dest, tmp, keep)
            return os.path.join(keep, f"{pin.shared}.git")
        tried.append(f"{pin.shared}/ in PREQUANT_SHARED, beside the checkout and beside its origin, and {KEEP}")
        try:
            _from_git(pin.upstream, pin, dest, tmp, keep)
            return f"{pin.upstream} at {pin.commit}"
        except SourceError as e:
            tried.append(str(e))
    raise SourceError(
        f"ComfyUI {version}'s sources were found nowhere: looked at " + "; ".join(tried) + ". "
        f"Set {MIRROR_VAR} to a folder or URL holding {pin.archive} (SHA-256 {pin.sha256[:16]}...) or a git "
        f"repository with {pin.ref}, or allow this machine to reach {pin.upstream}.")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in PINS:
        print(f"usage: comfyui_sources.py {{{','.join(PINS)}}} DEST", file=sys.stderr)
        return 2
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        where = fetch(argv[0], argv[1], root)
    except SourceError as e:
        print(f"[setup] {e}", file=sys.stderr)
        return 1
    print(f"[setup] ComfyUI {argv[0]} sources from {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
