"""ConvRot (``..._v2`` files, docs/FORMAT.md section 9): a layer's input is rotated by a block-diagonal Hadamard
before its int8 matmul. The file stores ``W H``; since ``H`` is symmetric and orthogonal (``H H = I``),
``(W H)(H x) = W x``. ``H`` is never stored: it is the Kronecker power of the *regular* 4x4 Hadamard (entry -1 where
the row and column index XOR to 3), scaled by ``1/sqrt(group)``, rebuilt here from that definition. Unsloth's hosted
files were rotated with this matrix; Sylvester's ordering is just as orthogonal, so a round trip through one's own
writer cannot tell them apart: only a file rotated by Unsloth's construction can (tests/unsloth_builder.py)."""
from __future__ import annotations

import math

import torch

KIND = "convrot_hadamard_v1"
DEFAULT_GROUP = 256
# The Hadamard is built as a dense group x group matrix: a file's group must not make that matrix large. Unsloth and
# ComfyUI use 256; 1024 costs 4 MB (float32), 4^8 would cost 17 GB.
MAX_GROUP = 1024

_H4 = tuple(tuple(-1 if i ^ j == 3 else 1 for j in range(4)) for i in range(4))  # [[1,1,1,-1],[1,1,-1,1],...]
_CACHE: dict = {}


def is_power_of_4(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 4 and (n & (n - 1)) == 0 and \
        (n.bit_length() - 1) % 2 == 0


def hadamard(group: int, device="cpu", dtype=torch.float32) -> torch.Tensor:
    """The ``group`` x ``group`` block (float64 entries ±1/sqrt(group), cast once to ``dtype``)."""
    if not is_power_of_4(group) or group > MAX_GROUP:
        raise ValueError(f"rotation group {group!r} is not a power of 4 up to {MAX_GROUP}")
    key = (group, str(device), dtype)
    if key not in _CACHE:
        h4 = torch.tensor(_H4, dtype=torch.float64)
        h = h4
        while h.shape[0] < group:
            h = torch.kron(h, h4)
        _CACHE[key] = (h / math.sqrt(group)).to(dtype=dtype, device=device)
    return _CACHE[key]


def rotate(x: torch.Tensor, group: int) -> torch.Tensor:
    """``x`` times the block-diagonal Hadamard along its last dimension, computed in float32 (float64 for a float64
    input), returned in ``x``'s dtype."""
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = hadamard(group, x.device, work)
    shape = x.shape
    y = x.reshape(*shape[:-1], shape[-1] // group, group).to(work) @ h
    return y.reshape(shape).to(x.dtype)
