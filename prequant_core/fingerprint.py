"""``md5-packed-v1``: per quantized weight, md5 over its packed codes then its per-row float32 scales."""
from __future__ import annotations

import hashlib

import torch

from . import qtensor
from .errors import PrequantError

ALGO = "md5-packed-v1"


def of_tensor(t) -> str:
    h = hashlib.md5()
    if qtensor.kind_of(t) in qtensor.BLOCK_KINDS:
        # per-block kinds: the packed codes, then the block scales and any per-tensor scale, bytes as stored
        for part in (t.qdata, t.scale, getattr(t, "per_tensor_scale", None)):
            if part is not None:
                h.update(part.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()
    q, s, _ = qtensor.split(t)
    h.update(q.contiguous().view(torch.uint8).numpy().tobytes())
    h.update(s.to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def compute(tensors: dict, skipped: list[str] | None = None) -> dict:
    mods = {k: of_tensor(v) for k, v in sorted(tensors.items()) if qtensor.is_quantized(v)}
    return {"algo": ALGO, "count": len(mods), "modules": mods, "skipped": sorted(skipped or [])}


def verify(tensors: dict, fp: dict) -> list[str]:
    """Reasons the fingerprint does not match (empty when it does)."""
    if not isinstance(fp, dict) or fp.get("algo") != ALGO:
        return [f"fingerprint algorithm {str(fp.get('algo'))[:40] if isinstance(fp, dict) else type(fp).__name__} is not {ALGO}"]
    mods = fp.get("modules") or {}
    if not isinstance(mods, dict):
        return [f"fingerprint 'modules' is {type(mods).__name__}, expected an object"]
    got, out = {}, []
    for k, v in tensors.items():
        if qtensor.is_quantized(v):
            try:
                got[k] = of_tensor(v)
            except PrequantError:
                raise
            except Exception as e:  # noqa: BLE001 - a non-zero zero point, a tensor torch cannot view as bytes ...
                out.append(f"weight '{k[:80]}' cannot be fingerprinted: {type(e).__name__}: {str(e)[:160]}")
    bad = [k for k, h in mods.items() if got.get(k) != h]
    missing = [k for k in got if k not in mods]
    if bad:
        out.append(f"{len(bad)} weights differ from the recorded fingerprint (e.g. '{bad[0]}')")
    if missing:
        out.append(f"{len(missing)} quantized weights are not in the fingerprint (e.g. '{missing[0]}')")
    if fp.get("count") is not None and fp.get("count") != len(got):
        out.append(f"fingerprint counts {fp.get('count')} weights, file has {len(got)}")
    return out
