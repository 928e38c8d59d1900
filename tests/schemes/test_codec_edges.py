"""prequant_core/schemes/codec.py's shared pieces on the inputs no file of the other tests gives them: fused NVFP4 rows
(a QParts) counting their elements; the e5m2 decode table against the format's own values; a scale that cannot be read
at all (a tensor without data); the NaN-code scan on empty, one-dimensional and strided codes (every code a number,
and a NaN in a known row); a per-block weight whose width is not a multiple of the block; and the block shapes a
per-row weight may record. Real torchao tensors. Core tier: no ComfyUI."""
from __future__ import annotations

import math

import pytest
import torch

from prequant_core.errors import CorruptCheckpointError
from prequant_core.schemes import codec, nvfp4, qtensor


def dense(rows, cols, seed=0):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def nv(seed, rows=32, cols=64):
    return nvfp4.quantize(dense(rows, cols, seed), nvfp4.config())


def test_fused_nvfp4_rows_count_their_elements():
    fused = qtensor.cat_rows([nv(1), nv(2, rows=16)])  # two per-tensor scales: a QParts
    assert isinstance(fused, codec.QParts)
    assert fused.numel() == 48 * 64 == math.prod(fused.shape)


def test_the_e5m2_table_holds_the_formats_values():
    t = codec.decode_table("e5m2", "cpu")
    assert t.dtype == torch.float32 and t.shape == (256,)
    assert t[0x3C].item() == 1.0 and t[0xBC].item() == -1.0 and t[0x40].item() == 2.0
    assert t[0x01].item() == 2.0 ** -16  # the smallest subnormal
    assert t[0x7B].item() == 57344.0  # the largest finite value
    assert t[0x7C].item() == math.inf and t[0xFC].item() == -math.inf
    assert all(math.isnan(t[b].item()) for b in (0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF))
    assert codec.decode_table("e5m2", "cpu") is t  # built once


def test_a_scale_that_cannot_be_read_is_refused_by_name():
    s = torch.empty(8, 1, device="meta")  # no data behind it
    with pytest.raises(CorruptCheckpointError) as ei:
        codec.check_scale_finite("blocks.0.attn.to_q.weight", s, "/m/f.safetensors")
    e = ei.value
    assert e.message == "The scale of quantized tensor 'blocks.0.attn.to_q.weight' cannot be read."
    assert e.path == "/m/f.safetensors" and e.found.split(":")[0] in ("RuntimeError", "NotImplementedError")


def test_the_nan_scan_of_codes_with_no_rows_or_one_dimension_finds_nothing():
    e4m3 = torch.float8_e4m3fn
    assert codec.first_special_row(torch.empty(0, 16, dtype=torch.uint8), e4m3) is None
    assert codec.first_special_row(torch.full((16,), 0x7F, dtype=torch.uint8), e4m3) is None  # not a weight


def test_the_nan_scan_of_strided_codes_names_the_row():
    e4m3 = torch.float8_e4m3fn
    b = torch.full((40, 64), 0x38, dtype=torch.uint8)  # 1.0 in e4m3
    b[7, 1] = 0x7F  # NaN, in a column the strided view leaves out
    view = b[:, ::2]
    assert codec.dense_run(view) is None  # gaps: the row-block path
    assert codec.first_special_row(view, e4m3) is None
    assert codec.first_special_row(view.view(e4m3), e4m3) is None
    b[5, 10] = 0xFF  # -NaN, inside the view (column 5 of it)
    b[9, 20] = 0x7F
    assert codec.first_special_row(view, e4m3) == (5, 2)  # row 5, and one more row (9) in its block
    with pytest.raises(CorruptCheckpointError) as ei:
        codec.refuse_special_codes("blocks.1.ff.weight", view, e4m3, "/m/f.pt")
    assert ei.value.found == "NaN codes in row 5 and 1 more row(s) near it"


@pytest.mark.parametrize("cols,block", [(60, 16), (64, 0), (64, -16)])
def test_a_block_weight_whose_width_is_not_a_multiple_of_the_block(cols, block):
    assert codec.block_scale_problem(nv(0), cols, block) == f"width {cols} is not a multiple of the block size {block}"
    assert codec.block_scale_problem(nv(0), 64, 16) is None  # the weight as it is


@pytest.mark.parametrize("v,whole_ok,ok", [
    ([1, 32], False, True), ((1, 32), False, True), ([1, 16], False, False), ([8, 32], False, False),
    ([8, 32], True, True), ([True, 32], False, False), ([1, 32.0], False, False), ("1,32", False, False),
    ([1, 32, 1], False, False), (None, True, False), ({1: 32}, False, False),
])
def test_the_block_shapes_a_per_row_weight_may_record(v, whole_ok, ok):
    assert codec.row_block_accepted(v, (8, 32), whole_ok) is ok
