"""NVFP4 weights (prequant_core/schemes/nvfp4.py) that do not hold together, on real torchao NVFP4Tensors made by
the pack's own quantizer and then altered: NVFP4Codec.parts refusing a column-major weight, another block size, a
width that is not a multiple of 16, block scales of the wrong shape or dtype and a per-expert scale;
structure_problem on wrong dtypes and a per-tensor scale that is not one number; comfy_read refusing ComfyUI block
scales that do not fit the codes; comfy_from_weight on a weight whose scales are not swizzled. Core tier: no
ComfyUI."""
from __future__ import annotations

import pytest
import torch

from prequant_core import schemes
from prequant_core.errors import CorruptCheckpointError
from prequant_core.schemes import nvfp4, qtensor
from prequant_core.schemes.native_layout import Stored

CODEC = nvfp4.CODEC


def weight(rows=32, cols=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return nvfp4.quantize(torch.randn(rows, cols, generator=g).to(torch.bfloat16), nvfp4.config())


def plain(t, **changes):
    """The same NVFP4 weight with row-major (unswizzled) block scales, some constructor arguments changed."""
    q, s, row = qtensor.parts(t)[0]
    args = dict(qdata=q, scale=s.view(torch.float8_e4m3fn), block_size=16, orig_dtype=torch.bfloat16,
                per_tensor_scale=row[0, 0].clone(), is_swizzled_scales=False)
    args.update(changes)
    return CODEC.tensor_type()(args.pop("qdata"), args.pop("scale"), args.pop("block_size"), args.pop("orig_dtype"),
                               args.pop("per_tensor_scale"), is_swizzled_scales=args.pop("is_swizzled_scales"))


def test_parts_of_a_good_weight_round_trip():
    t = weight()
    ts, spec = CODEC.parts(t)
    assert [tuple(x.shape) for x in ts] == [(32, 32), (32, 4), (32, 1)] and spec.kind == "nvfp4"
    u = plain(t)
    assert all(torch.equal(a, b) for a, b in zip(CODEC.parts(u)[0], ts))


def test_parts_refuses_a_column_major_weight():
    t = weight(32, 64)  # 32 x 32 bytes: the transpose has the same shape
    t.qdata = t.qdata.t()
    with pytest.raises(ValueError, match="row-major"):
        CODEC.parts(t)


def test_parts_refuses_another_block_size():
    t = weight()
    t.block_size = 32
    with pytest.raises(ValueError, match="block size 32, expected 16"):
        CODEC.parts(t)


def test_parts_refuses_a_width_not_a_multiple_of_16():
    t = plain(weight())
    t.qdata = t.qdata[:, :4].contiguous()  # 8 columns
    with pytest.raises(ValueError, match="width 8 is not a multiple of 16"):
        CODEC.parts(t)


def test_parts_refuses_block_scales_of_another_shape_or_dtype():
    t = plain(weight())
    t.scale = t.scale[:, :3].contiguous()
    with pytest.raises(ValueError, match=r"block scales \(32, 3\), expected \(32, 4\)"):
        CODEC.parts(t)
    u = plain(weight())
    u.scale = u.scale.view(torch.uint8)
    with pytest.raises(ValueError, match="uint8 / float8_e4m3fn"):
        CODEC.parts(u)


def test_parts_refuses_a_per_expert_scale():
    t = weight()
    t.per_tensor_scale = torch.ones(2)
    with pytest.raises(ValueError, match="per-expert"):
        CODEC.parts(t)


def test_structure_problem_names_wrong_dtypes_and_a_scale_that_is_not_one_number():
    assert CODEC.structure_problem(weight()) is None
    t = weight()
    t.qdata = t.qdata.view(torch.int8)
    assert CODEC.structure_problem(t) == \
        "data torch.int8, scales torch.float8_e4m3fn, block 16: expected uint8, float8_e4m3fn, 16"
    for pts in (torch.ones(3), 2.0):
        u = weight()
        u.per_tensor_scale = pts
        assert CODEC.structure_problem(u) == "a per-tensor scale that is not one number"


def comfy_layout():
    (layout,) = [x for x in schemes.get("nvfp4")[0].comfy_layouts if x.name == "nvfp4"]
    return layout


def test_comfy_read_refuses_block_scales_that_do_not_fit_the_codes():
    layout = comfy_layout()
    parts = nvfp4.comfy_from_weight(layout, weight())
    side = {"weight_scale": parts["_scale"], "weight_scale_2": parts["_scale_2"]}
    spec = lambda: schemes.spec("nvfp4")  # noqa: E731
    t, _, _ = nvfp4.comfy_read(layout, Stored("blocks.0.w", "/m.safetensors", {}, parts[""], side), spec)
    assert torch.equal(t.qdata, weight().qdata)
    side["weight_scale"] = parts["_scale"][:64]
    with pytest.raises(CorruptCheckpointError, match="do not fit its codes") as e:
        nvfp4.comfy_read(layout, Stored("blocks.0.w", "/m.safetensors", {}, parts[""], side), spec)
    # 32 rows of 4 blocks: one 128 x 4 tile, 512 scales; half a tile is given
    assert e.value.found == "256 for (32, 32)" and e.value.expected == "512 block scales"


def test_comfy_from_weight_leaves_unswizzled_or_fused_weights_to_the_dense_path():
    layout = comfy_layout()
    assert nvfp4.comfy_from_weight(layout, plain(weight())) is None
    fused = qtensor.cat_rows([weight(seed=1), weight(seed=2)])  # two per-tensor scales: no torchao tensor holds it
    assert isinstance(fused, qtensor.QParts) and nvfp4.comfy_from_weight(layout, fused) is None
