"""One load pipeline, top-down, for every client: candidates (``sources.plan``, no I/O) -> the located file
(``hub.locate``: a local path as given, or a Hub file found in the cache or downloaded) -> the route
(``route.choose``: the file opened once and judged by ``opening``, or the dense fallback) -> a building step the
caller supplies. The loader node and the diffusers loader go through ``run`` and differ only in the model they build
from it; Prequant Info and ``python -m prequant_core info | verify`` go through ``opening.inspect`` (the same open
and judge steps on a file already named) and build a report (``report.info``)."""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, Iterable

from . import hub, sources
from ..errors import PrequantError
from .metadata import Request
from .route import DENSE_ONLY, PREQUANT_ONLY, LoadRoute, choose


@dataclasses.dataclass
class Routed:
    route: LoadRoute
    located: hub.Located | None  # None: no pre-quantized file was located (the dense fallback route)
    request: Request  # as judged: the located candidate's scheme filled in


def run(candidates: sources.Candidates, request: Request, *, policy: str = PREQUANT_ONLY,
          model_dirs: Iterable[str] = (), dense_path: str | None = None, token: str | None = None,
          progress: hub.ProgressFn | None = None, download_dir: str | None = None, search_dirs: Iterable[str] = (),
          status: Callable[[str], None] | None = None, check: Callable[[], None] | None = None,
          memory_guard=True, unavailable: PrequantError | None = None) -> Routed:
    """Locate, open and judge, before anything is loaded or evicted: a refused file never costs the model that is
    resident now. ``model_dirs``: the folders a local path must lie in (a Hub file's cache folder is added for that
    file only); ``policy``: ``route.POLICIES``; a file that cannot be located counts as unusable for the fallback, as
    does ``unavailable`` (why the caller could not even make candidates, e.g. a listed file that is missing)."""
    model_dirs = list(model_dirs)
    located = None
    if policy != DENSE_ONLY and unavailable is None:
        try:
            located = hub.locate(candidates, model_dirs=model_dirs, token=token, progress=progress,
                                 dest_dir=download_dir, search_dirs=search_dirs, status=status, check=check)
        except PrequantError as e:
            unavailable = e
    request = dataclasses.replace(request, scheme=(located.candidate.scheme if located else None) or request.scheme)
    if located and status:
        status(f"checking {os.path.basename(located.path)} (header: scheme, base model, layout)")
    r = choose(located.path if located else None, request, policy=policy, dense_path=dense_path,
                  model_dirs=located.model_dirs if located else model_dirs, dense_model_dirs=model_dirs,
                  unavailable=unavailable, memory_guard=memory_guard)
    return Routed(r, located, request)
