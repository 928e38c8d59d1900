"""Metadata from a file, reduced to plain JSON-like values before anything else looks at it.

A file's metadata reaches validation, Prequant Info's table, ``--json`` and the browser. Whatever the container
(a pickled dict, a JSON string in a safetensors header), it becomes a tree of ``dict`` (str keys) / ``list`` /
``str`` / ``int`` / ``float`` / ``bool`` / ``None`` here, with bounded depth and size, no cycles, no NaN or
infinity, and no tensors (a tensor where metadata belongs can be any size). Anything else is refused as corrupt.
"""
from __future__ import annotations

import json
import math

import torch

from ..errors import CorruptCheckpointError

MAX_DEPTH = 32  # metadata written by any builder nests 3-4 levels
MAX_NODES = 1_000_000  # a fingerprint lists one entry per quantized layer
MAX_INT = 2**64


def _bad(path: str, what: str, found: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"The checkpoint's {what} is malformed.", path=path, found=found,
                                  fix="Download or build the file again.")


def plain(obj, path: str, what: str = "metadata"):
    """A copy of ``obj`` made only of plain JSON values, or ``CorruptCheckpointError``."""
    count = 0
    on_path: set[int] = set()  # containers being copied: meeting one again is a cycle

    def copy(v, depth):
        nonlocal count
        count += 1
        if count > MAX_NODES:
            raise _bad(path, what, f"more than {MAX_NODES:,} values")
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, int):
            if not -MAX_INT < v < MAX_INT:
                raise _bad(path, what, f"an integer of {v.bit_length()} bits")
            return int(v)
        if isinstance(v, float):
            if not math.isfinite(v):
                raise _bad(path, what, f"a non-finite number ({v})")
            return float(v)
        if isinstance(v, str):
            return str(v)
        if isinstance(v, torch.Tensor):
            raise _bad(path, what, f"a tensor {tuple(v.shape)} where a value belongs")
        if isinstance(v, (torch.dtype, torch.device, torch.Size)):
            return str(v)
        if isinstance(v, (dict, list, tuple)):
            if depth >= MAX_DEPTH:
                raise _bad(path, what, f"values nested deeper than {MAX_DEPTH} levels")
            if id(v) in on_path:
                raise _bad(path, what, "a value that contains itself")
            on_path.add(id(v))
            try:
                if isinstance(v, dict):
                    out = {}
                    for k, x in v.items():
                        if not isinstance(k, str):
                            raise _bad(path, what, f"a key of type {type(k).__name__}")
                        out[str(k)] = copy(x, depth + 1)
                    return out
                return [copy(x, depth + 1) for x in v]
            finally:
                on_path.discard(id(v))
        raise _bad(path, what, f"a value of type {type(v).__name__}")

    return copy(obj, 0)


def no_constant(name: str):
    raise ValueError(f"non-finite number {name}")


def loads(text: str, path: str, what: str):
    """Strict JSON: no NaN / Infinity, bounded nesting; errors become ``CorruptCheckpointError``."""
    try:
        value = json.loads(text, parse_constant=no_constant)
    except (json.JSONDecodeError, ValueError, RecursionError, TypeError) as e:
        raise CorruptCheckpointError(f"The checkpoint's {what} is not valid JSON.", path=path,
                                     found=f"{type(e).__name__}: {str(e)[:120]}",
                                     fix="Download or build the file again.") from None
    return plain(value, path, what)
