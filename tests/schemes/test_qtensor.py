"""prequant_core/schemes/qtensor.py's dispatch on real quantized weights: codec_of and scheme_of on a QParts (NVFP4
rows fused from weights of different per-tensor scales), codec_of on a plain tensor, split refusing a per-block
weight, rows_unchanged on parts whose scale is not one per row, and cat_rows refusing quantized rows fused with dense
rows or with rows quantized another way. Core tier: no ComfyUI."""
from __future__ import annotations

import pytest
import torch

from prequant_core import schemes
from prequant_core.schemes import nvfp4, qtensor


def dense(rows=8, cols=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g).to(torch.bfloat16)


def nv(seed):
    return nvfp4.quantize(dense(32, 64, seed), nvfp4.config())


def test_a_qparts_has_its_specs_codec_and_scheme():
    fused = qtensor.cat_rows([nv(1), nv(2)])  # two per-tensor scales: no NVFP4Tensor holds both
    assert isinstance(fused, qtensor.QParts) and tuple(fused.shape) == (64, 64)
    assert qtensor.codec_of(fused) is nvfp4.CODEC
    assert qtensor.scheme_of(fused) == "nvfp4"


def test_codec_of_a_plain_tensor_is_a_type_error():
    with pytest.raises(TypeError, match="not a quantized weight: Tensor"):
        qtensor.codec_of(torch.ones(2, 2))
    assert qtensor.scheme_of(torch.ones(2, 2)) is None


def test_split_refuses_per_block_weights():
    with pytest.raises(ValueError, match="nvfp4 weights have per-block scales"):
        qtensor.split(nv(0))


def test_rows_unchanged_with_one_scale_for_all_rows():
    w = schemes.quantize_weight(dense(), "int8")
    (q, s), spec = qtensor.parts(w)
    one = s[:1]  # a single scale for every row: not a per-row part
    ref = qtensor.dense_from_parts((q, one), spec, torch.bfloat16)
    changed = ref.clone()
    changed[3, 0] += 1
    got = qtensor.rows_unchanged(changed, (q, one), spec)
    assert got.tolist() == [i != 3 for i in range(8)]


def test_cat_rows_refuses_quantized_rows_with_dense_rows():
    w = schemes.quantize_weight(dense(), "int8")
    with pytest.raises(ValueError, match="quantized and dense rows"):
        qtensor.cat_rows([w, dense(seed=1)])


def test_cat_rows_refuses_rows_quantized_another_way():
    dyn = schemes.quantize_weight(dense(), "int8")
    wo = schemes.quantize_weight(dense(seed=1), "int8-weight-only")
    with pytest.raises(ValueError) as e:
        qtensor.cat_rows([dyn, wo])
    assert str(e.value) == "cannot fuse weights quantized with different settings"
    fp8 = schemes.quantize_weight(dense(seed=2), "fp8")
    with pytest.raises(ValueError) as e:
        qtensor.cat_rows([dyn, fp8])
    assert str(e.value) == "cannot fuse weights quantized with different settings (float8 and int8)"
