"""Download pre-quantized checkpoints from the Hugging Face Hub with the real ``huggingface_hub`` client.

This module fetches one file of a repo (``download``; which candidate's file a load opens is
``load/locate.py``'s); the pieces it uses live beside it: ``cache`` (cache, offline mode,
endpoint), ``local`` (origin folders, the operator mirror), ``transfer`` (the watched child process), ``errors``
(typed errors and their messages), ``child`` (the child itself).

Where files land: with ``dest_dir`` (what the loader node passes by default: the first folder ComfyUI lists for
``prequant``) the file is stored in its origin folder there, ``<dest>/<owner>/<repo>/`` (``<repo>@<revision>`` for a
pinned revision: ``origin_dir``), through the client's local-folder mode and a hidden staging folder per file
(``staging_dir``; a lock beside it makes a second process wait for a file another one is fetching), so it is
resumable and never half-written there; later loads find it there without any request, and a file of the same name
from another repo never stands in for it. Without ``dest_dir``, in the standard Hugging Face cache (``HF_HUB_CACHE``,
default ``~/.cache/huggingface/hub``) exactly as ``hf_hub_download`` puts them there, shared with other tools.

Rules (see ``sources`` for where the names come from):

- An operator mirror (``UNSLOTH_DIFFUSION_PREQUANT_MIRROR``) is searched before any request (for a pinned revision,
  only a copy whose ``unsloth_source`` records that revision counts).
- Names are tried in order; the next name is tried ONLY when the Hub says this file is not in the repo
  (``EntryNotFoundError``: HTTP 404 with ``X-Error-Code: EntryNotFound``). Any other answer (5xx, connection refused,
  401/403, unknown revision or repo) stops at once with a typed ``HubError`` naming the repo, the revision, every name
  tried and the fix. The client itself retries 5xx and connection errors with back-off before that.
- Every wait is bounded and can be cancelled: the client runs in a child process (``hub.child``) that this process
  watches (``Limits``: an answer within ``answer_s``, no stall longer than ``stall_s``, no transfer slower than
  ``min_bps``); the context's ``cancel`` (ComfyUI's interrupt) is called every poll. A stopped child is killed at once, its partial
  file kept, and the next run resumes from it with an HTTP Range request.
- A file announced larger than the free space of its disk is refused before a byte is written; a body longer than
  announced is discarded; a body of the wrong size is never renamed into place (the client checks the size).
- Token: the context's ``token``, else the client's default (``HF_TOKEN``, then the stored ``hf auth login``). A token
  is never logged, put into a message or on a command line (it reaches the child through its stdin).
- ``revision`` pins a branch, tag or commit (``names.normalize_revision``: what the Hub accepts, no path tricks);
  a commit hash already in the cache is served without any request.
- Offline (``HF_HUB_OFFLINE=1``): served from the cache only (names the cache records as absent are skipped); if none
  of the names is cached, ``HubOfflineError`` lists them all.
- Status and progress (``LoadContext``): ``status(text)`` gets a short line at each stage, ``progress(done_bytes,
  total_bytes)`` is called every poll from the size of the client's partial file.
- Resume: when the transfer breaks mid-body the client is started again (up to ``resume_attempts`` times, as long as
  bytes keep arriving), which resumes; a run killed or cancelled mid-download resumes the same way next time.
- No partial file is left on refusals (wrong size, oversized); the bytes of a transfer that broke, stalled or was
  cancelled are kept for the resume (the message says so).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Iterable

from ..families.hub_names import normalize_repo, normalize_revision, prefer_cached_twins
from ..context import LoadContext
from ..safe_text import redact
from .cache import (cache_dir, cached_file, client_constants, endpoint, is_offline, shown_endpoint, pinned_commit_hit,
                    storage_folder)
from .errors import HubDownloadError, HubNotFoundError, HubOfflineError, raise_for, reasons_of, where
from .local import local_file, mirror_file
from .transfer import Fetched, Job, Limits, discard_partial, fetch_in_child, file_size

log = logging.getLogger("prequant")


def download(repo: str, filenames: Iterable[str], ctx: LoadContext = LoadContext(), *,
             revision: str | None = None, resume_attempts: int = 3) -> Fetched:
    """Fetch the first of ``filenames`` that exists in ``repo``; return where it is.

    ``ctx.download_dir`` None: into the HF cache. A folder (ComfyUI's models/prequant): the file is stored in its
    origin folder there (``origin_dir``: ``<dest>/<owner>/<repo>[@<revision>]/``); a file already in the origin folder
    of the download folder or of ``ctx.search_dirs`` is used as it is, without any request. ``ctx.cancel`` is called
    every poll while waiting and may raise (ComfyUI's interrupt); the transfer then stops at once, its bytes kept."""
    constants = client_constants()
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo = normalize_repo(repo)
    filenames = list(filenames)
    rev = normalize_revision(revision) or constants.DEFAULT_REVISION
    token = (ctx.token or "").strip() or None  # None: the client's default (HF_TOKEN, then the stored login)
    ctx = dataclasses.replace(ctx, token=token)
    dest_dir, progress = ctx.download_dir, ctx.show
    cache, ep = cache_dir(), endpoint()
    folder = storage_folder(repo, cache)
    tried: list[tuple[str, str]] = []

    if dest_dir:
        hit = local_file(repo, filenames, [dest_dir, *ctx.search_dirs], rev)
        if hit:
            fn, p = hit
            log.info("[prequant] using %s (%s/%s, already downloaded)", p, repo, fn)
            progress(file_size(p) or 0, file_size(p) or 0)
            return Fetched(p, repo, rev, fn, None, file_size(p) or 0, False, os.path.dirname(p), tried)

    hit = mirror_file(repo, filenames, revision=rev)
    if hit:
        fn, p, root = hit
        log.info("[prequant] using %s (%s/%s from the operator mirror %s)", p, repo, fn, root)
        progress(file_size(p) or 0, file_size(p) or 0)
        return Fetched(p, repo, rev, fn, None, file_size(p) or 0, False, os.path.dirname(p), tried)

    if is_offline():
        for fn in filenames:
            try:
                p = hf_hub_download(repo, fn, revision=rev, cache_dir=cache, local_files_only=True)
            except LocalEntryNotFoundError:
                tried.append((fn, "not in the local cache"))
                continue
            log.info("[prequant] offline: using cached %s/%s (%s)", repo, fn, rev)
            progress(file_size(p) or 0, file_size(p) or 0)
            return Fetched(p, repo, rev, fn, None, file_size(p) or 0, False, folder, tried)
        raise HubOfflineError(f"Offline mode (HF_HUB_OFFLINE) is on and {repo} (revision {rev}) has none of these "
                              f"files in the local Hugging Face cache ({cache}).", reasons=reasons_of(tried),
                              fix="Run once with network access (unset HF_HUB_OFFLINE) so the file is downloaded, "
                                  "or put the file into ComfyUI/models/prequant/.")

    hit = None if dest_dir else pinned_commit_hit(repo, filenames, rev, cache)
    if hit:
        fn, p, skipped = hit
        log.info("[prequant] using cached %s/%s at pinned commit %s", repo, fn, rev)
        progress(file_size(p) or 0, file_size(p) or 0)
        return Fetched(p, repo, rev, fn, rev, file_size(p) or 0, False, folder, skipped)

    job = Job(repo, rev, cache, ep, Limits.from_env(), tried)
    names = prefer_cached_twins(list(filenames), lambda n: cached_file(repo, [n], rev, cache) is not None)
    attempt = 0
    while names:
        out = fetch_in_child(job, names, ctx)
        if out.result == "done":
            return out.fetched
        if out.result == "exhausted":
            break
        if out.result == "entry-late":
            names = names[names.index(out.name) + 1:]
            continue
        fn = out.name
        if out.result in ("network", "http", "metadata", "offline") and not out.started:
            # The client's own rule: when the Hub cannot answer, a copy of this very file already in the cache for
            # this revision is served. Never another name.
            hit = cached_file(repo, [fn], rev, cache)
            if hit:
                log.warning("[prequant] %s unreachable (%s); using the cached %s", redact(ep), redact(out.detail), fn)
                progress(file_size(hit[1]) or 0, file_size(hit[1]) or 0)
                return Fetched(hit[1], repo, rev, fn, None, file_size(hit[1]) or 0, False, folder, tried)
        if out.result == "network" and out.gained > 0 and attempt < resume_attempts:
            attempt += 1
            log.warning("[prequant] download of %s interrupted at %d bytes (%s); resuming (%d/%d)", fn, out.have,
                        out.detail, attempt, resume_attempts)
            names = names[names.index(fn):]
            continue
        if out.result == "network" and out.have > 0:
            raise HubDownloadError(
                f"Downloading {fn} from {where(repo, rev)} was interrupted ({out.detail}).",
                reasons=reasons_of(tried + [(fn, f"interrupted at {out.have} of {out.total} bytes")]),
                fix=f"Queue the prompt again: the {out.have} bytes received are kept and the download resumes from "
                    "there.")
        discard_partial(out.partial)
        raise_for((out.result, out.detail), None, repo=repo, revision=rev, fn=fn, tried=tried)

    raise HubNotFoundError(f"None of the expected file names is in {where(repo, rev)}.", reasons=reasons_of(tried),
                           fix=f"Check which files the repo holds ({shown_endpoint()}/{repo}/tree/{rev}); pick the other "
                               "scheme, give the right repo or revision, or download the file by hand into "
                               "ComfyUI/models/prequant/.")
