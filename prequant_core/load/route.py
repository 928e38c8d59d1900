"""Deciding, before anything is loaded or evicted, which path a load will take.

Policies: ``prequant only`` (fail with every reason), ``prequant, else quantize dense``, ``quantize dense``.
A pre-quantized source counts only when the loader would accept it (allowlisted, present, valid for the
request); a dense fallback only when its file exists and is allowlisted. Both paths use the same scheme,
min_features and exclude rules, so they give the same tensors.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

from . import allowlist
from .. import families, schemes
from ..errors import MemoryBudgetError, PrequantError, ValidationError
from .opening import Opened, open_checkpoint
from ..context import LoadContext
from ..request import Request

PREQUANT_ONLY = "prequant only"
PREQUANT_ELSE_DENSE = "prequant, else quantize dense"
DENSE_ONLY = "quantize dense"
POLICIES = (PREQUANT_ONLY, PREQUANT_ELSE_DENSE, DENSE_ONLY)


@dataclasses.dataclass(frozen=True)
class Fallback:
    """Whether the dense model may stand in for the pre-quantized file (``policy``, one of ``POLICIES``), and which
    dense file (the node's ``dense_fallback``)."""
    policy: str = PREQUANT_ONLY
    dense_path: str | None = None


@dataclasses.dataclass
class LoadRoute:
    """The route a load takes, decided before anything is loaded: the opened, validated pre-quantized file, or the
    dense file to quantize while reading it (with why the pre-quantized route was skipped)."""
    taken: str  # "pre-quantized" | "quantized at load"
    opened: Opened | None = None
    dense_path: str | None = None
    scheme: str | None = None
    min_features: int = schemes.DEFAULT_MIN_FEATURES
    exclude: list[str] = dataclasses.field(default_factory=list)
    family: families.Family | None = None
    skipped_because: list[str] = dataclasses.field(default_factory=list)



def choose(prequant_path: str | None, request: Request, ctx: LoadContext, *, fallback: Fallback = Fallback(),
           dense_dirs: Iterable[str] | None = None, unavailable: PrequantError | None = None) -> LoadRoute:
    """``unavailable``: why no pre-quantized file could even be located (e.g. offline, not on the Hub);
    ``dense_dirs``: the folders the dense file may lie in (default ``ctx.model_dirs``)."""
    policy, dense_path = fallback.policy, fallback.dense_path
    if policy not in POLICIES:
        raise ValidationError(f"Unknown load policy '{policy}'.", expected=", ".join(POLICIES), found=policy)
    model_dirs = list(ctx.model_dirs)
    dense_model_dirs = model_dirs if dense_dirs is None else list(dense_dirs)
    reasons: list[str] = []
    opened = None
    if policy != DENSE_ONLY:
        if unavailable is not None:
            if policy == PREQUANT_ONLY:
                raise unavailable
            reasons.extend(unavailable.reasons or [unavailable.message])
        elif prequant_path:
            try:
                opened = open_checkpoint(prequant_path, request, model_dirs=model_dirs, memory=ctx.memory)
            except PrequantError as e:
                # Short of memory for the quantized file means shorter still for quantizing the dense one.
                if policy == PREQUANT_ONLY or isinstance(e, MemoryBudgetError):
                    raise
                reasons.extend(e.reasons or [e.message])
        else:
            reasons.append("no pre-quantized file was given")
        if opened is not None:
            return LoadRoute("pre-quantized", opened=opened, family=opened.family,
                             scheme=opened.checkpoint.metadata.get("scheme"))
    if policy == PREQUANT_ONLY:
        raise ValidationError("No pre-quantized checkpoint to load.", fix="Pick a file, or allow the dense fallback.")
    if not dense_path:
        raise ValidationError("The pre-quantized file cannot be used and no dense fallback was given.",
                              reasons=reasons, fix="Pick a dense transformer in 'dense_fallback', or fix the "
                                                   "pre-quantized file.")
    real = allowlist.check(dense_path, dense_model_dirs)
    if not request.scheme:
        raise ValidationError("Quantizing at load needs a scheme.", expected=", ".join(schemes.names()), found="auto",
                              fix="Set the node's scheme input.")
    scheme = schemes.normalize(request.scheme)
    from ..formats.dense_sources import open_dense
    dense = open_dense(real)
    fam = families.get(request.family) if request.family else families.detect(list(dense.infos()), dense.hints, real)[0]
    min_features = request.min_features if request.min_features is not None else schemes.DEFAULT_MIN_FEATURES
    exclude = request.exclude_tokens if request.exclude_tokens is not None else \
        schemes.exclude_tokens(scheme, fam.arch.int8_exclude_extra)
    return LoadRoute("quantized at load", dense_path=real, scheme=scheme, min_features=min_features,
                     exclude=exclude, family=fam, skipped_because=reasons)
