"""NaN (and e5m2 infinite) float8 codes under a finite scale: refused naming the tensor and the row, in every float8
weight (Unsloth's fp8, MXFP8 elements; ComfyUI-native e4m3 / e5m2 in tests/test_comfy_native.py). The scan reads
eight bytes at a time (prequant_core.schemes.codec.first_special_row): held here against the byte-by-byte rule for
every alignment and width. Core tier: no ComfyUI."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import unsloth_builder as ub
from prequant_core import formats
from prequant_core.errors import CorruptCheckpointError
from prequant_core.schemes import codec

DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2]


def _naive(b: torch.Tensor, dtype) -> int | None:
    mask = 0x7F if dtype == torch.float8_e4m3fn else 0x7C
    bad = ((b & mask) == mask).any(dim=1).nonzero()
    return int(bad[0, 0]) if bad.numel() else None


@settings(max_examples=300, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 40), offset=st.integers(0, 7), seed=st.integers(0, 2 ** 31),
       plant=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 39), st.integers(0, 255)), max_size=3),
       e5m2=st.booleans())
def test_the_word_scan_finds_exactly_the_rows_the_byte_rule_finds(rows, cols, offset, seed, plant, e5m2):
    dtype = DTYPES[e5m2]
    g = torch.Generator().manual_seed(seed)
    # finite codes: random bytes with the special ones cleared, then a few planted bytes (special or not)
    raw = torch.randint(0, 256, (offset + rows * cols,), generator=g, dtype=torch.int32).to(torch.uint8)
    mask = 0x7F if dtype == torch.float8_e4m3fn else 0x7C
    raw[(raw & mask) == mask] ^= 0x04 if dtype == torch.float8_e4m3fn else 0x08
    b = raw[offset:].view(rows, cols)  # an address and a width of any alignment
    for r, c, v in plant:
        if r < rows and c < cols:
            b[r, c] = v
    got = codec.first_special_row(b, dtype)
    want = _naive(b, dtype)
    assert (got[0] if got else None) == want


def test_a_large_weight_is_scanned_in_blocks_and_its_last_row_is_seen(monkeypatch):
    monkeypatch.setattr(codec, "SCAN_ROWS_BYTES", 4096)
    b = torch.zeros(1000, 640, dtype=torch.uint8)
    b[999, 639] = 0xFF
    assert codec.first_special_row(b, torch.float8_e4m3fn) == (999, 1)


@pytest.mark.parametrize("kind,ext", [("fp8", ".pt"), ("fp8", ".safetensors"), ("mxfp8", ".pt")])
def test_an_unsloth_file_with_nan_codes_is_refused_naming_the_tensor_and_row(tmp_path, kind, ext):
    model = ub.tiny_model("z-image")
    ub.quantize(model, ub.KINDS[kind], ub.make_filter(ub.MIN_FEATURES, ub.exclude_tokens(ub.KINDS[kind], "z-image"),
                                                      True, ub.DIVISIBLE[ub.KINDS[kind]]))
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    key = next(k for k, v in sd.items() if hasattr(v, "qdata"))
    sd[key].qdata.view(torch.uint8)[4, 3] = 0x7F  # in place: the tensor subclass keeps its other fields
    meta = ub.metadata(family="z-image", scheme=ub.KINDS[kind], sd=sd, base_model_id=ub.FAMILIES["z-image"][1])
    path = str(tmp_path / ("poisoned" + ext))
    if ext == ".pt":
        ub.save_pt(path, sd, meta)
    else:
        pt = ub.save_pt(str(tmp_path / "src.pt"), sd, meta)
        ub.save_safetensors(path, sd, meta, converted_from=pt)
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(path)
    msg = str(e.value)
    assert key[:-len(".weight")] in msg and "Row 4" in msg and "NaN" in msg and path in msg, msg
