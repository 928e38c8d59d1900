"""Scheme edges no other test reaches: the fp8 codec's per-row value check given parts it cannot pair row by row, a
ComfyUI-native int8 ConvRot layer whose scale is one per tensor (refused: the rotation is undone per row), and the
row-block quantizer meeting a block whose settings differ from the first block's (the whole weight is quantized at
once instead, so the result is still ``schemes.quantize_weight``'s bit for bit). Real torchao tensors, real files;
core tier (no ComfyUI)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from prequant_core import formats, schemes
from prequant_core.errors import CorruptCheckpointError
from prequant_core.schemes import fp8, int8, qtensor, quantize, registry
from prequant_core.schemes.record import Scheme

KEY = "blocks.0.mlp.0.weight"
PATH = "/models/prequant/some-file.safetensors"


# --- fp8: the per-row value check ------------------------------------------------------------------------------------

def _fp8_parts_with_a_zero_row():
    """Per-row fp8 parts as ``Float8Codec.parts`` gives them, row 1 scaled 0 with NaN codes (torchao's per-row fp8 of
    an all-zero row without the pack's floor): what the check refuses."""
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(4, 32, generator=g)).to(torch.bfloat16)
    t = schemes.quantize_weight(w, "fp8")
    (q, s), _ = qtensor.parts(t)
    q, s = q.clone(), s.clone()
    q.view(torch.uint8)[1] = 0x7F  # e4m3fn NaN
    s[1] = 0
    return t, q, s


def test_the_fp8_value_check_refuses_a_zero_scale_row_with_nan_codes_when_parts_pair_up_per_row():
    t, q, s = _fp8_parts_with_a_zero_row()
    with pytest.raises(CorruptCheckpointError) as e:
        fp8.Float8Codec().check_values(KEY, t, (q, s), PATH)
    assert "Row 1 of quantized tensor" in e.value.message and "scale 0 and NaN float8 codes" in e.value.message
    assert e.value.path == PATH


@pytest.mark.parametrize("case", ["one-dim-codes", "one-scale-for-all-rows", "a-scale-too-many"])
def test_the_fp8_value_check_leaves_parts_it_cannot_pair_per_row_alone(case):
    """Codes that are not 2-D, or a scale count other than one per row, cannot be paired row by row: the check
    returns without judging them (``check_quantized`` refuses such shapes before, and ``parts`` repeats a per-tensor
    scale per row, so the reader never hands it these). Pairing them anyway would index the codes with a mask of the
    wrong length (an IndexError, not the pack's refusal)."""
    t, q, s = _fp8_parts_with_a_zero_row()
    parts = {"one-dim-codes": (q.reshape(-1), s),
             "one-scale-for-all-rows": (q, s[1:2].reshape(1, 1)),
             "a-scale-too-many": (q, torch.cat([s, s[:1]]))}[case]
    assert fp8.Float8Codec().check_values(KEY, t, parts, PATH) is None


# --- int8: ComfyUI-native ConvRot layers ------------------------------------------------------------------------------

def _json_tensor(obj) -> torch.Tensor:
    """A layer's ``.comfy_quant`` entry as ComfyUI's writer stores it: the JSON's UTF-8 bytes as a uint8 tensor."""
    return torch.tensor(list(json.dumps(obj).encode("utf-8")), dtype=torch.uint8)


def _convrot_file(path: str, scale: torch.Tensor) -> str:
    """One ComfyUI-native ``int8_tensorwise`` ConvRot layer (group 64) with the given ``weight_scale``, written as
    ComfyUI's writer lays a layer out (weight, weight_scale, comfy_quant), and a dense norm beside it."""
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(-127, 128, (64, 256), generator=g, dtype=torch.int8)
    save_file({"blocks.0.mlp.0.weight": codes, "blocks.0.mlp.0.weight_scale": scale,
               "blocks.0.mlp.0.comfy_quant": _json_tensor({"format": "int8_tensorwise", "convrot": True,
                                                           "convrot_groupsize": 64}),
               "blocks.0.norm.weight": torch.ones(256, dtype=torch.bfloat16)}, path)
    return path


def test_a_comfyui_convrot_int8_layer_with_one_scale_for_the_whole_weight_is_refused_naming_the_layer(tmp_path):
    path = _convrot_file(str(tmp_path / "convrot-per-tensor.safetensors"), torch.tensor(0.01, dtype=torch.float32))
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(path)
    assert e.value.message == "ComfyUI-native layer 'blocks.0.mlp.0': a ConvRot layer needs per-row scales"
    assert e.value.path == path and e.value.found == "per_tensor"


def test_the_same_convrot_layer_with_one_scale_per_row_is_read_with_its_group(tmp_path):
    """The control: the layer above with a per-row scale reads, its weight carrying the ConvRot group."""
    scale = torch.linspace(0.005, 0.02, 64, dtype=torch.float32).reshape(64, 1)
    path = _convrot_file(str(tmp_path / "convrot-per-row.safetensors"), scale)
    ck = formats.read(path)
    (q, s), spec = qtensor.parts(ck.tensors["blocks.0.mlp.0.weight"])
    assert spec.rotation == 64 and q.dtype == torch.int8 and torch.equal(s.reshape(-1), scale.reshape(-1))


# --- the row-block quantizer ------------------------------------------------------------------------------------------

LARGE = 4.0  # the toy scheme's threshold: a block whose largest magnitude exceeds it is quantized in the reduced range


def _quantize_by_magnitude(weight, cfg):
    """int8's quantizer, choosing the reduced int8 range (codes within [-64, 63], activations too) for a weight whose
    largest magnitude exceeds ``LARGE``: the settings a block gets depend on that block's values."""
    if float(weight.abs().amax()) > LARGE:
        cfg = dataclasses.replace(cfg, reduce_range=True)
    return int8.quantize(weight, cfg)


# a scheme whose blocks may quantize with other settings than the first (this pack ships none: its schemes' settings
# come from the config alone), added to the registry the way tests/schemes/test_scheme_registry.py adds its toys
VARYING = Scheme(name="q8vary", kind="int8", codec=int8.CODEC, suffix="-Q8VARY", config=int8.config,
                 quantize=_quantize_by_magnitude, granularity_field="int8_granularity",
                 exclude_base_tokens=int8.BASE_EXCLUDE, min_capability=(7, 5))


@pytest.fixture
def with_varying(monkeypatch):
    monkeypatch.setattr(registry, "SCHEMES", (*registry.SCHEMES, VARYING))


def test_a_later_row_block_quantizing_with_other_settings_quantizes_the_whole_weight_at_once(with_varying):
    g = torch.Generator().manual_seed(2)
    w = torch.randn(32, 64, generator=g).clamp(-2, 2).to(torch.bfloat16)
    w[24:] *= 4  # the last block's values exceed LARGE; the first block's do not
    chunk = 8 * 64  # blocks of 8 rows
    first_block = schemes.quantize_weight(w[:8].contiguous(), "q8vary")
    assert first_block.reduce_range is False and int(first_block.qdata.abs().max()) == 127
    got = quantize.quantize_rows(w, "q8vary", chunk_elems=chunk)
    want = schemes.quantize_weight(w, "q8vary")
    # the whole weight's settings for every row, bit for bit schemes.quantize_weight's: the first block's rows are in
    # the reduced range too (a tensor assembled from the blocks would hold them at full range under one setting)
    assert got.reduce_range is True and got.act_quant_kwargs == want.act_quant_kwargs
    assert torch.equal(got.qdata, want.qdata) and torch.equal(got.scale, want.scale)
    assert int(got.qdata[:8].abs().max()) <= 64 and not torch.equal(got.qdata[:8], first_block.qdata)
    assert list(got.block_size) == [1, 64] and got.dtype == torch.bfloat16


def test_row_blocks_with_the_same_settings_are_assembled_bit_for_bit(with_varying):
    """The control: every block under LARGE, so every block's settings are the first's; the blocks are assembled,
    and the result is still the whole weight's."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(32, 64, generator=g).clamp(-2, 2).to(torch.bfloat16)
    got = quantize.quantize_rows(w, "q8vary", chunk_elems=8 * 64)
    want = schemes.quantize_weight(w, "q8vary")
    assert got.reduce_range is False and torch.equal(got.qdata, want.qdata) and torch.equal(got.scale, want.scale)
