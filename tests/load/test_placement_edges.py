"""prequant_core/load/placement.py on a real torch module built on the ``meta`` device: a tensor of the wrong shape is
refused by name; ``place`` assigns a quantized weight as the Parameter itself, casts the plain tensors to the load's
dtype (float32 islands stay float32), fills the entries the family may lack, assigns buffers, moves and puts the
module in eval mode (its output then is the quantized math, bit for bit); and a tensor still on ``meta`` afterwards
(a quantized weight the host holds but never stored, a non-persistent buffer built on meta) is refused by name.
Core tier: no ComfyUI."""
from __future__ import annotations

import pytest
import torch

from prequant_core import schemes
from prequant_core.errors import CorruptCheckpointError
from prequant_core.load import placement
from prequant_core.schemes import qtensor

PATH = "/models/prequant/tiny.safetensors"


class Tiny(torch.nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.lin = torch.nn.Linear(32, 8, dtype=dtype)
        self.norm = torch.nn.LayerNorm(8, dtype=dtype)
        self.head = torch.nn.Linear(8, 4, dtype=torch.float32)  # declared float32: an island
        self.register_buffer("freq", torch.zeros(4, dtype=dtype))

    def forward(self, x):
        return self.head(self.norm(self.lin(x)).float())


def skeleton(dtype=torch.float32):
    with torch.device("meta"):
        return Tiny(dtype)


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"lin.weight": schemes.quantize_weight(torch.randn(8, 32, generator=g).bfloat16(), "int8"),
            "lin.bias": torch.randn(8, generator=g),  # float32 in the file
            "norm.weight": torch.randn(8, generator=g).bfloat16(), "norm.bias": torch.randn(8, generator=g).bfloat16(),
            "head.weight": torch.randn(4, 8, generator=g).bfloat16(), "head.bias": torch.randn(4, generator=g).bfloat16(),
            "freq": torch.arange(4, dtype=torch.float32)}


def test_a_tensor_of_another_shape_is_refused_by_name():
    t = weights()
    t["norm.weight"] = torch.ones(9, dtype=torch.bfloat16)
    m = skeleton()
    with pytest.raises(CorruptCheckpointError) as ei:
        placement.place(m, t, path=PATH)
    e = ei.value
    assert e.message == "Tensor 'norm.weight' has shape (9,), the model expects (8,)."
    assert e.path == PATH and e.fix == "The file is for another model size or family."
    assert m.lin.weight.is_meta  # nothing assigned


def test_place_assigns_casts_moves_and_evaluates():
    t = weights()
    m = skeleton(torch.bfloat16)
    out = placement.place(m, t, path=PATH, cast_plain=torch.bfloat16)
    assert out is m and not m.training
    # the quantized weight is the Parameter itself, not a dense copy
    assert isinstance(m.lin.weight, torch.nn.Parameter) and qtensor.is_quantized(m.lin.weight.data)
    (q, s), _ = qtensor.parts(m.lin.weight.data)
    (q0, s0), _ = qtensor.parts(t["lin.weight"])
    assert q.data_ptr() == q0.data_ptr() and s.data_ptr() == s0.data_ptr()  # the file's codes, not a copy
    assert not m.lin.weight.requires_grad
    # plain tensors take the load's dtype (the float32 bias cast to bf16), the float32 island keeps float32
    assert m.lin.bias.dtype == torch.bfloat16 and torch.equal(m.lin.bias, t["lin.bias"].bfloat16())
    assert m.head.weight.dtype == torch.float32 and torch.equal(m.head.weight, t["head.weight"].float())
    assert m.norm.weight.dtype == torch.bfloat16 and torch.equal(m.norm.weight, t["norm.weight"])
    # a buffer is a buffer (not a Parameter), in the load's dtype
    assert "freq" in dict(m.named_buffers()) and "freq" not in dict(m.named_parameters())
    assert m.freq.dtype == torch.bfloat16 and m.freq.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert not any(p.is_meta for p in m.parameters()) and not any(b.is_meta for b in m.buffers())
    # the module computes with the quantized weight: the same as the quantized math done by hand
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(5)).bfloat16()
    with torch.no_grad():
        got = m(x)
        ref_lin = torch.nn.functional.linear(x, t["lin.weight"], m.lin.bias)
        want = m.head(m.norm(ref_lin).float())
    assert torch.equal(got, want)


def test_fill_missing_fills_what_the_file_may_lack():
    t = weights()
    for k in ("norm.weight", "norm.bias", "freq"):
        del t[k]
    m = skeleton()
    placement.place(m, t, fill_missing={"norm.weight": "ones", "norm.bias": "zeros",
                                        "freq": lambda shape, dtype: torch.full(shape, 7.0, dtype=dtype)},
                    cast_plain=torch.bfloat16)
    assert m.norm.weight.tolist() == [1.0] * 8 and m.norm.bias.tolist() == [0.0] * 8
    assert m.freq.tolist() == [7.0] * 4 and m.freq.dtype == torch.float32  # the function's own dtype: the skeleton's


def test_a_quantized_weight_held_but_never_stored_is_refused():
    t = weights()
    m = skeleton()
    held = placement.assign(m, t, path=PATH, hold_quantized=True)
    assert [(sub, attr) for sub, attr, _ in held] == [(m.lin, "weight")] and held[0][2] is t["lin.weight"]
    assert m.lin.weight.is_meta  # left to the host
    with pytest.raises(CorruptCheckpointError) as ei:
        placement.check_complete(m, PATH)
    assert ei.value.message == ("1 model tensors were not provided by the file and cannot be rebuilt: lin.weight")
    assert ei.value.path == PATH


def test_a_non_persistent_buffer_built_on_meta_is_refused():
    m = skeleton()
    with torch.device("meta"):
        m.register_buffer("inv_freq", torch.ones(2), persistent=False)  # not in a state dict: no file provides it
    with pytest.raises(CorruptCheckpointError) as ei:
        placement.place(m, weights(), path=PATH)
    assert ei.value.message == ("1 model tensors were not provided by the file and cannot be rebuilt: inv_freq")
