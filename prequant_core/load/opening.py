"""Open a local checkpoint the way the loader node does: allowlist -> read -> family -> validation."""
from __future__ import annotations

import dataclasses
from typing import Iterable

import os

from . import allowlist, memory_check, metadata
from .. import families, formats
from ..formats import fingerprint, layer_policy
from ..formats.checkpoint import Checkpoint
from ..errors import ValidationError, reading
from ..families import Family


@dataclasses.dataclass
class Opened:
    checkpoint: Checkpoint
    family: Family
    layout: str
    verdict: metadata.Verdict


def open_checkpoint(path: str, request: metadata.Request | None = None, *, model_dirs: Iterable[str] = (),
                    strict: bool = True, memory_guard: bool | memory_check.Guard = True,
                    fingerprint_mode: str | None = None) -> Opened:
    """``memory_guard``: True checks host memory against the file's declared size before reading it (see
    ``memory``); a ``memory_check.Guard`` also names the load device etc.; False skips the check.
    ``fingerprint_mode``: ``full`` / ``sample`` / ``off`` (None: ``fingerprint.mode_from_env``); checked only for a
    file that passed validation (``strict``)."""
    request = request or metadata.Request()
    guard = memory_guard if isinstance(memory_guard, memory_check.Guard) else None
    allowlist.check(path, model_dirs)
    # Opened once: the allowlist, the guard and every read judge this handle, whatever happens to the name now.
    with formats.open_file(path) as f:
        allowlist.check_opened(f, model_dirs)
        if memory_guard is not False:
            memory_check.check_file(f, guard)
        ckpt = formats.read(f)
        st = os.fstat(f.fd)  # the opened file's identity, for a remembered fingerprint pass
        if memory_guard is not False:
            # the stored bytes passed; now what the tensors declare, before any of their bytes is touched
            memory_check.check_declared(ckpt, guard)
    real = f.real
    with reading(real, "judged"):
        return _judge(ckpt, request, real, st, strict, fingerprint_mode)


def _judge(ckpt, request, real, st, strict, fingerprint_mode) -> Opened:
    if request.family:
        fam = families.get(request.family)
        layout = fam.layout_of(ckpt.tensors.keys()) or families.detect(ckpt.tensors.keys(), ckpt.metadata, real)[1]
    else:
        fam, layout = families.detect(ckpt.tensors.keys(), ckpt.metadata, real)
    verdict = metadata.validate(ckpt, request, family=fam)
    if strict and not verdict.ok:
        raise ValidationError("The checkpoint does not match what was asked for; it was not loaded.", path=real,
                              reasons=verdict.reasons,
                              fix="Pick the file built for this base model and scheme, or change the node's "
                                  "base_model_id / scheme inputs.")
    if verdict.ok:
        check_fingerprint(ckpt, real, st, fingerprint_mode)
    # Unsloth's rule: every fp8 weight runs torchao's TORCH kernels (the same as load-time quantization)
    metadata.pin_fp8_kernels(ckpt.tensors)
    layer_policy.mark_rotations(ckpt)
    return Opened(ckpt, fam, layout, verdict)


def check_fingerprint(ckpt: Checkpoint, real: str, st: os.stat_result | None, mode: str | None = None) -> None:
    """Unsloth's check of the recorded ``md5-packed-v1`` digests against the weights, before any weight is placed.
    A full pass is remembered for this file (real path, size, mtime), so it is hashed once, not on every load."""
    fp = ckpt.metadata.get("fingerprint")
    mode = mode or fingerprint.mode_from_env()
    if not fp or mode == "off":
        return
    if st is not None and fingerprint.remembered(real, st, fp):
        return
    reasons = fingerprint.verify(ckpt.tensors, fp, mode)
    if reasons:
        raise ValidationError("The checkpoint's weights do not match the fingerprint recorded when it was built; it "
                              "was not loaded.", path=ckpt.path, reasons=reasons,
                              fix="Download or build the file again (a damaged or edited file). To load it anyway, "
                                  "set PREQUANT_FINGERPRINT=off before starting ComfyUI.")
    if mode == "full" and st is not None:
        fingerprint.remember(real, st, fp)
