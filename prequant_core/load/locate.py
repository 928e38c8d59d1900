"""Which file a load opens: a plan's candidates (``sources.plan``) turned into one file, a local path as given or a
Hub file found on disk, in the cache or downloaded (``hub.fetch.download``). The load pipeline's second step
(``pipeline.run``); a local file never reaches the Hub package."""
from __future__ import annotations

import dataclasses
import logging
from typing import Iterable, Mapping

from . import sources
from ..request import Candidate, Candidates
from ..context import LoadContext
from ..errors import CheckpointNotFoundError
from ..hub.cache import is_cached, is_offline
from ..hub.fetch import download
from ..hub.local import local_file, mirror_file
from ..hub.transfer import Fetched

log = logging.getLogger("prequant")


@dataclasses.dataclass
class Located:
    path: str
    candidate: Candidate
    extra_dirs: tuple[str, ...] = ()  # the folder a Hub file was stored in: allowed for this file only
    fetched: Fetched | None = None


def locate(plan: Candidates | Iterable[Candidate], ctx: LoadContext = LoadContext(), *,
           env: Mapping[str, str] | None = None) -> Located:
    """The file to open for a plan.

    A local candidate (typed path or listed file) comes first in a plan and is always used as given: a refused or
    missing file is reported by ``open_checkpoint``, never replaced by a silent download. Among Hub candidates the
    first usable one is taken (``sources.usable``: cached, or we are online), else the first, so that its own error
    explains what is wrong. Only a Hub file gets its repo's cache folder as an extra allowed folder.
    ``ctx.download_dir``: download into this folder instead of the HF cache (see ``download``); a file stored there or
    in ``ctx.search_dirs`` before counts as available offline.
    """
    cands = list(plan)
    model_dirs, dest_dir, search_dirs = list(ctx.model_dirs), ctx.download_dir, list(ctx.search_dirs)
    if not cands:
        notes = list(getattr(plan, "notes", ()))
        raise CheckpointNotFoundError("No checkpoint chosen.", reasons=notes,
                                      fix="Pick a file in 'checkpoint', fill 'path', type a 'hub_repo' (e.g. "
                                          "unsloth/Z-Image-Turbo-FP8) with a scheme, or pick a preset.")
    if cands[0].place == "local":
        return Located(cands[0].path, cands[0])
    hub_cands = [c for c in cands if c.place == "hub"]

    def available(c):
        return is_cached(c) or bool(dest_dir and local_file(c.repo, c.filenames, [dest_dir, *search_dirs],
                                                            c.revision)) \
            or mirror_file(c.repo, c.filenames, revision=c.revision) is not None

    u = sources.usable(hub_cands, model_dirs=model_dirs, offline=is_offline(env), is_cached=available, env=env)
    chosen = u.usable[0] if u.usable else hub_cands[0]
    for c, why in u.rejected:
        if hub_cands.index(c) < hub_cands.index(chosen):
            log.warning("[prequant] skipping %s: %s; using %s", c.describe(), why, chosen.describe())
    f = download(chosen.repo, chosen.filenames, ctx, revision=chosen.revision)
    return Located(f.path, chosen, (f.storage_folder,), f)
