"""prequant_core/formats/validate_tensors.py on real torchao tensors (made by the pack's own quantizers, then
altered the way a stranger's file could): dense_layout_problem on a sparse tensor and a declared size past 2**40;
check_quantized on per-row weights missing a part, holding a part that is not a tensor, or storing codes of another
dtype; _check_block on NVFP4 weights whose part is not a tensor, whose codes are empty, that lack a part altogether,
or whose parts cannot be read after the structure check passed. Core tier: no ComfyUI."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from prequant_core import schemes
from prequant_core.errors import CorruptCheckpointError
from prequant_core.formats import validate_tensors as vt
from prequant_core.schemes import nvfp4

PATH = "/models/m.safetensors"


def row_weight(scheme="int8", rows=8, cols=32):
    g = torch.Generator().manual_seed(0)
    return schemes.quantize_weight(torch.randn(rows, cols, generator=g).to(torch.bfloat16), scheme)


def block_weight(rows=32, cols=64):
    g = torch.Generator().manual_seed(0)
    return nvfp4.quantize(torch.randn(rows, cols, generator=g).to(torch.bfloat16), nvfp4.config())


def test_good_weights_pass():
    for t in (row_weight("int8"), row_weight("fp8"), block_weight()):
        vt.check_quantized("blocks.0.w", t, PATH)


def test_dense_layout_problem_names_a_sparse_tensor_and_a_huge_declared_size():
    assert vt.dense_layout_problem(torch.eye(3).to_sparse()) == "layout torch.sparse_coo"
    huge = torch.zeros(1).expand(vt.MAX_DIM + 1)  # a stride-0 view: one element stored, 2**40 + 1 declared
    assert vt.dense_layout_problem(huge) == f"a dimension beyond {vt.MAX_DIM} in shape ({vt.MAX_DIM + 1},)"
    assert vt.dense_layout_problem(torch.ones(3, 4).t()) is None  # transposed dense data is fine


def test_a_row_weight_without_its_scale_is_inconsistent():
    t = row_weight()
    del t.__dict__["scale"]
    with pytest.raises(CorruptCheckpointError, match="is inconsistent") as e:
        vt.check_quantized("blocks.0.w", t, PATH)
    assert e.value.found.startswith("AttributeError") and "scale" in e.value.found


def test_a_row_weight_part_that_is_not_a_tensor_is_refused():
    t = row_weight()
    t.qdata = np.zeros((8, 32), dtype=np.int8)
    with pytest.raises(CorruptCheckpointError, match=r"\(codes\) is not a tensor") as e:
        vt.check_quantized("blocks.0.w", t, PATH)
    assert e.value.found == "ndarray"


def test_codes_of_a_dtype_no_kind_uses_and_of_another_kinds_dtype_are_refused():
    t = row_weight("int8")
    t.qdata = t.qdata.to(torch.int16)
    with pytest.raises(CorruptCheckpointError, match="stores torch.int16 codes") as e:
        vt.check_quantized("blocks.0.w", t, PATH)
    assert e.value.expected == "int8 or float8 codes"
    u = row_weight("int8")
    u.qdata = u.qdata.to(torch.float8_e4m3fn)  # float8 codes: some kind's, not int8's
    with pytest.raises(CorruptCheckpointError, match=r"\(int8\) stores torch.float8_e4m3fn codes") as e:
        vt.check_quantized("blocks.0.w", u, PATH)
    assert e.value.expected == "int8 codes"


def test_a_block_weight_part_that_is_not_a_tensor_is_refused():
    t = block_weight()
    t.qdata = np.zeros((32, 32), dtype=np.uint8)
    with pytest.raises(CorruptCheckpointError, match=r"\(nvfp4\) is inconsistent") as e:
        vt.check_quantized("blocks.0.w", t, PATH)
    assert e.value.found == "codes is ndarray"


def test_a_block_weight_with_empty_codes_is_refused():
    t = block_weight()
    t.qdata = torch.empty(0, 32, dtype=torch.uint8)
    with pytest.raises(CorruptCheckpointError, match="is inconsistent") as e:
        vt.check_quantized("blocks.0.w", t, PATH)
    assert e.value.found == "data (0, 32): expected a non-empty 2-D weight"


def test_a_block_weight_missing_its_codes_is_refused():
    t = block_weight()
    del t.__dict__["qdata"]
    with pytest.raises(CorruptCheckpointError, match="is inconsistent") as e:
        vt.check_quantized("blocks.0.w", t, PATH)
    assert e.value.found.startswith("AttributeError") and "qdata" in e.value.found


def test_a_block_weight_whose_parts_cannot_be_read_after_the_structure_check_is_refused():
    t = block_weight(32, 64)  # 32 x 32 code bytes: a transposed view keeps the shape and is laid out densely
    t.qdata = t.qdata.t()
    assert nvfp4.CODEC.structure_problem(t) is None
    vt.check_quantized("blocks.0.w", t, PATH, read_data=False)  # shapes only: nothing read, nothing to refuse
    with pytest.raises(CorruptCheckpointError, match="is inconsistent") as e:
        vt.check_quantized("blocks.0.w", t, PATH)
    assert e.value.found == "ValueError: only 2-D, row-major NVFP4 weights are supported"
