"""An all-zero weight row under per-row fp8: torchao's scale for it is 0 (int8's scale has an eps floor, fp8's none),
so its codes come out 0 / 0 = NaN and every output of the layer is NaN. The pack's quantizer (the builder, the dense
fallback, the LoRA requantization) keeps such a row zero and every other byte torchao's; a file whose zero-scale
rows hold NaN codes (Unsloth's builder makes the same torchao call) is refused naming the tensor and the row, where
it used to load and give NaN. Core tier: no ComfyUI."""
from __future__ import annotations

import os

import pytest
import torch

import unsloth_builder
from prequant_core import builder, families, schemes
from prequant_core.errors import CorruptCheckpointError
from prequant_core.load import opening
from prequant_core.load.metadata import Request
from prequant_core.schemes import qtensor, quantize, registry

ZERO_ROW = 3


def weight(rows=1300, cols=640) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    w = (torch.randn(rows, cols, generator=g) / 25).to(torch.bfloat16)
    w[ZERO_ROW] = 0
    return w


def torchao_fp8(w, scheme):
    """torchao's own per-row fp8 tensor for ``w``, as ``quantize_`` builds it (no floor)."""
    from torchao.quantization.quantize_.workflows import Float8Tensor
    s, weight_only = schemes.get(scheme)
    cfg = s.config(weight_only)
    g = cfg.granularity if weight_only else cfg.granularity[1]
    return Float8Tensor.from_hp(w, float8_dtype=cfg.weight_dtype, granularity=g)


@pytest.mark.parametrize("scheme", ["fp8", "fp8-weight-only"])
def test_an_all_zero_row_quantizes_to_zero_and_every_other_byte_is_torchaos(scheme):
    w = weight()
    ref = torchao_fp8(w, scheme)
    assert torch.isnan(ref.dequantize()[ZERO_ROW]).all()  # what torchao alone gives
    _, spec = qtensor.parts(schemes.quantize_weight(w, scheme))
    codec = registry.codec(spec.kind)
    made = {
        "builder": schemes.quantize_weight(w, scheme),
        "builder, row blocks": quantize.quantize_rows(w, scheme, chunk_elems=640 * 100),
        "LoRA requantization": codec.assemble(codec.quantize(w.float(), spec), spec),
    }
    others = torch.ones(w.shape[0], dtype=torch.bool)
    others[ZERO_ROW] = False
    for how, t in made.items():
        q, s = qtensor.parts(t)[0][:2]
        deq = t.dequantize().float()
        assert torch.isfinite(deq).all() and torch.equal(deq[ZERO_ROW], torch.zeros(w.shape[1])), how
        assert torch.equal(q.view(torch.uint8)[others], ref.qdata.view(torch.uint8)[others]), how
        assert torch.equal(s.reshape(-1), ref.scale.reshape(-1)), how  # torchao's scales, the 0 included


def _tiny_with_a_zero_row(seed=0):
    model = unsloth_builder.tiny_model("z-image", seed)
    lin = model.get_submodule("layers.0.attention.to_q")
    with torch.no_grad():
        lin.weight[ZERO_ROW] = 0
    return model


@pytest.mark.parametrize("ext", ["safetensors", "pt"])
def test_unsloths_file_with_nan_codes_in_a_zero_row_is_refused_naming_the_row(tmp_path, ext):
    path = str(tmp_path / f"Z-Image-Turbo-FP8.{ext}")
    unsloth_builder.build(_tiny_with_a_zero_row(), "z-image", "fp8", path)
    with pytest.raises(CorruptCheckpointError) as e:
        opening.open_checkpoint(path, Request(scheme="fp8"), model_dirs=[str(tmp_path)])
    assert f"Row {ZERO_ROW} of quantized tensor 'layers.0.attention.to_q.weight' has scale 0 and NaN float8 codes" \
        in e.value.message, e.value.message
    assert "Build Prequant Checkpoint" in e.value.fix and e.value.path == os.path.realpath(path)


def test_the_packs_build_of_the_same_weights_loads_with_the_row_zero(tmp_path):
    model = _tiny_with_a_zero_row()
    dense = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    path = str(tmp_path / "mine.safetensors")
    builder.build_from_tensors(dense, builder.Target(path, container="safetensors"),
                               builder.Recipe("fp8", family=families.get("z-image"),
                                              base_model_id="Tongyi-MAI/Z-Image-Turbo"))
    opened = opening.open_checkpoint(path, Request(scheme="fp8"), model_dirs=[str(tmp_path)])
    t = opened.checkpoint.tensors["layers.0.attention.to_q.weight"]
    deq = t.dequantize().float()
    assert torch.isfinite(deq).all() and not deq[ZERO_ROW].any()
