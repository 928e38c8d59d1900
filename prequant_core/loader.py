"""Open a local checkpoint the way the loader node does: allowlist -> read -> family -> validation."""
from __future__ import annotations

import dataclasses
from typing import Iterable

from . import allowlist, families, formats, memory, metadata
from .checkpoint import Checkpoint
from .errors import ValidationError
from .families import Family


@dataclasses.dataclass
class Opened:
    checkpoint: Checkpoint
    family: Family
    layout: str
    verdict: metadata.Verdict


def open_checkpoint(path: str, request: metadata.Request | None = None, *, model_dirs: Iterable[str] = (),
                    strict: bool = True, memory_guard: bool | memory.Guard = True) -> Opened:
    """``memory_guard``: True checks host memory against the file's declared size before reading it (see
    ``memory``); a ``memory.Guard`` also names the load device etc.; False skips the check."""
    request = request or metadata.Request()
    real = allowlist.check(path, model_dirs)
    if memory_guard is not False:
        memory.check_file(real, memory_guard if isinstance(memory_guard, memory.Guard) else None)
    ckpt = formats.read(real)
    if request.family:
        fam = families.get(request.family)
        layout = fam.layout_of(ckpt.tensors.keys()) or families.detect(ckpt.tensors.keys(), ckpt.metadata, real)[1]
    else:
        fam, layout = families.detect(ckpt.tensors.keys(), ckpt.metadata, real)
    verdict = metadata.validate(ckpt, request, fam.int8_exclude_extra)
    if strict and not verdict.ok:
        raise ValidationError("The checkpoint does not match what was asked for; it was not loaded.", path=real,
                              reasons=verdict.reasons,
                              fix="Pick the file built for this base model and scheme, or change the node's "
                                  "base_model_id / scheme inputs.")
    return Opened(ckpt, fam, layout, verdict)
