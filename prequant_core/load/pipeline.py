"""One load pipeline, top-down, for every client: candidates (``sources.plan``, no I/O) -> the located file
(``locate.locate``: a local path as given, or a Hub file found in the cache or downloaded) -> the route
(``route.choose``: the file opened once and judged by ``opening``, or the dense fallback) -> a building step the
caller supplies. The loader node and the diffusers loader go through ``run`` and differ only in the model they build
from it; Prequant Info and ``python -m prequant_core info | verify`` go through ``opening.inspect`` (the same open
and judge steps on a file already named) and build a report (``report.info``)."""
from __future__ import annotations

import dataclasses
import os

from . import sources
from . import locate
from ..context import LoadContext
from ..errors import PrequantError
from ..request import Request
from .route import DENSE_ONLY, Fallback, LoadRoute, choose


@dataclasses.dataclass
class Routed:
    route: LoadRoute
    located: locate.Located | None  # None: no pre-quantized file was located (the dense fallback route)
    request: Request  # as judged: the located candidate's scheme filled in


def run(candidates: sources.Candidates, request: Request, ctx: LoadContext, *, fallback: Fallback = Fallback(),
        unavailable: PrequantError | None = None) -> Routed:
    """Locate, open and judge, before anything is loaded or evicted: a refused file never costs the model that is
    resident now. ``ctx.model_dirs``: the folders a local path must lie in (a Hub file's cache folder is added for
    that file only); ``fallback``: whether and which dense file stands in (``route.Fallback``); a file that cannot
    be located counts as unusable for the fallback, as does ``unavailable`` (why the caller could not even make
    candidates, e.g. a listed file that is missing)."""
    located = None
    if fallback.policy != DENSE_ONLY and unavailable is None:
        try:
            located = locate.locate(candidates, ctx)
        except PrequantError as e:
            unavailable = e
    request = dataclasses.replace(request, scheme=(located.candidate.scheme if located else None) or request.scheme)
    if located:
        ctx.say(f"checking {os.path.basename(located.path)} (header: scheme, base model, layout)")
    r = choose(located.path if located else None, request, ctx.within(*located.extra_dirs) if located else ctx,
               fallback=fallback, dense_dirs=ctx.model_dirs, unavailable=unavailable)
    return Routed(r, located, request)
