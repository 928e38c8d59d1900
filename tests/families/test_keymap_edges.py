"""prequant_core/families/keymap.py on the maps and tensors it must refuse or pass through: a fusion along the columns,
tensors the map has no place for, a fused weight whose parts do not fit (wrong row count, a part missing, quantized
rows fused with dense rows), row permutations that cannot apply (an odd row count, a quantized table, a name or a
function the pack does not know), and a family without a map. Real int8 tensors from the pack's own quantizer, every
result compared bit for bit. Core tier: no ComfyUI."""
from __future__ import annotations

import pytest
import torch

from prequant_core import schemes
from prequant_core.errors import CorruptCheckpointError
from prequant_core.families import keymap
from prequant_core.schemes import qtensor

PATH = "/models/prequant/some-file.safetensors"


def dense(rows, cols=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g).to(torch.bfloat16)


def int8(rows, seed=0):
    return schemes.quantize_weight(dense(rows, seed=seed), "int8")


def qkv_map(sizes=(4, 4, 4)):
    m: dict = {}
    keymap.qkv_rows(m, "blocks.0.attn", "blocks.0.qkv", sizes)
    return m


def bits(t):
    """A tensor's exact bytes (a quantized one's codes and scales)."""
    if qtensor.is_quantized(t):
        (q, s), _ = qtensor.parts(t)
        return q.view(torch.uint8).flatten().tolist(), s.float().flatten().tolist()
    return t.contiguous().view(torch.uint8).flatten().tolist()


def test_a_fusion_along_the_columns_is_refused():
    with pytest.raises(CorruptCheckpointError) as ei:
        keymap.parse_target("a.to_q.weight", ("a.qkv.weight", (1, 0, 8)), path=PATH)
    e = ei.value
    assert "fuses 'a.to_q.weight' along dim 1; only row fusion is supported" in e.message and e.path == PATH
    # the same map through to_comfy: refused before any tensor is touched
    with pytest.raises(CorruptCheckpointError, match="along dim 1"):
        keymap.to_comfy({"a.to_q.weight": dense(8)}, {"a.to_q.weight": ("a.qkv.weight", (1, 0, 8))}, path=PATH)


def test_tensors_without_a_place_in_the_map_are_named():
    tensors = {f"extra.{i}.weight": dense(2) for i in range(7)}
    tensors["kept.weight"] = dense(2)
    with pytest.raises(CorruptCheckpointError) as ei:
        keymap.to_comfy(tensors, {"kept.weight": "comfy.kept.weight"}, path=PATH)
    e = ei.value
    # the first five sorted names, and " ..." for the two more
    assert e.message == ("7 tensors have no place in the model: extra.0.weight, extra.1.weight, extra.2.weight, "
                         "extra.3.weight, extra.4.weight ...")
    assert e.path == PATH and "family or size does not match" in e.fix
    with pytest.raises(CorruptCheckpointError) as one:
        keymap.to_comfy({"kept.weight": dense(2), "x": dense(2)}, {"kept.weight": "k"}, path=PATH)
    assert one.value.message == "1 tensors have no place in the model: x"


def test_a_fused_part_with_the_wrong_row_count_is_refused():
    m = qkv_map()
    t = {"blocks.0.attn.to_q.weight": int8(4), "blocks.0.attn.to_k.weight": int8(3, 1),
         "blocks.0.attn.to_v.weight": int8(4, 2)}
    with pytest.raises(CorruptCheckpointError) as ei:
        keymap.to_comfy(t, m, path=PATH)
    e = ei.value
    assert e.message == "'blocks.0.attn.to_k.weight' has 3 rows, the fused 'blocks.0.qkv.weight' expects 4."
    assert e.path == PATH and e.fix == "The file does not match the model config it implies."


def test_a_fused_weight_missing_a_part_is_refused():
    m = qkv_map()
    t = {"blocks.0.attn.to_q.weight": int8(4), "blocks.0.attn.to_v.weight": int8(4, 2)}  # to_k absent
    with pytest.raises(CorruptCheckpointError) as ei:
        keymap.to_comfy(t, m, path=PATH)
    assert ei.value.message == ("Fused weight 'blocks.0.qkv.weight' is missing rows 4..8 (a part such as "
                                "to_q/to_k/to_v is absent).")
    assert ei.value.path == PATH


def test_quantized_rows_fused_with_dense_rows_are_refused():
    m = qkv_map()
    t = {"blocks.0.attn.to_q.weight": int8(4), "blocks.0.attn.to_k.weight": dense(4, seed=1),
         "blocks.0.attn.to_v.weight": int8(4, 2)}
    with pytest.raises(CorruptCheckpointError) as ei:
        keymap.to_comfy(t, m, path=PATH)
    assert ei.value.message.startswith("Cannot fuse 'blocks.0.qkv.weight': ")
    assert "quantized and dense rows" in ei.value.message and ei.value.path == PATH


def test_fused_quantized_rows_are_the_parts_in_row_order_bit_for_bit():
    m = qkv_map()
    q, k, v = int8(4), int8(4, 1), int8(4, 2)
    # given out of order: the offsets put them back
    out = keymap.to_comfy({"blocks.0.attn.to_v.weight": v, "blocks.0.attn.to_q.weight": q,
                           "blocks.0.attn.to_k.weight": k}, m)
    fused = out["blocks.0.qkv.weight"]
    assert list(out) == ["blocks.0.qkv.weight"] and tuple(fused.shape) == (12, 32)
    want = [bits(x) for x in (q, k, v)]
    codes, scales = bits(fused)
    assert codes == want[0][0] + want[1][0] + want[2][0]
    assert scales == want[0][1] + want[1][1] + want[2][1]


def test_swap_scale_shift_on_an_odd_row_count_is_refused():
    with pytest.raises(CorruptCheckpointError) as ei:
        keymap.apply_row_permutations({"norm_out.linear.weight": dense(3)},
                                      {"norm_out.linear.weight": ("final.adaLN.weight", None, "swap_scale_shift")},
                                      path=PATH)
    assert ei.value.message == "Cannot reorder the rows of 'norm_out.linear.weight': cannot swap the halves of 3 rows."
    assert ei.value.path == PATH


def test_a_quantized_table_cannot_be_flattened():
    with pytest.raises(CorruptCheckpointError) as ei:
        keymap.apply_row_permutations({"mod.table": int8(4)}, {"mod.table": ("mod_table", None, "flatten_table")},
                                      path=PATH)
    assert ei.value.message == "Cannot reorder the rows of 'mod.table': a quantized tensor cannot be reshaped."


@pytest.mark.parametrize("perm,shown", [("shuffle_rows", "shuffle_rows"), (lambda t: t, "<function")])
def test_an_unknown_row_permutation_is_refused(perm, shown):
    with pytest.raises(CorruptCheckpointError) as ei:
        keymap.apply_row_permutations({"a.weight": dense(4)}, {"a.weight": ("b.weight", None, perm)}, path=PATH)
    e = ei.value
    assert f"transforms 'a.weight' with '{shown}" in e.message and "not a known row permutation" in e.message
    assert e.expected == "flatten_table, swap_scale_shift" and e.path == PATH


def test_a_permutation_for_a_tensor_the_file_lacks_only_rewrites_the_map():
    t = {"other.weight": dense(2)}
    out, plain = keymap.apply_row_permutations(t, {"a.weight": ("b.weight", (0, 0, 4), "swap_scale_shift"),
                                                   "other.weight": "o.weight"})
    assert bits(out["other.weight"]) == bits(t["other.weight"]) and list(out) == ["other.weight"]
    assert plain == {"a.weight": keymap.KeyTarget("b.weight", (0, 4)), "other.weight": keymap.KeyTarget("o.weight")}


def test_comfyuis_own_swap_function_is_applied_by_name_bit_for_bit():
    def swap_scale_shift(weight):  # the name ComfyUI's comfy.utils function carries; the pack applies its own
        raise AssertionError("never called: the pack applies its row-wise twin")

    w = int8(6)
    out = keymap.to_comfy_layout({"norm_out.linear.weight": w, "x.weight": dense(2)},
                                 {"norm_out.linear.weight": ("final_layer.adaLN_modulation.1.weight", None,
                                                             swap_scale_shift), "x.weight": "y.weight"}, path=PATH)
    assert sorted(out) == ["final_layer.adaLN_modulation.1.weight", "y.weight"]
    codes, scales = bits(out["final_layer.adaLN_modulation.1.weight"])
    wc, ws = bits(w)
    row = 32  # int8 codes: one byte a column
    assert codes == wc[3 * row:] + wc[:3 * row] and scales == ws[3:] + ws[:3]


def test_a_family_without_a_map_keeps_the_tensors():
    t = {"a.weight": dense(2), "b": dense(1)}
    assert keymap.named(None) is None
    out = keymap.to_comfy_layout(t, None, path=PATH)
    assert out == t and out is not t
