"""diffusers <-> ComfyUI key maps: the one target type, applying a map to a state dict that may hold per-row
quantized weights, and the helpers our own maps (for families whose ComfyUI has none in ``comfy.utils``; they live
with their family in ``prequant_core/families/<family>.py``) are built with.

A map is ``{diffusers_key: target}`` in the form ComfyUI's own maps (``comfy.utils.flux_to_diffusers`` ...) use,
parsed in one place (:func:`parse_target`) into a :class:`KeyTarget`:

- ``"comfy_key"``: the tensor moves as is;
- ``("comfy_key", (0, offset, length))``: it is a row slice of a fused ComfyUI weight (e.g. ``to_q/to_k/to_v`` ->
  ``qkv``);
- ``("comfy_key", slice_or_None, row_permutation)``: its rows are reordered first (ComfyUI's third element is a
  function; ours is the name of a row permutation in :data:`ROW_PERMUTATIONS`, e.g. FLUX's final ``norm_out``
  stores ``(scale, shift)`` where ComfyUI's ``final_layer.adaLN_modulation`` wants ``(shift, scale)``).

Only row operations appear: per-row quantized weights carry one scale per output row, so moving, slicing,
concatenating and permuting rows is exact. No map splits or fuses along the input dimension. A fused weight is a
copy: the parts' pages of a memory-mapped file are given back once it is made (``pages.release``), so the file's
rows are not resident twice.

No ComfyUI import: the unet config passed in is the dict our families derive from the checkpoint's shapes.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from . import pages
from ..errors import CorruptCheckpointError


def _qtensor():
    # imported on first use: the family registry stays importable without torch (the command line's --help)
    from ..schemes import qtensor
    return qtensor


@dataclasses.dataclass(frozen=True)
class KeyTarget:
    name: str  # the ComfyUI key
    rows: tuple[int, int] | None = None  # (offset, length): a row slice of the fused weight ``name``
    perm: Any = None  # a row permutation: its name in ROW_PERMUTATIONS, or ComfyUI's own function


def parse_target(diffusers_key: str, target, *, path: str | None = None) -> KeyTarget:
    """One map entry, in any of the forms above, as a :class:`KeyTarget`; a fusion along another dim than the rows
    is refused (it could not be exact on per-row quantized weights)."""
    if isinstance(target, KeyTarget):
        return target
    if isinstance(target, str):
        return KeyTarget(target)
    name, sl = target[0], target[1]
    perm = target[2] if len(target) > 2 else None
    rows = None
    if sl is not None:
        dim, offset, length = sl
        if dim != 0:
            raise CorruptCheckpointError(f"The key map fuses '{diffusers_key}' along dim {dim}; only row fusion is "
                                         "supported.", path=path)
        rows = (offset, length)
    return KeyTarget(name, rows, perm)


def parse_map(key_map: Mapping, *, path: str | None = None) -> dict[str, KeyTarget]:
    return {dk: parse_target(dk, t, path=path) for dk, t in key_map.items()}


# ---------------------------------------------------------------------------------------------------------------
# Applying a map

def to_comfy(tensors: Mapping, key_map: Mapping, *, path: str | None = None, sources: dict | None = None) -> dict:
    """The tensors under ComfyUI's keys. ``sources``, where given, receives ``{fused key: [its parts' weights, in row
    order]}`` for every fused weight whose parts all lie in a memory-mapped file: the fused rows can be rebuilt from
    the file at any time (a LoRA's unpatch does: nodes/patcher.py) instead of being kept twice."""
    out: dict = {}
    fused: dict[str, list] = {}
    unknown = []
    for k, v in tensors.items():
        target = key_map.get(k)
        if target is None:
            unknown.append(k)
            continue
        t = parse_target(k, target, path=path)
        if t.rows is None:
            out[t.name] = v
        else:
            name, (offset, length) = t.name, t.rows
            if v.shape[0] != length:
                raise CorruptCheckpointError(f"'{k}' has {v.shape[0]} rows, the fused '{name}' expects {length}.",
                                             path=path, fix="The file does not match the model config it implies.")
            fused.setdefault(name, []).append((offset, k, v))
    if unknown:
        raise CorruptCheckpointError(
            f"{len(unknown)} tensors have no place in the model: {', '.join(sorted(unknown)[:5])}"
            + (" ..." if len(unknown) > 5 else ""), path=path,
            fix="The checkpoint's family or size does not match; check the family and base model.")
    maps = None
    for name, parts in fused.items():
        parts.sort(key=lambda p: p[0])
        pos = 0
        for offset, k, v in parts:
            if offset != pos:
                raise CorruptCheckpointError(f"Fused weight '{name}' is missing rows {pos}..{offset} "
                                             f"(a part such as to_q/to_k/to_v is absent).", path=path)
            pos += v.shape[0]
        try:
            out[name] = _qtensor().cat_rows([v for _, _, v in parts])
        except ValueError as e:
            raise CorruptCheckpointError(f"Cannot fuse '{name}': {e}.", path=path) from None
        plain = list(_plain_parts(v for _, _, v in parts))
        if maps is None:  # one read of /proc/self/maps for every fused weight (the parts stay alive meanwhile)
            maps = pages.file_mappings()
        if sources is not None and pages.file_backed(plain, maps):
            sources[name] = [v for _, _, v in parts]
        pages.release(plain, maps)
    return out


def _plain_parts(weights):
    for w in weights:
        if _qtensor().is_quantized(w):
            yield from _qtensor().parts(w)[0]
        else:
            yield w


# ---------------------------------------------------------------------------------------------------------------
# Row permutations (exact on per-row quantized tensors)


def swap_halves(t):
    """``(a, b)`` -> ``(b, a)`` along dim 0: ComfyUI's ``swap_scale_shift``, done row-wise (and self-inverse)."""
    n = t.shape[0]
    if n % 2:
        raise ValueError(f"cannot swap the halves of {n} rows")
    h = n // 2
    return _qtensor().cat_rows([_qtensor().slice_rows(t, h, h), _qtensor().slice_rows(t, 0, h)])


def flatten_table(t):
    """A plain (never quantized) modulation table ``[n, dim]`` -> ``[n * dim]``: diffusers keeps Krea 2's per-block
    table as rows, ComfyUI as one vector of the same values in the same order."""
    if _qtensor().is_quantized(t):
        raise ValueError("a quantized tensor cannot be reshaped")
    return t.reshape(-1)


ROW_PERMUTATIONS: dict[str, Callable] = {
    "swap_scale_shift": swap_halves,  # the name ComfyUI's own function carries (comfy.utils.swap_scale_shift)
    "flatten_table": flatten_table,  # a plain table's rows laid end to end (no quantized tensor is ever one)
}


def apply_row_permutations(tensors: Mapping, key_map: Mapping, *, path: str | None = None) -> tuple[dict, dict]:
    """Apply the map's row permutations to ``tensors``; returns (tensors, map) with only the plain and the
    row-slice forms left, ready for :func:`to_comfy`."""
    out = dict(tensors)
    plain = {}
    for dk, target in key_map.items():
        t = parse_target(dk, target, path=path)
        if t.perm is None:
            plain[dk] = t
            continue
        perm = t.perm
        fn = ROW_PERMUTATIONS.get(perm) if isinstance(perm, str) else None
        if fn is None:
            raise CorruptCheckpointError(f"The key map transforms '{dk}' with '{perm}', which is not a known row "
                                         f"permutation; this ComfyUI's map cannot be applied exactly to quantized "
                                         f"weights.", path=path, expected=", ".join(sorted(ROW_PERMUTATIONS)))
        if dk in out:
            try:
                out[dk] = fn(out[dk])
            except ValueError as e:
                raise CorruptCheckpointError(f"Cannot reorder the rows of '{dk}': {e}.", path=path) from None
        plain[dk] = KeyTarget(t.name, t.rows)
    return out, plain


# ---------------------------------------------------------------------------------------------------------------
# Shared pieces for building maps


def qkv_rows(m: dict, src: str, dst: str, sizes: tuple[int, ...], names=("to_q", "to_k", "to_v"), ends=("weight",)):
    """``src.to_q/k/v.<end>`` -> rows of ``dst.<end>`` (sizes in the order of ``names``)."""
    for end in ends:
        off = 0
        for n, size in zip(names, sizes):
            m[f"{src}.{n}.{end}"] = (f"{dst}.{end}", (0, off, size))
            off += size


def moves(m: dict, src: str, dst: str, pairs: Mapping[str, str], ends=("weight", "bias")):
    """Plain moves; a pair naming a module (no ``.weight``/``.bias`` ending) moves each of ``ends``."""
    for a, b in pairs.items():
        if a.endswith((".weight", ".bias")):
            m[f"{src}{a}"] = f"{dst}{b}"
        else:
            for end in ends:
                m[f"{src}{a}.{end}"] = f"{dst}{b}.{end}"


def mlp_embedder(m: dict, src: str, dst: str, ends=("weight", "bias")):
    """diffusers ``TimestepEmbedding`` (linear_1/linear_2) -> ComfyUI ``MLPEmbedder`` (in_layer/out_layer)."""
    moves(m, src, dst, {".linear_1": ".in_layer", ".linear_2": ".out_layer"}, ends)


def named(key_map: Mapping | None) -> dict | None:
    """A map whose third elements may be ComfyUI's own functions (``comfy.utils.swap_scale_shift``), with each
    function replaced by its name (the form :data:`ROW_PERMUTATIONS` is keyed by)."""
    if key_map is None:
        return None
    out = {}
    for k, target in key_map.items():
        t = parse_target(k, target)
        out[k] = dataclasses.replace(t, perm=getattr(t.perm, "__name__", repr(t.perm))) if callable(t.perm) else t
    return out


def to_comfy_layout(tensors: Mapping, key_map: Mapping | None, *, path: str | None = None) -> dict:
    """Diffusers-named tensors -> ComfyUI's names with a family's map (row permutations, moves, fused rows)."""
    if key_map is None:
        return dict(tensors)
    tensors, key_map = apply_row_permutations(tensors, named(key_map), path=path)
    return to_comfy(tensors, key_map, path=path)
