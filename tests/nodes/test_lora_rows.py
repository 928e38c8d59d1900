"""ComfyUI's weight patches cut by rows (nodes/lora_rows.py, issue 38): a layer patched a block of rows at a time by
ComfyUI's own ``calculate_weight`` gives the very numbers of patching it whole, on Z-Image's real layer shapes, for
every patch form that is cut; every other form is left whole."""
from __future__ import annotations

import pytest
import torch


def _lora(rows, cols, rank, seed, dora=False):
    from comfy.weight_adapter import LoRAAdapter
    g = torch.Generator().manual_seed(seed)
    up = (torch.randn(rows, rank, generator=g) * 0.02).to(torch.bfloat16)
    down = (torch.randn(rank, cols, generator=g) / cols ** 0.5).to(torch.bfloat16)
    dora_scale = torch.rand(rows, 1, generator=g) + 0.5 if dora else None
    return LoRAAdapter(set(), (up, down, torch.tensor(float(rank) / 2), None, dora_scale, None))


def _patch_in_blocks(lora_rows, patches, weight, rows=None):
    from comfy.lora import calculate_weight
    cuts = lora_rows.blocks(patches, weight.shape[0], rows or lora_rows.rows_per_block(weight.shape[1]))
    out = torch.empty_like(weight)
    for start, stop, ps in cuts:
        out[start:stop] = calculate_weight(ps, weight[start:stop].clone(), "k")
    return out, len(cuts)


@pytest.mark.parametrize("rows,cols,rank", [(11520, 3840, 32), (10240, 3840, 16), (3840, 10240, 64), (1000, 2500, 8)])
def test_blocks_of_rows_give_the_whole_layers_numbers(comfy, rows, cols, rank):
    """Z-Image's fused qkv, feed-forward in / out and an odd shape (a short last block): a plain LoRA on the whole
    weight, then a LoRA on the middle third only (ComfyUI's offset: a LoRA on to_k patching the fused qkv) at a
    strength_model below 1, then a ``diff``: torch.equal with patching the whole weight at once."""
    from comfy.lora import calculate_weight
    _, pack = comfy
    lora_rows = pack.nodes.lora_rows
    g = torch.Generator().manual_seed(rows + cols)
    w = torch.randn(rows, cols, generator=g) / cols ** 0.5
    third = rows // 3
    patches = [(1.0, _lora(rows, cols, rank, 1), 1.0, None, None),
               (0.8, _lora(third, cols, rank, 2), 0.7, (0, third, third), None),
               (0.5, (torch.randn(rows, cols, generator=g) * 1e-3,), 1.0, None, None)]
    whole = calculate_weight(patches, w.clone(), "k")
    got, n = _patch_in_blocks(lora_rows, patches, w)
    assert n == -(-rows // lora_rows.rows_per_block(cols)) > 1
    assert lora_rows.rows_per_block(cols) * cols * 4 <= 8 << 20  # each float32 copy of a block: 8 MiB at most
    assert torch.equal(got, whole)
    assert not torch.equal(whole, w)


@pytest.mark.parametrize("form", ["diff", "set"])
def test_named_diff_and_set_patches_cut_by_rows_give_the_whole_layers_numbers(comfy, form):
    """The named forms a model merge or a full-weight patch arrives as, ``("diff", (d,))`` and ``("set", (w,))``:
    cut by rows, each block's part of the tensor patched by ComfyUI, the very numbers of patching the whole weight."""
    from comfy.lora import calculate_weight
    _, pack = comfy
    lora_rows = pack.nodes.lora_rows
    rows, cols = 3000, 2500
    g = torch.Generator().manual_seed(7)
    w = torch.randn(rows, cols, generator=g) / cols ** 0.5
    patches = [(0.6, (form, (torch.randn(rows, cols, generator=g) * 1e-2,)), 1.0, None, None)]
    whole = calculate_weight(patches, w.clone(), "k")
    got, n = _patch_in_blocks(lora_rows, patches, w)
    assert n > 1 and torch.equal(got, whole) and not torch.equal(whole, w)


def test_a_block_outside_an_offset_patch_is_left_alone(comfy):
    """A patch on rows 100..149 only: blocks of 64 rows carry it where they meet those rows (rebased to the block),
    and nowhere else."""
    _, pack = comfy
    lora_rows = pack.nodes.lora_rows
    patches = [(1.0, _lora(50, 32, 4, 3), 1.0, (0, 100, 50), None)]
    cuts = lora_rows.blocks(patches, 256, 64)
    assert [(a, b) for a, b, _ in cuts] == [(0, 64), (64, 128), (128, 192), (192, 256)]
    assert [len(ps) for _, _, ps in cuts] == [0, 1, 1, 0]
    assert cuts[1][2][0][3] == (0, 36, 28) and cuts[1][2][0][1].weights[0].shape[0] == 28
    assert cuts[2][2][0][3] == (0, 0, 22) and cuts[2][2][0][1].weights[0].shape[0] == 22
    w = torch.randn(256, 32, generator=torch.Generator().manual_seed(4))
    from comfy.lora import calculate_weight
    assert torch.equal(_patch_in_blocks(lora_rows, patches, w, 64)[0], calculate_weight(patches, w.clone(), "k"))


def test_patches_that_are_not_row_local_are_left_whole(comfy):
    """DoRA (its norms), a conversion function (e.g. a row permutation), a padded diff, an offset along the columns,
    an adapter of another kind: the layer is patched in one block, as ComfyUI would."""
    from comfy.weight_adapter import LoHaAdapter
    _, pack = comfy
    lora_rows = pack.nodes.lora_rows
    n, m = 1200, 64
    plain = (1.0, _lora(n, m, 4, 5), 1.0, None, None)
    assert len(lora_rows.blocks([plain], n, 100)) == 12
    diff = torch.zeros(n, m)
    others = [
        (1.0, _lora(n, m, 4, 6, dora=True), 1.0, None, None),
        (1.0, _lora(n, m, 4, 7), 1.0, None, lambda a: a),
        (1.0, ("diff", (diff, {"pad_weight": True})), 1.0, None, None),
        (1.0, _lora(n, m // 2, 4, 8), 1.0, (1, 0, m // 2), None),
        (1.0, LoHaAdapter(set(), (None,) * 6), 1.0, None, None),
        (1.0, (torch.zeros(n - 1, m),), 1.0, None, None),  # rows that do not match the weight's: ComfyUI's warning
    ]
    for p in others:
        cuts = lora_rows.blocks([plain, p], n, 100)
        assert len(cuts) == 1 and cuts[0][2] == [plain, p], p
    assert len(lora_rows.blocks([plain], 80, 100)) == 1  # no larger than a block


def test_a_patch_comfyui_cannot_apply_is_logged_once_per_layer_not_once_per_block(comfy, zimage_dense, caplog,
                                                                                  monkeypatch):
    """Round 5: a LoRA whose rank does not fit logged ComfyUI's "Calculate Weight Failed" once per block of rows
    (43 times for one layer); the layer is left as it was and the message is logged once."""
    import logging
    from prequant_core import families, schemes
    from prequant_core.schemes import quantize
    from comfy.weight_adapter import LoRAAdapter
    _, pack = comfy
    lora_rows = pack.nodes.lora_rows
    q, _ = quantize.quantize_tensors(zimage_dense, "int8", exclude=schemes.exclude_tokens("int8"))
    model = pack.nodes.comfy_model.build_patcher(families.get("z-image"), "diffusers", q)
    op = model.model.diffusion_model.layers[0].feed_forward.w1
    rows, cols = op.weight.shape
    g = torch.Generator().manual_seed(5)
    bad = LoRAAdapter(set(), (torch.randn(rows, 8, generator=g), torch.randn(4, cols, generator=g),  # rank 8 vs 4
                              torch.tensor(4.0), None, None, None))
    monkeypatch.setattr(lora_rows, "rows_per_block", lambda columns: 8)
    originals = op.prequant_parts()
    assert len(lora_rows.blocks([(1.0, bad, 1.0, None, None)], rows, lora_rows.rows_per_block(cols))) > 10
    with caplog.at_level(logging.WARNING):
        new = lora_rows.patched_parts(op, originals, [(1.0, bad, 1.0, None, None)], "diffusion_model.w1.weight",
                                      give_back_pages=False)
    failed = [r for r in caplog.records if "diffusion_model.w1.weight" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in failed][:3]
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(new, originals))
