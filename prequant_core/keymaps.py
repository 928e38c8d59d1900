"""What our own diffusers -> ComfyUI key maps share. The maps themselves (for families whose ComfyUI has none in
``comfy.utils``) live with their family, in ``prequant_core/families/<family>.py``; they are data built with the
helpers here, and applied with :func:`apply_row_permutations` and :func:`prequant_core.keymap.to_comfy`.

A map is ``{diffusers_key: target}`` in the form ComfyUI's own maps (``comfy.utils.flux_to_diffusers`` ...) use:

- ``"comfy_key"``: the tensor moves as is;
- ``("comfy_key", (0, offset, length))``: it is a row slice of a fused ComfyUI weight (e.g. ``to_q/to_k/to_v`` ->
  ``qkv``), applied by :func:`prequant_core.keymap.to_comfy`;
- ``("comfy_key", slice_or_None, "row_permutation")``: its rows are reordered first (ComfyUI's third element is a
  function; ours is the name of a row permutation in :data:`ROW_PERMUTATIONS`, e.g. FLUX's final ``norm_out``
  stores ``(scale, shift)`` where ComfyUI's ``final_layer.adaLN_modulation`` wants ``(shift, scale)``).

Only row operations appear: per-row quantized weights carry one scale per output row, so moving, slicing,
concatenating and permuting rows is exact. No map splits or fuses along the input dimension.

No ComfyUI import: the unet config passed in is the dict our families derive from the checkpoint's shapes.
"""
from __future__ import annotations

from typing import Callable, Mapping

from . import qtensor
from .errors import CorruptCheckpointError

# ---------------------------------------------------------------------------------------------------------------
# Row permutations (exact on per-row quantized tensors)


def swap_halves(t):
    """``(a, b)`` -> ``(b, a)`` along dim 0: ComfyUI's ``swap_scale_shift``, done row-wise (and self-inverse)."""
    n = t.shape[0]
    if n % 2:
        raise ValueError(f"cannot swap the halves of {n} rows")
    h = n // 2
    return qtensor.cat_rows([qtensor.slice_rows(t, h, h), qtensor.slice_rows(t, 0, h)])


ROW_PERMUTATIONS: dict[str, Callable] = {
    "swap_scale_shift": swap_halves,  # the name ComfyUI's own function carries (comfy.utils.swap_scale_shift)
}


def apply_row_permutations(tensors: Mapping, key_map: Mapping, *, path: str | None = None) -> tuple[dict, dict]:
    """Apply the map's row permutations to ``tensors``; returns (tensors, map) with only the plain and the
    row-slice forms left, ready for :func:`prequant_core.keymap.to_comfy`."""
    out = dict(tensors)
    plain = {}
    for dk, target in key_map.items():
        if isinstance(target, str) or len(target) == 2:
            plain[dk] = target
            continue
        name, sl, perm = target[0], target[1], target[2]
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
        plain[dk] = name if sl is None else (name, sl)
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
    for k, t in key_map.items():
        if not isinstance(t, str) and len(t) > 2 and callable(t[2]):
            t = (t[0], t[1], getattr(t[2], "__name__", repr(t[2])))
        out[k] = t
    return out


def to_comfy_layout(tensors: Mapping, key_map: Mapping | None, *, path: str | None = None) -> dict:
    """Diffusers-named tensors -> ComfyUI's names with a family's map (row permutations, moves, fused rows)."""
    from .keymap import to_comfy
    if key_map is None:
        return dict(tensors)
    tensors, key_map = apply_row_permutations(tensors, named(key_map), path=path)
    return to_comfy(tensors, key_map, path=path)
